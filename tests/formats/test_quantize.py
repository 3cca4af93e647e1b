"""quantize: byte-identical to ggml's own quantizers (through ctypes), the
NVFP4 decode tables against torch and gguf, error bounds per type, and clear
errors for bad input. Every random input draws a fresh seed, named in the
failure message."""
from __future__ import annotations

import random

import gguf
import numpy as np
import pytest
import torch

from muser_torch import GGMLType, dequantize, quantize
from muser_torch.formats import can_quantize
from muser_torch.formats.nvfp4 import E2M1_VALUES, e2m1_table, ue4m3_bytes
from muser_torch.formats.types import NEEDS_COMPANIONS
from muser_torch.formats.floats import e4m3fn_table

from .ggml_ref import lib, quantize_chunk

LEGACY = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0]
KQUANTS = [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q2_K, GGMLType.Q3_K]
LOOKUP = [GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.MXFP4]


def edge_rows(n_in: int, g: torch.Generator) -> torch.Tensor:
    """The rows where quantizers tend to slip: zeros (and negative zeros,
    which hypothesis caught us encoding as d = +0 where ggml has -0), a
    constant, one outlier, all negative, and tiny / huge magnitudes."""
    def randn() -> torch.Tensor:
        return torch.randn(n_in, generator=g)
    outlier = randn() * 0.01
    at = int(torch.randint(0, n_in, (1,), generator=g))
    outlier[at] = 40.0 * (1 + float(torch.rand(1, generator=g)))
    constant = torch.full((n_in,), float(torch.randn(1, generator=g)) * 3)
    return torch.stack([torch.zeros(n_in), torch.full((n_in,), -0.0), constant, outlier,
                        -randn().abs() - 0.1, randn() * 1e-8, randn() * 1e4])


def random_matrix(qtype: GGMLType, g: torch.Generator) -> torch.Tensor:
    """Random rows of varied scale and offset, then the edge rows."""
    unit = 256 if qtype.block_elems == 256 else qtype.block_elems * 3
    n_in = unit * int(torch.randint(1, 4, (1,), generator=g))
    rows = int(torch.randint(48, 96, (1,), generator=g))
    x = torch.randn(rows, n_in, generator=g) * torch.rand(rows, 1, generator=g) * 4
    x[: rows // 3] += torch.randn(rows // 3, 1, generator=g)          # some rows off-centre
    x[-4:] *= 10.0 ** torch.empty(4, 1).uniform_(-6, 6, generator=g)  # far from unit scale
    return torch.cat((x, edge_rows(n_in, g)))


def assert_same_bytes(ours: torch.Tensor, ref: torch.Tensor, qtype: GGMLType, what: str) -> None:
    assert ours.dtype == torch.uint8 and ours.shape == ref.shape, (
        f"{what}: got {ours.dtype} {tuple(ours.shape)}, ggml {tuple(ref.shape)}")
    diff = (ours != ref).view(ours.shape[0], -1, qtype.block_bytes).any(-1)
    if bool(diff.any()):
        r, b = (int(i) for i in diff.nonzero()[0])
        blk = slice(b * qtype.block_bytes, (b + 1) * qtype.block_bytes)
        pytest.fail(f"{what}: {int(diff.sum())} blocks differ; first row {r} block {b}:\n"
                    f"  ours {ours[r, blk].tolist()}\n  ggml {ref[r, blk].tolist()}")


@pytest.mark.parametrize("weighted", [False, True], ids=["ref", "imatrix"])
@pytest.mark.parametrize("qtype", LEGACY + KQUANTS + LOOKUP, ids=lambda t: t.name)
def test_byte_identical_to_ggml(qtype: GGMLType, weighted: bool) -> None:
    lib()
    seed = random.randrange(1 << 32)
    g = torch.Generator().manual_seed(seed)
    x = random_matrix(qtype, g)
    imatrix = None
    if weighted:
        magnitude = 10.0 ** float(torch.empty(()).uniform_(-2, 2, generator=g))
        imatrix = torch.rand(x.shape[1], generator=g) * magnitude
        imatrix[torch.rand(x.shape[1], generator=g) < 0.05] = 0.0      # unused inputs
    assert_same_bytes(quantize(x, qtype, imatrix=imatrix), quantize_chunk(x, qtype, imatrix),
                      qtype, f"{qtype.name} {'imatrix' if weighted else 'ref'} seed {seed}")


def test_k_quant_bytes_do_not_depend_on_threads() -> None:
    """Chunks run in parallel Python threads; the bytes must not change."""
    seed = random.randrange(1 << 32)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 256 * 1100, generator=g)        # several chunks of super-blocks
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = quantize(x, GGMLType.Q4_K)
        torch.set_num_threads(2)
        two = quantize(x, GGMLType.Q4_K)
    finally:
        torch.set_num_threads(before)
    assert torch.get_num_threads() == before
    assert torch.equal(one, two), f"seed {seed}"


