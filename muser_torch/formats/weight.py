"""``PackedWeight``: one packed matrix and its companions, as every backend takes it.

The ops take a weight as ``(packed, qtype, n_out, n_in, scales, scale_2)``;
``PackedWeight.op_args`` builds that tuple; its companions go through
``companions.companion_args``, the one normaliser of NVFP4 companions.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .companions import companion_args, scale_bytes
from .reference import dequantize_reference
from .types import NEEDS_COMPANIONS, GGMLType


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
        return dequantize_reference(self.packed, self.qtype, self.n_in, **self.companions())
