"""Glimmer: the decoder GLIMMER.md defines, with its KV cache and sampler.

The model reads top to bottom: RMSNorm, Attention (gated, optional q/k norms,
NeoX RoPE, GQA, sliding window on 3 of every 4 layers), FeedForward (SwiGLU),
TransformerBlock, Glimmer. Projections are plain ``nn.Linear`` when the model
is built from a config (that is how the demo is trained); ``from_gguf`` and
``random`` swap in ``QLinear`` / ``QEmbedding`` holding packed bytes, so the
forward code is the same for float and packed weights.

Cache layout and positions. Every layer's cache is a ring of ``capacity``
entries per slot: ``context`` entries for global layers, ``sliding_window``
for SWA layers; position p lives in entry ``p % capacity``. With ``L`` tokens
already cached, entry i holds position ``i + capacity * floor((L-1-i)/capacity)``
(none when ``i >= L``), which for a global layer (``L <= capacity``) is just i.
A step of T new tokens writes its keys into the ring in place and attends
over the cache as it sits, masked by that formula, when nothing it overwrites
is still needed: a decode step (T = 1 overwrites only the position that fell
out of the window) and any step of a global layer (its ring never wraps:
``check_room`` keeps every length within it). A prefill chunk on an SWA layer
may overwrite keys its own earlier queries need (it may even be longer than
the ring), so it attends over the cached entries and its new keys together,
then stores its last ``min(T, capacity)``. When a batch holds every slot,
``Glimmer.forward`` runs its rows in slot order so that a layer reads its cache
buffers directly, with no gather. Shapes decide every branch, so the decode
step compiles with ``fullgraph=True``.
"""
from __future__ import annotations

import os
from typing import Callable, Iterator, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import GlimmerConfig

__all__ = ["Glimmer", "GlimmerConfig", "KVCache", "gguf_names"]


# ---- names: GGUF tensor <-> module parameter ------------------------------------

_LAYER_NAMES = {  # GGUF suffix under blk.N. -> module path under layers.N.
    "attn_norm.weight": "attention_norm.weight",
    "attn_q.weight": "attention.wq.weight",
    "attn_k.weight": "attention.wk.weight",
    "attn_v.weight": "attention.wv.weight",
    "attn_gate.weight": "attention.wgate.weight",
    "attn_output.weight": "attention.wo.weight",
    "attn_q_norm.weight": "attention.q_norm.weight",
    "attn_k_norm.weight": "attention.k_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "ffn_gate.weight": "feed_forward.w_gate.weight",
    "ffn_up.weight": "feed_forward.w_up.weight",
    "ffn_down.weight": "feed_forward.w_down.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "tok_embeddings.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "output.weight",
}


def gguf_names(config: GlimmerConfig, qk_norm: bool = False) -> dict[str, tuple[int, int]]:
    """Every GGUF tensor of a Glimmer with this config -> its (n_out, n_in),
    a norm as (1, n): the loader's table (``expected_tensors``) in torch order."""
    from .loader import expected_tensors
    return {name: (ne[1], ne[0]) if len(ne) == 2 else (1, ne[0])
            for name, (_, ne) in expected_tensors(config, qk_norm).items()}


def module_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``layers.3.attention.wq.weight``."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    raise ValueError(f"{gguf_name!r} is not a Glimmer tensor")


# ---- model parts ---------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in float32 whatever the activation dtype: an f16 sum of
        # squares over 6656 features overflows.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rope_inv_freq(config: GlimmerConfig) -> torch.Tensor:
    """``rope_base ** (-2i / head_dim)`` for i < head_dim/2 (float64 math, float32 out)."""
    half = torch.arange(0, config.head_dim, 2, dtype=torch.float64) / config.head_dim
    return (config.rope_base ** -half).float()