@pytest.mark.parametrize("qtype", [GGMLType.F16, GGMLType.BF16, GGMLType.NVFP4], ids=lambda t: t.name)
def test_float_and_nvfp4_byte_identical_to_ggml(qtype: GGMLType) -> None:
    lib()
    seed = random.randrange(1 << 32)
    g = torch.Generator().manual_seed(seed)
    n_in = 64 * int(torch.randint(1, 6, (1,), generator=g))
    x = torch.cat((torch.randn(12, n_in, generator=g) * torch.rand(12, 1, generator=g) * 8,
                   edge_rows(n_in, g)))
    assert_same_bytes(quantize(x, qtype), quantize_chunk(x, qtype), qtype, f"{qtype.name} seed {seed}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("weighted", [False, True], ids=["ref", "imatrix"])
@pytest.mark.parametrize("qtype", LEGACY + KQUANTS + LOOKUP + [GGMLType.F16, GGMLType.BF16, GGMLType.NVFP4,
                                                               GGMLType.NVFP4_E2M1],
                         ids=lambda t: t.name)
def test_quantize_on_cuda_gives_the_cpu_bytes(qtype: GGMLType, weighted: bool) -> None:
    """The same vectorized torch on the GPU: the same bytes as on the CPU
    (which are ggml's), companions included. (MPS is not checked: Metal has
    no float64 for the correctly rounded square root.)"""
    seed = random.randrange(1 << 32)
    g = torch.Generator().manual_seed(seed)
    x = random_matrix(qtype, g)
    imatrix = torch.rand(x.shape[1], generator=g) if weighted else None
    cpu_out = quantize(x, qtype, imatrix=imatrix)
    gpu_out = quantize(x.cuda(), qtype, imatrix=None if imatrix is None else imatrix.cuda())
    for ours, want in zip(*(o if isinstance(o, tuple) else (o,) for o in (gpu_out, cpu_out))):
        assert ours.device.type == "cuda"
        assert torch.equal(ours.cpu(), want), f"{qtype.name} seed {seed}"


# Worst relative RMSE (per row, against the row's RMS) measured over many
# seeds of the rows below, plus about 15% margin: a slip in a scale search or
# a rounding rule shows up as an error above these.
RMSE_BOUND = {
    GGMLType.Q4_0: 0.105, GGMLType.Q4_1: 0.095, GGMLType.Q5_0: 0.053, GGMLType.Q5_1: 0.047,
    GGMLType.Q8_0: 0.0066, GGMLType.Q4_K: 0.088, GGMLType.Q5_K: 0.045, GGMLType.Q6_K: 0.022,
    GGMLType.F16: 2.7e-4, GGMLType.BF16: 2.1e-3, GGMLType.NVFP4: 0.12, GGMLType.NVFP4_E2M1: 0.12,
    GGMLType.Q2_K: 0.39, GGMLType.Q3_K: 0.195,     # 0.338, 0.169 worst over 40 seeds
    GGMLType.IQ4_NL: 0.099, GGMLType.IQ4_XS: 0.1, GGMLType.MXFP4: 0.15,
}


def round_trip(x: torch.Tensor, qtype: GGMLType, imatrix=None) -> torch.Tensor:
    out = quantize(x, qtype, imatrix=imatrix)
    if qtype == GGMLType.NVFP4_E2M1:
        payload, scales, scale_2 = out
        return dequantize(payload, qtype, x.shape[1], scales=scales, scale_2=scale_2)
    return dequantize(out, qtype, x.shape[1])


@pytest.mark.parametrize("qtype", list(RMSE_BOUND), ids=lambda t: t.name)
def test_quantization_error_bound(qtype: GGMLType) -> None:
    seed = random.randrange(1 << 32)
    g = torch.Generator().manual_seed(seed)
    # Rows of RMS 0.25 .. 5: NVFP4 (type 40) has no tensor scale, and its
    # UE4M3 group scales flush groups below about 0.005 to zero.
    x = torch.randn(24, 512, generator=g) * (0.25 + torch.rand(24, 1, generator=g) * 5)
    x[:8] = torch.rand(8, 512, generator=g) * 3 - 0.5                  # uniform, off-centre
    imatrix = None if qtype == GGMLType.NVFP4_E2M1 else torch.rand(512, generator=g) + 0.1
    for im in (None, imatrix) if imatrix is not None else (None,):
        y = round_trip(x, qtype, im)
        rel = ((y - x).pow(2).mean(1).sqrt() / x.pow(2).mean(1).sqrt()).max().item()
        assert rel < RMSE_BOUND[qtype], (
            f"{qtype.name} {'imatrix' if im is not None else 'ref'} seed {seed}: "
            f"relative RMSE {rel:.4g} above {RMSE_BOUND[qtype]}")


# ---- NVFP4 ---------------------------------------------------------------------

def test_e4m3fn_table_against_torch_and_formula() -> None:
    """Every byte: the table equals torch.float8_e4m3fn and a float64 formula."""
    table = e4m3fn_table()
    via_torch = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)
    formula = []
    for b in range(256):
        sign, exp, man = -1.0 if b & 0x80 else 1.0, (b >> 3) & 0xF, b & 7
        if exp == 15 and man == 7:
            formula.append(float("nan"))
        elif exp == 0:
            formula.append(sign * man * 2.0 ** -9)
        else:
            formula.append(sign * (1 + man / 8) * 2.0 ** (exp - 7))
    formula = torch.tensor(formula, dtype=torch.float64)
    for ref in (via_torch.double(), formula):
        assert torch.equal(table.isnan(), ref.isnan())
        assert torch.equal(table.double().nan_to_num(0.0), ref.nan_to_num(0.0))


