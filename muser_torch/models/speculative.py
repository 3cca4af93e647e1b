"""DFlash speculative decoding: a target model (a ``Decoder``) and its draft
(``models/dflash.py``) generate one sequence together.

One round, with ``n`` positions in the target's cache and ``anchor`` the last
emitted token (not yet in the cache):

1. the draft proposes ``block_size - 1`` candidates after ``anchor`` (greedy:
   its argmax; sampling: draws from its distribution), cut after the first
   stop token and to what the budget can still emit;
2. the target scores ``[anchor, candidates]`` in one forward at ``n ..``,
   its KV writes journaled, and its tapped layers' outputs recorded;
3. greedy accepts the longest prefix of candidates equal to the target's
   argmax, plus the target's own next token; sampling accepts candidate x
   with probability ``min(1, p(x) / q(x))`` and on the first rejection draws
   from ``max(p - q, 0)`` normalized, else from p after the last candidate
   (so every emitted token is distributed as the target's own);
4. the emitted tokens are cut after a stop token; the target's cache keeps
   the anchor and the accepted candidates (``KVCache.rewind`` restores what
   the rejected rows overwrote, sliding rings included) and the draft
   encodes their tapped states as its next context.

``stats.proposed`` lists each round's candidates, ``stats.accepted`` each
round's count of accepted candidates (the target's own token not counted).
A round is one draft proposal: the prefill, and a last token that no
candidate could precede, run the target alone."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch

from .dflash import DraftContext, Drafter
from .draft_rounds import DraftRounds, cut_at_stop, draft_rounds
from .engine import decode_engine
from .taps import Taps, caches
from .sampling import distribution, sample

__all__ = ["DraftStats", "speculative_generate", "speculative_rounds"]


@dataclass
class DraftStats:
    proposed: list[list[int]] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    @property
    def rounds(self) -> int:
        return len(self.accepted)

    @property
    def mean_accepted(self) -> float:
        """Mean accepted candidates per round (0.0 with no round)."""
        return sum(self.accepted) / len(self.accepted) if self.accepted else 0.0


def _accept_greedy(cands: torch.Tensor, logits: torch.Tensor) -> list[int]:
    """The accepted candidates and the target's next token."""
    best = logits.argmax(-1)                      # [k + 1]
    k = cands.numel()
    m = int((cands == best[:k]).int().cumprod(0).sum()) if k else 0
    return cands[:m].tolist() + [int(best[m])]


def _accept_sampled(cands: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                    gen: torch.Generator | None) -> list[int]:
    """The standard speculative-sampling rule: ``q [k, V]`` the draft's
    distributions the candidates were drawn from, ``p [k + 1, V]`` the target's."""
    k = cands.numel()
    idx = torch.arange(k, device=cands.device)
    ratio = p[idx, cands] / q[idx, cands]
    u = torch.rand(k, generator=gen, device=cands.device)
    m = int((u <= ratio).int().cumprod(0).sum()) if k else 0
    if m < k:
        residual = (p[m] - q[m]).clamp(min=0)
        total = residual.sum()
        # p == q leaves no mass to draw from, and then the candidate would have been accepted
        last = p[m] if float(total) <= 0 else residual / total
    else:
        last = p[m]
    nxt = torch.multinomial(last, 1, generator=gen)
    return cands[:m].tolist() + [int(nxt)]


@torch.no_grad()
def speculative_generate(target: Any, draft: Drafter, ids: torch.Tensor, max_new_tokens: int,
                         temperature: float = 0.0, top_k: int | None = None,
                         top_p: float | None = None, seed: int | None = None,
                         stop: Sequence[int] = (), engine: str = "auto",
                         embeds: "tuple[torch.Tensor, torch.Tensor] | None" = None
                         ) -> tuple[list[int], DraftStats]:
    """The new tokens after ``ids`` (``[1, T]``, already checked) and the
    rounds' statistics. The target's cache must hold slot 0 with room for
    ``T + max_new_tokens`` positions, empty. ``embeds``: rows for the
    prompt's placeholders (``speculative_rounds``)."""
    stats = DraftStats()
    out = [t for new in speculative_rounds(target, draft, ids, max_new_tokens, temperature, top_k,
                                           top_p, seed, stop, stats, engine, ahead=True,
                                           embeds=embeds)
           for t in new]
    return out, stats


