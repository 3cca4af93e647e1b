"""ggml's own ``mul_mat`` as the oracle (``muser_torch.bench.ggml_mulmat`` over
libggml-python's prebuilt CPU library, its x86 build: AVX2, ggml-cpu's
``quantize_row_q8_*`` and ``ggml_vec_dot_*``); skips when it is absent."""
from __future__ import annotations

import ctypes

import numpy as np
import torch

from muser_torch.bench import ggml_mulmat
from muser_torch.bench.ggml_mulmat import GGML_TYPE_F32

from ..formats.ggml_ref import loaded_or_skip


def lib() -> ctypes.CDLL:
    """libggml-cpu with the graph API declared; skips the calling test when absent."""
    return loaded_or_skip(ggml_mulmat.load())


def ggml_mul_mat(packed: torch.Tensor, qtype: int, n_out: int, n_in: int, x: torch.Tensor,
                 threads: int = 1) -> torch.Tensor:
    """ggml's ``x @ W.T`` (float32 ``[T, n_out]``) for W's bytes ``packed``."""
    return ggml_mulmat.mul_mat(lib(), packed, qtype, n_out, n_in, x, threads)


class _TraitsCpu(ctypes.Structure):
    # ggml-cpu.h's struct ggml_type_traits_cpu
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


# The activation types ggml's CPU dot products read, as their bytes decode:
# Q8_0 (f16 d, 32 int8), Q8_1 (f16 d, f16 s, 32 int8), Q8_K (f32 d, 256 int8, 16 int16 sums).
_Q8 = {8: (32, 2, np.float16, 34), 9: (32, 4, np.float16, 36), 15: (256, 4, np.float32, 292)}


def ggml_activations(qtype: int, x: torch.Tensor) -> torch.Tensor:
    """``x`` (float32 ``[T, n_in]``) as ggml's CPU ``mul_mat`` rounds it before
    its dot products with a ``qtype`` weight, in float64: the weight type's
    ``vec_dot_type``, and that type's ``from_float``, asked of ggml-cpu itself; the bytes it
    writes decoded here (Q8_0, Q8_1, Q8_K: ``d * q``). ``x @ W.T`` on these is
    what ggml's integer dots compute, up to float32 rounding, so ggml can be
    held to a float bound instead of to the noise of rounding x."""
    dll = lib()
    if not hasattr(dll, "_traits_declared"):
        dll.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_TraitsCpu)
        dll.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
        dll._traits_declared = True
    vt = dll.ggml_get_type_traits_cpu(int(qtype)).contents.vec_dot_type
    src = np.ascontiguousarray(x.detach().cpu().numpy(), dtype=np.float32)
    if vt == GGML_TYPE_F32:
        return torch.from_numpy(src).double()
    block, head, d_type, block_bytes = _Q8[vt]            # KeyError: a type this helper does not decode
    rows, n_in = src.shape
    dst = np.zeros((rows, n_in // block * block_bytes), dtype=np.uint8)
    from_float = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
        dll.ggml_get_type_traits_cpu(vt).contents.from_float)
    for r in range(rows):
        from_float(src[r].ctypes.data, dst[r].ctypes.data, n_in)
    blocks = dst.reshape(rows, n_in // block, block_bytes)
    d = blocks[..., :np.dtype(d_type).itemsize].copy().view(d_type).astype(np.float64)
    q = blocks[..., head:head + block].copy().view(np.int8).astype(np.float64)
    return torch.from_numpy((d * q).reshape(rows, n_in))
