"""GGUF's fixed facts: the magic and versions, the value types and their
numpy encodings, the tensor type-id table (``block_geometry``, ``type_name``)
and the NVFP4 companion suffixes. Reader and writer both read these; this
module imports nothing from them.

File layout (little-endian; GGUF v2 and v3 are identical on disk):

    "GGUF" | version u32 | tensor_count u64 | kv_count u64
    kv_count   x  key:str | value_type u32 | value
    tensor_count x  name:str | n_dims u32 | ne[n_dims] u64 | type u32 | offset u64
    padding to general.alignment (default 32)
    tensor data: each tensor at data_start + offset, offsets aligned

    str   = length u64 | UTF-8 bytes
    array = item_type u32 | count u64 | count items
"""
from __future__ import annotations

import struct

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from ..formats import GGMLType

MAGIC = b"GGUF"
VERSIONS = (2, 3)
WRITE_VERSION = 3
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4                  # GGML_MAX_DIMS
# NVFP4_E2M1 tensor "X.weight" keeps its scales in "X.weight_scale" (F8_E4M3FN)
# and "X.weight_scale_2" (F32), as NVFP4 safetensors checkpoints do.
SCALE_SUFFIX, SCALE2_SUFFIX = "_scale", "_scale_2"
MAX_NAME_BYTES = 63           # llama.cpp refuses tensor names of GGML_MAX_NAME (64) bytes or more
# What the reader accepts, the GGUF spec's limits: keys at most 2**16 - 1 bytes,
# tensor names at most 64 (the writer keeps to llama.cpp's 63).
MAX_KEY_BYTES = 2**16 - 1
MAX_TENSOR_NAME_BYTES = 64
_INT64_MAX = 2**63 - 1
# Items of one metadata array the reader turns into Python values. The GGUF
# spec sets no limit, but the largest arrays in published files are
# vocabularies of a few hundred thousand tokens; 300 million tokens of
# empty strings fit in a 2.4 GB file and would become 2.4 GB of list.
MAX_ARRAY_ITEMS = 1 << 24

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

V = GGUFValueType
# scalar value type -> its little-endian numpy dtype (BOOL is one byte, nonzero = true)
_SCALARS: dict[GGUFValueType, np.dtype] = {
    V.UINT8: np.dtype("<u1"), V.INT8: np.dtype("<i1"),
    V.UINT16: np.dtype("<u2"), V.INT16: np.dtype("<i2"),
    V.UINT32: np.dtype("<u4"), V.INT32: np.dtype("<i4"),
    V.UINT64: np.dtype("<u8"), V.INT64: np.dtype("<i8"),
    V.FLOAT32: np.dtype("<f4"), V.FLOAT64: np.dtype("<f8"),
    V.BOOL: np.dtype("<u1"),
}
_INTS = {V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64}
_FLOATS = {V.FLOAT32, V.FLOAT64}


# ---- tensor types -----------------------------------------------------------

def block_geometry(type_id: int) -> tuple[int, int] | None:
    """(elements, bytes) per block of a tensor type id, or None if unknown.

    GGMLType is the source for every type this package computes; ids it does
    not know (Q2_K, IQ*, I32, ...) take their geometry from gguf's table, so
    their tensors can still be sized, bounds-checked, listed and copied."""
    t = _ggml_type(type_id)
    if t is not None:
        return t.block_elems, t.block_bytes
    if type_id in _GGUF_PY_STALE:
        return _GGUF_PY_STALE[type_id]
    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    except (ValueError, KeyError):
        return None


# gguf-py's table still gives Q8_1 its old 40-byte block (f32 d and s); ggml's
# block_q8_1 has been 36 bytes (two f16) for years, and ggml sizes the files.
_GGUF_PY_STALE = {9: (32, 36)}


def type_name(type_id: int) -> str:
    """The type's name (GGMLType first, then gguf's), or ``type<id>`` if unknown."""
    t = _ggml_type(type_id)
    if t is not None:
        return t.name
    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"type{type_id}"


def _ggml_type(type_id: int) -> GGMLType | None:
    try:
        return GGMLType(type_id)
    except ValueError:
        return None


def _align(n: int, alignment: int) -> int:
    """``n`` rounded up to a multiple of ``alignment``."""
    return -(-n // alignment) * alignment