def speculative_rounds(target: Any, draft: Drafter, ids: torch.Tensor, max_new_tokens: int,
                       temperature: float = 0.0, top_k: int | None = None,
                       top_p: float | None = None, seed: int | None = None,
                       stop: Sequence[int] = (), stats: DraftStats | None = None,
                       engine: str = "auto", ahead: bool = False,
                       grammar: Any = None,
                       embeds: "tuple[torch.Tensor, torch.Tensor] | None" = None) -> Iterator[list[int]]:
    """``speculative_generate`` one round at a time: yields each round's
    emitted tokens (the prefill's one token first), as a server streams them.
    Closing the generator early removes the taps and leaves slot 0's cache
    consistent up to what was yielded.

    ``engine`` as ``Generation.stream``'s: where the target's steps are
    recorded (CUDA), greedy rounds of a ``Drafter`` run as one recorded round
    each (``draft_rounds.py``) unless ``"eager"``; the tokens are the same.
    ``ahead`` (for a caller that reads every round): the next round runs
    while the host looks at this one.

    ``grammar`` (a structured output's position in its grammar: ``allowed()``
    the ``[vocab]`` bool mask of the next token, ``take(token)``, ``copy()``)
    masks every row: the draft's block row by row, each candidate taken by a
    copy of the grammar before the next row's mask, and the target's verify
    rows the same way; the grammar itself is left where the round found it
    (the caller takes the emitted tokens). Emitted tokens then follow the
    masked target: greedy, its masked argmax; sampled, its masked distribution.
    Such rounds run eagerly.

    ``embeds`` (``Decoder.forward``'s: a vision model's image and video rows
    at the prompt's placeholders) enter the target's prefill only. The draft
    needs nothing more: its context is the tapped layers' outputs, which at
    those positions already derive from the rows, and its block embeds
    generated tokens, never a placeholder."""
    if draft.target is not target:
        raise ValueError("generate: draft= was loaded for another model "
                         "(muser_torch.from_gguf(draft_path, target=this_model))")
    stats = DraftStats() if stats is None else stats
    if max_new_tokens == 0:
        return
    stop_set = set(int(s) for s in stop)
    gen = None
    if seed is not None:
        gen = torch.Generator(device=ids.device).manual_seed(seed)
    greedy = temperature == 0
    slots = torch.zeros(1, dtype=torch.long, device=ids.device)
    ctx = DraftContext()
    emitted, last = 0, -1

    def pick(logits: torch.Tensor) -> int:
        if grammar is not None:
            logits = _mask_row(logits, grammar)
        return int(sample(logits[None], temperature, top_k, top_p, gen)[0])

    recorded = None if grammar is not None else \
        _recorded_rounds(target, draft, engine, greedy, ids.shape[1], max_new_tokens)
    if recorded is not None:
        with Taps(target, draft.tap_layers) as taps:
            logits = target(ids, slots, embeds=embeds)[0]
            tapped = taps.take()
        last = pick(logits[-1])
        recorded.begin(tapped, last, max_new_tokens - 1, stop_set)
        yield [last]
        if last not in stop_set:
            yield from recorded.rounds(max_new_tokens - 1, stop_set, stats, ahead)
        return
    with Taps(target, draft.tap_layers) as taps:
        logits = target(ids, slots, embeds=embeds)[0]
        draft.extend(ctx, taps.take())
        last, emitted = pick(logits[-1]), 1
        yield [last]
        while emitted < max_new_tokens and last not in stop_set:
            left, anchor = max_new_tokens - emitted, last
            if left == 1:   # no room for a candidate: the target's own step
                last = pick(target(torch.tensor([[anchor]], device=ids.device), slots)[0, -1])
                taps.take()
                yield [last]
                return
            draft_logits = draft.propose(ctx, anchor)
            if grammar is not None:
                cands, q = _grammar_candidates(draft_logits, grammar, greedy, temperature, top_k,
                                               top_p, gen)
            elif greedy:
                cands, q = draft_logits.argmax(-1), None
            else:
                q = distribution(draft_logits, temperature, top_k, top_p)
                cands = torch.multinomial(q, 1, generator=gen).squeeze(-1)
            cands = cands[:len(cut_at_stop(cands.tolist(), stop_set))]
            stats.proposed.append(cands.tolist())
            cands = cands[:left - 1]
            n = int(target.lengths[0])
            for cache in caches(target):
                cache.journal = []
            block = torch.cat((torch.tensor([anchor], device=ids.device), cands))[None]
            logits = target(block, slots)[0].float()
            if grammar is not None:
                logits = _grammar_rows(logits, cands, grammar)
            if greedy:
                new = _accept_greedy(cands, logits)
            else:
                new = _accept_sampled(cands, q[:cands.numel()],
                                      distribution(logits, temperature, top_k, top_p), gen)
            new = cut_at_stop(new, stop_set)
            keep = len(new)   # the anchor and the accepted candidates stay in the cache
            for cache in caches(target):
                cache.rewind(keep)
            target.lengths[0] = n + keep
            stats.accepted.append(keep - 1)
            draft.extend(ctx, taps.take()[:, :keep])
            last, emitted = new[-1], emitted + keep
            yield new


