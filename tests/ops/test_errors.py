"""Bad input raises ValueError naming the op, the argument and what was expected."""
from __future__ import annotations

import importlib.util

import pytest
import torch

import muser_torch.ops as ops
from muser_torch.ops import defaults
from muser_torch.formats.types import GGMLType

from .conftest import Case, ref_dequantize


@pytest.fixture
def q4k():
    return Case(GGMLType.Q4_K, 6, blocks=1)


@pytest.fixture
def nv():
    return Case(GGMLType.NVFP4_E2M1, 6, blocks=32)


def _raises(match, fn, *args):
    with pytest.raises(ValueError, match=match):
        fn(*args)


def test_x_dtype_shape_device(q4k):
    p, qt, n_out, n_in = q4k.packed, q4k.qtype, 6, 256
    _raises(r"muser\.qmatmul: x must be float32, float16 or bfloat16, got torch\.int64",
            ops.qmatmul, torch.zeros(2, n_in, dtype=torch.long), p, qt, n_out, n_in)
    _raises(r"muser\.qmatmul: x must have shape \[\.\.\., 256\], got \(2, 255\)",
            ops.qmatmul, torch.zeros(2, 255), p, qt, n_out, n_in)
    _raises(r"muser\.qmatmul: x must have shape", ops.qmatmul, torch.tensor(1.0), p, qt, n_out, n_in)
    _raises(r"muser\.qmatmul: x is on meta but packed is on cpu",
            ops.qmatmul, torch.zeros(2, n_in, device="meta"), p, qt, n_out, n_in)
    _raises(r"muser\.qmatmul_t: g must have shape \[\.\.\., 6\]",
            ops.qmatmul_t, torch.zeros(2, 5), p, qt, n_out, n_in)


def test_packed_and_sizes(q4k):
    x = torch.zeros(1, 256)
    _raises(r"muser\.qmatmul: packed must be uint8 bytes", ops.qmatmul, x,
            q4k.packed.view(torch.int8), GGMLType.Q4_K, 6, 256)
    _raises(r"muser\.qmatmul: packed: a Q4_K row of 512 elements is 288 bytes, got 144",
            ops.qmatmul, torch.zeros(1, 512), q4k.packed, GGMLType.Q4_K, 6, 512)
    _raises(r"muser\.qmatmul: packed: expected 7 rows, got 6", ops.qmatmul, x, q4k.packed,
            GGMLType.Q4_K, 7, 256)
    _raises(r"muser\.qmatmul: packed must be contiguous", ops.qmatmul, x,
            torch.zeros(144, 6, dtype=torch.uint8).t(), GGMLType.Q4_K, 6, 256)
    _raises(r"muser\.dequantize: Q4_K: n_in=100 is not a positive multiple of the block size 256",
            ops.dequantize, q4k.packed, GGMLType.Q4_K, 6, 100)
    _raises(r"muser\.dequantize: n_out must be a positive int, got 0", ops.dequantize,
            q4k.packed, GGMLType.Q4_K, 0, 256)
    _raises(r"muser\.qmatmul: qtype: unknown GGML type id 99", ops.qmatmul, x, q4k.packed, 99, 6, 256)
    _raises(r"muser\.dequantize: qtype: unknown GGML type name 'Q3_X'", ops.dequantize,
            q4k.packed, "Q3_X", 6, 256)


def test_companions(q4k, nv):
    x = torch.zeros(1, nv.n_in)
    _raises(r"muser\.qmatmul: NVFP4_E2M1 needs both companions", ops.qmatmul, x, nv.packed,
            nv.qtype, 6, nv.n_in)
    _raises(r"muser\.qmatmul: scales must have shape \(6, 32\)", ops.qmatmul, x, nv.packed,
            nv.qtype, 6, nv.n_in, nv.scales[:, :31].contiguous(), nv.scale_2)
    _raises(r"muser\.qmatmul: scale_2 must hold one value", ops.qmatmul, x, nv.packed,
            nv.qtype, 6, nv.n_in, nv.scales, torch.ones(2))
    _raises(r"muser\.qmatmul: scales must be E4M3FN bytes", ops.qmatmul, x, nv.packed,
            nv.qtype, 6, nv.n_in, nv.scales.float(), nv.scale_2)
    _raises(r"muser\.qmatmul: scale_2 must be a floating-point tensor", ops.qmatmul, x,
            nv.packed, nv.qtype, 6, nv.n_in, nv.scales, torch.ones(1, dtype=torch.int32))
    _raises(r"muser\.qmatmul: Q4_K takes no scales/scale_2 companions", ops.qmatmul,
            torch.zeros(1, 256), q4k.packed, q4k.qtype, 6, 256, nv.scales, nv.scale_2)