def test_e2m1_table_against_gguf_nvfp4() -> None:
    """gguf decodes each of the 16 codes under a unit scale (UE4M3 0x38 = 1.0)
    to our E2M1 value (its code 8 is +0 where ours is -0: equal values)."""
    codes = np.arange(16, dtype=np.uint8)
    qs = codes[:8] | (codes[8:] << 4)                  # sub-block 0: elements 0..15
    block = np.zeros((1, 36), dtype=np.uint8)
    block[0, :4] = 0x38
    block[0, 4:12] = qs
    ref = gguf.dequantize(block, gguf.GGMLQuantizationType.NVFP4).reshape(-1)[:16]
    assert ref.tolist() == list(E2M1_VALUES)
    assert e2m1_table().tolist() == list(E2M1_VALUES)


def test_ue4m3_encoder_against_gguf() -> None:
    seed = random.randrange(1 << 32)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(20000) * 10.0 ** rng.uniform(-5, 3.5, 20000)).astype(np.float32)
    x[:6] = [0.0, -1.0, 448.0, 1e9, 2.0 ** -9, 2.0 ** -10]
    ref = gguf.quants.NVFP4.fp32_to_ue4m3(x)
    ours = ue4m3_bytes(torch.from_numpy(x)).numpy()
    bad = np.flatnonzero(ours != ref)
    assert bad.size == 0, (f"seed {seed}: {bad.size} differ, first x={x[bad[0]]!r}: "
                           f"{ours[bad[0]]} vs gguf {ref[bad[0]]}")


def test_nvfp4_round_trip_matches_gguf_dequantize() -> None:
    seed = random.randrange(1 << 32)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(9, 192, generator=g) * 3
    packed = quantize(x, GGMLType.NVFP4)
    ref = gguf.dequantize(packed.numpy(), gguf.GGMLQuantizationType.NVFP4).reshape(9, 192)
    assert np.array_equal(dequantize(packed, GGMLType.NVFP4, 192).numpy(), ref), f"seed {seed}"


