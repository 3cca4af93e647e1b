"""ggml's own ``mul_mat`` as the oracle: a one-op graph built and computed by
libggml-python's prebuilt CPU library (its x86 build: AVX2, ggml-cpu's
``quantize_row_q8_*`` and ``ggml_vec_dot_*``) through ctypes.

:func:`ggml_mul_mat` takes our packed bytes ``[n_out, row_bytes]`` as
ggml's ``[n_in, n_out]`` weight of the same type and float32 ``x``
``[T, n_in]``, and returns ggml's ``[T, n_out]``. :func:`ggml_build` says
which build it is.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import os

import numpy as np
import torch

from ..formats.ggml_ref import loaded_or_skip

GGML_TYPE_F32 = 0


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


@functools.lru_cache(maxsize=None)
def _load() -> ctypes.CDLL | None:
    spec = importlib.util.find_spec("libggml")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib_dir = os.path.join(spec.submodule_search_locations[0], "lib64")
    ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    dll = ctypes.CDLL(os.path.join(lib_dir, "libggml-cpu.so"))
    P, i64 = ctypes.c_void_p, ctypes.c_int64
    dll.ggml_init.restype, dll.ggml_init.argtypes = P, [_InitParams]
    dll.ggml_free.argtypes = [P]
    dll.ggml_new_tensor_2d.restype = P
    dll.ggml_new_tensor_2d.argtypes = [P, ctypes.c_int, i64, i64]
    dll.ggml_get_data.restype, dll.ggml_get_data.argtypes = P, [P]
    dll.ggml_mul_mat.restype, dll.ggml_mul_mat.argtypes = P, [P, P, P]
    dll.ggml_new_graph.restype, dll.ggml_new_graph.argtypes = P, [P]
    dll.ggml_build_forward_expand.argtypes = [P, P]
    dll.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    dll.ggml_graph_compute_with_ctx.argtypes = [P, P, ctypes.c_int]
    dll.ggml_nbytes.restype, dll.ggml_nbytes.argtypes = ctypes.c_size_t, [P]
    return dll


def lib() -> ctypes.CDLL:
    """libggml-cpu with the graph API declared; skips the calling test when absent."""
    return loaded_or_skip(_load())


def ggml_build() -> str:
    """Which ggml this is (the package and its library file)."""
    spec = importlib.util.find_spec("libggml")
    from importlib.metadata import version
    return f"libggml-python {version('libggml-python')} ({spec.submodule_search_locations[0]}/lib64)"


class MulMat:
    """A prepared ``mul_mat`` graph for one weight and token count, so that
    timing it (bench ops --against ggml) measures ggml's compute, not setup."""

    def __init__(self, packed: torch.Tensor, qtype: int, n_out: int, n_in: int, tokens: int,
                 threads: int = 1) -> None:
        self.dll = dll = lib()
        raw = np.ascontiguousarray(packed.cpu().numpy())
        mem = raw.nbytes + 4 * tokens * (n_in + n_out) * 3 + (n_in * tokens * 2) + (16 << 20)
        self.ctx = dll.ggml_init(_InitParams(mem, None, False))
        if not self.ctx:
            raise RuntimeError("ggml_init failed")
        a = dll.ggml_new_tensor_2d(self.ctx, int(qtype), n_in, n_out)
        if dll.ggml_nbytes(a) != raw.nbytes:
            raise ValueError(f"ggml sizes the weight at {dll.ggml_nbytes(a)} bytes, ours is {raw.nbytes}")
        ctypes.memmove(dll.ggml_get_data(a), raw.ctypes.data, raw.nbytes)
        self.b = dll.ggml_new_tensor_2d(self.ctx, GGML_TYPE_F32, n_in, tokens)
        self.out = dll.ggml_mul_mat(self.ctx, a, self.b)
        self.graph = dll.ggml_new_graph(self.ctx)
        dll.ggml_build_forward_expand(self.graph, self.out)
        self.shape, self.threads = (tokens, n_out), threads

    def set_x(self, x: torch.Tensor) -> None:
        src = np.ascontiguousarray(x.detach().cpu().numpy(), dtype=np.float32)
        ctypes.memmove(self.dll.ggml_get_data(self.b), src.ctypes.data, src.nbytes)

    def compute(self) -> None:
        status = self.dll.ggml_graph_compute_with_ctx(self.ctx, self.graph, self.threads)
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute_with_ctx returned {status}")

    def result(self) -> torch.Tensor:
        res = np.empty(self.shape, dtype=np.float32)
        ctypes.memmove(res.ctypes.data, self.dll.ggml_get_data(self.out), res.nbytes)
        return torch.from_numpy(res)

    def close(self) -> None:
        if self.ctx:
            self.dll.ggml_free(self.ctx)
            self.ctx = None

    def __del__(self) -> None:
        self.close()


def ggml_mul_mat(packed: torch.Tensor, qtype: int, n_out: int, n_in: int, x: torch.Tensor,
                 threads: int = 1) -> torch.Tensor:
    """ggml's ``x @ W.T`` (float32 ``[T, n_out]``) for W's bytes ``packed``."""
    mm = MulMat(packed, qtype, n_out, n_in, x.shape[0], threads)
    try:
        mm.set_x(x)
        mm.compute()
        return mm.result()
    finally:
        mm.close()
