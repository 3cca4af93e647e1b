"""Timing on CUDA for the benchmarks (docs/performance.md says why this way).

Every op is captured in a CUDA graph that calls it once for each of several
copies of its weights (>= ``ROTATE_BYTES`` in all, so nothing is served from
the 50 MB L2), and the graph's replays are timed with CUDA events: time per
call = replay time / calls. That is the cost inside a decode graph, without
Python's ~0.2 ms per eager call. The device's read bandwidth is a ``sum``
over 1 GiB buffers, timed the same way.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

ROTATE_BYTES = 512 << 20


def copies_for(nbytes: int, at_most: int | None = None) -> int:
    """How many copies of ``nbytes`` overflow the L2 when read in turn."""
    n = max(1, math.ceil(ROTATE_BYTES / nbytes))
    return n if at_most is None else min(at_most, n)


def graph_time(fns: Sequence[Callable[[], object]], reps: int = 20) -> float:
    """Seconds per call of the callables ``fns`` captured once each in one CUDA
    graph, replayed ``reps`` times (median of 5 timings)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:            # warm up: compile, allocate
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / reps / len(fns))
    del g
    return sorted(times)[2]


def event_time(fn: Callable[[], object], reps: int = 10) -> float:
    """Seconds per eager call of ``fn`` (after one warm-up call), CUDA events."""
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3 / reps


def read_bandwidth() -> float:
    """Bytes per second of ``sum`` over 1 GiB of int64 (two buffers, in a graph)."""
    bufs = [torch.ones((1 << 30) // 8, dtype=torch.int64, device="cuda") for _ in range(2)]
    t = graph_time([lambda b=b: b.sum() for b in bufs], reps=10)
    del bufs
    return (1 << 30) / t


def copy_bandwidth() -> float:
    """Bytes per second of ``copy_`` of 1 GiB, read + write."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").fill_(1)
    b = torch.empty_like(a)
    t = graph_time([lambda: b.copy_(a)], reps=10)
    return 2 * (1 << 30) / t
