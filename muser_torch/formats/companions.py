"""NVFP4_E2M1's companion buffers: the one normaliser and the one check.

A weight whose scales live outside its bytes (``types.NEEDS_COMPANIONS``)
travels with ``scales`` (E4M3FN, ``[rows, n_in/16]``) and ``scale_2`` (one
float32). Callers hand them in several forms (float8_e4m3fn or uint8 scales;
a tensor of any float dtype and shape with one element, or a Python number,
for scale_2); :func:`companion_args` is the one place that turns them into
what the kernels read (uint8 scales, float32 ``[1]`` scale_2 on the weight's
device), and :func:`check_companions` the one place that says what is valid.
The ops' boundary, ``nn``, ``PackedWeight`` and the reference decoder all use
these two.
"""
from __future__ import annotations

import torch

from .types import NVFP4_GROUP


def scale_bytes(scales):
    """E4M3 scales as the uint8 bytes the kernels read (float8_e4m3fn is re-viewed)."""
    if isinstance(scales, torch.Tensor) and scales.dtype == torch.float8_e4m3fn:
        return scales.view(torch.uint8)
    return scales


def companion_args(scales, scale_2, device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(uint8 scales, float32 ``[1]`` scale_2 on ``device``) from what a caller
    may pass. A value already in that form is returned as is (no copy, no
    kernel launch); anything that is not a float (an integer tensor, a string)
    is passed through for :func:`check_companions` to refuse by name."""
    scales = scale_bytes(scales)
    if scale_2 is None:
        return scales, None
    if not isinstance(scale_2, torch.Tensor):
        try:
            value = float(scale_2)
        except (TypeError, ValueError):
            return scales, scale_2
        return scales, torch.tensor([value], dtype=torch.float32, device=device)
    if not scale_2.dtype.is_floating_point or scale_2.numel() != 1:
        return scales, scale_2
    if scale_2.dtype != torch.float32 or scale_2.dim() != 1 or (
            device is not None and scale_2.device != torch.device(device)):
        scale_2 = scale_2.to(device=device, dtype=torch.float32).reshape(1)
    return scales, scale_2


def check_companions(scales, scale_2, rows: int, n_in: int, device) -> None:
    """Raise ValueError unless ``scales`` and ``scale_2`` are valid companions
    of ``rows`` packed rows of width ``n_in`` on ``device``. Reads no tensor
    data (fake kernels call it too) and converts nothing: pass the values
    through :func:`companion_args` first to accept float8 or Python numbers."""
    if scales is None or scale_2 is None:
        raise ValueError(f"NVFP4_E2M1 needs both companions: scales (uint8 "
                         f"[{rows}, {n_in // NVFP4_GROUP}]) and scale_2 (float32 [1])")
    if not isinstance(scales, torch.Tensor):
        raise ValueError(f"scales must be a torch.Tensor, got {type(scales).__name__}")
    if scales.dtype not in (torch.uint8, torch.float8_e4m3fn):
        raise ValueError(f"scales must be E4M3FN bytes (uint8 or float8_e4m3fn), got {scales.dtype}")
    if tuple(scales.shape) != (rows, n_in // NVFP4_GROUP):
        raise ValueError(f"scales must have shape {(rows, n_in // NVFP4_GROUP)}, got {tuple(scales.shape)}")
    if not scales.is_contiguous():
        raise ValueError("scales must be contiguous")
    if not isinstance(scale_2, torch.Tensor):
        raise ValueError(f"scale_2 must be a tensor or a Python float, got {type(scale_2).__name__}")
    if scale_2.numel() != 1:
        raise ValueError(f"scale_2 must hold one value, got shape {tuple(scale_2.shape)}")
    if scales.device != torch.device(device):
        raise ValueError(f"scales is on {scales.device} but packed is on {device}")
    if not scale_2.dtype.is_floating_point:
        raise ValueError(f"scale_2 must be a floating-point tensor (read as float32), got {scale_2.dtype}")
