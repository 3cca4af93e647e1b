"""CUDA (Triton) kernels against independent references. Skipped without Triton,
and without CUDA unless TRITON_INTERPRET=1 (Triton's CPU interpreter runs the
same kernels on CPU tensors, with smaller shapes).

Types are ``ops/cuda``'s ``SUPPORTED`` and token counts come from its
``LADDER``, so every rung of every type is exercised. References: gguf's
numpy ``dequantize`` (bit for bit) and a float64 matmul of the dequantized
weight. Random data is drawn fresh each run; the seed is in every assertion
message (MUSER_TEST_SEED=N replays one).
"""
from __future__ import annotations

import os

import gguf
import numpy as np
import pytest
import torch

from muser_torch.formats import random_weight
from muser_torch.ops import checks
from muser_torch.formats.types import GGMLType

from ...random_seed import fresh_seed

try:
    from muser_torch.ops import cuda
except ImportError:          # no Triton: every test below is skipped
    cuda = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(cuda is None or not (torch.cuda.is_available() or INTERPRET),
                                reason="needs Triton, and CUDA or TRITON_INTERPRET=1")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

TYPES = sorted(cuda.SUPPORTED) if cuda else []
KQUANT = (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K)
# (n_out, n_in): awkward row counts, single- and multi-tile rows; for the
# 32-element types also rows that end inside a 256-column tile.
KQ_SHAPES = [(1, 256), (37, 512), (130, 768)] if INTERPRET else \
    [(1, 256), (37, 512), (300, 768), (1000, 2816), (4096, 6656), (256, 6656)]
SMALL_SHAPES = [(1, 32), (37, 96), (130, 544)] if INTERPRET else \
    [(1, 32), (37, 96), (300, 800), (1000, 2592), (256, 6656)]
ALL_SHAPES = [(t, s) for t in TYPES for s in (KQ_SHAPES if t.block_elems == 256 else SMALL_SHAPES)]


def _ladder_tokens() -> list[int]:
    """Both ends of every bounded rung and the first count past it, plus (on a
    GPU) counts inside the rungs and two large batches."""
    ends = {1}
    for rung in cuda.LADDER if cuda else ():
        if rung.max_tokens is not None:
            ends |= {rung.max_tokens, rung.max_tokens + 1}
    return sorted(ends if INTERPRET else ends | {4, 5, 6, 7, 8, 64, 200})


TOKENS = _ladder_tokens()


class Case:
    """A random weight of ``qt`` on the CPU and on DEVICE, with its float64 value."""

    def __init__(self, qt: GGMLType, n_out: int, n_in: int):
        self.seed = fresh_seed()
        self.gen = torch.Generator().manual_seed(self.seed)
        self.qt, self.n_out, self.n_in = qt, n_out, n_in
        self.weight = random_weight(qt, n_out, n_in, generator=self.gen)
        self.args = self.weight.to(DEVICE).op_args()      # (packed, qtype, n_out, n_in, s, s2)
        self.packed, _, _, _, self.scales, self.scale_2 = self.args
        self.w64 = self.weight.dequantize().double()

    def randn(self, *shape, dtype=torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen).to(dtype)

    def __str__(self) -> str:
        return f"{self.qt.name} [{self.n_out}, {self.n_in}] seed={self.seed}"