def test_embedding_ids(q4k):
    _raises(r"muser\.embedding: ids must be an integer tensor, got torch\.float32",
            ops.embedding, torch.zeros(3), q4k.packed, q4k.qtype, 6, 256)
    _raises(r"muser\.embedding: ids must lie in \[0, 6\), got values from 0 to 6",
            ops.embedding, torch.tensor([0, 6]), q4k.packed, q4k.qtype, 6, 256)
    _raises(r"muser\.embedding: ids must lie in \[0, 6\), got values from -1",
            ops.embedding, torch.tensor([-1, 2]), q4k.packed, q4k.qtype, 6, 256)
    _raises(r"muser\.embedding: ids is on meta but packed is on cpu",
            ops.embedding, torch.zeros(3, dtype=torch.long, device="meta"), q4k.packed,
            q4k.qtype, 6, 256)


def test_direct_torch_ops_call_is_checked(q4k):
    """torch.ops.muser.* validates too, not only the Python wrappers."""
    _raises(r"muser\.qmatmul: x must be float32", torch.ops.muser.qmatmul,
            torch.zeros(1, 256, dtype=torch.float64), q4k.packed, 12, 6, 256)


def test_device_without_kernel():
    with pytest.raises(ValueError, match=r"muser\.qmatmul: no kernel for device 'xpu'"):
        defaults._backend_for("qmatmul", torch.device("xpu"), 12)


def test_metal_emulation_without_mps_module(q4k, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "muser_torch.ops.metal" else real(name, *a))
    with ops.use_backend("metal-emulator"):
        _raises(r"muser\.qmatmul: use_backend\('metal-emulator'\), but muser_torch/ops/metal ",
                ops.qmatmul, torch.zeros(1, 256), q4k.packed, q4k.qtype, 6, 256)


def test_bool_qtype_is_refused(q4k):
    """True is not F16: the wrappers refuse it (torch.ops' dispatcher turns a
    bool into 1 before any Python sees it, so there the F16 sizes decide)."""
    x, p = torch.zeros(1, 256), q4k.packed
    _raises(r"muser\.qmatmul: qtype must be a GGMLType, its int id or its name, got the bool True",
            ops.qmatmul, x, p, True, 6, 256)
    _raises(r"muser\.dequantize: qtype must be .* got the bool False", ops.dequantize, p, False, 6, 256)
    _raises(r"muser\.qmatmul: qtype must be .* bool", ops.check_args, "qmatmul", p, True, 6, 256,
            None, None)


@pytest.mark.parametrize("n_out, n_in, what", [(6, 2**63, "n_in is 9223372036854775808"),
                                               (2**40, 256, "n_out is 1099511627776"),
                                               (6, 2**31, "n_in is 2147483648")])
def test_absurd_dimensions_get_a_clear_message(q4k, n_out, n_in, what):
    x = torch.zeros(1, 256)
    _raises(rf"muser\.qmatmul: {what}, past 2147483647 \(2\*\*31 - 1\)", ops.qmatmul, x,
            q4k.packed, q4k.qtype, n_out, n_in)
    if max(n_out, n_in) < 2**63:     # the schema's int64 holds it, so the op checks it too
        _raises(rf"muser\.qmatmul: {what}", torch.ops.muser.qmatmul, x, q4k.packed, 12, n_out,
                n_in)


def test_type_ids_are_checked_before_sizes():
    """IQ2_XXS (id 16) rows of exactly its 66 bytes: refused by id, naming
    what the ops compute, not by a row size."""
    p = torch.zeros(3, 66, dtype=torch.uint8)
    with pytest.raises(ValueError) as e:
        ops.dequantize(p, 16, 3, 256)
    msg = str(e.value)
    assert "unknown GGML type id 16" in msg and "bytes" not in msg
    assert "Q4_K (12)" in msg and "NVFP4 (40)" in msg and "NVFP4_E2M1 (1000)" in msg
    assert ops.implemented_types() == frozenset(GGMLType)   # every GGMLType has a block format


def test_id_40_on_q4k_sized_rows_computes_llama_cpp_nvfp4(q4k):
    """Type 40 (llama.cpp's NVFP4) is a type the ops compute, and its rows of
    256 inputs are 144 bytes like Q4_K's: the bytes are read as NVFP4 blocks,
    matching the NVFP4 reference (not Q4_K's), as ggml would read them."""
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(q4k.seed), dtype=torch.float64)
    got = ops.qmatmul(x.float(), q4k.packed, 40, 6, 256).double()
    want_nvfp4 = x @ ref_dequantize(q4k.packed, GGMLType.NVFP4, 256).double().T
    want_q4k = x @ ref_dequantize(q4k.packed, GGMLType.Q4_K, 256).double().T
    scale = want_nvfp4.abs().max()
    assert ((got - want_nvfp4).abs().max() <= 1e-4 * scale), f"seed {q4k.seed}"
    assert not torch.allclose(want_nvfp4, want_q4k), f"seed {q4k.seed}"
