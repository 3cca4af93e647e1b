"""Greedy DFlash rounds as one recorded step: the draft's block, the target's
verify, the acceptance, the cache's rewind and the draft's new context, all
over static buffers, so that on CUDA a whole round is one graph replay
(``speculative.py`` has the round itself; this is its static-shape form).

What changes from the eager round, so that no decision needs the host:
- the verify always scores the whole block (the anchor and ``block_size - 1``
  candidates); the rows are causal, so cutting the candidates at a stop token
  or at the budget (as the eager round does) is the same as cutting what the
  round keeps, ``keep = min(accepted + 1, first stop + 1, tokens left)``;
- the cache's rewind takes ``keep`` as a device tensor (``KVCache.rewind_on_device``)
  and the draft's context is a ring of static buffers (``Drafter.extend_ring``);
- the round carries ``left`` (the budget) and ``done`` (a stop was kept or the
  budget is spent) on the device; a round after ``done`` keeps nothing and
  changes nothing, so the host can look at round k while round k + 1 runs.

Each round's output, ``[best (B), candidates (B - 1), keep (1)]``, reaches the
host through a pinned copy (behind the next round, for a caller that reads
every round). Sampled rounds, a draft that
is not a ``Drafter`` and targets whose sliding rings are shorter than a block
run the eager round."""
from __future__ import annotations

import weakref
from typing import Iterator, Sequence

import torch

from .. import changes
from .dflash import Drafter, DraftRing
from .engine import record
from .host_copy import HostCopy
from .taps import Taps, caches

__all__ = ["DraftRounds", "cut_at_stop", "draft_rounds"]


