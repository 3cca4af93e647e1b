"""Block formats: the type registry, ``dequantize_reference`` and ``quantize``.

Both work on whole rows: a matrix ``(n_out, n_in)`` is a uint8
tensor ``[n_out, row_bytes]`` whose row r is ``n_in / block_elems``
consecutive blocks, exactly as in a GGUF file. Everything here is vectorized
torch, so it runs on any device and under ``torch.compile``. This package is
the reference layer: it imports nothing above it. ``muser_torch.dequantize``
(``ops/unpack.py``) is the public decode that picks a native kernel.
"""
from __future__ import annotations

import torch

from . import floats, kquant, legacy, nvfp4  # noqa: F401  (registers the formats)
from .nvfp4 import dequantize_nvfp4_e2m1
from .registry import can_quantize, format_for
from .types import NEEDS_COMPANIONS, NVFP4_GROUP, QK_K, GGMLType
from .weight import PackedWeight, companion_args
from .random import random_weight  # noqa: E402  (needs dequantize_reference lazily)

__all__ = ["GGMLType", "QK_K", "PackedWeight", "dequantize_reference", "quantize", "can_quantize",
           "check_packed", "random_weight"]

# Activation dtypes the quantizers and the ops accept.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_packed(packed: torch.Tensor, qtype: GGMLType, n_in: int, what: str = "packed",
                 n_out: int | None = None) -> None:
    """Raise ValueError unless ``packed`` is a contiguous uint8 ``[rows, row_bytes]``."""
    if not isinstance(packed, torch.Tensor):
        raise ValueError(f"{what} must be a torch.Tensor, got {type(packed).__name__}")
    if packed.dtype != torch.uint8:
        raise ValueError(f"{what} must be uint8 bytes, got dtype {packed.dtype}")
    if packed.dim() != 2:
        raise ValueError(f"{what} must be 2-D [rows, row_bytes], got shape {tuple(packed.shape)}")
    if not packed.is_contiguous():
        raise ValueError(f"{what} must be contiguous (got strides {packed.stride()})")
    row_bytes = qtype.row_bytes(n_in)
    if packed.shape[1] != row_bytes:
        raise ValueError(
            f"{what}: a {qtype.name} row of {n_in} elements is {row_bytes} bytes, "
            f"got {packed.shape[1]} bytes per row")
    if n_out is not None and packed.shape[0] != n_out:
        raise ValueError(f"{what}: expected {n_out} rows, got {packed.shape[0]}")


def check_companions(scales, scale_2, rows: int, n_in: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate NVFP4_E2M1 companions for ``rows`` packed rows; return (uint8
    scales, float32 scale_2 on ``device``)."""
    if scales is None or scale_2 is None:
        raise ValueError(f"NVFP4_E2M1 needs both companions: scales (uint8 "
                         f"[{rows}, {n_in // NVFP4_GROUP}]) and scale_2 (float32 [1])")
    if not isinstance(scales, torch.Tensor):
        raise ValueError(f"scales must be a torch.Tensor, got {type(scales).__name__}")
    scales, scale_2 = companion_args(scales, scale_2, device)
    if scales.dtype != torch.uint8:
        raise ValueError(f"scales must be E4M3FN bytes (uint8 or float8_e4m3fn), got {scales.dtype}")
    if tuple(scales.shape) != (rows, n_in // NVFP4_GROUP):
        raise ValueError(f"scales must have shape {(rows, n_in // NVFP4_GROUP)}, got {tuple(scales.shape)}")
    if not scales.is_contiguous():
        raise ValueError("scales must be contiguous")
    if scale_2.numel() != 1:
        raise ValueError(f"scale_2 must hold one value, got shape {tuple(scale_2.shape)}")
    return scales, scale_2.to(device=device, dtype=torch.float32)


def dequantize_reference(packed: torch.Tensor, qtype: "GGMLType | int", n_in: int, *,
                         scales: torch.Tensor | None = None,
                         scale_2: "torch.Tensor | float | None" = None) -> torch.Tensor:
    """Packed uint8 ``[rows, row_bytes]`` of ``qtype`` to float32 ``[rows, n_in]``
    in vectorized torch: any device, traceable by ``torch.compile``, and the
    reference every kernel is tested against. Bit-exact with gguf's numpy
    ``dequantize`` (and ggml's ``to_float``)."""
    qtype = GGMLType.parse(qtype)
    check_packed(packed, qtype, n_in)
    rows = packed.shape[0]
    if qtype in NEEDS_COMPANIONS:
        scales, scale_2 = check_companions(scales, scale_2, rows, n_in, packed.device)
        return dequantize_nvfp4_e2m1(packed, scales, scale_2)
    blocks = packed.reshape(-1, qtype.block_bytes)
    return format_for(qtype).dequantize_blocks(blocks).reshape(rows, n_in)


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
