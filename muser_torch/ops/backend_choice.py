"""Which backend runs the ops on CPU tensors: the CPU kernels ("native"), or
the .metal kernels through the emulator ("metal-emulator", the only evidence
for them on a machine without a Mac). Chosen explicitly with
:func:`use_backend`, never by an environment variable."""
from __future__ import annotations

import contextlib

__all__ = ["CPU_BACKENDS", "use_backend", "chosen_backend"]

CPU_BACKENDS = ("native", "metal-emulator")
_chosen = "native"


@contextlib.contextmanager
def use_backend(name: str):
    """Within the block, the ops run CPU tensors on backend ``name`` (one of
    ``CPU_BACKENDS``); ``"metal-emulator"`` runs ops/metal's kernels."""
    global _chosen
    if name not in CPU_BACKENDS:
        raise ValueError(f"use_backend: unknown backend {name!r}; expected one of {CPU_BACKENDS}")
    old, _chosen = _chosen, name
    try:
        yield
    finally:
        _chosen = old


def chosen_backend() -> str:
    """The CPU backend ``use_backend`` selected ("native" outside any block)."""
    return _chosen

