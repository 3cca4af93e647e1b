"""Picking the next token from logits: ``sample`` (greedy or a draw) and the
``distribution`` it draws from, which speculative decoding also reads."""
from __future__ import annotations

import torch

__all__ = ["sample", "distribution"]


def sample(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
           top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token ``[B]`` from logits ``[B, V]``: argmax at temperature 0, else a
    draw from ``distribution``."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = distribution(logits, temperature, top_k, top_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def distribution(logits: torch.Tensor, temperature: float, top_k: int | None = None,
                 top_p: float | None = None) -> torch.Tensor:
    """float32 probabilities ``[..., V]`` of logits ``[..., V]`` scaled by
    ``temperature`` (> 0) and cut to top-k, then top-p."""
    # Scale with the max shifted to 0 and the divisor kept a normal float32, so a
    # tiny temperature drives the others toward -inf and never the max to +inf
    # (inf - inf is NaN in softmax).
    logits = logits.float()
    t = max(temperature, torch.finfo(torch.float32).tiny)
    logits = (logits - logits.amax(-1, keepdim=True)) / t
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass before it already reaches top_p (keeps >= 1)
        drop = (probs.cumsum(-1) - probs) >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits.softmax(-1)
