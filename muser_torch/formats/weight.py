"""``PackedWeight``: one packed matrix and its companions, as every backend takes it.

The ops take a weight as ``(packed, qtype, n_out, n_in, scales, scale_2)``;
``PackedWeight.op_args`` builds that tuple, and :func:`companion_args` is the
one place that turns the companions users hand in (float8 scales, a Python
float ``scale_2``) into what the kernels read (uint8 E4M3 bytes, float32 [1]).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .types import NEEDS_COMPANIONS, GGMLType


def scale_bytes(scales):
    """E4M3 scales as the uint8 bytes the kernels read (float8_e4m3fn is re-viewed)."""
    if isinstance(scales, torch.Tensor) and scales.dtype == torch.float8_e4m3fn:
        return scales.view(torch.uint8)
    return scales


def companion_args(scales, scale_2, device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(uint8 scales, float32 ``[1]`` scale_2) from what a caller may pass:
    float8_e4m3fn or uint8 scales, a tensor or a Python number for scale_2.
    Anything else is passed through for the argument checks to refuse."""
    scales = scale_bytes(scales)
    if scale_2 is not None and not isinstance(scale_2, torch.Tensor):
        scale_2 = torch.tensor([float(scale_2)], dtype=torch.float32, device=device)
    return scales, scale_2


@dataclass(frozen=True)
class PackedWeight:
    """A weight as the ops take it: packed rows plus, for a type with
    companions (NVFP4_E2M1), ``scales`` (E4M3FN, uint8 or float8_e4m3fn,
    ``[n_out, n_in/16]``) and
    ``scale_2`` (float32 ``[1]``). ``packed`` of a loaded file views its
    read-only memory map."""

    name: str
    qtype: GGMLType
    n_out: int
    n_in: int
    packed: torch.Tensor
    scales: torch.Tensor | None = None
    scale_2: torch.Tensor | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "qtype", GGMLType.parse(self.qtype))
        _, scale_2 = companion_args(None, self.scale_2, self.packed.device)
        object.__setattr__(self, "scale_2", scale_2)

    @property
    def has_companions(self) -> bool:
        return self.qtype in NEEDS_COMPANIONS

    def op_args(self) -> tuple:
        """``(packed, qtype id, n_out, n_in, scales, scale_2)`` for ``torch.ops.muser.*``."""
        return (self.packed, int(self.qtype), self.n_out, self.n_in, scale_bytes(self.scales),
                self.scale_2)

    def companions(self) -> dict[str, torch.Tensor]:
        """``{"scales": ..., "scale_2": ...}`` for keyword calls (empty without companions)."""
        return {"scales": self.scales, "scale_2": self.scale_2} if self.has_companions else {}

    def to(self, device: torch.device | str) -> "PackedWeight":
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return PackedWeight(self.name, self.qtype, self.n_out, self.n_in, move(self.packed),
                            move(self.scales), move(self.scale_2))

    def dequantize(self) -> torch.Tensor:
        """float32 ``[n_out, n_in]`` (the vectorized reference; for checks and norms)."""
        from . import dequantize_reference
        return dequantize_reference(self.packed, self.qtype, self.n_in, **self.companions())
