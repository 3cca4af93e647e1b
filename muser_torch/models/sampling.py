"""Picking the next token from logits: ``sample`` (greedy or a draw) and the
``distribution`` it draws from, which speculative decoding also reads.

Top-p keeps the smallest set of most probable tokens whose mass reaches
``top_p``, and every token tied with the last of them: a token is kept when
its probability is at least the ``cut``, the probability of the last token of
that set in descending order. Defined by the cut's value rather than by a
position in a sorted order, the set does not depend on how a sort orders ties.

On the CPU the cut is found without sorting the whole vocabulary (Gemma 3's
262,144 scores took 21 ms a token to sort against an 11 ms decode step): only
the tokens of probability >= a floor are sorted, and when their mass reaches
``top_p`` the cut is among them, because every token left out is less
probable than every one sorted. A peaked distribution (most decode steps)
needs the first floor, at most 2**10 candidates; a flat one falls through to
the whole sort, the same cut. The draw is then made over the kept tokens only
(``torch.multinomial`` costs 5 ms over 262,144 probabilities). On an
accelerator the whole sort stays: it is cheap there, and the candidate count
would cost a host sync per token that ``Generation.stream`` avoids."""
from __future__ import annotations

import torch

__all__ = ["sample", "distribution"]

# Probability floors of the CPU's candidate search, tried in turn; 1/floor bounds the candidates.
TOP_P_FLOORS = (2.0 ** -10, 2.0 ** -14)


def sample(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
           top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token ``[B]`` from logits ``[B, V]``: argmax at temperature 0, else a
    draw from ``distribution``."""
    if temperature == 0:
        return logits.argmax(-1)
    if _nucleus_on_host(logits, top_p):
        probs = _probs(logits, temperature, top_k)
        picks = []
        for row in probs:   # a draw over the kept tokens only: same distribution, a fraction of the work
            kept = _kept_ids(row, top_p)
            picks.append(kept[torch.multinomial(row[kept], 1, generator=generator)])
        return torch.cat(picks)
    probs = distribution(logits, temperature, top_k, top_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def distribution(logits: torch.Tensor, temperature: float, top_k: int | None = None,
                 top_p: float | None = None) -> torch.Tensor:
    """float32 probabilities ``[..., V]`` of logits ``[..., V]`` scaled by
    ``temperature`` (> 0) and cut to top-k, then top-p."""
    shape = logits.shape
    probs = _probs(logits.reshape(-1, shape[-1]), temperature, top_k)
    if top_p is not None and top_p < 1:
        if _nucleus_on_host(logits, top_p):
            keep = torch.zeros_like(probs, dtype=torch.bool)
            for row, mask in zip(probs, keep):
                mask[_kept_ids(row, top_p)] = True
        else:
            keep = probs >= _cut(probs.sort(dim=-1, descending=True).values, top_p)
        probs = torch.where(keep, probs, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs.reshape(shape)


def _probs(logits: torch.Tensor, temperature: float, top_k: int | None) -> torch.Tensor:
    """float32 softmax ``[B, V]`` of logits ``[B, V]`` scaled and cut to top-k."""
    # Scale with the max shifted to 0 and the divisor kept a normal float32, so a
    # tiny temperature drives the others toward -inf and never the max to +inf
    # (inf - inf is NaN in softmax).
    logits = logits.float()
    t = max(temperature, torch.finfo(torch.float32).tiny)
    logits = (logits - logits.amax(-1, keepdim=True)) / t
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits.softmax(-1)


def _nucleus_on_host(logits: torch.Tensor, top_p: float | None) -> bool:
    return top_p is not None and top_p < 1 and logits.device.type == "cpu"


def _cut(sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """``[N, 1]``: the probability of the last token kept of each row of
    probabilities sorted in descending order; a token is dropped when the
    mass before it already reaches ``top_p`` (the first one never is)."""
    before = sorted_probs.cumsum(-1) - sorted_probs
    n = (before < top_p).sum(-1, keepdim=True).clamp(min=1)
    return sorted_probs.gather(-1, n - 1)


def _kept_ids(row: torch.Tensor, top_p: float) -> torch.Tensor:
    """The ids (ascending) of the tokens that top-p keeps of one row ``[V]``
    of probabilities, sorting only the candidates above a floor (module doc)."""
    for floor in (*TOP_P_FLOORS, 0.0):      # floor 0: every token, the whole sort
        ids = (row >= floor).nonzero().squeeze(1)
        ranked = row[ids].sort(descending=True).values[None]
        if floor == 0.0 or ranked.sum() >= top_p:
            break
    return ids[row[ids] >= _cut(ranked, top_p)[0]]
