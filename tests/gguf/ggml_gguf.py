"""llama.cpp's own GGUF parser (``gguf.cpp`` in libggml-python's
``libggml-base.so``), called through ctypes: the independent reference for
header fields, tensor offsets and sizes, and the check that files written
here open in llama.cpp."""
from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass

import numpy as np

from ..formats.ggml_ref import lib as ggml_lib

GGML_MAX_DIMS = 4


class _InitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


@functools.lru_cache(maxsize=None)
def _typed(dll: ctypes.CDLL) -> ctypes.CDLL:
    """Declare the gguf.cpp signatures on the library ggml_ref loads (once)."""
    sigs = {
        "gguf_init_from_file": (ctypes.c_void_p, [ctypes.c_char_p, _InitParams]),
        "gguf_free": (None, [ctypes.c_void_p]),
        "gguf_get_version": (ctypes.c_uint32, [ctypes.c_void_p]),
        "gguf_get_alignment": (ctypes.c_size_t, [ctypes.c_void_p]),
        "gguf_get_data_offset": (ctypes.c_size_t, [ctypes.c_void_p]),
        "gguf_get_n_kv": (ctypes.c_int64, [ctypes.c_void_p]),
        "gguf_get_key": (ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_kv_type": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_n_tensors": (ctypes.c_int64, [ctypes.c_void_p]),
        "gguf_get_tensor_name": (ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_tensor_offset": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_tensor_ne": (ctypes.POINTER(ctypes.c_int64), [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_tensor_type": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_tensor_size": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int64]),
        "ggml_blck_size": (ctypes.c_int64, [ctypes.c_int]),
        "ggml_type_size": (ctypes.c_size_t, [ctypes.c_int]),
        "gguf_get_arr_type": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_arr_n": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_arr_data": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_arr_str": (ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t]),
        "gguf_get_val_str": (ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_val_data": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int64]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(dll, name)
        fn.restype, fn.argtypes = res, args
    return dll


def lib() -> ctypes.CDLL:
    """libggml-base.so with gguf.cpp's signatures; skips the calling test if
    libggml-python is not installed."""
    return _typed(ggml_lib())


@dataclass
class GGMLTensorInfo:
    type_id: int
    ne: tuple[int, ...]     # always GGML_MAX_DIMS long, padded with 1
    offset: int             # absolute, in the file
    size: int


@dataclass
class GGMLHeader:
    version: int
    alignment: int
    data_offset: int
    kv_types: dict[str, int]        # value type; for an array, its item type
    metadata: dict[str, object]
    tensors: dict[str, GGMLTensorInfo]


def read_header(path) -> GGMLHeader | None:
    """What gguf.cpp reads from ``path``; None when it refuses the file."""
    dll = lib()
    ctx = dll.gguf_init_from_file(os.fsencode(path), _InitParams(True, None))
    if not ctx:
        return None
    try:
        data = dll.gguf_get_data_offset(ctx)
        kv, values = {}, {}
        for i in range(dll.gguf_get_n_kv(ctx)):
            key = dll.gguf_get_key(ctx, i).decode()
            vtype = dll.gguf_get_kv_type(ctx, i)
            values[key] = _value(dll, ctx, i, vtype)
            kv[key] = dll.gguf_get_arr_type(ctx, i) if vtype == 9 else vtype
        tensors = {}
        for i in range(dll.gguf_get_n_tensors(ctx)):
            ne = dll.gguf_get_tensor_ne(ctx, i)
            tensors[dll.gguf_get_tensor_name(ctx, i).decode()] = GGMLTensorInfo(
                dll.gguf_get_tensor_type(ctx, i), tuple(ne[d] for d in range(GGML_MAX_DIMS)),
                data + dll.gguf_get_tensor_offset(ctx, i), dll.gguf_get_tensor_size(ctx, i))
        return GGMLHeader(dll.gguf_get_version(ctx), dll.gguf_get_alignment(ctx), data, kv, values,
                          tensors)
    finally:
        dll.gguf_free(ctx)


# gguf_type -> numpy dtype of the value (the numbering is GGUF's value types)
_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
           10: "<u8", 11: "<i8", 12: "<f8"}


def _value(dll, ctx, i: int, vtype: int):
    if vtype == 8:
        return dll.gguf_get_val_str(ctx, i).decode()
    if vtype == 9:
        itype, n = dll.gguf_get_arr_type(ctx, i), dll.gguf_get_arr_n(ctx, i)
        if itype == 8:
            return [dll.gguf_get_arr_str(ctx, i, j).decode() for j in range(n)]
        dt = np.dtype(_DTYPES[itype])
        items = np.frombuffer(ctypes.string_at(dll.gguf_get_arr_data(ctx, i), n * dt.itemsize), dt)
    else:
        dt = np.dtype(_DTYPES[vtype])
        items = np.frombuffer(ctypes.string_at(dll.gguf_get_val_data(ctx, i), dt.itemsize), dt)
    values = (items != 0).tolist() if vtype == 7 or (vtype == 9 and itype == 7) else items.tolist()
    return values if vtype == 9 else values[0]


def padded_ne(ne: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(ne) + (1,) * (GGML_MAX_DIMS - len(ne))
