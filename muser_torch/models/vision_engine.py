"""The vision engine: Muse Glimmer's vision forward (tower, adapter and
projection: ``vision/tower.py``) recorded once per patch grid and replayed,
as the decode engine (``engine.py``) records its one-token step.

A bucket is one exact grid ``(t, h, w)``: every shape in the forward follows
from it (no padding: a padded grid would change the position table's
resampling, the windows and the attention), so each grid is its own bucket.
A bucket owns a static pixel buffer ``[t, h*w, 3*p*p]`` and the grid's plan
(``VisionTower.plan``: the position taps, rotary tables, windows and merge
gather, made on the host once). Where the backend can record
(``ops.graph_capture``: CUDA graphs), a grid's first call runs eagerly
(compiling and warming every kernel), its second records the forward over
the static buffer and every later call copies the pixels in and replays:
one launch for the 50 layers' few thousand kernels. Elsewhere (CPU, MPS)
the engine is the tower's own eager forward.

At most ``MAX_GRIDS`` grids are kept (least recently used first out): each
recording holds its static buffer and the pool's blocks its output lives in,
and a server that sees images of many sizes should not keep one recording
per size forever. Evicting a grid drops its graph; recordings share one
memory pool (one graph runs at a time), so what the pool holds is about one
forward's intermediates plus the kept grids' outputs.

What a recording holds (the weights, the numerics each projection chose) is
fixed when it is recorded, so the engine keeps ``muser_torch.changes``'
count and drops every recording and plan when it moves (``.to()``,
``set_numerics``, any module registration).

The rows a call returns are a copy (the recording's output is overwritten by
the next replay, and callers keep a chat's rows across turns). Calls from
several threads (``serve`` computes each request's rows on the request's
thread) take a lock: they share the buffers. Recording uses CUDA's
thread-local capture mode, so the scheduler's thread may allocate while a
request's thread records."""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable

import torch

from .. import changes
from ..vision import Grid, GridPlan, VisionTower
from .engine import engine_recorder, record

__all__ = ["VisionEngine", "vision_engine", "MAX_GRIDS", "engine_choice"]

MAX_GRIDS = 4   # grids kept recorded at once (an image size each; a video's grid counts its groups)


class _Bucket:
    """One grid's static pixel buffer, plan and recorded forward."""

    def __init__(self, tower: VisionTower, grid: Grid, device: torch.device):
        cfg = tower.config
        self.grid = grid
        self.pixels = torch.zeros((grid.t, grid.h * grid.w, cfg.patch_pixels), dtype=torch.float32,
                                  device=device)
        self.plan: GridPlan = tower.plan(grid)
        self.calls = 0
        self.replay: Callable[[], torch.Tensor] | None = None


class VisionEngine:
    """The vision forward of ``tower`` per grid.

    ``recorder`` is the backend's ``graphs`` module (``capture(fn, pool,
    mode=...)``, ``new_pool()``), or None to run every call as the tower's
    eager forward. The tests give the CPU a recorder whose recording is the
    eager function itself, to run the buckets' logic there."""

    def __init__(self, tower: VisionTower, recorder: Any = None, max_grids: int = MAX_GRIDS):
        if max_grids < 1:
            raise ValueError(f"vision engine: max_grids must be >= 1, got {max_grids}")
        # weak: the tower keeps its engines (vision_engine); a cycle would keep a
        # dropped tower (and the file it maps) alive until the garbage collector runs
        self._tower = weakref.ref(tower)
        self.recorder = recorder
        self.max_grids = max_grids
        self.captures = 0           # forwards recorded so far (a test reads it)
        self.evictions = 0          # grids dropped to stay within max_grids
        self._buckets: OrderedDict[Grid, _Bucket] = OrderedDict()
        self._key: tuple | None = None
        self._pool = None
        self._lock = threading.Lock()

    @property
    def tower(self) -> VisionTower:
        tower = self._tower()
        if tower is None:
            raise ReferenceError("vision engine: its tower was deleted")
        return tower

    @property
    def records(self) -> bool:
        """Whether forwards are recorded and replayed (else run eagerly)."""
        return self.recorder is not None

    @property
    def grids(self) -> list[Grid]:
        """The grids held now, least recently used first."""
        return list(self._buckets)

    def _device(self) -> torch.device:
        return self.tower.inv_freq.device

    def _bucket(self, grid: Grid) -> _Bucket:
        key = (changes.count(), self._device())
        if key != self._key:        # the tower changed: every recording and plan is stale
            self._buckets.clear()
            self._pool = None
            self._key = key
        entry = self._buckets.get(grid)
        if entry is not None:
            self._buckets.move_to_end(grid)
            return entry
        while len(self._buckets) >= self.max_grids:
            self._buckets.popitem(last=False)
            self.evictions += 1
        entry = self._buckets[grid] = _Bucket(self.tower, grid, self._device())
        return entry

    def rows(self, pixels: torch.Tensor, grid: Grid) -> torch.Tensor:
        """``tower(pixels, grid)``: embedding rows ``[grid.rows(merge), text_hidden]``
        of ``pixels`` ``[t, h*w, 3*p*p]`` (on any device), a tensor of the
        caller's own."""
        if self.recorder is None:
            return self.tower(pixels.to(self._device()), grid)
        want = (grid.t, grid.h * grid.w, self.tower.config.patch_pixels)
        if tuple(pixels.shape) != want:
            raise ValueError(f"vision engine: pixels of shape {tuple(pixels.shape)} for grid "
                             f"{grid}; expected {want}")
        with self._lock:
            entry = self._bucket(grid)
            entry.pixels.copy_(pixels)
            return self._run(entry).clone()

    def _run(self, entry: _Bucket) -> torch.Tensor:
        tower = self.tower

        def forward() -> torch.Tensor:
            return tower.run(entry.pixels, entry.plan)
        entry.calls += 1
        if entry.replay is not None:
            return entry.replay()
        if entry.calls == 1:
            return forward()        # eager: compiles and warms every kernel the forward launches
        if self._pool is None:
            self._pool = self.recorder.new_pool()
        entry.replay = record(self.recorder, forward, self._pool, "vision forwards", mode="thread_local")
        if entry.replay is None:    # this forward and every later one unrecorded
            self.recorder, self._pool = None, None
            self._buckets.clear()
            return forward()
        self.captures += 1
        return entry.replay()


def engine_choice(engine: Any) -> str:
    """The vision engine's word for a decode ``engine`` argument: a word as
    it is; a ``DecodeEngine`` (``generate(engine=...)``) "auto" where it
    records and "eager" where it does not."""
    if isinstance(engine, str):
        return engine
    return "auto" if getattr(engine, "records", False) else "eager"


def vision_engine(tower: VisionTower, engine: "str | VisionEngine" = "auto") -> VisionEngine:
    """``tower``'s engine (made once per kind, kept on the tower), chosen as
    ``decode_engine`` chooses: ``"auto"`` records where the backend can
    (CUDA), ``"graph"`` insists on it (a ``ValueError`` elsewhere),
    ``"eager"`` never records; a ``VisionEngine`` of ``tower`` is used as it is."""
    if isinstance(engine, VisionEngine):
        if engine.tower is not tower:
            raise ValueError("engine: a VisionEngine runs the tower it was made for, not this one")
        return engine
    recorder = engine_recorder(engine, tower.inv_freq.device, "a vision forward")
    kind = "graph" if recorder is not None else "eager"
    cached = tower.__dict__.setdefault("_vision_engines", {})
    if kind not in cached:
        cached[kind] = VisionEngine(tower, recorder)
    return cached[kind]
