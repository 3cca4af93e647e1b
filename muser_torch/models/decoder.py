"""``Decoder``: what every architecture's model shares: the embedding, the
stack of blocks, the final norm and lm_head; the multi-slot KV cache;
generation (``Generation``); and construction from a GGUF through the
architecture's tensor table (``assembly``).

An architecture's model subclasses it with its block and its facts
(``ARCH``, the RoPE tables); ``models/glimmer.py`` and ``models/gemma3.py``
are the examples. ``forward`` is shared: one RoPE table per frequency set
and one mask per window, both made once per step and shared by the layers
that use them. When a batch holds every slot, its rows run in slot order so
that a layer reads its cache buffers directly, with no gather.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import torch
import torch.nn as nn

from .. import changes
from ..arch import Architecture
from ..errors import ContextLengthError, MetadataError
from ..formats import GGMLType, PackedWeight
from ..formats.legacy import q5_0_as_q8_0 as q5_0_as_q8_0_rows
from ..gguf_io import GGUFFile, load_gguf
from ..loader import check, packed_weight
from .assembly import assemble, tokenizer_for
from .generation import Generation
from .layer_plan import layer_runner
from .parts import KVCache, RMSNorm, rope_angles

__all__ = ["Decoder"]


class Decoder(nn.Module, Generation):
    ARCH: Architecture
    # dtype of the embedding rows before ``embed_scale`` (None: the activation dtype)
    EMBED_DTYPE: torch.dtype | None = None
    # activation dtype of ``from_gguf`` on an accelerator when none is given (float32 on CPU)
    ACCEL_DTYPE: torch.dtype = torch.float16

    def __init__(self, config: Any, layers: Sequence[nn.Module], *, embed_scale: float = 1.0,
                 final_softcap: float | None = None):
        super().__init__()
        self.config = config
        # nn.Embedding's own init (normal_) on the meta device costs seconds of
        # imports; the meta build of from_gguf needs no values at all.
        table = torch.empty(config.vocab_size, config.hidden)
        if not table.is_meta:
            nn.init.normal_(table)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden, _weight=table)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(config.hidden, config.rms_eps)
        self.output = nn.Linear(config.hidden, config.vocab_size, bias=False)
        self.embed_scale = embed_scale        # Gemma: sqrt(hidden)
        self.final_softcap = final_softcap    # logits -> cap * tanh(logits / cap)
        self._rope_names = []
        for k, table in enumerate(self.rope_tables()):
            name = "inv_freq" if k == 0 else f"inv_freq_{k}"
            self.register_buffer(name, table, persistent=False)
            self._rope_names.append(name)
        self.register_buffer("lengths", torch.zeros(0, dtype=torch.long), persistent=False)
        self.tokenizer = None  # set by from_gguf when the file carries one
        self.act_dtype: torch.dtype | None = None  # set for packed models
        self.max_seq_len = 0

    def rope_tables(self) -> list[torch.Tensor]:
        """The inverse-frequency tables; attention ``rope_slot`` k uses the k-th."""
        raise NotImplementedError

    def _apply(self, fn, recurse=True):
        changes.bump()   # .to() replaces the RoPE tables without registering them
        return super()._apply(fn, recurse)

    # -- cache ------------------------------------------------------------------

    def setup_cache(self, slots: int = 1, max_seq_len: int | None = None,
                    dtype: torch.dtype | None = None) -> None:
        """Allocate an empty KV cache of ``slots`` sequences. Global layers hold
        ``max_seq_len`` positions (default: the context length; more is a
        ``ContextLengthError``), SWA layers their window. ``dtype`` defaults
        to float16 (float32/64 for a model computing in those)."""
        c = self.config
        dtype = dtype or self._cache_dtype()
        ctx = c.context_length if max_seq_len is None else max_seq_len
        if slots < 1 or ctx < 1:
            raise ValueError(f"setup_cache: need slots >= 1 and max_seq_len >= 1, got {slots}, {ctx}")
        if ctx > c.context_length:
            raise ContextLengthError(f"setup_cache: max_seq_len {ctx} exceeds the model's "
                                     f"context length of {c.context_length}", ctx, c.context_length)
        device = self.lengths.device
        for layer in self.layers:
            att = layer.attention
            cap = ctx if att.window is None else min(att.window, ctx)
            att.kv_cache = KVCache(slots, cap, att.n_kv, att.head_dim, dtype, device)
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)
        self.max_seq_len = ctx

    def reset(self, slots: Sequence[int] | torch.Tensor | None = None) -> None:
        """Forget the cached tokens of ``slots`` (all when None)."""
        if slots is None:
            self.lengths.zero_()
        else:
            self.lengths[torch.as_tensor(slots, device=self.lengths.device)] = 0

    def reusable(self, cached: int, common: int) -> int:
        """How many leading positions a slot that holds ``cached`` tokens can
        keep for a new sequence whose first ``common`` tokens (<= ``cached``)
        are those: ``common``, or 0 when a sliding-window ring has wrapped and
        cutting back would need positions it overwrote. (A ring of capacity c
        keeps positions >= cached - c; the next token after a kept prefix of
        ``common`` sees the positions >= common - c.)"""
        if common >= cached:
            return cached
        for layer in self.layers:
            cache = layer.attention.kv_cache
            if layer.attention.window is not None and cache is not None and cached > cache.capacity:
                return 0
        return common

    def keep(self, slot: int, length: int) -> None:
        """Cut cached sequence ``slot`` back to its first ``length`` positions
        (``reusable`` says how many may be kept); the next step continues there."""
        if not 0 <= length <= self.max_seq_len:
            raise ValueError(f"keep: length must be in [0, {self.max_seq_len}], got {length}")
        self.lengths[slot] = length

    def check_room(self, slots: torch.Tensor, n_new: int) -> None:
        """Raise ``ContextLengthError`` unless every slot can take ``n_new``
        more tokens (ValueError for a missing cache or bad slot ids)."""
        if self.lengths.numel() == 0:
            raise ValueError("no KV cache: call setup_cache(slots, max_seq_len) first")
        s = torch.as_tensor(slots).tolist()
        if len(set(s)) != len(s) or min(s) < 0 or max(s) >= self.lengths.numel():
            raise ValueError(f"slots must be distinct ids in [0, {self.lengths.numel()}), got {s}")
        longest = int(self.lengths[torch.as_tensor(s, device=self.lengths.device)].max()) + n_new
        if longest > self.max_seq_len:
            raise ContextLengthError(f"a sequence of {longest} tokens exceeds the cache's capacity of "
                                     f"{self.max_seq_len} (context_length {self.config.context_length})",
                                     longest, self.max_seq_len)

    # -- forward ----------------------------------------------------------------

    def forward(self, tokens: torch.Tensor, slots: torch.Tensor | None = None,
                last_only: bool = False, *, checked: bool = True,
                embeds: "tuple[torch.Tensor, torch.Tensor] | None" = None,
                logits_at: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[B, T, vocab]`` for token ids ``[B, T]`` (``[B, 1, vocab]``,
        the last position's, with ``last_only``: a prefill needs no more; or
        position ``logits_at``'s, a ``[1]`` long device tensor, for a prefill
        padded past its prompt, ``models/prefill.py``).

        Without ``slots`` the tokens are one self-contained sequence per row
        (positions 0..T-1, no cache). With ``slots`` (``[B]`` long, distinct),
        row b continues cached sequence ``slots[b]`` from its current length,
        and the cache advances by T; a step past the cache's capacity is a
        ``ContextLengthError`` (a global layer's ring would silently wrap).
        That check (``check_room``) reads the lengths on the host, so it runs
        where that costs no device sync: eager calls on CPU tensors. A
        compiled step, or one on an accelerator (where a sync per step would
        stall the launch queue and break CUDA graph capture), trusts its
        caller: ``stream`` checks the whole run up front, the server's
        scheduler each request. The decode engine passes ``checked=False``: it
        pads a batch with copies of its first row (the same slot twice), and its
        callers have checked the room.

        ``embeds``: ``(mask [B, T] bool, rows [N, hidden])``, N the mask's count:
        the first layer's input at the marked positions is ``rows`` (in row-major
        order of the mask) instead of the tokens' embeddings (a vision model's
        image rows at its placeholder tokens)."""
        B, T = tokens.shape
        if checked and slots is not None and tokens.device.type == "cpu" \
                and not torch.compiler.is_compiling():
            self.check_room(slots, T)
        steps = torch.arange(T, device=tokens.device)
        order = None
        if slots is not None and B == self.lengths.numel():
            # Every slot: run the rows in slot order (row s is slot s), so each
            # layer attends over its cache buffers as they sit (KVCache.rows).
            order, slots = slots, torch.arange(B, device=tokens.device)
            tokens = tokens.index_copy(0, order, tokens)
            if embeds is not None:   # the rows move with their prompts
                mask, rows = embeds
                full = rows.new_zeros(B, T, rows.shape[-1]).masked_scatter(mask.unsqueeze(-1), rows)
                mask = mask.index_copy(0, order, mask)
                embeds = mask, full.index_copy(0, order, full)[mask]
        if slots is None:
            positions, lengths = steps.expand(B, T), None
        else:
            lengths = self.lengths.index_select(0, slots)
            positions = lengths.unsqueeze(-1) + steps
        x = self.embed(tokens).to(self.activation_dtype)
        if embeds is not None:
            mask, rows = embeds
            x = x.masked_scatter(mask.unsqueeze(-1).to(x.device), rows.to(x.device, x.dtype))
        runner = layer_runner(self, x, slots)
        if runner is not None:   # the backend runs whole layers (the CPU library: a call each)
            x = runner(x, slots, lengths, [getattr(self, name) for name in self._rope_names])
        else:
            rots = [rope_angles(positions, getattr(self, name)) for name in self._rope_names]
            # one mask per window (None: global), shared by the layers with that window
            kinds = {layer.attention.window: layer.attention for layer in self.layers}
            masks = {window: att.make_mask(positions, lengths) for window, att in kinds.items()}
            for layer in self.layers:
                att = layer.attention
                x = layer(x, positions, rots[att.rope_slot], masks[att.window], slots)
        if slots is not None:
            self.lengths.index_put_((slots,), lengths + T)
        if logits_at is not None:
            x = x.index_select(1, logits_at)
        elif last_only:
            x = x[:, -1:]
        if order is not None:  # back to the caller's row order
            x = x.index_select(0, order)
        return self.head(self.norm(x))

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The first layer's input for token ids ``[B, T]``, in the embedding's
        dtype (``forward`` casts it to the activation dtype, so an
        architecture's override, such as Muse Glimmer's norm, calls nothing
        back in this module)."""
        x = self.tok_embeddings(tokens)
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the final-normed hidden states: the lm_head, then the soft-cap."""
        logits = self.output(x)
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits

    # -- accounting ---------------------------------------------------------------

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads: every projection and norm in
        full (a tied lm_head reads the embedding's bytes in full), one row of
        the embedding table (the KV cache is not counted). Bytes that several
        modules view (joined projections) count once."""
        model_buffers = {id(t) for t in self.buffers(recurse=False)}   # RoPE tables, lengths
        spans, total = [], 0
        for mod in self.modules():
            if isinstance(mod, KVCache):
                continue
            for t in (*mod.parameters(recurse=False), *mod.buffers(recurse=False)):
                if id(t) in model_buffers or t.numel() == 0:
                    continue
                size = t.numel() * t.element_size()
                if mod is self.tok_embeddings:
                    total += size // self.config.vocab_size
                else:
                    spans.append((t.data_ptr(), t.data_ptr() + size))
        end = 0
        for lo, hi in sorted(spans):   # the union of the byte ranges
            total += max(0, hi - max(lo, end))
            end = max(end, hi)
        return total

    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one decode step reads per slot: every cache entry
        (the step attends over the whole ring, masked)."""
        return sum(2 * layer.attention.kv_cache.k[0].numel() * layer.attention.kv_cache.k.element_size()
                   for layer in self.layers if layer.attention.kv_cache is not None)

    def _cache_dtype(self) -> torch.dtype:
        # f16 cache by default; a float32/64 model (tests) keeps its own precision.
        dt = self.activation_dtype
        return dt if dt in (torch.float32, torch.float64) else torch.float16

    @property
    def activation_dtype(self) -> torch.dtype:
        """The dtype hidden states flow in: ``from_gguf``'s ``dtype``, or the
        float weights' dtype for a model built from a config."""
        return self.act_dtype if self.act_dtype is not None else self.output.weight.dtype

    # -- construction from packed weights ---------------------------------------

    @classmethod
    def build(cls, config: Any, groups: frozenset[str]) -> "Decoder":
        """The module tree for a config and the optional tensor groups a file has."""
        raise NotImplementedError

    @classmethod
    def from_gguf(cls, path: str | os.PathLike, device: torch.device | str | None = None,
                  dtype: torch.dtype | None = None, progress: bool = False) -> "Decoder":
        """Build from a GGUF file of this architecture after fail-closed admission.

        Projections become ``QLinear`` over the file's packed bytes (the memory
        map itself on CPU, one copy on an accelerator), the embedding a
        ``QEmbedding``; norms are float32. ``dtype`` is the activation dtype
        (default: ``default_dtype(device)``, float32 on CPU and ``ACCEL_DTYPE``
        on an accelerator, as ``muser_torch.from_gguf``)."""
        return cls.from_file(load_gguf(path), device, dtype, progress)

    @classmethod
    def from_file(cls, gguf: GGUFFile, device: torch.device | str | None = None,
                  dtype: torch.dtype | None = None, progress: bool = False,
                  q5_0_as_q8_0: bool = False) -> "Decoder":
        """``from_gguf`` of an already parsed file. ``q5_0_as_q8_0``: Q5_0
        weights become Q8_0 of the same values at load (``formats.legacy.q5_0_as_q8_0``:
        more bytes, a simpler kernel; a trade to measure per device)."""
        admitted = check(gguf, cls.ARCH)   # raises a GGUFError subclass naming what is wrong
        tokenizer = tokenizer_for(gguf)
        rows = admitted.config.vocab_size
        if tokenizer is not None and tokenizer.vocab_size > rows:
            # ids past the embedding's rows would index outside it in generate
            raise MetadataError(f"{gguf.path.name}: the tokenizer has {tokenizer.vocab_size:,} "
                                f"tokens but the model's vocabulary ({cls.ARCH.name}.vocab_size, "
                                f"the embedding's rows) is {rows:,}")
        device = torch.device(device if device is not None else "cpu")
        dtype = dtype or cls.default_dtype(device)

        def get(name, n_out, n_in):  # shapes and companions were admitted above
            w = packed_weight(gguf, name)
            if q5_0_as_q8_0 and w.qtype is GGMLType.Q5_0:
                w = PackedWeight(name, GGMLType.Q8_0, w.n_out, w.n_in, q5_0_as_q8_0_rows(w.packed))
            return w

        label = f"loading {gguf.path.name}" if progress else None
        return assemble(cls, admitted.config, admitted.groups, get, device, dtype, tokenizer, label)

    @classmethod
    def default_dtype(cls, device: torch.device) -> torch.dtype:
        """float32 on CPU (torch's CPU float16 matmul is slow), ``ACCEL_DTYPE`` elsewhere."""
        return torch.float32 if torch.device(device).type == "cpu" else cls.ACCEL_DTYPE

    def finish(self, device: torch.device, dtype: torch.dtype) -> None:
        """Recreate the non-persistent buffers that the meta build left empty."""
        for name, table in zip(self._rope_names, self.rope_tables()):
            setattr(self, name, table.to(device))
        self.lengths = torch.zeros(0, dtype=torch.long, device=device)
        self.act_dtype = dtype