def gguf_dequantize(weight) -> torch.Tensor:
    """gguf's numpy dequantize of a packed weight; NVFP4_E2M1, which gguf does
    not know, falls back to ``muser_torch.formats.dequantize_reference``."""
    try:
        gtype = gguf.GGMLQuantizationType(int(weight.qtype))
    except ValueError:
        return weight.dequantize()
    out = gguf.dequantize(weight.packed.numpy(), gtype).astype(np.float32, copy=False)
    return torch.from_numpy(out.reshape(weight.n_out, weight.n_in).copy())


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double().cpu() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _rel_abs(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    """Error over the scale of the products, ||y - x W^T|| / || |x| |W|^T ||: a
    cancelling sum (one output of a single 32-element block, say) cannot blow it up."""
    x = x.double()
    return ((y.double().cpu() - x @ w.T).norm() / (x.abs() @ w.abs().T).norm().clamp_min(1e-30)).item()


def _contract_err(y, x, w) -> float:
    """The numerics contract, 1e-5 of float64: relative to ||x W^T||, or, where
    that sum cancels, 1e-6 of || |x| |W|^T ||."""
    return min(_rel(y, x.double() @ w.T), 10 * _rel_abs(y.reshape(-1, w.shape[0]),
                                                        x.reshape(-1, w.shape[1]), w))


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


# ---- dequantize / embedding: bit for bit -----------------------------------------

@pytest.mark.parametrize("qt,shape", ALL_SHAPES, ids=lambda v: getattr(v, "name", str(v)))
def test_dequantize_bit_exact(qt, shape):
    c = Case(qt, *shape)
    out = cuda.dequantize(*c.args).cpu()
    assert out.dtype == torch.float32
    assert _bits_equal(out, gguf_dequantize(c.weight)), str(c)


@pytest.mark.parametrize("qt", TYPES, ids=lambda v: v.name)
def test_embedding_bit_exact(qt):
    c = Case(qt, 53, 512)
    ids = torch.randint(0, c.n_out, (3, 7), generator=c.gen)
    out = cuda.embedding(ids.to(DEVICE), *c.args).cpu()
    assert out.shape == (3, 7, c.n_in)
    assert _bits_equal(out, gguf_dequantize(c.weight)[ids]), str(c)


# ---- qmatmul: every rung against float64 ------------------------------------------

def test_ladder_tokens_reach_every_rung():
    """The token counts the ladder test runs reach every rung of every type (with
    float32 activations every rung but the half-only ones), and float32 never
    reaches a half-only rung."""
    def covers(e, r):           # e takes every token count and dtype r takes
        longer = e.max_tokens is None or (r.max_tokens is not None and e.max_tokens >= r.max_tokens)
        return longer and (e.dtypes is None or (r.dtypes is not None and r.dtypes <= e.dtypes))

    def shadowed(i, r, qt):     # an earlier built rung takes every call r would
        return any(covers(e, r) and qt in e.types and (e.built is None or e.built())
                   for e in cuda.LADDER[:i])
    for qt in TYPES:
        served = {r.name for i, r in enumerate(cuda.LADDER) if qt in r.types
                  and (r.built is None or r.built()) and not shadowed(i, r, qt)}
        f32 = {cuda.rung_for(qt, m).name for m in TOKENS}
        half = {cuda.rung_for(qt, m, torch.float16).name for m in TOKENS}
        assert f32 | half == served, qt.name
        assert all(cuda.RUNGS[n].dtypes is None for n in f32), qt.name


@pytest.mark.parametrize("qt,shape", ALL_SHAPES, ids=lambda v: getattr(v, "name", str(v)))
def test_qmatmul_ladder(qt, shape):
    """Every rung of the token ladder, float32 activations, within 1e-5 of float64."""
    c = Case(qt, *shape)
    for tokens in TOKENS:
        x = c.randn(tokens, c.n_in)
        y = cuda.qmatmul(x.to(DEVICE), *c.args)
        assert y.shape == (tokens, c.n_out) and y.dtype == torch.float32
        err = _contract_err(y, x, c.w64)
        rung = cuda.rung_for(qt, tokens).name
        assert err < 1e-5, f"{c} tokens={tokens} ({rung}) rel err {err:.3g}"


@pytest.mark.parametrize("qt", sorted(cuda.RUNGS["mv_kquant"].types) if cuda else [],
                         ids=lambda v: v.name)
def test_kquant_matvec_split(qt):
    """The one-token K-quant kernels with a split K and other tile widths (the sweep's)."""
    for n_out, n_in in [(37, 512), (100, 1024) if INTERPRET else (300, 1536)]:
        c = Case(qt, n_out, n_in)
        for target, bn in [(1, 32), (10 ** 4, 64)]:
            x = c.randn(1, n_in)
            y = cuda.run_rung("mv_kquant", x.to(DEVICE), c.packed, qt, n_out, n_in,
                              target=target, bn=bn)
            err = _contract_err(y, x, c.w64)
            assert err < 1e-5, f"{c} target={target} bn={bn} rel err {err:.3g}"


@pytest.mark.parametrize("qt", sorted(cuda.RUNGS["token_axis"].types) if cuda else [],
                         ids=lambda v: v.name)
def test_token_axis_kernel(qt):
    """The CUDA-core kernel with a token axis, past the 2 tokens it is dispatched
    at (its axis is padded to 2, 4 or 8), with a split K."""
    c = Case(qt, 40, 1024) if INTERPRET else Case(qt, 100, 1536)
    for tokens in (2, 3, 4):
        for target in (1, 10 ** 4):
            x = c.randn(tokens, c.n_in)
            y = cuda.run_rung("token_axis", x.to(DEVICE), c.packed, qt, c.n_out, c.n_in,
                              target=target)
            err = _rel(y, x.double() @ c.w64.T)
            assert err < 1e-5, f"{c} tokens={tokens} target={target} rel err {err:.3g}"


I8_TYPES = sorted(cuda.I8_TYPES) if cuda else []


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("qt", I8_TYPES, ids=lambda v: v.name)
def test_i8_dot_kernel(qt, dtype):
    """The int8-dot kernels (x in two int8 levels per 32 columns, integer dots),
    dispatched or not, against float64 of the half x as given, their output in
    float32 so the kernel's own error shows: about 2e-5, held under 1e-4. Rows of
    32-element types that end inside a 256-column tile, a split K (summed in the
    kernel) and an all-zero activation block are included."""
    shapes = [(37, 512), (29, 544)] if qt.block_elems == 32 else [(37, 512)]
    if not INTERPRET:
        shapes += [(300, 2816 if qt.block_elems == 256 else 2592)]
    for n_out, n_in in shapes:
        c = Case(qt, n_out, n_in)
        for tokens in (1, 3, 8) if INTERPRET else (1, 2, 3, 5, 8):
            x = c.randn(tokens, n_in, dtype=dtype)
            x[:, 32:64] = 0                                   # a block with amax 0
            for launch in (cuda.Launch(16, 2, 1), cuda.Launch(32, 4, 1, target=10 ** 4)):
                y = cuda._i8_dot(x.to(DEVICE), c.packed, qt, n_out, n_in, None, None, launch,
                                 out_dtype=torch.float32)
                assert y.shape == (tokens, n_out) and y.dtype == torch.float32
                err = _rel(y, x.double() @ c.w64.T)
                assert err < 1e-4, f"{c} tokens={tokens} {launch} rel err {err:.3g}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("qt", sorted(cuda.RUNGS["cuda_mv"].types) if cuda else [],
                         ids=lambda v: v.name)
