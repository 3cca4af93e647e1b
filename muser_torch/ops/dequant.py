"""``muser_torch.dequantize``: packed rows to float32 on the fastest kernel at hand.

It lives with the ops because it picks a backend's kernel; the reference it
is held to, ``formats.reference.dequantize_reference``, stays in the formats layer.
"""
from __future__ import annotations

import torch

from ..formats.reference import dequantize_reference, rows_args
from ..formats.types import GGMLType
from . import backend, cpu

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

    CPU tensors go to the native kernel (``muser_torch/ops/cpu/``), which
    decodes straight into the output, CUDA tensors of the types it covers to
    the Triton kernel (``muser_torch/ops/cuda/``); both are held
    to gguf bit for bit by the tests. MPS, ``torch.compile`` graphs, and
    machines without a C compiler or Triton get :func:`dequantize_reference`.

    ``out``: a contiguous float32 ``[rows, n_in]`` on packed's device to write
    into, returned. Worth passing when dequantizing tensor after tensor: a
    fresh 100 MB output costs the kernel's zero-filling of its pages, about as
    long as the decode itself."""
    qtype, scales, scale_2 = rows_args(packed, qtype, n_in, scales, scale_2)
    rows = packed.shape[0]
    if out is not None:
        check_out(out, rows, n_in, packed.device)
    w = None
    if not torch.compiler.is_compiling():
        if packed.device.type == "cpu":
            return cpu.dequantize_rows(packed, qtype, n_in, scales, scale_2, out=out)
        kernels = backend("cuda") if packed.device.type == "cuda" else None
        if kernels is not None and qtype in kernels.SUPPORTED:
            w = kernels.dequantize(packed, int(qtype), rows, n_in, scales, scale_2)
    if w is None:
        w = dequantize_reference(packed, qtype, n_in, scales=scales, scale_2=scale_2)
    return w if out is None else out.copy_(w)
