"""The batching scheduler: one background thread owns the model and its
multi-slot KV cache, and every request is a ``Job`` queued to it.

Each turn of the loop, in order:

1. jobs cancelled since the last turn (their client went away) leave: a
   waiting one is dropped, a running one frees its slot, so a slot is free
   again within one step of the cancel;
2. waiting jobs take the free slots, first come first served; each is
   prefilled alone (its prompt in one forward into its slot) and its first
   token sampled;
3. every running job that already has a token to feed decodes together:
   one forward of ``[B, 1]`` tokens over their ``B`` slots, then each job
   samples from its own row (``TokenPicker``) and checks its own stops.

At most ``queue`` jobs wait; ``submit`` refuses more (``QueueFull``), so
memory does not grow with the number of clients. Events go to a job's
``sink`` from the scheduler thread: ``Piece`` as text settles, then one
``Finish`` (or ``Failure``). A job ends on the tokenizer's stop ids (end of
text, end of turn), on a stop string, at ``max_tokens`` or when its slot's
context is full.

With a DFlash draft (``draft=``, one slot) a job decodes in speculative
rounds (``models/speculative.py``) instead of single steps: each turn runs
one round and handles its emitted tokens one by one, exactly as the plain
loop handles a sampled token.
"""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from ..models.engine import decode_engine
from ..models.speculative import speculative_rounds
from ..text.stream import TextStream
from .sampling import SamplingParams, StopStrings, TokenLogprob, TokenPicker

__all__ = ["Failure", "Finish", "Job", "Piece", "QueueFull", "Scheduler"]


class QueueFull(RuntimeError):
    """Every slot is taken and ``queue`` jobs already wait."""


@dataclass(frozen=True)
class Piece:
    """Text released since the last event (may be empty) and the tokens
    sampled since then, with their logprobs when asked."""
    text: str
    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Finish:
    """``reason``: "stop" (a stop token or string) or "length" (``max_tokens``
    or the context). ``completion_tokens`` counts every sampled token, the
    stop token included."""
    reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0     # of the prompt, reused from the slot's cache


@dataclass(frozen=True)
class Failure:
    message: str


Event = Piece | Finish | Failure


