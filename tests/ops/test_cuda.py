"""CUDA (Triton) kernels against the CPU reference. Skipped without CUDA + Triton.

The reference is ``muser_torch.formats.dequantize`` (bit-exact to gguf) on the
CPU, then a float64 matmul. Random data is drawn fresh each run; the seed is
in every assertion message.
"""
from __future__ import annotations

import os
import random

import pytest
import torch

from muser_torch.formats import dequantize_reference as ref_dequantize
from muser_torch.formats.types import GGMLType

try:
    import triton  # noqa: F401
    HAVE_TRITON = True
except ImportError:
    HAVE_TRITON = False

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not HAVE_TRITON or not (torch.cuda.is_available() or INTERPRET),
                                reason="needs CUDA and Triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

TYPES = [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.NVFP4_E2M1,
         GGMLType.Q8_0, GGMLType.F16]
# The ladder: 1 (matvec), 2..8 and 16 (one weight pass), large (tiled).
LADDER = [1, 2, 3, 4, 5, 8, 16, 33] if INTERPRET else [1, 2, 3, 4, 5, 6, 7, 8, 16, 17, 64, 200]
# (n_out, n_in): awkward row counts, single- and multi-block rows.
KQ_SHAPES = [(1, 256), (37, 512), (300, 768)] if INTERPRET else \
    [(1, 256), (37, 512), (300, 768), (1000, 2816), (4096, 6656), (256, 6656)]
SMALL_SHAPES = [(1, 32), (37, 96), (300, 800)] if INTERPRET else \
    [(1, 32), (37, 96), (300, 800), (1000, 2592), (256, 6656)]
ALL_SHAPES = [(t, s) for t in TYPES for s in (KQ_SHAPES if t in
              (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K) else SMALL_SHAPES)]


def _f16_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).contiguous().view(torch.uint8).reshape(*x.shape, 2)


