"""The decode engine: the one-token step that every generation path runs
(``Generation.stream`` and ``generate``, ``run``, ``serve``'s batched slots).

A step reads its inputs from static buffers that the engine owns: ``[b, 1]``
token ids and ``[b]`` slot ids for each batch size b it runs. A batch of B
rows runs in the smallest power of two that holds it, its extra rows copies
of its first row (the same token into the same slot at the same position:
they write what that row writes, and touch no other slot); a B for which
that power would reach the cache's slot count runs as it is (a batch of every
slot takes ``Decoder.forward``'s in-place path, which needs distinct slots).
Where the backend can record a step (``ops.graph_capture``: CUDA graphs), a
bucket's first call runs eagerly (compiling and warming every kernel), its
second records the step and every call replays it: one launch for the whole
step. Elsewhere (CPU, MPS) the engine is the model's own eager forward.
A step that cannot be recorded says why (a ``RuntimeWarning``) and runs
eagerly, as every later step does.

What a recorded step holds (the cache tensors, the weights, the numerics each
projection chose) is fixed when it is recorded, so the engine keeps a key of
the model's state and drops every recording when it changes: any module
registration or ``_apply`` (``.to()``, ``setup_cache``, ``set_numerics``:
``muser_torch.changes``) or a new ``lengths`` tensor.

A step's logits are the engine's buffer: read (sample) them before the next step.
"""
from __future__ import annotations

import warnings
import weakref
from typing import Callable, Sequence

import torch

from .. import changes, ops

__all__ = ["DecodeEngine", "ENGINES", "decode_engine", "engine_recorder", "record", "bucket"]

ENGINES = ("auto", "graph", "eager")


def bucket(rows: int, n_slots: int) -> int:
    """The batch size a step of ``rows`` rows runs at in a cache of ``n_slots``."""
    size = 1
    while size < rows:
        size *= 2
    return size if size < n_slots else rows


class _Bucket:
    """One batch size's static buffers and its recorded step."""

    def __init__(self, size: int, device: torch.device):
        self.size = size
        self.tokens = torch.zeros((size, 1), dtype=torch.long, device=device)
        self.slots = torch.zeros(size, dtype=torch.long, device=device)
        self.slot_ids: list[int] | None = None   # the rows' slots in self.slots now
        self.calls = 0
        self.replay: Callable[[], torch.Tensor] | None = None


class DecodeEngine:
    """One-token steps of ``model`` over static per-bucket buffers.

    ``recorder`` is the backend's ``graphs`` module (``capture(fn, pool)``,
    ``new_pool()``), or None to run every step as the model's eager forward
    of the rows as given. The tests give the CPU a recorder whose recording
    is the eager function itself, to run the buckets' logic there."""

    def __init__(self, model: torch.nn.Module, recorder=None):
        # a weak reference: the model keeps its engines (decode_engine), and a
        # cycle would keep a deleted model, and the file it maps, alive until
        # the garbage collector runs
        self._model = weakref.ref(model)
        self.recorder = recorder
        self.captures = 0          # steps recorded so far (a test reads it)
        self._buckets: dict[int, _Bucket] = {}
        self._key: tuple | None = None
        self._pool = None
        self._eager_ids: list[int] | None = None
        self._eager_slots: torch.Tensor | None = None

    @property
    def model(self) -> torch.nn.Module:
        model = self._model()
        if model is None:
            raise ReferenceError("decode engine: its model was deleted")
        return model

    @property
    def records(self) -> bool:
        """Whether steps are recorded and replayed (else run eagerly)."""
        return self.recorder is not None

    def _state(self) -> tuple:
        lengths = self.model.lengths
        return changes.count(), lengths.data_ptr(), lengths.numel()

    def _bucket(self, rows: int) -> _Bucket:
        key = self._state()
        if key != self._key:        # the model changed: every recording is stale
            self._buckets.clear()
            self._key = key
            self._pool = None
        size = bucket(rows, self.model.lengths.numel())
        entry = self._buckets.get(size)
        if entry is None:
            entry = self._buckets[size] = _Bucket(size, self.model.lengths.device)
        return entry

    def step(self, tokens: torch.Tensor, slots: Sequence[int]) -> torch.Tensor:
        """Logits ``[B, 1, vocab]`` of one new token per row, as
        ``model(tokens, slots)`` gives them: ``tokens [B, 1]`` (or ``[B]``) on
        the model's device continue the cached sequences ``slots`` (B distinct
        ids, a list), each of which grows by one. The caller checks room
        (``check_room``) before a run of steps."""
        slots = [int(s) for s in slots]
        rows = len(slots)
        n_slots = self.model.lengths.numel()
        if rows == 0 or rows > n_slots:
            raise ValueError(f"decode step: need 1 to {n_slots} slots (the cache's), got {rows}")
        if self.recorder is None:   # eager: the rows as they are, no padding
            if slots != self._eager_ids:
                self._eager_slots = torch.tensor(slots, dtype=torch.long, device=tokens.device)
                self._eager_ids = slots
            return self.model(tokens.reshape(rows, 1), self._eager_slots)
        entry = self._bucket(rows)
        if slots != entry.slot_ids:
            padded = slots + slots[:1] * (entry.size - rows)
            entry.slots.copy_(torch.tensor(padded, dtype=torch.long))
            entry.slot_ids = slots
        entry.tokens[:rows].copy_(tokens.reshape(rows, 1))
        if entry.size > rows:       # padding rows repeat the first row
            entry.tokens[rows:].copy_(entry.tokens[:1].expand(entry.size - rows, 1))
        return self._run(entry)[:rows]

    def _run(self, entry: _Bucket) -> torch.Tensor:
        def forward() -> torch.Tensor:
            return self.model(entry.tokens, entry.slots, checked=False)
        entry.calls += 1
        if entry.replay is not None:
            return entry.replay()
        if entry.calls == 1:
            return forward()        # eager: compiles and warms every kernel the step launches
        if self._pool is None:
            self._pool = self.recorder.new_pool()
        entry.replay = record(self.recorder, forward, self._pool, "decode steps")
        if entry.replay is None:    # this step and every later one unrecorded
            self.recorder, self._pool = None, None
            self._buckets.clear()
            return forward()
        self.captures += 1
        return entry.replay()


