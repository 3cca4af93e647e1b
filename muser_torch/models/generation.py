"""Generation, shared by every model: ``Generation`` adds ``stream`` and
``generate`` to a model that has a multi-slot KV cache (``Decoder``); the
next token is picked by ``sampling.sample``."""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

import torch

from .engine import decode_engine
from .prefill import prefill_engine
from .host_copy import HostCopy
from .sampling import sample
from .vision_engine import engine_choice

__all__ = ["Generation", "sample", "SYNC_EVERY"]

# Tokens an accelerator's stream samples between two looks of the host (stop
# checks, handing tokens over): one look costs a queue drain on the device.
SYNC_EVERY = 8


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
               decode_step: Callable | None = None, engine: str = "auto",
               sync_every: int = SYNC_EVERY,
               embeds: "tuple[torch.Tensor, torch.Tensor] | None" = None) -> Iterator[torch.Tensor]:
        """Yield ``[B]`` next tokens as they are produced (one tensor per step).

        ``input_ids`` is ``[T]`` or ``[B, T]``; the B prompts run in cache
        slots 0..B-1 (the cache is set up or reset here). A row that emits a
        token in ``stop`` (default: the tokenizer's stop ids, else its EOS) keeps emitting it;
        the stream ends when every row has stopped.

        The steps run on the decode engine (``models/engine.py``): on CUDA,
        recorded once as a CUDA graph and replayed (``engine="auto"``, the
        default; ``"eager"`` launches every kernel from Python, ``"graph"``
        insists on recording). ``decode_step`` replaces the one-token forward
        (e.g. a ``torch.compile``d ``model.forward``, called as
        ``decode_step(tokens [B, 1], slots)``).

        On the CPU each token is checked for a stop as it comes. On an
        accelerator sampling stays on the device and the host looks at the
        tokens once per window (the first token alone, then ``sync_every`` at a
        time) while the next window already runs, so a token reaches the caller
        within one window, as a CPU tensor; steps run ahead past a stop by at
        most two windows, never past ``max_new_tokens``.

        ``embeds`` replaces prompt positions' embeddings in the prefill
        (``Decoder.forward``'s argument: a vision model's image rows)."""
        ids, slots, stop = self._start(input_ids, max_new_tokens, temperature, top_k, top_p, stop)
        if sync_every < 1:
            raise ValueError(f"stream: sync_every must be >= 1, got {sync_every}")
        # The one-token step, called as step(tokens [B, 1], where) -> logits [B, 1, V].
        runner = decode_engine(self, engine)
        if decode_step is not None:
            step, where = decode_step, slots
        elif runner.records:
            step, where = runner.step, slots.tolist()
        else:   # the eager engine is the model's own forward (one call fewer in a token's walk)
            step, where = self, slots

        def next_logits(tok: torch.Tensor) -> torch.Tensor:
            return step(tok.unsqueeze(-1), where)[:, -1]
        gen = None
        if seed is not None:
            gen = torch.Generator(device=ids.device).manual_seed(seed)
        picker = _Picker(ids.shape[0], stop, ids.device, (temperature, top_k, top_p, gen))
        # the prompt: recorded per length bucket where the steps are (models/prefill.py)
        logits = prefill_engine(self, runner.recorder).prefill(ids, slots, embeds)[:, -1]
        if ids.device.type == "cpu":
            for i in range(max_new_tokens):
                tok = picker.pick(logits)
                yield tok
                if bool(picker.done.all()) or i + 1 == max_new_tokens:
                    return
                logits = step(tok.unsqueeze(-1), where)[:, -1]
            return
        yield from _windowed(picker, logits, next_logits, max_new_tokens, sync_every)

    def generate(self, input_ids, max_new_tokens: int, *, draft=None, return_stats: bool = False,
                 images: Sequence = (), videos: Sequence = (), image_token_id: int | None = None,
                 video_token_id: int | None = None, **kw):
        """Prompt plus generated tokens, ``[B, T + n]`` (or ``[T + n]`` for a 1-D
        prompt). Takes ``stream``'s keyword arguments.

        ``draft``: a DFlash draft loaded for this model
        (``muser_torch.from_gguf(path, target=model)``) proposes tokens that
        this model verifies (``models/speculative.py``), one sequence at a
        time; greedy output is this model's own, sampled output has its
        distribution. ``return_stats=True`` (with a draft) returns ``(ids,
        stats)``: ``stats.proposed`` each round's candidates, ``stats.accepted``
        each round's count of accepted candidates.

        ``images`` / ``videos`` (a model loaded with a vision projector: Muse
        Glimmer's ``mmproj``) fill the prompt's placeholder tokens, in order
        (``<|patch|>`` / ``<|video|>``, or the ids given; ``vision_embeds``),
        with or without a draft."""
        if images or videos:
            if not hasattr(self, "vision_embeds"):
                from ..errors import ImageError
                raise ImageError(f"generate: a {type(self).__name__} model takes no images")
            ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.lengths.device)
            # the vision forward follows the decode steps' engine choice (models/vision_engine.py)
            kw["embeds"] = self.vision_embeds(ids.unsqueeze(0) if ids.dim() == 1 else ids, images, videos,
                                              image_token_id, video_token_id,
                                              engine=engine_choice(kw.get("engine", "auto")))
        if draft is not None or return_stats:
            if draft is None:
                raise ValueError("generate: return_stats=True reports a draft's rounds; pass draft=")
            return self._generate_drafted(input_ids, max_new_tokens, draft, return_stats, **kw)
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.lengths.device)
        out = list(self.stream(ids, max_new_tokens, **kw))
        new = torch.stack(out, dim=-1).to(ids.device) if out else \
            ids.new_zeros(ids.reshape(-1, ids.shape[-1]).shape[0], 0)
        if ids.dim() == 1:
            return torch.cat((ids, new[0]))
        return torch.cat((ids, new), dim=-1)

    def _generate_drafted(self, input_ids, max_new_tokens: int, draft, return_stats: bool,
                          decode_step=None, **kw):
        from .dflash import Drafter
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
        unknown = set(kw) - {"temperature", "top_k", "top_p", "seed", "stop", "engine", "embeds"}
        if unknown:
            raise TypeError(f"generate() got an unexpected keyword argument {sorted(unknown)[0]!r}")
        # room for a whole verify block past the last token, where the context
        # allows: a recorded round always scores the whole block
        block = draft.config.block_size if isinstance(draft, Drafter) else 0
        room = min(rows.shape[1] + max_new_tokens + block, self.config.context_length)
        if self.lengths.numel() < 1 or self.max_seq_len < room:
            self.setup_cache(max(1, self.lengths.numel()), room)
        rows, _, stop = self._start(rows, max_new_tokens, t, k, p, kw.get("stop"))
        new, stats = speculative_generate(self, draft, rows, max_new_tokens, t, k, p, kw.get("seed"),
                                          stop, kw.get("engine", "auto"), kw.get("embeds"))
        out = torch.cat((rows, torch.tensor([new], dtype=torch.long, device=rows.device)), dim=-1)
        out = out[0] if ids.dim() == 1 else out
        return (out, stats) if return_stats else out


