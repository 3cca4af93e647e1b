"""ggml itself as the oracle: ``ggml_quantize_chunk`` from libggml-python's
prebuilt ``libggml-base.so``, called through ctypes.

Tests import :func:`lib` (which skips the test when libggml is absent) and
:func:`quantize_chunk`, which returns ggml's bytes as a uint8 tensor shaped
like ours, ``[rows, row_bytes]``. Sizes are asked of ggml, not of our
registry, so a geometry mistake on our side cannot hide in the oracle.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import os

import numpy as np
import pytest
import torch

_F32_P = ctypes.POINTER(ctypes.c_float)


@functools.lru_cache(maxsize=None)
def _load() -> ctypes.CDLL | None:
    spec = importlib.util.find_spec("libggml")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], "lib64", "libggml-base.so")
    dll = ctypes.CDLL(path)
    dll.ggml_quantize_chunk.restype = ctypes.c_size_t
    dll.ggml_quantize_chunk.argtypes = [ctypes.c_int, _F32_P, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, _F32_P]
    dll.ggml_row_size.restype = ctypes.c_size_t
    dll.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    return dll


def lib() -> ctypes.CDLL:
    """The loaded library; skips the calling test if libggml-python is not installed."""
    return loaded_or_skip(_load())


def loaded_or_skip(dll: ctypes.CDLL | None) -> ctypes.CDLL:
    """``dll``, or a skip of the calling test when libggml-python is absent (None)."""
    if dll is None:
        pytest.skip("libggml-python is not installed (pip install libggml-python)")
    return dll


def quantize_chunk(x: torch.Tensor, qtype: int, imatrix: torch.Tensor | None = None) -> torch.Tensor:
    """ggml's own quantization of float ``x`` ``[rows, n_in]`` to ``qtype``.

    With ``imatrix`` (``[n_in]``) ggml takes its importance-weighted paths
    (``quantize_row_*_impl``); without, the ``*_ref`` reference quantizers."""
    dll = lib()
    src = np.ascontiguousarray(x.detach().cpu().numpy(), dtype=np.float32)
    rows, n_in = src.shape
    row_bytes = dll.ggml_row_size(int(qtype), n_in)
    dst = np.zeros((rows, row_bytes), dtype=np.uint8)
    qw = None
    if imatrix is not None:
        qw_arr = np.ascontiguousarray(imatrix.detach().cpu().numpy(), dtype=np.float32)
        qw = qw_arr.ctypes.data_as(_F32_P)
    written = dll.ggml_quantize_chunk(int(qtype), src.ctypes.data_as(_F32_P), dst.ctypes.data,
                                      0, rows, n_in, qw)
    assert written == dst.size, f"ggml wrote {written} bytes, expected {dst.size}"
    return torch.from_numpy(dst)
