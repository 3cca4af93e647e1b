"""qmatmul / qmatmul_t / dequantize / embedding on CPU, both paths (native C
and pure torch), against the float64 reference built from
muser_torch.dequantize (bit-exact with gguf)."""
from __future__ import annotations

import pytest
import torch

import muser_torch.ops as ops
from muser_torch.formats import dequantize_reference as ref_dequantize
from muser_torch.formats.types import GGMLType
from muser_torch.ops import cpu

from .conftest import ALL_TYPES, NATIVE_TYPES, Case, rel_err

# Every CPU rung: the fused kernel up to cpu.FUSED_MAX_TOKENS (8), the
# gemm above (token panels, a narrow last panel at 65 and 200, full ones at 128).
TOKENS = [1, 2, 3, 4, 8, 9, 16, 17, 64, 65, 128, 200]
# n_out not a multiple of 2, 4, 8 or 32.
N_OUT = 67


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_qmatmul_float32_matches_float64(qtype, tokens, cpu_path):
    case = Case(qtype, N_OUT, blocks=3 if qtype.block_elems >= 256 else 2)
    # non-contiguous x with two leading batch dims: every other column of a wider tensor
    wide = case.randn(tokens, 2, case.n_in * 2)
    x = wide[..., ::2].transpose(0, 1)
    assert not x.is_contiguous()
    y = ops.qmatmul(x, *case.args)
    ref = x.double() @ case.weight64().T
    assert y.dtype == torch.float32 and y.shape == (2, tokens, N_OUT), f"{case}: {y.shape}"
    err = rel_err(y, ref)
    assert err < 1e-5, f"{case} tokens={tokens} ({cpu_path}): relative error {err:.3g}"


@pytest.mark.parametrize("dtype,bound", [(torch.float16, 1e-3), (torch.bfloat16, 8e-3)])
@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
                                   GGMLType.NVFP4_E2M1], ids=lambda t: t.name)
@pytest.mark.parametrize("tokens", [1, 5, 33])
def test_qmatmul_half_activations(qtype, dtype, bound, tokens, cpu_path):
    """Output in x's dtype; the only extra error is rounding the output."""
    case = Case(qtype, N_OUT, blocks=2)
    x = case.randn(tokens, case.n_in, dtype=dtype)
    y = ops.qmatmul(x, *case.args)
    assert y.dtype == dtype, f"{case}: output {y.dtype}"
    err = rel_err(y, x.double() @ case.weight64().T)
    assert err < bound, f"{case} {dtype} ({cpu_path}): relative error {err:.3g}"


@pytest.mark.parametrize("tokens", [1, 17, 65])
def test_qmatmul_many_tiles(tokens, cpu_path, monkeypatch):
    """A tile of a few rows forces many tiles with a partial last one."""
    monkeypatch.setattr(cpu, "TILE_BYTES", 5 * 4 * 512)
    for qtype in (GGMLType.Q4_K, GGMLType.NVFP4_E2M1, GGMLType.F16):
        case = Case(qtype, 53, blocks=2)
        x = case.randn(tokens, case.n_in)
        err = rel_err(ops.qmatmul(x, *case.args), x.double() @ case.weight64().T)
        assert err < 1e-5, f"{case} tokens={tokens} ({cpu_path}): relative error {err:.3g}"
        dq = ops.dequantize(*case.args)
        assert torch.equal(dq.double(), case.weight64()), f"{case}: tiled dequantize differs"


@pytest.mark.parametrize("qtype", NATIVE_TYPES, ids=lambda t: t.name)
def test_qmatmul_gemm_edges(qtype, cpu_path):
    """The gemm rung at a real width (6656 = 26 decode chunks, or a partial last
    chunk for the small blocks), n_out not a multiple of its row group, and
    token counts whose last panel is narrow, padded or full."""
    n_in = 6656 if qtype.block_elems >= 256 else 6656 + 2 * qtype.block_elems
    case = Case(qtype, 29, blocks=n_in // max(qtype.block_elems, 16))
    for tokens in (cpu.FUSED_MAX_TOKENS + 1, 90, 97):
        x = case.randn(tokens, case.n_in)
        err = rel_err(ops.qmatmul(x, *case.args), x.double() @ case.weight64().T)
        assert err < 1e-5, f"{case} tokens={tokens} ({cpu_path}): relative error {err:.3g}"


def test_qmatmul_seed_shape_single_token(cpu_path):
    """One row of a real shape (attn_k: 6656 -> 256) through the decode path."""
    case = Case(GGMLType.Q4_K, 256, blocks=26)
    x = case.randn(1, case.n_in)
    err = rel_err(ops.qmatmul(x, *case.args), x.double() @ case.weight64().T)
    assert err < 1e-5, f"{case} ({cpu_path}): relative error {err:.3g}"


def test_qmatmul_no_tokens():
    case = Case(GGMLType.Q4_K, 5, blocks=1)
    y = ops.qmatmul(torch.empty(0, 3, case.n_in), *case.args)
    assert y.shape == (0, 3, 5)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_dequantize_bit_exact(qtype, cpu_path):
    case = Case(qtype, N_OUT, blocks=2)
    out = ops.dequantize(*case.args)
    ref = ref_dequantize(case.packed, qtype, case.n_in, scales=case.scales, scale_2=case.scale_2)
    assert out.dtype == torch.float32 and out.shape == (N_OUT, case.n_in)
    same = out.view(torch.int32) == ref.view(torch.int32)
    if not bool(same.all()):
        r, c = (~same).nonzero()[0].tolist()
        pytest.fail(f"{case} ({cpu_path}): {(~same).sum()} values differ; first at row {r} "
                    f"col {c}: {out[r, c].item()!r} vs {ref[r, c].item()!r}")


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_embedding_rows(qtype, cpu_path):
    case = Case(qtype, N_OUT, blocks=2)
    ids = torch.randint(0, N_OUT, (3, 5), generator=case.gen)
    ids[0, 0] = ids[2, 4] = N_OUT - 1      # repeats and the last row
    out = ops.embedding(ids.to(torch.int32), *case.args)
    ref = case.weight64()[ids]
    assert out.dtype == torch.float32 and out.shape == (3, 5, case.n_in)
    assert torch.equal(out.double(), ref), f"{case} ({cpu_path}): rows differ"


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.NVFP4_E2M1,
                                   GGMLType.Q8_0, GGMLType.IQ3_XXS, GGMLType.IQ3_S],
                         ids=lambda t: t.name)
def test_qmatmul_t(qtype, cpu_path):
    case = Case(qtype, N_OUT, blocks=2)
    g = case.randn(2, 9, N_OUT)
    out = ops.qmatmul_t(g, *case.args)
    err = rel_err(out, g.double() @ case.weight64())
    assert out.shape == (2, 9, case.n_in) and err < 1e-5, f"{case} ({cpu_path}): {err:.3g}"
