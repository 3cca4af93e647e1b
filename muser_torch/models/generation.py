"""Generation, shared by every model: ``Generation`` adds ``stream`` and
``generate`` to a model that has a multi-slot KV cache (``Decoder``); the
next token is picked by ``sampling.sample``."""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

import torch

from .sampling import sample

__all__ = ["Generation", "sample"]


class Generation:
    """``stream`` and ``generate`` over a model's KV cache; the model provides
    ``config`` (vocab_size, context_length), ``lengths``, ``max_seq_len``,
    ``setup_cache``, ``reset``, ``check_room``, ``tokenizer`` and
    ``forward(tokens, slots, last_only)``."""

    def _start(self, input_ids, max_new_tokens: int, temperature: float, top_k: int | None,
               top_p: float | None, stop: Sequence[int] | None):
        """Checked ``[B, T]`` ids, their slots (a cache set up and reset) and the stop ids."""
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.lengths.device)
        if ids.dim() == 1:
            ids = ids.unsqueeze(0)
        if ids.dim() != 2 or ids.shape[1] == 0:
            raise ValueError(f"generate: input_ids must be [T] or [B, T] with T >= 1, got {tuple(ids.shape)}")
        if int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size:
            raise ValueError(f"generate: token ids must lie in [0, {self.config.vocab_size})")
        if max_new_tokens < 0:
            raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
        if temperature < 0 or (top_k is not None and top_k < 1) or \
                (top_p is not None and not 0 < top_p <= 1):
            raise ValueError(f"generate: need temperature >= 0, top_k >= 1, 0 < top_p <= 1; "
                             f"got {temperature}, {top_k}, {top_p}")
        B, T = ids.shape
        need = min(T + max_new_tokens, self.config.context_length)  # check_room refuses more
        if self.lengths.numel() < B or self.max_seq_len < need:
            self.setup_cache(B, need)
        slots = torch.arange(B, device=ids.device)
        self.reset(slots)
        self.check_room(slots, T + max_new_tokens)
        if stop is None:   # the tokenizer's stop tokens (end of turn too, where it has them)
            tok = self.tokenizer
            stop = [] if tok is None else list(getattr(tok, "stop_ids", None) or [tok.eos_id])
        return ids, slots, stop

    @torch.no_grad()
    def stream(self, input_ids: torch.Tensor | Sequence[int], max_new_tokens: int,
               temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
               seed: int | None = None, stop: Sequence[int] | None = None,
               decode_step: Callable | None = None) -> Iterator[torch.Tensor]:
        """Yield ``[B]`` next tokens as they are produced (one tensor per step).

        ``input_ids`` is ``[T]`` or ``[B, T]``; the B prompts run in cache
        slots 0..B-1 (the cache is set up or reset here). A row that emits a
        token in ``stop`` (default: the tokenizer's stop ids, else its EOS) keeps emitting it;
        the stream ends when every row has stopped. ``decode_step`` replaces
        the one-token forward (e.g. a ``torch.compile``d ``model.forward``)."""
        ids, slots, stop = self._start(input_ids, max_new_tokens, temperature, top_k, top_p, stop)
        B = ids.shape[0]
        stop_t = torch.as_tensor(list(stop), dtype=torch.long, device=ids.device)
        gen = None
        if seed is not None:
            gen = torch.Generator(device=ids.device).manual_seed(seed)
        step = decode_step or self
        logits = self(ids, slots, last_only=True)[:, -1]
        done = torch.zeros(B, dtype=torch.bool, device=ids.device)
        tok = torch.zeros(B, dtype=torch.long, device=ids.device)
        for i in range(max_new_tokens):
            tok = torch.where(done, tok, sample(logits, temperature, top_k, top_p, gen))
            done = done | torch.isin(tok, stop_t)
            yield tok
            if bool(done.all()) or i + 1 == max_new_tokens:
                return
            logits = step(tok.unsqueeze(-1), slots)[:, -1]

    def generate(self, input_ids, max_new_tokens: int, *, draft=None, return_stats: bool = False,
                 **kw):
        """Prompt plus generated tokens, ``[B, T + n]`` (or ``[T + n]`` for a 1-D
        prompt). Takes ``stream``'s keyword arguments.

        ``draft``: a DFlash draft loaded for this model
        (``muser_torch.from_gguf(path, target=model)``) proposes tokens that
        this model verifies (``models/speculative.py``), one sequence at a
        time; greedy output is this model's own, sampled output has its
        distribution. ``return_stats=True`` (with a draft) returns ``(ids,
        stats)``: ``stats.proposed`` each round's candidates, ``stats.accepted``
        each round's count of accepted candidates."""
        if draft is not None or return_stats:
            if draft is None:
                raise ValueError("generate: return_stats=True reports a draft's rounds; pass draft=")
            return self._generate_drafted(input_ids, max_new_tokens, draft, return_stats, **kw)
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.lengths.device)
        out = list(self.stream(ids, max_new_tokens, **kw))
        new = torch.stack(out, dim=-1) if out else ids.new_zeros(ids.reshape(-1, ids.shape[-1]).shape[0], 0)
        if ids.dim() == 1:
            return torch.cat((ids, new[0]))
        return torch.cat((ids, new), dim=-1)

    def _generate_drafted(self, input_ids, max_new_tokens: int, draft, return_stats: bool,
                          decode_step=None, **kw):
        from .speculative import speculative_generate
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.lengths.device)
        rows = ids.unsqueeze(0) if ids.dim() == 1 else ids
        if rows.dim() != 2 or rows.shape[0] != 1:
            raise ValueError(f"generate: draft= runs one sequence ([T] or [1, T]), got input_ids of "
                             f"shape {tuple(ids.shape)}")
        if decode_step is not None:
            raise ValueError("generate: draft= verifies blocks with the model's own forward; "
                             "decode_step does not apply")
        t, k, p = kw.get("temperature", 0.0), kw.get("top_k"), kw.get("top_p")
        unknown = set(kw) - {"temperature", "top_k", "top_p", "seed", "stop"}
        if unknown:
            raise TypeError(f"generate() got an unexpected keyword argument {sorted(unknown)[0]!r}")
        rows, _, stop = self._start(rows, max_new_tokens, t, k, p, kw.get("stop"))
        new, stats = speculative_generate(self, draft, rows, max_new_tokens, t, k, p, kw.get("seed"),
                                          stop)
        out = torch.cat((rows, torch.tensor([new], dtype=torch.long, device=rows.device)), dim=-1)
        out = out[0] if ids.dim() == 1 else out
        return (out, stats) if return_stats else out
