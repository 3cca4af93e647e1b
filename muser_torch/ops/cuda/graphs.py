"""Capture of a step in a CUDA graph (``models/engine.py`` asks for it through
``ops.graph_capture``): the decode step's few hundred kernels replayed by one
launch instead of a Python call each (about 160 us of host time per kernel
eagerly, 49 ms per Gemma token, against about 1 ms of GPU work).

The step reads and writes only static buffers that the engine owns (its token
and slot ids, the model's KV cache and lengths), so a replay computes the next
step of whatever those buffers hold now. Every graph of one engine draws its
intermediate tensors from one memory pool: the engine runs one graph at a time
and reads each output before the next replay.
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = ["capture"]


def capture(fn: Callable[[], torch.Tensor], pool=None, mode: str = "global") -> Callable[[], torch.Tensor]:
    """Record ``fn`` (already run once eagerly, so every kernel is compiled and
    every library handle made) into a CUDA graph; return a function that
    replays it and returns its output tensor (the same tensor every time).

    ``pool`` is a ``torch.cuda.graph_pool_handle()`` shared by the graphs of
    one engine. Recording runs nothing: the caller replays once to compute.

    ``mode`` is CUDA's stream-capture mode: "global" (the decode engine's:
    any thread's unsafe call, a ``cudaMalloc``, fails the capture) or
    "thread_local" (the vision engine's: it records on a request's thread
    while the scheduler's thread keeps decoding and may allocate)."""
    graph = torch.cuda.CUDAGraph()
    torch.cuda.current_stream().synchronize()
    with torch.cuda.graph(graph, pool=pool, capture_error_mode=mode):
        out = fn()

    def replay() -> torch.Tensor:
        graph.replay()
        return out
    replay.graph = graph          # kept alive with the function
    return replay


def new_pool():
    """A memory pool for the graphs of one engine."""
    return torch.cuda.graph_pool_handle()
