"""``dequantize_reference``: the vectorized torch decoder every kernel is held to.

It works on whole rows: a matrix ``(n_out, n_in)`` is a uint8 tensor
``[n_out, row_bytes]`` whose row r is ``n_in / block_elems`` consecutive
blocks, exactly as in a GGUF file. :func:`check_packed` is the check of such
rows that this decoder and the ops' boundary share.
"""
from __future__ import annotations

import torch

from .companions import check_companions, companion_args
from .nvfp4 import dequantize_nvfp4_e2m1
from .registry import format_for
from .types import NEEDS_COMPANIONS, GGMLType


def check_packed(packed: torch.Tensor, qtype: GGMLType, n_in: int, what: str = "packed",
                 n_out: int | None = None) -> None:
    """Raise ValueError unless ``packed`` is a contiguous uint8 ``[rows, row_bytes]``."""
    if not isinstance(packed, torch.Tensor):
        raise ValueError(f"{what} must be a torch.Tensor, got {type(packed).__name__}")
    if packed.dtype != torch.uint8:
        raise ValueError(f"{what} must be uint8 bytes, got dtype {packed.dtype}")
    shape = packed.shape          # read once: every eager op call runs this check
    if len(shape) != 2:
        raise ValueError(f"{what} must be 2-D [rows, row_bytes], got shape {tuple(shape)}")
    if not packed.is_contiguous():
        raise ValueError(f"{what} must be contiguous (got strides {packed.stride()})")
    row_bytes = qtype.row_bytes(n_in)
    if shape[1] != row_bytes:
        raise ValueError(
            f"{what}: a {qtype.name} row of {n_in} elements is {row_bytes} bytes, "
            f"got {shape[1]} bytes per row")
    if n_out is not None and shape[0] != n_out:
        raise ValueError(f"{what}: expected {n_out} rows, got {shape[0]}")


def rows_args(packed: torch.Tensor, qtype: "GGMLType | int | str", n_in: int, scales,
              scale_2) -> tuple[GGMLType, torch.Tensor | None, torch.Tensor | None]:
    """The checked arguments of a decode of packed rows: (GGMLType, scales,
    scale_2), NVFP4_E2M1's companions normalised (``companions.companion_args``)
    and checked. Raises ValueError naming what is wrong."""
    qtype = GGMLType.parse(qtype)
    check_packed(packed, qtype, n_in)
    if qtype in NEEDS_COMPANIONS:
        scales, scale_2 = companion_args(scales, scale_2, packed.device)
        check_companions(scales, scale_2, packed.shape[0], n_in, packed.device)
    return qtype, scales, scale_2


def dequantize_reference(packed: torch.Tensor, qtype: "GGMLType | int", n_in: int, *,
                         scales: torch.Tensor | None = None,
                         scale_2: "torch.Tensor | float | None" = None) -> torch.Tensor:
    """Packed uint8 ``[rows, row_bytes]`` of ``qtype`` to float32 ``[rows, n_in]``
    in vectorized torch: any device, traceable by ``torch.compile``, and the
    reference every kernel is tested against. Bit-exact with gguf's numpy
    ``dequantize`` (and ggml's ``to_float``)."""
    qtype, scales, scale_2 = rows_args(packed, qtype, n_in, scales, scale_2)
    if qtype in NEEDS_COMPANIONS:
        return dequantize_nvfp4_e2m1(packed, scales, scale_2)
    blocks = packed.reshape(-1, qtype.block_bytes)
    return format_for(qtype).dequantize_blocks(blocks).reshape(packed.shape[0], n_in)
