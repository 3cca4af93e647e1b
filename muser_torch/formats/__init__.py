"""Block formats: the type registry, ``dequantize_reference`` (``reference.py``)
and ``quantize``.

Both work on whole rows: a matrix ``(n_out, n_in)`` is a uint8
tensor ``[n_out, row_bytes]`` whose row r is ``n_in / block_elems``
consecutive blocks, exactly as in a GGUF file. Everything here is vectorized
torch, so it runs on any device and under ``torch.compile``. This package is
the reference layer: it imports nothing above it. ``muser_torch.dequantize``
(``ops/dequant.py``) is the public decode, the op ``muser.dequantize``.
"""
from __future__ import annotations

import functools

import torch

from . import floats, iq3, iq4, kquant, legacy, mxfp4, nvfp4  # noqa: F401  (registers the formats)
from .companions import check_companions, companion_args
from .random import random_weight
from .reference import check_packed, dequantize_reference
from .registry import can_quantize, format_for
from .types import NEEDS_COMPANIONS, QK_K, GGMLType
from .weight import PackedWeight

__all__ = ["GGMLType", "QK_K", "PackedWeight", "dequantize_reference", "quantize", "can_quantize",
           "check_packed", "check_companions", "companion_args", "random_weight", "scale_byte_table"]

# The value of every byte of a one-byte float scale, by its field kind (layout.FIELD_KINDS).
_SCALE_BYTE_TABLES = {"ue4m3": nvfp4.ue4m3_half_table, "e4m3": floats.e4m3fn_table}


@functools.lru_cache(maxsize=None)
def scale_byte_table(qtype: "GGMLType | int", device: torch.device | str = "cpu") -> torch.Tensor | None:
    """float32 ``[256]``: the values of ``qtype``'s one-byte float scales, an
    in-block field or a companion tensor (read from its layout), or None when
    it has none. Kernels gather their scales through it without naming a
    format. Built once per (type, device): read it, never write it."""
    from .layout import LAYOUTS
    lay = LAYOUTS[GGMLType.parse(qtype).name]
    kinds = [f.kind for f in lay.fields] + [LAYOUTS[c.type_name].fields[0].kind for c in lay.companions]
    found = [k for k in kinds if k in _SCALE_BYTE_TABLES]
    return _SCALE_BYTE_TABLES[found[0]](device) if found else None


# Activation dtypes the quantizers and the ops accept.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def quantize(x: torch.Tensor, qtype: "GGMLType | int", *, imatrix: torch.Tensor | None = None):
    """float ``[rows, n_in]`` to packed uint8 ``[rows, row_bytes]`` of ``qtype``.

    Byte-identical to ggml's reference quantizers (``ggml_quantize_chunk``),
    including the importance-weighted variants when ``imatrix`` (``[n_in]``,
    per-input importance) is given. NVFP4_E2M1 returns
    ``(payload, scales, scale_2)``."""
    qtype = GGMLType.parse(qtype)
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"x must be float32, float16 or bfloat16, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [rows, n_in], got shape {tuple(x.shape)}")
    rows, n_in = x.shape
    qtype.row_bytes(n_in)  # raises if n_in does not fill whole blocks
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"x contains NaN or inf; cannot quantize to {qtype.name}")
    x = x.to(torch.float32).contiguous()
    if imatrix is not None:
        if not isinstance(imatrix, torch.Tensor) or imatrix.shape != (n_in,):
            raise ValueError(f"imatrix must be a tensor of shape ({n_in},), got "
                             f"{getattr(imatrix, 'shape', type(imatrix).__name__)}")
        if not bool(torch.isfinite(imatrix).all()) or bool((imatrix < 0).any()):
            raise ValueError("imatrix must be finite and non-negative")
        imatrix = imatrix.to(device=x.device, dtype=torch.float32).contiguous()
    if qtype in NEEDS_COMPANIONS:
        return nvfp4.quantize_nvfp4_e2m1(x)
    if not can_quantize(qtype):
        raise ValueError(f"quantize to {qtype.name} is not supported")
    if rows == 0:   # the block paths cannot reshape or concatenate nothing
        return x.new_empty((0, qtype.row_bytes(n_in)), dtype=torch.uint8)
    return format_for(qtype).quantize_rows(x, imatrix)
