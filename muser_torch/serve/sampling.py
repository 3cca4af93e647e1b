"""One request's token choice and stop handling, apart from the batch it
decodes in: ``SamplingParams`` (what the request asked), ``TokenPicker`` (its
own random generator over its own row of logits) and ``StopStrings`` (cuts
the text at the first stop string and never releases text that may still
turn out to begin one).

A request's tokens depend only on its own logits row and its own generator,
so a seeded request samples the same tokens alone or batched with others
(up to the float32 differences of the batched forward itself).
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

from ..models.sampling import sample


@dataclass(frozen=True)
class SamplingParams:
    """``max_tokens`` None: until the slot's context is full. ``top_k`` None
    and ``top_p`` 1.0 leave the distribution whole. ``seed`` None draws a
    fresh one. ``top_logprobs``: how many alternatives each reported token
    carries (with ``logprobs``)."""
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    json_schema: str | None = None    # JSON text: every response follows it (serve/grammar.py)


@dataclass(frozen=True)
class TokenLogprob:
    """A chosen token's log-probability and the ``top`` alternatives, each
    ``(token id, logprob)``, most likely first. The distribution is the
    model's own (log-softmax of the logits at temperature 1, before top-k and
    top-p), as OpenAI's ``logprobs`` report it."""
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class TokenPicker:
    """Next tokens of one request from its logits rows ``[1, V]``."""

    def __init__(self, params: SamplingParams, device: torch.device) -> None:
        self.params = params
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def draw(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token ``[1]``, left on the logits' device (a batch's draws
        then reach the host in one copy)."""
        p = self.params
        top_p = p.top_p if p.top_p < 1 else None
        return sample(logits, p.temperature, p.top_k, top_p, self.generator)

    def pick(self, logits: torch.Tensor) -> int:
        return int(self.draw(logits)[0])

    def logprob(self, logits: torch.Tensor, token: int) -> TokenLogprob:
        lp = torch.log_softmax(logits[0].float(), dim=-1)
        top = ()
        if self.params.top_logprobs:
            values, ids = torch.topk(lp, min(self.params.top_logprobs, lp.numel()))
            top = tuple(zip(ids.tolist(), values.tolist()))
        return TokenLogprob(token, float(lp[token]), top)


class StopStrings:
    """Feed text as it settles; ``feed`` returns ``(text safe to release,
    whether a stop string ended it)``. Generation stops as soon as some stop
    string is complete (as llama.cpp's server does): the text is cut before
    the earliest-starting complete one, and nothing after that is ever
    released. Until then the longest tail that is the start of some stop
    string is held back until more text decides it; ``flush`` releases it at
    the end."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        if any(not s for s in stops):
            raise ValueError("a stop string must not be empty")
        self.stops = stops
        self.held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        if not self.stops:
            return text, False
        # Released text never ends in the start of a stop string, so a stop
        # can only begin inside the held tail plus the new text.
        buf = self.held + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.held = ""
            return buf[:min(hits)], True
        keep = max((n for s in self.stops for n in range(min(len(s) - 1, len(buf)), 0, -1)
                    if buf.endswith(s[:n])), default=0)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep], False

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held