class DraftRounds:
    """Recorded greedy rounds of ``draft`` and its target in slot 0."""

    def __init__(self, draft: Drafter, recorder):
        self._draft = weakref.ref(draft)
        self.recorder = self.recorded_by = recorder   # recorder: None once recording failed
        self.captures = 0          # rounds recorded so far (a test reads it)
        self._key: tuple | None = None
        self._calls = 0
        self._replay = None
        self._pool = None
        self.ring: DraftRing | None = None

    @property
    def draft(self) -> Drafter:
        draft = self._draft()
        if draft is None:
            raise ReferenceError("draft rounds: the draft was deleted")
        return draft

    def why_not(self, n_prompt: int, max_new_tokens: int) -> str | None:
        """Why rounds of a ``n_prompt``-token prompt cannot run here (None: they can)."""
        draft = self.draft
        target, block = draft.target, draft.config.block_size
        short = [layer.attention.kv_cache.capacity for layer in target.layers
                 if layer.attention.kv_cache.capacity < block]
        if short:
            return f"a sliding ring of {short[0]} entries is shorter than the draft's block of {block}"
        if n_prompt + max_new_tokens + block - 1 > target.max_seq_len:
            return "the cache has no room for a whole block past the last token"
        return None

    def _capacity(self) -> int:
        c, target = self.draft.config, self.draft.target
        windows = [c.window(i) for i in range(c.n_layers)]
        reach = target.max_seq_len if None in windows else max(windows)
        return reach + c.block_size

    def _state(self) -> tuple:
        lengths = self.draft.target.lengths
        return changes.count(), lengths.data_ptr(), lengths.numel(), self.draft.target.max_seq_len

    def begin(self, tapped: torch.Tensor, anchor: int, left: int, stop: Sequence[int]) -> None:
        """Start a sequence: the prompt's tapped states ``[1, n, taps x hidden]``
        (its n positions are in the target's cache), the last emitted token,
        how many more may be emitted and the stop ids."""
        key = self._state()
        if key != self._key:       # new buffers: every recording is stale
            draft = self.draft
            device = draft.target.lengths.device
            self._key, self._calls, self._replay, self._pool = key, 0, None, None
            self.ring = draft.new_ring(self._capacity())
            self.anchor = torch.zeros(1, dtype=torch.long, device=device)
            self.left = torch.zeros(1, dtype=torch.long, device=device)
            self.done = torch.zeros(1, dtype=torch.bool, device=device)
            self.stop_mask = torch.zeros(draft.config.vocab_size, dtype=torch.bool, device=device)
            self.slot = torch.zeros(1, dtype=torch.long, device=device)
        ring = self.ring
        ring.positions.fill_(-1)
        ring.length.zero_()
        self.draft.extend_ring(ring, tapped, torch.tensor([tapped.shape[1]], device=tapped.device))
        self.anchor.fill_(anchor)
        self.left.fill_(left)
        self.done.fill_(left == 0 or anchor in stop)
        self.stop_mask.zero_()
        if stop:
            self.stop_mask[torch.tensor(sorted(stop), device=self.stop_mask.device)] = True

    def _round(self) -> torch.Tensor:
        draft = self.draft
        target, block = draft.target, draft.config.block_size
        cands = draft.propose_ring(self.ring, self.anchor).argmax(-1)           # [B - 1]
        for cache in caches(target):
            cache.journal = []
        with Taps(target, draft.tap_layers) as taps:
            logits = target(torch.cat((self.anchor, cands))[None], self.slot, checked=False)[0]
            tapped = taps.take()
        best = logits.argmax(-1)                                                 # [B]
        rows = torch.arange(block, device=best.device)
        matched = (cands == best[:-1]).long().cumprod(0).sum(0, keepdim=True)    # [1]
        first_stop = torch.where(self.stop_mask[best], rows + 1, block).amin(0, keepdim=True)
        keep = torch.minimum(torch.minimum(matched + 1, first_stop), self.left)
        keep = torch.where(self.done, 0, keep)
        for cache in caches(target):
            cache.rewind_on_device(keep)
        target.lengths[:1] += keep - block        # the verify advanced it by the whole block
        draft.extend_ring(self.ring, tapped, keep)
        last = best.gather(0, (keep - 1).clamp(min=0))
        self.anchor.copy_(torch.where(keep > 0, last, self.anchor))
        self.left -= keep
        self.done |= ((keep > 0) & self.stop_mask[last]) | (self.left == 0)
        return torch.cat((best, cands, keep))

    def _step(self) -> torch.Tensor:
        self._calls += 1
        if self.recorder is None or self._calls == 1:
            return self._round()   # the first runs eagerly: compiles and warms every kernel
        if self._replay is None:
            self._pool = self.recorder.new_pool()
            self._replay = record(self.recorder, self._round, self._pool, "DFlash rounds")
            if self._replay is None:   # this round and every later one unrecorded
                self.recorder = None
                return self._round()
            self.captures += 1
        return self._replay()

    def rounds(self, left: int, stop: Sequence[int], stats, ahead: bool = False) -> Iterator[list[int]]:
        """Each round's emitted tokens until a stop or ``left`` more, after
        ``begin``. ``ahead``: the host looks at round k while round k + 1
        runs (for a caller that reads to the end: a round in flight when the
        generator is closed would leave tokens in the cache that it never
        yielded)."""
        block, stop_set = self.draft.config.block_size, set(stop)
        pending = None
        while left > 0:
            window = HostCopy(self._step())
            if not ahead:
                pending, window = window, None
            if pending is not None:
                out = pending.tokens().tolist()
                best, cands, keep = out[:block], out[block:2 * block - 1], out[-1]
                stats.proposed.append(cut_at_stop(cands, stop_set))   # as the eager round records them
                stats.accepted.append(keep - 1)
                new, left = best[:keep], left - keep
                yield new
                if new[-1] in stop_set:
                    return      # a round in flight keeps nothing (done is set)
            pending = window


def cut_at_stop(tokens: list[int], stop: set[int]) -> list[int]:
    """``tokens`` up to and including the first stop token."""
    for i, t in enumerate(tokens):
        if t in stop:
            return tokens[:i + 1]
    return tokens


def draft_rounds(draft: Drafter, recorder) -> DraftRounds:
    """``draft``'s recorded rounds (made once, kept on the draft)."""
    rounds = draft.__dict__.get("_draft_rounds")
    if rounds is None or rounds.recorded_by is not recorder:
        rounds = draft.__dict__["_draft_rounds"] = DraftRounds(draft, recorder)
    return rounds
