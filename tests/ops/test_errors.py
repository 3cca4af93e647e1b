"""Bad input raises ValueError naming the op, the argument and what was expected."""
from __future__ import annotations

import importlib.util

import pytest
import torch

import muser_torch.ops as ops
from muser_torch.formats.types import GGMLType

from .conftest import Case


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
        ops._backend_for("qmatmul", torch.device("xpu"))


def test_metal_emulation_without_mps_module(q4k, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "muser_torch.ops.mps" else real(name, *a))
    with ops.use_backend("metal-emulator"):
        _raises(r"muser\.qmatmul: use_backend\('metal-emulator'\), but muser_torch/ops/mps\.py",
                ops.qmatmul, torch.zeros(1, 256), q4k.packed, q4k.qtype, 6, 256)
