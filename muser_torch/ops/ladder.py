"""The one shape of a backend's qmatmul ladder.

Every backend folder (``cpu/``, ``cuda/``, ``metal/``) holds its ladder as
one table, ``LADDER``: rungs in the order they are tried, each a kernel and
the calls it takes. Each rung has the :class:`Rung` shape, and each backend's
``rung_for(qtype, tokens, dtype)`` returns the first rung of its table that
serves the call (a loop in the backend's own module, so a call never comes
back into it from here), so the tests, the benchmarks and the docs ask every
backend the same question.
What a rung runs (a C function, a Triton launch, a .metal kernel name) stays
the backend's own.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from ..formats.types import GGMLType

__all__ = ["Rung", "takes", "no_rung"]


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


def no_rung(where: str, qtype: GGMLType, tokens: int, dtype: torch.dtype) -> str:
    """The message of a ladder (``where``) without a rung for the call."""
    return (f"{where}: no rung of the ladder runs {GGMLType(qtype).name} at {tokens} tokens "
            f"of {dtype}")