class _Picker:
    """Next tokens on the device: each row samples until it emits a stop id,
    then repeats it (``done`` marks those rows)."""

    def __init__(self, rows: int, stop: Sequence[int], device: torch.device, how: tuple):
        self.stop = torch.as_tensor(list(stop), dtype=torch.long, device=device)
        self.how = how      # temperature, top_k, top_p, generator
        self.done = torch.zeros(rows, dtype=torch.bool, device=device)
        self.tok = torch.zeros(rows, dtype=torch.long, device=device)

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        self.tok = torch.where(self.done, self.tok, sample(logits, *self.how))
        self.done = self.done | torch.isin(self.tok, self.stop)
        return self.tok


def _windowed(picker: _Picker, logits: torch.Tensor, next_logits: Callable, n: int,
              sync_every: int) -> Iterator[torch.Tensor]:
    """``stream``'s loop on an accelerator: windows of tokens sampled on the
    device, each copied to the host without blocking; the host hands window k
    over (and looks for the end) while window k+1 runs."""
    ends = _Ends(picker.stop.tolist(), picker.done.shape[0])
    pending = None
    produced, size = 0, 1
    while produced < n:
        block = []
        for _ in range(min(size, n - produced)):
            block.append(picker.pick(logits))
            produced += 1
            if produced < n:
                logits = next_logits(block[-1])
        window = HostCopy(torch.stack(block))
        if pending is not None:
            yield from ends.cut(pending.tokens())
            if ends.all:
                return
        pending, size = window, sync_every
    if pending is not None:
        yield from ends.cut(pending.tokens())


class _Ends:
    """The host's view of which rows have stopped."""

    def __init__(self, stop: Sequence[int], rows: int):
        self.stop = set(stop)
        self.done = [False] * rows
        self.all = False

    def cut(self, window: torch.Tensor) -> list[torch.Tensor]:
        """The window's steps up to the one at which every row has stopped."""
        for i, row in enumerate(window.tolist()):
            self.done = [d or t in self.stop for d, t in zip(self.done, row)]
            if all(self.done):
                self.all = True
                return list(window[:i + 1])
        return list(window)