def test_cuda_cpp_matvec(qt, dtype):
    """mv.cu's one-token kernels (built where nvcc is), their output in float32:
    within 1e-4 of float64 of the half x as given, as the int8-dot kernels, and
    within 1e-5 of ``_i8_dot`` on the same quantized activation. Row counts that
    split K across a block's warps, block counts that leave lanes idle, and a
    zero activation block are included."""
    if not cuda.RUNGS["cuda_mv"].built():
        pytest.skip(f"the CUDA C++ kernels are not built: {cuda.compiled.reason()}")
    for n_out, n_in in [(37, 512), (300, 2816), (4101, 1280), (513, 6656)]:
        c = Case(qt, n_out, n_in)
        x = c.randn(1, n_in, dtype=dtype)
        x[:, 32:64] = 0
        i8 = cuda._i8_dot(x.to(DEVICE), c.packed, qt, n_out, n_in, None, None,
                          cuda.Launch(32, 4, 1), out_dtype=torch.float32)
        for rows in (1, 2, 4):
            y = cuda._cuda_mv(x.to(DEVICE), c.packed, qt, n_out, n_in, None, None,
                              cuda.Launch(rows, 4, 0), out_dtype=torch.float32)
            assert y.shape == (1, n_out) and y.dtype == torch.float32
            assert _rel(y, x.double() @ c.w64.T) < 1e-4, f"{c} rows={rows}"
            assert _rel(y, i8.double().cpu()) < 1e-5, f"{c} rows={rows}"
        half = cuda.qmatmul(x.to(DEVICE), *c.args)
        assert half.dtype == dtype and cuda.rung_for(qt, 1, dtype).name == "cuda_mv"
        dflt = cuda._cuda_mv(x.to(DEVICE), c.packed, qt, n_out, n_in, None, None,
                             cuda.RUNGS["cuda_mv"].launch[qt], out_dtype=torch.float32)
        assert torch.equal(half.cpu(), dflt.cpu().to(dtype)), f"{c}"


