"""Shared by the models' cache tests: decode several sequences together in
some slots of one cache."""
from __future__ import annotations

import torch


def decode_in_slots(model, seqs: list[torch.Tensor], lengths: list[int], slots: list[int],
                    steps: int, max_seq_len: int) -> torch.Tensor:
    """Prefill ``seqs[i][:lengths[i]]`` into slot ``slots[i]`` of a fresh
    ``max(slots) + 2``-slot cache one by one, then feed the next ``steps``
    tokens of every sequence as one batch per step: logits ``[len(seqs), steps, V]``."""
    model.setup_cache(slots=max(slots) + 2, max_seq_len=max_seq_len)
    for s, seq, n in zip(slots, seqs, lengths):
        model(seq[None, :n], torch.tensor([s]))
    out = []
    for t in range(steps):
        step = torch.stack([seq[n + t] for seq, n in zip(seqs, lengths)])[:, None]
        out.append(model(step, torch.tensor(slots))[:, 0])
    return torch.stack(out, dim=1)