def random_packed(qt: GGMLType, n_out: int, n_in: int, gen: torch.Generator):
    """Random packed weights of a plausible magnitude: (packed, scales, scale_2) on the CPU.

    Every byte is random except the float headers, which are drawn in
    [1e-3, 1e-2] (random f16 bytes would give inf and NaN)."""
    if qt is GGMLType.F16:
        w = torch.randn(n_out, n_in, generator=gen) * 0.05
        return w.to(torch.float16).view(torch.uint8), None, None
    if qt is GGMLType.NVFP4_E2M1:
        payload = torch.randint(0, 256, (n_out, n_in // 2), generator=gen, dtype=torch.uint8)
        # E4M3FN scales of 2^-6 .. 2^2 (exponent field 1..9), no NaN
        e = torch.randint(1, 10, (n_out, n_in // 16), generator=gen)
        m = torch.randint(0, 8, (n_out, n_in // 16), generator=gen)
        scales = ((e << 3) | m).to(torch.uint8)
        scale_2 = torch.rand(1, generator=gen) * 0.01 + 1e-3
        return payload, scales, scale_2
    bb, be = qt.block_bytes, qt.block_elems
    blocks = torch.randint(0, 256, (n_out * (n_in // be), bb), generator=gen, dtype=torch.uint8)
    hdr = lambda k: _f16_bytes(torch.rand(blocks.shape[0], generator=gen) * 9e-3 + 1e-3)  # noqa: E731
    if qt in (GGMLType.Q4_K, GGMLType.Q5_K):
        blocks[:, 0:2] = hdr(0)
        blocks[:, 2:4] = hdr(1)
    elif qt is GGMLType.Q6_K:
        blocks[:, 208:210] = hdr(0)
    elif qt is GGMLType.Q8_0:
        blocks[:, 0:2] = hdr(0)
    return blocks.reshape(n_out, -1).contiguous(), None, None


def reference(packed, qt, n_in, scales, scale_2) -> torch.Tensor:
    return ref_dequantize(packed, qt, n_in, scales=scales, scale_2=scale_2)


def _to(dev, *ts):
    return [None if t is None else t.to(dev) for t in ts]


def _cuda_mod():
    from muser_torch.ops import cuda
    return cuda


def _seed() -> int:
    return random.SystemRandom().randrange(2 ** 31)


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double().cpu() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _rel_abs(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    """Error over the scale of the products, ||y - x W^T|| / || |x| |W|^T ||: the
    measure for rounded (tf32 / half) tiles, which a cancelling sum (a dot of a
    single 32-element block, say) cannot blow up."""
    x = x.double()
    return ((y.double().cpu() - x @ w.T).norm() / (x.abs() @ w.abs().T).norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("qt,shape", ALL_SHAPES, ids=lambda v: getattr(v, "name", str(v)))
def test_dequantize_bit_exact(qt, shape):
    cuda = _cuda_mod()
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    n_out, n_in = shape
    packed, scales, scale_2 = random_packed(qt, n_out, n_in, gen)
    ref = reference(packed, qt, n_in, scales, scale_2)
    p, s, s2 = _to(DEVICE, packed, scales, scale_2)
    out = cuda.dequantize(p, int(qt), n_out, n_in, s, s2).cpu()
    assert out.dtype == torch.float32 and out.shape == (n_out, n_in)
    assert torch.equal(out.view(torch.int32), ref.view(torch.int32)), f"seed={seed}"


@pytest.mark.parametrize("qt", [GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.F16, GGMLType.NVFP4_E2M1,
                                GGMLType.Q8_0, GGMLType.Q5_K], ids=lambda v: v.name)
def test_embedding_bit_exact(qt):
    cuda = _cuda_mod()
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    n_out, n_in = 53, 512
    packed, scales, scale_2 = random_packed(qt, n_out, n_in, gen)
    ref = reference(packed, qt, n_in, scales, scale_2)
    ids = torch.randint(0, n_out, (3, 7), generator=gen)
    p, s, s2, i = _to(DEVICE, packed, scales, scale_2, ids)
    out = cuda.embedding(i, p, int(qt), n_out, n_in, s, s2).cpu()
    assert out.shape == (3, 7, n_in)
    assert torch.equal(out.view(torch.int32), ref[ids].view(torch.int32)), f"seed={seed}"


def _tolerance(tokens: int, dtype: torch.dtype) -> float:
    if tokens == 1 and dtype == torch.float32:
        return 1e-5          # float32 FFMA matvec
    if dtype == torch.float32:
        return 2e-3          # tensor-core tiles: set for TF32; IEEE float32 products now (~3e-7)
    return 1e-2              # half / bfloat16 tiles and output


@pytest.mark.parametrize("qt,shape", ALL_SHAPES, ids=lambda v: getattr(v, "name", str(v)))
def test_qmatmul_ladder(qt, shape):
    """Every rung of the token ladder, float32 activations, against float64."""
    cuda = _cuda_mod()
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    n_out, n_in = shape
    packed, scales, scale_2 = random_packed(qt, n_out, n_in, gen)
    w = reference(packed, qt, n_in, scales, scale_2).double()
    p, s, s2 = _to(DEVICE, packed, scales, scale_2)
    for tokens in LADDER:
        x = torch.randn(tokens, n_in, generator=gen)
        ref = x.double() @ w.T
        y = cuda.qmatmul(x.to(DEVICE), p, int(qt), n_out, n_in, s, s2)
        assert y.shape == (tokens, n_out) and y.dtype == torch.float32
        fp32_path = tokens == 1 or (tokens <= cuda.MT_MAX and qt in (GGMLType.Q4_K, GGMLType.Q5_K))
        if fp32_path:   # 1e-5 of ||ref||; a sum that cancels (one output row) is held to
            err = min(_rel(y, ref), 10 * _rel_abs(y, x, w))   # 1e-6 of || |x| |W|^T || instead
            tol = 1e-5
        else:
            err, tol = _rel_abs(y, x, w), 2e-3
        assert err < tol, f"seed={seed} tokens={tokens} rel err {err:.3g}"


# the versions of ops/cuda.py's MV_VERSIONS (that module needs Triton to import)
@pytest.mark.parametrize("qt,version", [(q, v) for q in (GGMLType.Q4_K, GGMLType.Q5_K) for v in (3, 4)]
                         + [(GGMLType.Q6_K, v) for v in (2, 3)], ids=str)
def test_matvec_versions(qt, version):
    """Every one-token kernel version (the benchmark sweeps them), with a split K."""
    cuda = _cuda_mod()
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    for n_out, n_in in [(37, 512), (300, 1536)]:
        packed, _, _ = random_packed(qt, n_out, n_in, gen)
        w = reference(packed, qt, n_in, None, None).double()
        p = packed.to(DEVICE)
        for target, bn in [(1, 32), (10 ** 4, 64)]:
            x = torch.randn(n_in, generator=gen)
            y = cuda.matvec(x.to(DEVICE), p, qt, n_out, n_in, version=version, target=target, bn=bn)
            err = min(_rel(y, x.double() @ w.T), 10 * _rel_abs(y.reshape(1, -1), x.reshape(1, -1), w))
            assert err < 1e-5, f"seed={seed} shape={(n_out, n_in)} target={target} rel err {err:.3g}"


@pytest.mark.parametrize("qt", [GGMLType.Q4_K, GGMLType.Q5_K], ids=lambda v: v.name)
def test_token_axis_kernel(qt):
    """The 2..8-token CUDA-core kernel at every token count it supports, with a split K."""
    cuda = _cuda_mod()
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    n_out, n_in = 100, 1536
    packed, _, _ = random_packed(qt, n_out, n_in, gen)
    w = reference(packed, qt, n_in, None, None).double()
    p = packed.to(DEVICE)
    for tokens in (2, 3, 4):
        for target in (1, 10 ** 4):
            x = torch.randn(tokens, n_in, generator=gen)
            y = cuda.matmul_mt(x.to(DEVICE), p, qt, n_out, n_in, target=target)
            err = _rel(y, x.double() @ w.T)
            assert err < 1e-5, f"seed={seed} tokens={tokens} target={target} rel err {err:.3g}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("qt", [GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.NVFP4_E2M1],
                         ids=lambda v: v.name)
def test_qmatmul_half_activations(qt, dtype):
    cuda = _cuda_mod()
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    n_out, n_in = 96, 768
    packed, scales, scale_2 = random_packed(qt, n_out, n_in, gen)
    w = reference(packed, qt, n_in, scales, scale_2).double()
    p, s, s2 = _to(DEVICE, packed, scales, scale_2)
    for lead in [(1,), (1, 1), (4,), (2, 3), (40,)]:
        x = torch.randn(*lead, n_in, generator=gen).to(dtype)
        ref = x.double() @ w.T
        y = cuda.qmatmul(x.to(DEVICE), p, int(qt), n_out, n_in, s, s2)
        assert y.shape == (*lead, n_out) and y.dtype == dtype
        err = _rel(y, ref)
        assert err < 1e-2, f"seed={seed} lead={lead} rel err {err:.3g}"


def test_qmatmul_strided_and_empty():
    cuda = _cuda_mod()
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    qt, n_out, n_in = GGMLType.Q4_K, 40, 512
    packed, _, _ = random_packed(qt, n_out, n_in, gen)
    w = reference(packed, qt, n_in, None, None).double()
    p = packed.to(DEVICE)
    big = torch.randn(6, 2 * n_in, generator=gen)
    x = big[:, ::2]                                   # non-contiguous rows
    y = cuda.qmatmul(x.to(DEVICE)[:, :], p, int(qt), n_out, n_in)
    assert _rel_abs(y, x, w) < 2e-3, f"seed={seed}"
    for m in (2, 3):         # the token-axis kernel, then tensor cores with float32 products
        ym = cuda.qmatmul(x[:m].to(DEVICE), p, int(qt), n_out, n_in)
        assert _rel(ym, x[:m].double() @ w.T) < 1e-5, f"seed={seed} tokens={m}"
    x1 = big[:1, ::2]
    y1 = cuda.qmatmul(x1.to(DEVICE), p, int(qt), n_out, n_in)
    assert _rel(y1, x1.double() @ w.T) < 1e-5, f"seed={seed}"
    e = cuda.qmatmul(torch.empty(0, 3, n_in, device=DEVICE), p, int(qt), n_out, n_in)
    assert e.shape == (0, 3, n_out)


# ---- through the dispatcher (needs muser_torch.ops and a real GPU) ------------------

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _ops():
    import muser_torch.ops  # noqa: F401  (defines torch.ops.muser, registers CUDA kernels)
    if not hasattr(torch.ops.muser, "qmatmul"):
        pytest.skip("muser_torch.ops does not define the ops yet")
    _cuda_mod().register()
    return torch.ops.muser


@needs_gpu
@pytest.mark.parametrize("qt", [GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.NVFP4_E2M1, GGMLType.F16],
                         ids=lambda v: v.name)
def test_opcheck(qt):
    ops = _ops()
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    n_out, n_in = 64, 512
    packed, scales, scale_2 = _to("cuda", *random_packed(qt, n_out, n_in, gen))
    ids = torch.randint(0, n_out, (2, 3), generator=gen).cuda()
    for tokens in (1, 4, 20):
        x = torch.randn(tokens, n_in, generator=gen).cuda()
        torch.library.opcheck(ops.qmatmul.default, (x, packed, int(qt), n_out, n_in, scales, scale_2),
                              test_utils=("test_schema", "test_faketensor",
                                          "test_aot_dispatch_dynamic"))
    torch.library.opcheck(ops.dequantize.default, (packed, int(qt), n_out, n_in, scales, scale_2))
    torch.library.opcheck(ops.embedding.default, (ids, packed, int(qt), n_out, n_in, scales, scale_2))


@needs_gpu
def test_dispatch_matches_cuda_module():
    ops = _ops()
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    qt, n_out, n_in = GGMLType.Q5_K, 200, 1024
    packed, _, _ = random_packed(qt, n_out, n_in, gen)
    w = reference(packed, qt, n_in, None, None).double()
    x = torch.randn(1, n_in, generator=gen)
    y = ops.qmatmul(x.cuda(), packed.cuda(), int(qt), n_out, n_in)
    assert y.is_cuda and _rel(y, x.double() @ w.T) < 1e-5, f"seed={seed}"


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
    seed = _seed()
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