@dataclass(eq=False)
class Job:
    """One request: ``prompt`` ids, how to sample, where its events go, and
    extra stop token ids beyond the tokenizer's."""
    prompt: Sequence[int]
    params: SamplingParams
    sink: Callable[[Event], Any]
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    # scheduler-side state, touched only by the scheduler thread
    slot: int = -1
    cached: int = 0          # prompt tokens the slot's cache already held
    generated: int = 0
    limit: int = 0
    last: int = -1
    picker: TokenPicker | None = None
    text: TextStream | None = None
    stops: StopStrings | None = None
    rounds: Iterator[list[int]] | None = None     # with a draft: the job's speculative rounds
    constraint: Any = None       # a grammar.Constraint: the response's JSON schema
    # image rows for the prompt's placeholders: Decoder.forward's (mask [1, T], rows)
    embeds: "tuple[torch.Tensor, torch.Tensor] | None" = None

    def cancel(self) -> None:
        """The client is gone: the job leaves at the scheduler's next turn."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


@dataclass
class Stats:
    """Counters of the loop: decode steps run, the largest batch one step
    decoded, jobs finished and cancelled."""
    steps: int = 0
    max_batch: int = 0
    finished: int = 0
    cancelled: int = 0


class Scheduler:
    """Decodes queued jobs over ``slots`` cache slots of ``context`` tokens
    each. ``start`` runs the loop on its thread; ``stop`` ends it and fails
    whatever is left."""

    def __init__(self, model: Any, slots: int, queue: int, context: int, draft: Any = None,
                 engine: str = "auto") -> None:
        if slots < 1 or queue < 0:
            raise ValueError(f"need slots >= 1 and queue >= 0, got {slots} and {queue}")
        if draft is not None and slots != 1:
            raise ValueError(f"a draft decodes one request at a time (its rounds verify blocks in "
                             f"one slot): need 1 slot, got {slots}")
        self.model = model
        self.draft = draft
        self.tokenizer = model.tokenizer
        self.stop_ids = frozenset(self.tokenizer.stop_ids)
        self.context = min(context, model.config.context_length)
        self.slots = slots
        self.queue = queue
        self.device = model.lengths.device
        model.setup_cache(slots, self.context)
        # the batched one-token steps: on CUDA, replayed CUDA graphs per batch bucket
        self.engine = decode_engine(model, engine)
        self.engine_name = engine   # the image rows' vision forward follows it (prompts.visual_prompt)
        self.stats = Stats()
        self._waiting: collections.deque[Job] = collections.deque()
        self._running: dict[int, Job] = {}          # slot -> job
        self._free = list(range(slots))
        # the token ids each slot's cache holds, in order (what a new prompt may reuse);
        # a slot whose cache is in doubt (a failed step, a draft's rounds) holds []
        self._held: list[list[int]] = [[] for _ in range(slots)]
        # placeholder ids: a cached prefix ends before the first (two images share their ids)
        ids = model.placeholder_ids() if hasattr(model, "placeholder_ids") else ()
        self._barriers = frozenset(i for i in ids if i is not None)
        self._lock = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    # -- the client side (any thread) --------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue ``job``; ``QueueFull`` when ``queue`` jobs already wait. The
        prompt must leave room for one new token in the context."""
        if not 0 < len(job.prompt) < self.context:
            raise ValueError(f"a prompt of {len(job.prompt)} tokens does not fit a slot's "
                             f"context of {self.context} with room for one new token")
        with self._lock:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            if len(self._waiting) >= self.queue:
                raise QueueFull(f"all {self.slots} slots are busy and {self.queue} requests "
                                f"already wait")
            self._waiting.append(job)
            self._lock.notify()

    def load(self) -> dict[str, int]:
        """Slots idle and busy, and jobs waiting, at this moment."""
        with self._lock:
            return {"slots_idle": len(self._free), "slots_processing": len(self._running),
                    "queued": len(self._waiting)}

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="muser-serve-decode",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify()
        if self._thread is not None:
            self._thread.join()
        for job in [*self._waiting, *self._running.values()]:
            _send(job, Failure("the server shut down"))
            _close_rounds(job)
        self._waiting.clear()
        self._running.clear()

    # -- the loop (the scheduler thread) -----------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._stopping and not self._waiting and not self._running:
                    self._lock.wait()
                if self._stopping:
                    return
                self._drop_cancelled()
                admitted = []
                while self._waiting and self._free:
                    job = self._waiting.popleft()
                    job.slot = self._free.pop(self._best_slot(job.prompt))
                    self._running[job.slot] = job
                    admitted.append(job)
            with torch.no_grad():
                for job in admitted:
                    self._guarded(self._prefill, [job], job)
                self._guarded(self._decode, list(self._running.values()))

    def _best_slot(self, prompt: Sequence[int]) -> int:
        """The index in ``_free`` of the free slot whose cache can give ``prompt``
        the longest prefix (the first free one when none can)."""
        # caller holds the lock
        reuse = [self._reusable(slot, prompt) for slot in self._free]
        return max(range(len(reuse)), key=lambda i: (reuse[i], -i))

    def _reusable(self, slot: int, prompt: Sequence[int]) -> int:
        """Leading tokens of ``prompt`` the slot's cache holds and may keep (one
        token at least is left to prefill: its logits pick the first new token)."""
        held = self._held[slot]
        if self.draft is not None or not held:
            return 0
        common = 0
        for a, b in zip(held, prompt[:len(prompt) - 1]):
            if a != b or a in self._barriers:
                break
            common += 1
        return self.model.reusable(len(held), common)

    def _guarded(self, work: Callable, jobs: list[Job], *args: Any) -> None:
        """Run ``work(*args)``; if the model fails, fail ``jobs`` (free their
        slots) and keep serving the others."""
        try:
            work(*args)
        except Exception as e:  # noqa: BLE001
            failure = Failure(f"decoding failed: {type(e).__name__}: {e}")
            with self._lock:
                for job in jobs:
                    self._held[job.slot] = []     # what the failed step wrote is unknown
                    if self._running.get(job.slot) is job:
                        self._end(job, failure)

    def _drop_cancelled(self) -> None:
        # caller holds the lock
        for job in [j for j in self._waiting if j.cancelled]:
            self._waiting.remove(job)
            self.stats.cancelled += 1
        for job in [j for j in self._running.values() if j.cancelled]:
            self._release(job)
            self.stats.cancelled += 1

    def _prefill(self, job: Job) -> None:
        job.picker = TokenPicker(job.params, self.device)
        job.text = TextStream(self.tokenizer)
        job.stops = StopStrings(job.params.stop)
        room = self.context - len(job.prompt)
        job.limit = room if job.params.max_tokens is None else min(job.params.max_tokens, room)
        slot = torch.tensor([job.slot], device=self.device)
        job.cached = self._reusable(job.slot, job.prompt)
        self._held[job.slot] = []
        self.model.keep(job.slot, job.cached)     # 0: the slot starts over
        ids = torch.tensor([list(job.prompt)], dtype=torch.long, device=self.device)
        if self.draft is not None:
            p = job.params
            job.rounds = speculative_rounds(self.model, self.draft, ids, job.limit, p.temperature,
                                            p.top_k, p.top_p if p.top_p < 1 else None,
                                            int(job.picker.generator.initial_seed()),
                                            sorted(self.stop_ids), grammar=job.constraint,
                                            embeds=job.embeds)   # cached is 0 with a draft
            self._round(job)
            return
        if job.embeds is None:
            logits = self.model(ids[:, job.cached:], slot, last_only=True)[:, -1]
        else:   # no placeholder lies in the cached prefix (_reusable): every row comes after it
            mask, rows = job.embeds
            logits = self.model(ids[:, job.cached:], slot, last_only=True,
                                embeds=(mask[:, job.cached:], rows))[:, -1]
        self._held[job.slot] = list(job.prompt)
        self._advance(job, logits)

    def _round(self, job: Job) -> None:
        """One speculative round of ``job``: its tokens, each handled as a sampled one."""
        self.stats.steps += 1
        self.stats.max_batch = 1
        tokens = next(job.rounds, None)
        if tokens is None:     # the rounds ended on their own budget (the job's limit)
            self._finish(job, "length", Piece(self._tail(job)[0], ()))
            return
        for token in tokens:
            if not self._take(job, token):
                break

    def _decode(self) -> None:
        jobs = [j for j in self._running.values() if j.last >= 0]
        if not jobs:
            return
        if self.draft is not None:
            for job in jobs:
                self._round(job)
            return
        tokens = torch.tensor([j.last for j in jobs], dtype=torch.long, device=self.device)
        logits = self.engine.step(tokens, [j.slot for j in jobs])[:, -1]
        for job in jobs:
            self._held[job.slot].append(job.last)
        self.stats.steps += 1
        self.stats.max_batch = max(self.stats.max_batch, len(jobs))
        # each job draws from its own row with its own generator, on the device;
        # the batch's tokens then reach the host in one copy
        picked = torch.cat([j.picker.draw(_allowed(j, logits[i:i + 1]))
                            for i, j in enumerate(jobs)]).tolist()
        for i, job in enumerate(jobs):
            self._take(job, picked[i], logits[i:i + 1])

    def _advance(self, job: Job, logits: torch.Tensor) -> None:
        """Sample ``job``'s next token from its row and act on it."""
        token = job.picker.pick(_allowed(job, logits))
        self._take(job, token, logits)

    def _take(self, job: Job, token: int, logits: torch.Tensor | None = None) -> bool:
        """Act on ``job``'s next token (``logits``: its row, for logprobs);
        False when the job ended."""
        job.generated += 1
        if token in self.stop_ids:     # (a complete schema allows only these)
            self._finish(job, "stop", Piece(self._tail(job)[0], (token,)))
            return False
        if job.constraint is not None:
            job.constraint.take(token)
        logprobs = (job.picker.logprob(logits, token),) \
            if job.params.logprobs and logits is not None else ()
        text, hit = job.stops.feed(job.text.push(token))
        if not hit and job.generated >= job.limit:
            tail, hit = self._tail(job)
            text += tail
        if hit or job.generated >= job.limit:
            self._finish(job, "stop" if hit else "length", Piece(text, (token,), logprobs))
            return False
        job.last = token
        if not _send(job, Piece(text, (token,), logprobs)):
            job.cancel()
            return False
        return True

    @staticmethod
    def _tail(job: Job) -> tuple[str, bool]:
        """The text still unreleased at the end, and whether it holds a stop string."""
        text, hit = job.stops.feed(job.text.finish())
        return (text, True) if hit else (text + job.stops.flush(), False)

    def _finish(self, job: Job, reason: str, last: Piece) -> None:
        _send(job, last)
        with self._lock:
            self._end(job, Finish(reason, len(job.prompt), job.generated, job.cached))
            self.stats.finished += 1

    def _end(self, job: Job, event: Event) -> None:
        # caller holds the lock
        _send(job, event)
        self._release(job)

    def _release(self, job: Job) -> None:
        # caller holds the lock
        if self._running.pop(job.slot, None) is job:
            self._free.append(job.slot)
            self._free.sort()
        job.last = -1
        _close_rounds(job)


def _allowed(job: Job, logits: torch.Tensor) -> torch.Tensor:
    """``job``'s logits row with what its JSON schema forbids next at -inf."""
    return logits if job.constraint is None else job.constraint.mask(logits)


def _close_rounds(job: Job) -> None:
    """End ``job``'s speculative rounds, if any: their taps leave the model."""
    if job.rounds is not None:
        job.rounds.close()
        job.rounds = None


def _send(job: Job, event: Event) -> bool:
    """Deliver ``event``; False when the receiver is gone (its loop closed)."""
    try:
        job.sink(event)
        return True
    except Exception:  # noqa: BLE001  (a closed event loop: treat as a client gone)
        return False