def test_nvfp4_e2m1_error_bound_and_layout() -> None:
    """|w - x| <= 0.1875 * amax(group) + 6 * 2**-10 * scale_2, rows spanning
    1e-6 .. 1e4 (so small groups reach E4M3's subnormal scales)."""
    seed = random.randrange(1 << 32)
    g = torch.Generator().manual_seed(seed)
    rows, n_in = 20, 160
    x = torch.randn(rows, n_in, generator=g) * torch.logspace(-6, 4, rows).view(-1, 1)
    x[0] = 0.0
    x[1, 7] = -x.abs().max() * 1.5                     # the tensor's largest |x|
    payload, scales, scale_2 = quantize(x, GGMLType.NVFP4_E2M1)
    assert payload.dtype == scales.dtype == torch.uint8
    assert payload.shape == (rows, n_in // 2) and scales.shape == (rows, n_in // 16)
    assert scale_2.dtype == torch.float32 and scale_2.dim() == 0
    assert scale_2.item() == pytest.approx(-x[1, 7].item() / (6 * 448), rel=1e-6)
    assert not scales.view(torch.float8_e4m3fn).float().isnan().any()
    w = dequantize(payload, GGMLType.NVFP4_E2M1, n_in, scales=scales, scale_2=scale_2)
    amax = x.view(rows, -1, 16).abs().amax(-1, keepdim=True)
    bound = 0.1875 * amax + 6 * 2.0 ** -10 * scale_2
    excess = ((w - x).view(rows, -1, 16).abs() - bound).max().item()
    assert excess <= 0, f"seed {seed}: error exceeds the bound by {excess}"
    assert torch.equal(w[0], torch.zeros(n_in))
    # element 2i is the low nibble: the outlier at column 7 is the high nibble of byte 3
    assert payload[1, 3].item() >> 4 == 8 + 7          # -6 * scale: sign bit + code 7
    zero = quantize(torch.zeros(2, 32), GGMLType.NVFP4_E2M1)
    assert not any(t.any() for t in zero)


# ---- bad input -----------------------------------------------------------------

@pytest.mark.parametrize("make, qtype, message", [
    (lambda: torch.tensor([[1.0, float("nan")] * 16]), GGMLType.Q4_0, "NaN or inf"),
    (lambda: torch.tensor([[1.0, float("inf")] * 128]), GGMLType.Q4_K, "NaN or inf"),
    (lambda: torch.ones(2, 100), GGMLType.Q4_K, "n_in=100"),
    (lambda: torch.ones(2, 48), GGMLType.Q8_0, "n_in=48"),
    (lambda: torch.ones(2, 8), GGMLType.NVFP4_E2M1, "n_in=8"),
    (lambda: torch.ones(2, 32), 77, "unknown GGML type id 77"),
    (lambda: torch.ones(2, 32), "Q9_Z", "unknown GGML type name"),
    (lambda: torch.ones(2, 32, dtype=torch.int32), GGMLType.Q8_0, "float32, float16 or bfloat16"),
    (lambda: torch.ones(64), GGMLType.Q8_0, "2-D"),
    (lambda: np.ones((2, 32), dtype=np.float32), GGMLType.Q8_0, "torch.Tensor"),
], ids=["nan", "inf", "n_in-kquant", "n_in-legacy", "n_in-nvfp4", "type-id", "type-name",
        "dtype", "dims", "not-tensor"])
def test_bad_input_names_the_problem(make, qtype, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        quantize(make(), qtype)


@pytest.mark.parametrize("imatrix, message", [
    (torch.ones(31), r"imatrix must be a tensor of shape \(256,\)"),
    (-torch.ones(256), "non-negative"),
    (torch.full((256,), float("nan")), "finite"),
])
def test_bad_imatrix(imatrix, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        quantize(torch.ones(2, 256), GGMLType.Q4_K, imatrix=imatrix)


@pytest.mark.parametrize("qtype", [t for t in GGMLType if can_quantize(t) or t in NEEDS_COMPANIONS],
                         ids=lambda t: t.name)
def test_zero_rows_round_trip(qtype: GGMLType) -> None:
    """A matrix with no rows quantizes to no rows and dequantizes back to [0, n_in]."""
    n_in = max(qtype.block_elems, 16) * 2
    out = quantize(torch.zeros(0, n_in), qtype)
    packed, scales, scale_2 = out if isinstance(out, tuple) else (out, None, None)
    assert packed.dtype == torch.uint8 and packed.shape == (0, qtype.row_bytes(n_in))
    back = dequantize(packed, qtype, n_in, scales=scales, scale_2=scale_2)
    assert back.dtype == torch.float32 and back.shape == (0, n_in)


@pytest.mark.parametrize("qtype", [t for t in GGMLType if not (can_quantize(t) or t in NEEDS_COMPANIONS)],
                         ids=lambda t: t.name)
def test_types_without_a_quantizer_are_refused(qtype: GGMLType) -> None:
    """Decode-only types (IQ3_XXS, IQ3_S: llama-quantize makes their files)."""
    with pytest.raises(ValueError, match=f"quantize to {qtype.name} is not supported"):
        quantize(torch.ones(2, 256), qtype)


@pytest.mark.parametrize("qtype", [12.0, 12.5, True])
def test_type_id_must_be_an_int(qtype) -> None:
    with pytest.raises(ValueError, match="unknown GGML type id"):
        quantize(torch.ones(2, 256), qtype)


def test_mxfp4_scale_exponent_at_binade_edges_and_subnormals() -> None:
    """MXFP4's E8M0 exponent is floor(log2(amax)) - 2 + 127: blocks whose
    largest magnitude sits on, just under and just over powers of two from
    2**-140 (a negative exponent, wrapped as x86 converts it) to 2**127."""
    lib()
    seed = random.randrange(1 << 32)
    g = torch.Generator().manual_seed(seed)
    rows = []
    for k in range(-140, 128):
        for m in (1.0, 1 - 2.0 ** -24, 1 + 2.0 ** -23, 0.75):
            a = float(np.float32(2.0 ** k) * np.float32(m))
            if a == 0 or not np.isfinite(a):
                continue
            sign = torch.randint(0, 2, (32,), generator=g) * 2 - 1
            r = torch.rand(32, generator=g) * a * sign
            r[int(torch.randint(0, 32, (1,), generator=g))] = -a if k % 2 else a
            rows.append(r)
    x = torch.stack(rows)
    assert_same_bytes(quantize(x, GGMLType.MXFP4), quantize_chunk(x, GGMLType.MXFP4),
                      GGMLType.MXFP4, f"MXFP4 binade edges seed {seed}")
