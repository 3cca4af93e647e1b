"""The one shape of a backend's qmatmul ladder.

Every backend folder (``cpu/``, ``cuda/``, ``metal/``) holds its ladder as
one table, ``LADDER``: rungs in the order they are tried, each a kernel and
the calls it takes. Each rung has the :class:`Rung` shape, and each backend's
``rung_for(qtype, tokens, dtype)`` is :func:`first_rung` over its table, so
the tests, the benchmarks and the docs ask every backend the same question.
What a rung runs (a C function, a Triton launch, a .metal kernel name) stays
the backend's own.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch

from ..formats.types import GGMLType

__all__ = ["Rung", "first_rung", "takes"]


@runtime_checkable
class Rung(Protocol):
    """One rung of a backend's qmatmul ladder."""
    name: str
    max_tokens: int | None      # the most activation rows it takes (None: any)

    def serves(self, qtype: GGMLType, tokens: int, dtype: torch.dtype) -> bool:
        """Whether it runs ``tokens`` activation rows of ``dtype`` against a
        ``qtype`` weight."""
        ...


def takes(max_tokens: int | None, tokens: int) -> bool:
    """Whether a rung whose top is ``max_tokens`` takes ``tokens`` rows."""
    return max_tokens is None or tokens <= max_tokens


def first_rung(ladder: Sequence[Rung], qtype: GGMLType, tokens: int, dtype: torch.dtype,
               where: str) -> Rung:
    """The first rung of ``ladder`` that serves the call; ValueError naming
    ``where`` (the backend) when none does."""
    for rung in ladder:
        if rung.serves(qtype, tokens, dtype):
            return rung
    raise ValueError(f"{where}: no rung of the ladder runs {GGMLType(qtype).name} at {tokens} "
                     f"tokens of {dtype}")