def rope_angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) ``[B, T, 1, D/2]`` for positions ``[B, T]``: made once per
    forward and shared by every layer."""
    angles = positions.unsqueeze(-1).float() * inv_freq            # [B, T, D/2]
    return angles.cos().unsqueeze(2), angles.sin().unsqueeze(2)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX (rotate-half) RoPE. x ``[B, T, H, D]``; cos, sin from ``rope_angles``."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class KVCache(nn.Module):
    """One layer's keys and values: ``[slots, capacity, n_kv, head_dim]`` rings."""

    def __init__(self, slots: int, capacity: int, n_kv: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str | None):
        super().__init__()
        self.capacity = capacity
        shape = (slots, capacity, n_kv, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def entry_positions(self, lengths: torch.Tensor) -> torch.Tensor:
        """``[B]`` cached lengths -> ``[B, capacity]`` position held by each entry
        (-1 when the entry is still empty)."""
        i = torch.arange(self.capacity, device=lengths.device)
        last = lengths.unsqueeze(-1) - 1
        pos = i + self.capacity * torch.div(last - i, self.capacity, rounding_mode="floor")
        return torch.where(i <= last, pos, torch.full_like(pos, -1))

    def update(self, slots: torch.Tensor, positions: torch.Tensor,
               k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the last ``min(T, capacity)`` of the new keys ``[B, T, n_kv, D]``
        at their ring entries, in place."""
        m = min(k.shape[1], self.capacity)
        idx = positions[:, -m:] % self.capacity
        rows = slots.unsqueeze(-1).expand_as(idx)
        self.k.index_put_((rows, idx), k[:, -m:].to(self.k.dtype))
        self.v.index_put_((rows, idx), v[:, -m:].to(self.v.dtype))

    def rows(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[B, capacity, n_kv, D]`` of the batch's slots: the
        buffers themselves when the batch holds every slot (``Glimmer.forward``
        then passes them in slot order), else a gather of those slots."""
        if slots.shape[0] == self.k.shape[0]:
            return self.k, self.v
        # index_select, not self.k[slots]: advanced indexing on CPU takes a
        # parallel path that costs milliseconds on a busy machine.
        return self.k.index_select(0, slots), self.v.index_select(0, slots)


class Attention(nn.Module):
    def __init__(self, config: GlimmerConfig, layer: int, qk_norm: bool = False):
        super().__init__()
        c = config
        self.n_heads, self.n_kv, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim
        self.window = None if c.is_global(layer) else c.sliding_window
        self.wq = nn.Linear(c.hidden, c.q_dim, bias=False)
        self.wk = nn.Linear(c.hidden, c.kv_dim, bias=False)
        self.wv = nn.Linear(c.hidden, c.kv_dim, bias=False)
        self.wgate = nn.Linear(c.hidden, c.q_dim, bias=False)
        self.wo = nn.Linear(c.q_dim, c.hidden, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_eps) if qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.rms_eps) if qk_norm else None
        self.kv_cache: KVCache | None = None

    def in_place(self, T: int) -> bool:
        """Whether a step of T tokens writes its keys before attending over the
        cache as it sits (see the module docstring): nothing it overwrites is
        needed by its own queries."""
        return T == 1 or self.window is None

    def make_mask(self, positions: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        """``[B, 1, group*T, S]``: which keys each query row may see: the T new
        ones without ``lengths``; with it the ring after this step's write, or
        (an SWA prefill chunk) the ring before it and then the T new ones. It
        depends only on the layer's kind and T, so ``Glimmer.forward`` makes
        one per kind."""
        key_pos = positions
        if self.kv_cache is not None and lengths is not None:
            T = positions.shape[1]
            if self.in_place(T):  # the ring after this step's write
                key_pos = self.kv_cache.entry_positions(lengths + T)
            else:                 # the ring before it, then the new keys
                key_pos = torch.cat((self.kv_cache.entry_positions(lengths), positions), dim=1)
        # Causal, within the window, and never an empty entry (position -1).
        qp, kp = positions.unsqueeze(-1), key_pos.unsqueeze(1)              # [B,T,1], [B,1,S]
        mask = (kp <= qp) & (kp >= 0)
        if self.window is not None:
            mask = mask & (qp - kp < self.window)
        (B, T), S, group = positions.shape, key_pos.shape[1], self.n_heads // self.n_kv
        return mask.unsqueeze(1).expand(B, group, T, S).reshape(B, 1, group * T, S)

    def forward(self, x: torch.Tensor, positions: torch.Tensor,
                rot: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor,
                slots: torch.Tensor | None) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim)
        k = self.wk(x).view(B, T, self.n_kv, self.head_dim)
        v = self.wv(x).view(B, T, self.n_kv, self.head_dim)
        if self.q_norm is not None:  # per-head norms come before RoPE (as in Qwen3/Gemma)
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(q, *rot), rope(k, *rot)

        if self.kv_cache is not None and slots is not None:
            cache = self.kv_cache
            if self.in_place(T):
                cache.update(slots, positions, k, v)
                keys, values = cache.rows(slots)
            else:  # an SWA prefill chunk: old ring and new keys, then keep the last window
                old_k, old_v = cache.rows(slots)
                keys = torch.cat((old_k.to(k.dtype), k), dim=1)
                values = torch.cat((old_v.to(v.dtype), v), dim=1)
                cache.update(slots, positions, k, v)
        else:
            keys, values = k, v
        # GQA without copying K/V: query head h uses KV head h // group, so the
        # group's heads become extra query rows of their KV head.
        group, D = self.n_heads // self.n_kv, self.head_dim
        q = q.view(B, T, self.n_kv, group, D).permute(0, 2, 3, 1, 4).reshape(B, self.n_kv, group * T, D)
        # In the cache's dtype when attending over it as it sits (a bfloat16 model
        # with its f16 cache), so the cache is never converted.
        q = q.to(keys.dtype)
        o = F.scaled_dot_product_attention(q, keys.transpose(1, 2), values.transpose(1, 2),
                                           attn_mask=mask).to(x.dtype)      # [B, KV, G*T, D]
        o = o.view(B, self.n_kv, group, T, D).permute(0, 3, 1, 2, 4).reshape(B, T, -1)
        o = o * torch.sigmoid(self.wgate(x))   # gate from the normed input x, per feature
        return self.wo(o)


class FeedForward(nn.Module):
    def __init__(self, config: GlimmerConfig):
        super().__init__()
        self.w_gate = nn.Linear(config.hidden, config.ffn, bias=False)
        self.w_up = nn.Linear(config.hidden, config.ffn, bias=False)
        self.w_down = nn.Linear(config.ffn, config.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class TransformerBlock(nn.Module):
    def __init__(self, config: GlimmerConfig, layer: int, qk_norm: bool = False):
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden, config.rms_eps)
        self.attention = Attention(config, layer, qk_norm)
        self.ffn_norm = RMSNorm(config.hidden, config.rms_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x, positions, rot, mask, slots):
        h = x + self.attention(self.attention_norm(x), positions, rot, mask, slots)
        return h + self.feed_forward(self.ffn_norm(h))


class Glimmer(nn.Module):
    def __init__(self, config: GlimmerConfig, qk_norm: bool = False):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden)
        self.layers = nn.ModuleList(TransformerBlock(config, il, qk_norm)
                                    for il in range(config.n_layers))
        self.norm = RMSNorm(config.hidden, config.rms_eps)
        self.output = nn.Linear(config.hidden, config.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)
        self.register_buffer("lengths", torch.zeros(0, dtype=torch.long), persistent=False)
        self.tokenizer = None  # set by from_gguf when the file carries one
        self.act_dtype: torch.dtype | None = None  # set for packed models
        self.max_seq_len = 0

    # -- cache ------------------------------------------------------------------

    def setup_cache(self, slots: int = 1, max_seq_len: int | None = None,
                    dtype: torch.dtype | None = None) -> None:
        """Allocate an empty KV cache of ``slots`` sequences. Global layers hold
        ``min(max_seq_len, context_length)`` positions, SWA layers their window.
        ``dtype`` defaults to float16 (float32/64 for a model computing in those)."""
        c = self.config
        dtype = dtype or self._cache_dtype()
        ctx = c.context_length if max_seq_len is None else min(max_seq_len, c.context_length)
        if slots < 1 or ctx < 1:
            raise ValueError(f"setup_cache: need slots >= 1 and max_seq_len >= 1, got {slots}, {ctx}")
        device = self.inv_freq.device
        for layer in self.layers:
            att = layer.attention
            cap = ctx if att.window is None else min(att.window, ctx)
            att.kv_cache = KVCache(slots, cap, c.n_kv_heads, c.head_dim, dtype, device)
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)
        self.max_seq_len = ctx

    def reset(self, slots: Sequence[int] | torch.Tensor | None = None) -> None:
        """Forget the cached tokens of ``slots`` (all when None)."""
        if slots is None:
            self.lengths.zero_()
        else:
            self.lengths[torch.as_tensor(slots, device=self.lengths.device)] = 0

    # -- forward ----------------------------------------------------------------

    def forward(self, tokens: torch.Tensor, slots: torch.Tensor | None = None,
                last_only: bool = False) -> torch.Tensor:
        """Logits ``[B, T, vocab]`` for token ids ``[B, T]`` (``[B, 1, vocab]``,
        the last position's, with ``last_only``: a prefill needs no more).

        Without ``slots`` the tokens are one self-contained sequence per row
        (positions 0..T-1, no cache). With ``slots`` (``[B]`` long, distinct),
        row b continues cached sequence ``slots[b]`` from its current length,
        and the cache advances by T. Lengths are trusted here; ``generate``
        and ``check_room`` check them on the host, outside the compiled step."""
        B, T = tokens.shape
        steps = torch.arange(T, device=tokens.device)
        order = None
        if slots is not None and B == self.lengths.numel():
            # Every slot: run the rows in slot order (row s is slot s), so each
            # layer attends over its cache buffers as they sit (KVCache.rows).
            order, slots = slots, torch.arange(B, device=tokens.device)
            tokens = tokens.index_copy(0, order, tokens)
        if slots is None:
            positions, lengths = steps.expand(B, T), None
        else:
            lengths = self.lengths.index_select(0, slots)
            positions = lengths.unsqueeze(-1) + steps
        rot = rope_angles(positions, self.inv_freq)
        # one mask per kind of layer (global, sliding window), shared by its layers
        kinds = {layer.attention.window: layer.attention for layer in self.layers}
        masks = {window: att.make_mask(positions, lengths) for window, att in kinds.items()}
        x = self.tok_embeddings(tokens).to(self.activation_dtype)
        for layer in self.layers:
            x = layer(x, positions, rot, masks[layer.attention.window], slots)
        if slots is not None:
            self.lengths.index_put_((slots,), lengths + T)
        if last_only:
            x = x[:, -1:]
        if order is not None:  # back to the caller's row order
            x = x.index_select(0, order)
        return self.output(self.norm(x))

    def check_room(self, slots: torch.Tensor, n_new: int) -> None:
        """Raise ValueError unless every slot can take ``n_new`` more tokens."""
        if self.lengths.numel() == 0:
            raise ValueError("no KV cache: call setup_cache(slots, max_seq_len) first")
        s = torch.as_tensor(slots).tolist()
        if len(set(s)) != len(s) or min(s) < 0 or max(s) >= self.lengths.numel():
            raise ValueError(f"slots must be distinct ids in [0, {self.lengths.numel()}), got {s}")
        longest = int(self.lengths[torch.as_tensor(s, device=self.lengths.device)].max()) + n_new
        if longest > self.max_seq_len:
            raise ValueError(f"sequence of {longest} tokens exceeds the cache's "
                             f"{self.max_seq_len} (context_length {self.config.context_length})")

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads: every projection and norm in
        full, one row of the embedding table (the KV cache is not counted)."""
        total = 0
        model_buffers = {id(self.inv_freq), id(self.lengths)}
        for mod in self.modules():
            if isinstance(mod, KVCache):
                continue
            own = [t for t in (*mod.parameters(recurse=False), *mod.buffers(recurse=False))
                   if id(t) not in model_buffers]
            size = sum(t.numel() * t.element_size() for t in own)
            total += size // self.config.vocab_size if mod is self.tok_embeddings else size
        return total

    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one decode step reads per slot: every cache entry
        (the step attends over the whole ring, masked)."""
        return sum(2 * layer.attention.kv_cache.k[0].numel() * layer.attention.kv_cache.k.element_size()
                   for layer in self.layers if layer.attention.kv_cache is not None)

    # -- generation -------------------------------------------------------------

    @torch.no_grad()
    def stream(self, input_ids: torch.Tensor | Sequence[int], max_new_tokens: int,
               temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
               seed: int | None = None, stop: Sequence[int] | None = None,
               decode_step: Callable | None = None) -> Iterator[torch.Tensor]:
        """Yield ``[B]`` next tokens as they are produced (one tensor per step).

        ``input_ids`` is ``[T]`` or ``[B, T]``; the B prompts run in cache
        slots 0..B-1 (the cache is set up or reset here). A row that emits a
        token in ``stop`` (default: the tokenizer's EOS) keeps emitting it;
        the stream ends when every row has stopped. ``decode_step`` replaces
        the one-token forward (e.g. a ``torch.compile``d ``model.forward``)."""
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.inv_freq.device)
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
        if stop is None:
            stop = [self.tokenizer.eos_id] if self.tokenizer is not None else []
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

    def generate(self, input_ids, max_new_tokens: int, **kw) -> torch.Tensor:
        """Prompt plus generated tokens, ``[B, T + n]`` (or ``[T + n]`` for a 1-D
        prompt). Takes ``stream``'s keyword arguments."""
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.inv_freq.device)
        out = list(self.stream(ids, max_new_tokens, **kw))
        new = torch.stack(out, dim=-1) if out else ids.new_zeros(ids.reshape(-1, ids.shape[-1]).shape[0], 0)
        if ids.dim() == 1:
            return torch.cat((ids, new[0]))
        return torch.cat((ids, new), dim=-1)

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
    def from_gguf(cls, path: str | os.PathLike, device: torch.device | str | None = None,
                  dtype: torch.dtype = torch.float16, progress: bool = False) -> "Glimmer":
        """Build from a GGUF file after fail-closed admission (GLIMMER.md).

        Projections become ``QLinear`` over the file's packed bytes (the memory
        map itself on CPU, one copy on an accelerator), the embedding a
        ``QEmbedding``; norms are float32. ``dtype`` is the activation dtype."""
        from .gguf_io import load_gguf
        from .loader import admit, packed_weight
        from .tokenizer import ByteTokenizer

        gguf = load_gguf(path)
        config = admit(gguf)  # raises a GGUFError subclass naming what is wrong
        try:
            tokenizer = ByteTokenizer.from_metadata(gguf.metadata)
        except ValueError as e:
            from .errors import MetadataError
            raise MetadataError(f"{path}: {e}") from None
        qk_norm = "blk.0.attn_q_norm.weight" in gguf.tensors

        def get(name, n_out, n_in):  # shapes and companions were admitted above
            return packed_weight(gguf, name)

        label = f"loading {os.path.basename(str(path))}" if progress else None
        return cls._assemble(config, qk_norm, get, device, dtype, tokenizer, label)

    @classmethod
    def random(cls, config: GlimmerConfig, device: torch.device | str | None = None,
               dtype: torch.dtype = torch.float16, seed: int = 0,
               qk_norm: bool = False) -> "Glimmer":
        """Random packed weights made directly on ``device`` in the seed's recipe
        (``config.weight_precision`` picks the lane), at any shape including the
        full 52-layer geometry: random bytes with sane scale fields, no file and
        no float copy of any weight."""
        from .loader import PackedWeight
        from .tiny import random_rows, recipe_type, tensor_std

        device = torch.device(device if device is not None else "cpu")
        gen = torch.Generator(device=device).manual_seed(seed)

        def get(name, n_out, n_in):
            qtype = recipe_type(config, name)
            packed, extra = random_rows(qtype, n_out, n_in, gen, device, tensor_std(name, n_in))
            return PackedWeight(name, qtype, n_out, n_in, packed, **extra)

        return cls._assemble(config, qk_norm, get, device, dtype, None)

    @classmethod
    def _assemble(cls, config, qk_norm, get, device, dtype, tokenizer,
                  progress: str | None = None) -> "Glimmer":
        """Build the module tree on the meta device (no float weights), then put
        a packed module or a float norm at every GGUF name; ``get(name, n_out,
        n_in)`` returns its ``loader.PackedWeight``."""
        from .nn import QEmbedding, QLinear

        device = torch.device(device if device is not None else "cpu")
        with torch.device("meta"):
            model = cls(config, qk_norm)
        shapes = gguf_names(config, qk_norm)
        names = shapes
        if progress is not None:
            from tqdm import tqdm
            names = tqdm(shapes, desc=progress, unit="tensor")
        for name in names:
            n_out, n_in = shapes[name]
            w = get(name, n_out, n_in)
            path = module_name(name).rsplit(".", 1)[0]            # drop ".weight"
            parent, _, leaf = path.rpartition(".")
            owner = model.get_submodule(parent) if parent else model
            if name.endswith("norm.weight"):
                norm = w.dequantize().reshape(n_in).to(device, torch.float32)
                getattr(owner, leaf).weight = nn.Parameter(norm, requires_grad=False)
                continue
            packed, scales, scale_2 = (None if t is None else t.to(device)
                                       for t in (w.packed, w.scales, w.scale_2))
            if name == "token_embd.weight":
                module = QEmbedding(packed, w.qtype, n_out, n_in, scales, scale_2, dtype=dtype)
            else:
                module = QLinear(packed, w.qtype, n_out, n_in, scales, scale_2)
            setattr(owner, leaf, module)
        model._finish(device, dtype)
        left = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
        if left:  # admission guarantees every tensor; this guards the wiring itself
            raise RuntimeError(f"Glimmer: no weight was bound to {left}")
        model.tokenizer = tokenizer
        return model

    def _finish(self, device: torch.device, dtype: torch.dtype) -> None:
        """Recreate the non-persistent buffers that the meta build left empty."""
        self.inv_freq = rope_inv_freq(self.config).to(device)
        self.lengths = torch.zeros(0, dtype=torch.long, device=device)
        self.act_dtype = dtype


# ---- sampling ------------------------------------------------------------------

def sample(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
           top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token ``[B]`` from logits ``[B, V]``: argmax at temperature 0, else a
    draw from the temperature-scaled distribution cut to top-k, then top-p."""
    if temperature == 0:
        return logits.argmax(-1)
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
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