def record(recorder, fn: Callable[[], torch.Tensor], pool, what: str, **how) -> Callable | None:
    """``recorder.capture(fn, pool, **how)``: the replay of ``fn`` recorded;
    or None, after a ``RuntimeWarning`` that ``what`` (a plural: "decode
    steps") could not be recorded and why. A recording computes nothing, so
    the caller's state is as before: it runs ``fn`` eagerly, and from then on
    unrecorded (slower, the same results). The one rule for the decode
    engine, DFlash's rounds and the vision engine."""
    try:
        return recorder.capture(fn, pool, **how)
    except Exception as err:   # noqa: BLE001 -- any failure to record: said, then unrecorded
        warnings.warn(f"{what} could not be recorded as a CUDA graph "
                      f"({type(err).__name__}: {err}); they run unrecorded",
                      RuntimeWarning, stacklevel=4)
        return None


def engine_recorder(engine: str, device: torch.device, what: str):
    """The backend's recorder (``ops.graph_capture``) that an ``engine`` word
    asks for on ``device``, or None to run eagerly: ``"auto"`` records where
    the backend can (CUDA), ``"graph"`` insists on it (a ``ValueError``
    naming ``what`` elsewhere), ``"eager"`` never records."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    recorder = None if engine == "eager" else ops.graph_capture(device.type)
    if engine == "graph" and recorder is None:
        raise ValueError(f"engine='graph': {what} on {device.type} cannot be recorded "
                         f"(CUDA graphs need a CUDA model); use engine='eager' or 'auto'")
    return recorder


def decode_engine(model: torch.nn.Module, engine: "str | DecodeEngine" = "auto") -> DecodeEngine:
    """``model``'s engine (made once, kept on the model): ``"auto"`` records
    steps where the backend can (CUDA), ``"graph"`` insists on it (a
    ``ValueError`` elsewhere), ``"eager"`` never records; a ``DecodeEngine``
    of ``model`` is used as it is."""
    if isinstance(engine, DecodeEngine):
        if engine.model is not model:
            raise ValueError("engine: a DecodeEngine runs the model it was made for, not this one")
        return engine
    recorder = engine_recorder(engine, model.lengths.device, "steps")
    cached = model.__dict__.get("_decode_engines", {})
    model.__dict__["_decode_engines"] = cached
    kind = "graph" if recorder is not None else "eager"
    if kind not in cached:
        cached[kind] = DecodeEngine(model, recorder)
    return cached[kind]
