"""What a DFlash draft reads of its target: the outputs of some of its layers
during a forward (``Taps``), and the KV caches a verify journals (``caches``)."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from .layer_plan import output_hook

__all__ = ["Taps", "caches"]


class Taps:
    """Records the outputs of ``layers`` of ``target`` during its forwards
    (forward hooks); ``take()`` returns them concatenated, ``[B, T, taps x
    hidden]``, and forgets them."""

    def __init__(self, target: Any, layers: Sequence[int]):
        self.target, self.layers = target, tuple(layers)
        self.seen: dict[int, torch.Tensor] = {}
        self.handles: list = []

    def __enter__(self) -> "Taps":
        for i in sorted(set(self.layers)):
            self.handles.append(self.target.layers[i].register_forward_hook(self._hook(i)))
        return self

    def _hook(self, i: int):
        @output_hook   # reads only the output: a layer runner may call it
        def record(module, args, out):
            self.seen[i] = out
        return record

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def take(self) -> torch.Tensor:
        out = torch.cat([self.seen[i] for i in self.layers], dim=-1)
        self.seen.clear()
        return out


def caches(target: Any) -> list:
    """The target's per-layer KV caches."""
    return [layer.attention.kv_cache for layer in target.layers]
