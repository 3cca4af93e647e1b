"""``muser_torch.dequantize``: packed rows to float32 through the op
``torch.ops.muser.dequantize``, so the dispatcher picks the kernel of the
tensor's device as for every other op (one way to choose a kernel).

It lives with the ops because it is one; the reference every kernel is held
to, ``formats.reference.dequantize_reference``, stays in the formats layer.
"""
from __future__ import annotations

import torch

from ..formats.reference import rows_args
from ..formats.types import GGMLType
from .cpu import dequantize_rows
from .cpu.eager import plain_eager

__all__ = ["dequantize"]


def check_out(out: torch.Tensor, rows: int, n_in: int, device: torch.device) -> None:
    """Raise ValueError unless ``out`` can take a dequantized ``[rows, n_in]``."""
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if out.dtype != torch.float32:
        raise ValueError(f"out must be float32, got {out.dtype}")
    if tuple(out.shape) != (rows, n_in):
        raise ValueError(f"out must have shape {(rows, n_in)}, got {tuple(out.shape)}")
    if not out.is_contiguous():
        raise ValueError(f"out must be contiguous (got strides {out.stride()})")
    if out.device != device:
        raise ValueError(f"out is on {out.device} but packed is on {device}")


def dequantize(packed: torch.Tensor, qtype: "GGMLType | int", n_in: int, *,
               scales: torch.Tensor | None = None,
               scale_2: "torch.Tensor | float | None" = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Packed uint8 ``[rows, row_bytes]`` of ``qtype`` to float32 ``[rows, n_in]``,
    bit-exact with gguf's numpy ``dequantize``. NVFP4_E2M1 also takes its
    ``scales`` and ``scale_2`` companions.

    It is the op ``torch.ops.muser.dequantize``: the kernel of packed's
    device (``ops/cpu``, ``ops/cuda``, ``ops/metal``), behind the op
    boundary's checks, which refuse by name a type the device's backend has
    no kernel for; one node of a ``torch.compile`` graph.

    ``out``: a contiguous float32 ``[rows, n_in]`` on packed's device to write
    into, returned. Worth passing when dequantizing tensor after tensor: a
    fresh 100 MB output costs the kernel's zero-filling of its pages, about as
    long as the decode itself. On a plain eager CPU call the op's CPU kernel
    decodes straight into it (``ops/cpu/eager.py``'s rule, as ``QLinear``);
    elsewhere the op's output is copied in."""
    qtype, scales, scale_2 = rows_args(packed, qtype, n_in, scales, scale_2)
    rows = packed.shape[0]
    if out is not None:
        check_out(out, rows, n_in, packed.device)
        if packed.is_cpu and plain_eager(out):
            return dequantize_rows(packed, qtype, n_in, scales, scale_2, out=out)
    if rows == 0:   # the op takes a matrix of at least one row
        w = torch.empty(0, n_in, dtype=torch.float32, device=packed.device)
    else:
        w = torch.ops.muser.dequantize(packed, int(qtype), rows, n_in, scales, scale_2)
    return w if out is None else out.copy_(w)