def _mask_row(row: torch.Tensor, grammar: Any) -> torch.Tensor:
    """``row [V]`` with what the grammar forbids next at -inf; as it is where
    the grammar allows nothing (past a stop token: a row no round keeps)."""
    allowed = grammar.allowed().to(row.device)
    return torch.where(allowed, row, float("-inf")) if bool(allowed.any()) else row


def _grammar_candidates(draft_logits: torch.Tensor, grammar: Any, greedy: bool,
                        temperature: float, top_k: int | None, top_p: float | None,
                        gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Candidates drawn row by row from the draft's rows, each masked by the
    grammar after the candidates before it (taken by a copy), and (sampled)
    the distributions they were drawn from."""
    trial, cands, qs = grammar.copy(), [], []
    for row in draft_logits:
        allowed = trial.allowed().to(row.device)
        if not bool(allowed.any()):
            break
        row = torch.where(allowed, row, float("-inf"))
        if greedy:
            token = int(row.argmax())
        else:
            qs.append(distribution(row[None], temperature, top_k, top_p)[0])
            token = int(torch.multinomial(qs[-1], 1, generator=gen))
        trial.take(token)
        cands.append(token)
    device = draft_logits.device
    return (torch.tensor(cands, dtype=torch.long, device=device),
            torch.stack(qs) if qs else None)


def _grammar_rows(logits: torch.Tensor, cands: torch.Tensor, grammar: Any) -> torch.Tensor:
    """The verify's rows ``[k + 1, V]``, row i masked by the grammar after
    ``cands[:i]`` (taken by a copy)."""
    trial, rows = grammar.copy(), []
    for i in range(logits.shape[0]):
        rows.append(_mask_row(logits[i], trial))
        if i < cands.numel():
            trial.take(int(cands[i]))
    return torch.stack(rows)


def _recorded_rounds(target: Any, draft: Any, engine: str, greedy: bool, n_prompt: int,
                     max_new_tokens: int) -> "DraftRounds | None":
    """The recorded rounds for this run, or None for the eager loop."""
    runner = decode_engine(target, engine)   # checks the name; records on CUDA
    if not (runner.records and greedy and isinstance(draft, Drafter)):
        return None
    rounds = draft_rounds(draft, runner.recorder)
    return rounds if rounds.why_not(n_prompt, max_new_tokens) is None else None