@pytest.mark.parametrize("run8", [True, False], ids=["runs-of-8", "natural"])
def test_fragment_order_activation(run8):
    """``_quantize_frag`` holds ``_quantize_x``'s values, each where the fragment
    layout puts it: a lane 4 g + u of a tile holds token g's a1 then a2 bytes of its
    k-slots (columns 8u.. in runs of 8, else 4u.. and 16 + 4u..); the scales of a block
    pair sit per (u, e) as (dx, dx, dx s, dx s) of token 2u + e; tokens past M are 0."""
    g = torch.Generator().manual_seed(5)
    for M, n_in in ((1, 300), (7, 512), (9, 256), (16, 544)):
        x = (torch.randn(M, n_in, generator=g) * torch.rand(M, 1, generator=g) * 4).half()
        a12, sc = (t.cpu() for t in cuda._quantize_frag(x.to(DEVICE), n_in, run8))
        a1, a2, dxs, _, s32, _ = (t.cpu() if torch.is_tensor(t) else t
                                   for t in cuda._quantize_x(x.to(DEVICE), n_in))
        tiles, n_blk = -(-M // 8), a1.shape[1] // 32
        assert a12.shape == (tiles, n_blk, 32, 16) and sc.shape == (tiles, n_blk // 2, 4, 2, 4)
        pad = lambda t: torch.cat([t, t.new_zeros(8 * tiles - M, *t.shape[1:])])
        k = torch.arange(32)
        lane, at = (k // 8, k % 8) if run8 else ((k % 16) // 4, (k // 16) * 4 + k % 4)
        for tok in range(8 * tiles):
            tile, gg = divmod(tok, 8)
            for level, a in ((0, pad(a1)), (8, pad(a2))):
                got = a12[tile, :, 4 * gg + lane, level + at]           # [n_blk, 32]
                assert torch.equal(got, a[tok].view(n_blk, 32)), f"M={M} token {tok}"
            pair = sc[tile, :, gg // 2, gg % 2]                        # [n_blk / 2, 4]
            dx, s = pad(dxs)[tok].view(-1, 2), pad(s32)[tok].view(-1, 2).float()
            assert torch.equal(pair[:, :2], dx), f"M={M} token {tok}"
            assert torch.equal(pair[:, 2:], dx * s), f"M={M} token {tok}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("qt", sorted(cuda.RUNGS["cuda_mm"].types) if cuda else [],
                         ids=lambda v: v.name)
def test_cuda_cpp_tensor_core_matmul(qt, dtype):
    """mv.cu's 1..16-row int8 tensor-core kernels, their output in float32: within
    1e-4 of float64 of the half x as given, and within 1e-5 of ``_i8_dot`` on the
    same quantized activation (run 8 rows at a time). Token counts on both sides
    of the 8-token tile, row counts that leave a warp's 16 rows partly idle, K
    split across a block's warps (and warps with no super-block), Q6_K rows of an
    odd number of 210-byte blocks (2-byte aligned words), 32-column rows that end
    inside a 256-column tile, and a zero activation block are included."""
    if not cuda.RUNGS["cuda_mm"].built():
        pytest.skip(f"the CUDA C++ kernels are not built: {cuda.compiled.reason()}")
    launch = cuda.RUNGS["cuda_mm"].launch[qt]
    shapes = [(37, 512), (300, 2816), (4101, 1280), (513, 6656), (6150, 512)]   # the last:
    # past MM_32_ROWS_FROM, where the default takes 32 rows a warp for Q4_K / Q5_K
    for n_out, n_in in shapes + ([(29, 544), (70, 96)] if qt.block_elems == 32 else []):
        c = Case(qt, n_out, n_in)
        for tokens in (1, 2, 7, 8, 9, 16):
            x = c.randn(tokens, n_in, dtype=dtype)
            x[:, 32:64] = 0
            y = cuda._cuda_mm(x.to(DEVICE), c.packed, qt, n_out, n_in, None, None, launch,
                              out_dtype=torch.float32)
            assert y.shape == (tokens, n_out) and y.dtype == torch.float32
            assert _rel(y, x.double() @ c.w64.T) < 1e-4, f"{c} tokens={tokens}"
            if qt in cuda.MM_RUNS_OF_8:                      # 32 rows a warp: the same dots (its K
                y32 = cuda._cuda_mm(x.to(DEVICE), c.packed, qt, n_out, n_in, None, None,   # split may differ)
                                    cuda.Launch(32, 8, 0), out_dtype=torch.float32)
                assert _rel(y32, y.double().cpu()) < 1e-6, f"{c} tokens={tokens} rows a warp 32"
            i8 = torch.cat([cuda._i8_dot(x[i:i + 8].to(DEVICE), c.packed, qt, n_out, n_in, None,
                                         None, cuda.Launch(32, 4, 1), out_dtype=torch.float32)
                            for i in range(0, tokens, 8)])
            assert _rel(y, i8.double().cpu()) < 1e-5, f"{c} tokens={tokens}"
            if tokens > 1:
                half = cuda.qmatmul(x.to(DEVICE), *c.args)
                assert cuda.rung_for(qt, tokens, dtype).name == "cuda_mm"
                assert torch.equal(half.cpu(), y.cpu().to(dtype)), f"{c} tokens={tokens}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("qt", TYPES, ids=lambda v: v.name)
def test_qmatmul_half_activations(qt, dtype):
    c = Case(qt, 96, 768)
    for lead in [(1,), (1, 1), (2,), (2, 3), (40,), (2, 100), (2, 150)]:
        m = int(np.prod(lead))
        if INTERPRET and dtype == torch.bfloat16 and cuda.rung_for(qt, m).name.startswith("qmm"):
            # Triton 3.9's interpreter multiplies bfloat16 tl.dot operands as their
            # raw uint16 storage (runtime/interpreter.py, create_dot): only a GPU
            # can check the tensor-core rungs with bfloat16 activations.
            continue
        x = c.randn(*lead, c.n_in, dtype=dtype)
        y = cuda.qmatmul(x.to(DEVICE), *c.args)
        assert y.shape == (*lead, c.n_out) and y.dtype == dtype
        err = _rel(y, x.double() @ c.w64.T)
        assert err < 1e-2, f"{c} lead={lead} rel err {err:.3g}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("qt", [GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q5_0, GGMLType.IQ3_S],
                         ids=lambda v: v.name)
def test_dense_rung_is_the_decoded_weight_times_x(qt, dtype, monkeypatch):
    """From DENSE_FROM half rows: gguf's dequantize of the weight, rounded to x's
    dtype, times x by the same ``torch.mm``, bit for bit; a weight past
    DENSE_MAX_BYTES runs qmm_wide's tiles instead, also bit for bit."""
    if INTERPRET and dtype == torch.bfloat16:
        pytest.skip("Triton 3.6's interpreter truncates float32 to bfloat16 (a GPU rounds to "
                    "nearest, as asked): only a GPU can check the bfloat16 copy")
    c = Case(qt, 70, 512)
    x = c.randn(cuda.DENSE_FROM + 3, c.n_in, dtype=dtype).to(DEVICE)
    assert cuda.rung_for(qt, x.shape[0], dtype).name == "dense"
    w = gguf_dequantize(c.weight).to(DEVICE).to(dtype)
    y = cuda.qmatmul(x, *c.args)
    assert y.dtype == dtype and torch.equal(y, torch.mm(x, w.t())), str(c)
    monkeypatch.setattr(cuda, "DENSE_MAX_BYTES", c.n_out * c.n_in * x.element_size() - 1)
    tiles = cuda.run_rung("qmm_wide", x, c.packed, qt, c.n_out, c.n_in)
    assert torch.equal(cuda.qmatmul(x, *c.args), tiles), str(c)


def test_qmatmul_strided_and_empty():
    c = Case(GGMLType.Q4_K, 40, 512)
    big = c.randn(6, 2 * c.n_in)
    x = big[:, ::2]                                   # non-contiguous rows
    y = cuda.qmatmul(x.to(DEVICE)[:, :], *c.args)
    assert _rel_abs(y, x, c.w64) < 1e-6, str(c)
    for m in (2, 3):         # the token-axis kernel, then tensor cores with float32 products
        ym = cuda.qmatmul(x[:m].to(DEVICE), *c.args)
        assert _rel(ym, x[:m].double() @ c.w64.T) < 1e-5, f"{c} tokens={m}"
    x1 = big[:1, ::2]
    y1 = cuda.qmatmul(x1.to(DEVICE), *c.args)
    assert _rel(y1, x1.double() @ c.w64.T) < 1e-5, str(c)
    e = cuda.qmatmul(torch.empty(0, 3, c.n_in, device=DEVICE), *c.args)
    assert e.shape == (0, 3, c.n_out)


@pytest.mark.parametrize("qt", [t for t in GGMLType if cuda and t not in cuda.SUPPORTED],
                         ids=lambda v: v.name)
def test_unsupported_type_refused(qt):
    """A type outside SUPPORTED is refused by name, never decoded as another."""
    w = random_weight(qt, 4, 64).to(DEVICE)
    x = torch.randn(1, 64, device=DEVICE)
    qmm, deq = (checks.KERNELS[(op, "cuda")] for op in ("qmatmul", "dequantize"))
    for call in (lambda: qmm(x, *w.op_args()), lambda: deq(*w.op_args())):
        with pytest.raises(ValueError, match=f"{qt.name} has no CUDA kernel"):
            call()


# ---- through the dispatcher (needs muser_torch.ops and a real GPU) ------------------

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _ops():
    import muser_torch.ops  # noqa: F401  (defines torch.ops.muser, registers CUDA kernels)
    cuda.register()
    return torch.ops.muser


@needs_gpu
@pytest.mark.parametrize("qt", TYPES, ids=lambda v: v.name)
def test_opcheck(qt):
    ops = _ops()
    c = Case(qt, 64, 512)
    ids = torch.randint(0, c.n_out, (2, 3), generator=c.gen).cuda()
    for tokens in (1, 4, 20):
        x = c.randn(tokens, c.n_in).cuda()
        torch.library.opcheck(ops.qmatmul.default, (x, *c.args),
                              test_utils=("test_schema", "test_faketensor",
                                          "test_aot_dispatch_dynamic"))
    torch.library.opcheck(ops.dequantize.default, c.args)
    torch.library.opcheck(ops.embedding.default, (ids, *c.args))


@needs_gpu
def test_dispatch_matches_cuda_module():
    ops = _ops()
    c = Case(GGMLType.Q5_K, 200, 1024)
    x = c.randn(1, c.n_in)
    y = ops.qmatmul(x.cuda(), *c.args)
    assert y.is_cuda and _rel(y, x.double() @ c.w64.T) < 1e-5, str(c)


@needs_gpu
def test_compile_glimmer_decode_step():
    """torch.compile(fullgraph=True) of one Glimmer decode step on the GPU."""
    _ops()
    try:
        from muser_torch.glimmer import Glimmer, GlimmerConfig
    except ImportError as e:
        pytest.skip(f"muser_torch.glimmer not available: {e}")
    config = GlimmerConfig(context_length=128, hidden=512, ffn=1024, n_layers=4, n_heads=4,
                           n_kv_heads=2, head_dim=128, rms_eps=1e-6, sliding_window=16,
                           sliding_window_pattern=4, rope_base=10000.0, vocab_size=1000)
    seed = fresh_seed()
    model = Glimmer.random(config, device="cuda", dtype=torch.float16, seed=seed)
    model.setup_cache(1, 64)
    slots = torch.zeros(1, dtype=torch.long, device="cuda")
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, config.vocab_size, (1, 20), generator=gen).cuda()
    tok = torch.randint(0, config.vocab_size, (1, 1), generator=gen).cuda()
    step = torch.compile(model.forward, fullgraph=True)
    with torch.no_grad():
        model(prompt, slots)                              # prefill (tiled kernels)
        ref = model(tok, slots).float()                   # eager decode step
        model.lengths -= 1                                # rewind; the step rewrites the same entry
        out = step(tok, slots).float()
    assert torch.isfinite(ref).all(), f"seed={seed}"
    err = ((out - ref).norm() / ref.norm()).item()
    assert err < 5e-3, f"seed={seed} compiled vs eager rel err {err:.3g}"
