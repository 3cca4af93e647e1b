"""Prompt prefills recorded per length bucket: one replay instead of a
prompt's few hundred kernel launches.

An eager prefill launches every kernel of every layer from Python, which on
CUDA costs about as much as the GPU's work for a small model (Gemma 3 270M:
a 512-token prefill took 42.7 ms, an eager one-token step 35.2 ms;
docs/performance.md). The engine runs a prompt of T tokens in a bucket of C
tokens, the smallest power of two that holds it (at least ``MIN_BUCKET``);
prompts longer than the largest bucket run in chunks of it, then a bucket for
the rest. A bucket's static buffers hold the tokens (padded with copies of
the last one), the slot and the count of real tokens; its first call runs
eagerly (compiling every kernel), its second records it (``engine.record``),
and every later prompt that falls in the bucket replays it.

What a padded chunk does, and how it is taken back: the tokens are causal,
so the real rows never see the padding, and their logits are the last real
row's (``Decoder.forward``'s ``logits_at``). The padding's keys and values
are written like any others, with the KV caches journaling what each write
overwrote; after the forward every cache takes back the writes past the
real rows (``KVCache.rewind_on_device``, as DFlash's recorded rounds do) and
the slot's length grows by the real count. That is exact when no two rows of
a chunk share a ring entry, so the largest bucket is the shortest ring (a
sliding window) or ``MAX_BUCKET``, whichever is smaller.

The engine takes one sequence without image rows; anything else (a batch of
prompts, a vision prompt, a model without a cache) is the model's own eager
forward, as is every prefill where the backend records nothing (CPU, MPS).
The projections see C rows, not T, so a recorded prefill's logits agree with
the eager one's within the kernels' numerics, not bit for bit.
"""
from __future__ import annotations

import weakref

import torch

from .. import changes
from .engine import record
from .taps import caches

__all__ = ["MIN_BUCKET", "MAX_BUCKET", "PrefillEngine", "prefill_bucket", "prefill_engine"]

MIN_BUCKET = 16
MAX_BUCKET = 512


def prefill_bucket(tokens: int, largest: int) -> int:
    """The bucket a chunk of ``tokens`` tokens runs in, below ``largest``."""
    size = MIN_BUCKET
    while size < tokens:
        size *= 2
    return min(size, largest)


class _Bucket:
    """One chunk length's static buffers and its recording."""

    def __init__(self, size: int, device: torch.device):
        self.size = size
        self.tokens = torch.zeros((1, size), dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.keep = torch.zeros(1, dtype=torch.long, device=device)    # the real tokens
        self.last = torch.zeros(1, dtype=torch.long, device=device)    # keep - 1
        self.calls = 0
        self.replay = None


class PrefillEngine:
    """Prefills of one sequence of ``model`` over static per-bucket buffers.

    ``recorder`` as ``DecodeEngine``'s: the backend's ``graphs`` module, or
    None to run every prefill as the model's eager forward. The tests give the
    CPU a recorder whose recording is the eager function itself."""

    def __init__(self, model: torch.nn.Module, recorder=None):
        self._model = weakref.ref(model)    # the model keeps its engines: no cycle
        self.recorder = self.recorded_by = recorder    # recorder: None once recording failed
        self.captures = 0                   # chunks recorded so far (a test reads it)
        self._buckets: dict[int, _Bucket] = {}
        self._key: tuple | None = None
        self._pool = None

    @property
    def model(self) -> torch.nn.Module:
        model = self._model()
        if model is None:
            raise ReferenceError("prefill engine: its model was deleted")
        return model

    def largest(self) -> int:
        """The largest chunk: no longer than any layer's ring, nor ``MAX_BUCKET``."""
        return min([MAX_BUCKET] + [cache.capacity for cache in caches(self.model)])

    def takes(self, ids: torch.Tensor, embeds=None) -> bool:
        """Whether ``prefill`` records this prompt (else it is the eager forward)."""
        return (self.recorder is not None and embeds is None and ids.dim() == 2 and ids.shape[0] == 1
                and ids.shape[1] > 0 and all(c is not None for c in caches(self.model))
                and self.largest() >= MIN_BUCKET)

    def prefill(self, ids: torch.Tensor, slot: torch.Tensor, embeds=None) -> torch.Tensor:
        """Logits ``[B, 1, vocab]`` of the last prompt position, as
        ``model(ids, slot, last_only=True)`` gives them (and with the cache
        grown the same way): ``ids [B, T]`` continue the cached sequences
        ``slot [B]``. The caller checks room (``check_room``) first."""
        model = self.model
        if not self.takes(ids, embeds):
            return model(ids, slot, last_only=True, embeds=embeds) if embeds is not None else \
                model(ids, slot, last_only=True)
        largest, logits, start = self.largest(), None, 0
        while start < ids.shape[1]:
            n = min(largest, ids.shape[1] - start)
            logits = self._chunk(ids[:, start:start + n], slot, prefill_bucket(n, largest))
            start += n
        return logits

    def _state(self) -> tuple:
        lengths = self.model.lengths
        return changes.count(), lengths.data_ptr(), lengths.numel()

    def _chunk(self, ids: torch.Tensor, slot: torch.Tensor, size: int) -> torch.Tensor:
        key = self._state()
        if key != self._key:        # the model changed: every recording is stale
            self._buckets.clear()
            self._key, self._pool = key, None
        entry = self._buckets.get(size)
        if entry is None:
            entry = self._buckets[size] = _Bucket(size, self.model.lengths.device)
        n = ids.shape[1]
        entry.tokens[:, :n].copy_(ids)
        entry.tokens[:, n:].copy_(ids[:, -1:].expand(1, size - n))
        entry.slot.copy_(slot.reshape(1))
        entry.keep.fill_(n)
        entry.last.fill_(n - 1)
        entry.calls += 1
        if entry.replay is not None:
            return entry.replay()
        if entry.calls == 1 or self.recorder is None:
            return self._forward(entry)   # eager: compiles and warms every kernel the chunk launches
        if self._pool is None:
            self._pool = self.recorder.new_pool()
        entry.replay = record(self.recorder, lambda: self._forward(entry), self._pool, "prompt prefills")
        if entry.replay is None:     # this chunk and every later one unrecorded
            self.recorder, self._pool = None, None
            self._buckets.clear()
            return self._forward(entry)
        self.captures += 1
        return entry.replay()

    def _forward(self, entry: _Bucket) -> torch.Tensor:
        """The padded chunk, then the padding taken back (module docstring)."""
        model = self.model
        for cache in caches(model):
            cache.journal = []
        logits = model(entry.tokens, entry.slot, checked=False, logits_at=entry.last)
        for cache in caches(model):
            cache.rewind_on_device(entry.keep)
        # the forward grew the length by the whole bucket (index ops only: no accumulate,
        # whose CUDA path sorts)
        grown = model.lengths.index_select(0, entry.slot)
        model.lengths.index_copy_(0, entry.slot, grown + entry.keep - entry.size)
        return logits


def prefill_engine(model: torch.nn.Module, recorder=None) -> PrefillEngine:
    """``model``'s prefill engine for ``recorder`` (made once, kept on the model):
    the decode engine's recorder, so that prompts are recorded where steps are
    (``DecodeEngine.recorder``; None: the eager forward)."""
    cached = model.__dict__.setdefault("_prefill_engines", {})
    key = id(recorder)
    if key not in cached or cached[key].recorded_by is not recorder:
        cached[key] = PrefillEngine(model, recorder)
    return cached[key]
