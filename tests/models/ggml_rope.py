"""ggml's own RoPE as the oracle: ``ggml_rope_ext`` from libggml-python's
prebuilt CPU library, run on a one-op graph through ctypes.

:func:`ggml_rope` takes the arguments llama.cpp's graphs pass to
``ggml_rope_ext`` (mode, rotated dims, base, freq_scale, the YaRN ext /
attn factors and betas, the original context, optional per-pair frequency
factors) and returns what ggml computes, so a RoPE written here can be held
to ggml's for every mode and scaling, partial rotation included.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import os

import numpy as np
import torch

from ..formats.ggml_ref import loaded_or_skip

GGML_TYPE_F32, GGML_TYPE_I32 = 0, 26
MODES = {"normal": 0, "neox": 2}   # GGML_ROPE_TYPE_NEOX is 2


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
    P = ctypes.c_void_p
    dll.ggml_init.restype, dll.ggml_init.argtypes = P, [_InitParams]
    dll.ggml_free.argtypes = [P]
    dll.ggml_new_tensor_1d.restype, dll.ggml_new_tensor_1d.argtypes = P, [P, ctypes.c_int, ctypes.c_int64]
    dll.ggml_new_tensor_3d.restype = P
    dll.ggml_new_tensor_3d.argtypes = [P, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    dll.ggml_get_data.restype, dll.ggml_get_data.argtypes = P, [P]
    f = ctypes.c_float
    dll.ggml_rope_ext.restype = P
    dll.ggml_rope_ext.argtypes = [P, P, P, P, ctypes.c_int, ctypes.c_int, ctypes.c_int, f, f, f, f, f, f]
    dll.ggml_new_graph.restype, dll.ggml_new_graph.argtypes = P, [P]
    dll.ggml_build_forward_expand.argtypes = [P, P]
    dll.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    dll.ggml_graph_compute_with_ctx.argtypes = [P, P, ctypes.c_int]
    return dll


def lib() -> ctypes.CDLL:
    return loaded_or_skip(_load())


def _fill(dll, tensor: int, values: np.ndarray) -> None:
    ctypes.memmove(dll.ggml_get_data(tensor), values.ctypes.data, values.nbytes)


def ggml_rope(x: torch.Tensor, positions: torch.Tensor, *, mode: str, n_rot: int, base: float,
              freq_scale: float = 1.0, ext_factor: float = 0.0, attn_factor: float = 1.0,
              beta_fast: float = 32.0, beta_slow: float = 1.0, n_ctx_orig: int = 0,
              freq_factors: torch.Tensor | None = None) -> torch.Tensor:
    """ggml's RoPE of ``x`` ``[T, H, D]`` (float32) at ``positions`` ``[T]``."""
    dll = lib()
    T, H, D = x.shape
    src = np.ascontiguousarray(x.detach().cpu().numpy(), dtype=np.float32)
    pos = np.ascontiguousarray(positions.cpu().numpy(), dtype=np.int32)
    mem = 4 * src.size * 4 + 4 * T + 4 * D + (1 << 20)
    ctx = dll.ggml_init(_InitParams(mem, None, False))
    if not ctx:
        raise RuntimeError("ggml_init failed")
    try:
        a = dll.ggml_new_tensor_3d(ctx, GGML_TYPE_F32, D, H, T)   # ne0 = D fastest: [T, H, D] in C order
        b = dll.ggml_new_tensor_1d(ctx, GGML_TYPE_I32, T)
        _fill(dll, a, src)
        _fill(dll, b, pos)
        c = None
        if freq_factors is not None:
            ff = np.ascontiguousarray(freq_factors.cpu().numpy(), dtype=np.float32)
            c = dll.ggml_new_tensor_1d(ctx, GGML_TYPE_F32, ff.size)
            _fill(dll, c, ff)
        out = dll.ggml_rope_ext(ctx, a, b, c, n_rot, MODES[mode], n_ctx_orig, base, freq_scale,
                                ext_factor, attn_factor, beta_fast, beta_slow)
        graph = dll.ggml_new_graph(ctx)
        dll.ggml_build_forward_expand(graph, out)
        status = dll.ggml_graph_compute_with_ctx(ctx, graph, 1)
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute_with_ctx returned {status}")
        res = np.empty_like(src)
        ctypes.memmove(res.ctypes.data, dll.ggml_get_data(out), res.nbytes)
    finally:
        dll.ggml_free(ctx)
    return torch.from_numpy(res)
