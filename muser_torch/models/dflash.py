"""A DFlash draft (``arch/dflash.py`` holds the facts), as transformers'
``MuseGlimmerAssistantModel`` defines it and llama.cpp's ``dflash.cpp`` runs
it. It has no embedding and no lm_head: it borrows its target's.

* ``extend``: the target's tapped hidden states of newly accepted tokens,
  ``[n, taps x hidden]``, are encoded once, ``ctx = enc_norm(fc(taps))``, and
  kept per layer as keys ``rope(k_norm(Wk ctx))`` and values ``Wv ctx`` at
  their absolute positions (not normed by the layer's input norm);
* ``propose``: the block ``[anchor, mask x (block_size - 1)]`` at positions
  ``n .. n + block_size - 1``, embedded with the target's raw table, runs
  through pre-norm layers whose queries are the block's rows and whose keys
  are the context's and the block's, bidirectional within the window
  (``|q - k| <= window``); the final norm, then the target's lm_head, no
  logit scale or soft-cap. Row 0 (the anchor's) is dropped.

The block's own keys are never stored: each round computes them afresh, so a
rejected proposal leaves nothing to take back. Context keys older than the
window behind the next block are dropped."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..arch.dflash import DFLASH, DFlashConfig
from ..errors import DraftMismatchError
from ..gguf_io import GGUFFile, load_gguf
from ..loader import check, packed_weight
from ..ops import layer as layer_ops
from .assembly import assemble
from .parts import GatedMLP, RMSNorm, rope_angles, rope_inv_freq

__all__ = ["Drafter", "DraftContext", "DraftRing"]


class DraftAttention(nn.Module):
    def __init__(self, c: DFlashConfig, window: int | None):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim, self.window = c.n_heads, c.n_kv_heads, c.head_dim, window
        self.wq = nn.Linear(c.hidden, c.q_dim, bias=False)
        self.wk = nn.Linear(c.hidden, c.kv_dim, bias=False)
        self.wv = nn.Linear(c.hidden, c.kv_dim, bias=False)
        self.wo = nn.Linear(c.q_dim, c.hidden, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_eps)

    def keys(self, x: torch.Tensor, rot) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, rotated) and values ``[B, T, n_kv, D]`` of rows x."""
        B, T, _ = x.shape
        k = self.wk(x).view(B, T, self.n_kv, self.head_dim)
        k = layer_ops.norm_rope(k, self.k_norm.weight, self.k_norm.eps, *rot, layer_ops.ROPE_NEOX)
        return k, self.wv(x).view(B, T, self.n_kv, self.head_dim)

    def forward(self, x: torch.Tensor, rot, positions: torch.Tensor, ctx_k: torch.Tensor,
                ctx_v: torch.Tensor, ctx_pos: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim)
        q = layer_ops.norm_rope(q, self.q_norm.weight, self.q_norm.eps, *rot, layer_ops.ROPE_NEOX)
        k, v = self.keys(x, rot)
        keys, values = torch.cat((ctx_k, k), dim=1), torch.cat((ctx_v, v), dim=1)
        key_pos = torch.cat((ctx_pos, positions))
        # never an empty entry (position -1, in a ring: ``DraftRing``)
        keep = (key_pos >= 0).expand(T, key_pos.numel())
        if self.window is not None:   # bidirectional: within the window either way
            keep = keep & ((positions.unsqueeze(-1) - key_pos).abs() <= self.window)
        group = self.n_heads // self.n_kv
        keys = keys.transpose(1, 2).repeat_interleave(group, dim=1)
        values = values.transpose(1, 2).repeat_interleave(group, dim=1)
        o = F.scaled_dot_product_attention(q.transpose(1, 2).to(keys.dtype), keys, values,
                                           attn_mask=keep, scale=1 / math.sqrt(self.head_dim))
        return self.wo(o.transpose(1, 2).reshape(B, T, -1).to(x.dtype))


class DraftLayer(nn.Module):
    def __init__(self, c: DFlashConfig, layer: int):
        super().__init__()
        self.attention_norm = RMSNorm(c.hidden, c.rms_eps)
        self.attention = DraftAttention(c, c.window(layer))
        self.ffn_norm = RMSNorm(c.hidden, c.rms_eps)
        self.feed_forward = GatedMLP(c.hidden, c.ffn, F.silu)

    def forward(self, x, rot, positions, ctx_k, ctx_v, ctx_pos):
        x = x + self.attention(self.attention_norm(x), rot, positions, ctx_k, ctx_v, ctx_pos)
        return x + self.feed_forward(self.ffn_norm(x))


@dataclass
class DraftContext:
    """The encoded context of one sequence: per layer, keys and values
    ``[1, S, n_kv, D]``, and their positions ``[S]``; ``length`` positions
    have been seen."""
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    positions: torch.Tensor | None = None
    length: int = 0


@dataclass
class DraftRing:
    """The encoded context of one sequence in static buffers, for rounds
    recorded as a CUDA graph (``models/draft_rounds.py``): per layer, keys and
    values ``[1, C, n_kv, D]`` in a ring of C entries (position p at entry
    ``p % C``), ``positions [C]`` (-1: an empty entry, or a row of a block
    that was not accepted) and ``length [1]``, all on the device."""
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    positions: torch.Tensor
    length: torch.Tensor

    @property
    def capacity(self) -> int:
        return self.positions.numel()


class Drafter(nn.Module):
    ARCH = DFLASH
    EMBED_DTYPE = None

    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(config.fc_in, config.hidden, bias=False)
        self.enc_norm = RMSNorm(config.hidden, config.rms_eps)
        self.layers = nn.ModuleList(DraftLayer(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.hidden, config.rms_eps)
        self.register_buffer("inv_freq", rope_inv_freq(config.head_dim, config.rope_base), persistent=False)
        self.tokenizer = None
        self.act_dtype = torch.float32
        self.__dict__["_target"] = None   # not a submodule: its weights are the target's

    @property
    def target(self) -> Any:
        """The model whose embedding, lm_head and hidden states the draft uses."""
        return self.__dict__["_target"]

    @classmethod
    def build(cls, config: DFlashConfig, groups: frozenset[str]) -> "Drafter":
        return cls(config)

    def finish(self, device: torch.device, dtype: torch.dtype) -> None:
        self.inv_freq = rope_inv_freq(self.config.head_dim, self.config.rope_base).to(device)
        self.act_dtype = dtype

    @property
    def tap_layers(self) -> tuple[int, ...]:
        """The target layers whose outputs the draft reads (llama.cpp's target_layers - 1)."""
        return tuple(t - 1 for t in self.config.target_layers)

    # -- construction ---------------------------------------------------------------

    @classmethod
    def from_gguf(cls, path: "str | os.PathLike[str]", target: Any) -> "Drafter":
        return cls.from_file(load_gguf(path), target)

    @classmethod
    def from_file(cls, gguf: GGUFFile, target: Any) -> "Drafter":
        """The draft in ``gguf``, on ``target``'s device and activation dtype,
        sharing its packed embedding and lm_head; DraftMismatchError when there
        is no target or it does not fit."""
        where = gguf.path.name
        if target is None:
            raise DraftMismatchError(f"{where} is a DFlash draft: load it with its target, "
                                     f"muser_torch.from_gguf({where!r}, target=model)")
        admitted = check(gguf, DFLASH)
        check_fit(admitted.config, target, where)
        device = target.lengths.device
        draft = assemble(cls, admitted.config, admitted.groups,
                         lambda name, n_out, n_in: packed_weight(gguf, name), device,
                         target.activation_dtype, None)
        draft.__dict__["_target"] = target
        return draft

    # -- the draft's two steps -------------------------------------------------------

    def _rot(self, positions: torch.Tensor):
        cos, sin = rope_angles(positions.unsqueeze(0), self.inv_freq)
        return cos, sin

    @torch.no_grad()
    def extend(self, ctx: DraftContext, tapped: torch.Tensor) -> None:
        """Encode the target's tapped hidden states ``[1, n, taps x hidden]`` of
        the next n positions into ``ctx``; drop keys no later block can see."""
        n = tapped.shape[1]
        positions = torch.arange(ctx.length, ctx.length + n, device=tapped.device)
        x = self.enc_norm(self.fc(tapped.to(self.act_dtype)))
        rot = self._rot(positions)
        new = [layer.attention.keys(x, rot) for layer in self.layers]
        if ctx.positions is None:
            ctx.keys, ctx.values = [k for k, _ in new], [v for _, v in new]
            ctx.positions = positions
        else:
            ctx.keys = [torch.cat((a, k), dim=1) for a, (k, _) in zip(ctx.keys, new)]
            ctx.values = [torch.cat((a, v), dim=1) for a, (_, v) in zip(ctx.values, new)]
            ctx.positions = torch.cat((ctx.positions, positions))
        ctx.length += n
        windows = [layer.attention.window for layer in self.layers]
        if None not in windows:   # the next block starts at ctx.length and looks back max(window)
            first = int(torch.searchsorted(ctx.positions, ctx.length - max(windows)))
            if first:
                ctx.keys = [k[:, first:] for k in ctx.keys]
                ctx.values = [v[:, first:] for v in ctx.values]
                ctx.positions = ctx.positions[first:]

    @torch.no_grad()
    def propose(self, ctx: DraftContext, anchor: int) -> torch.Tensor:
        """Logits ``[block_size - 1, vocab]`` of the block after ``anchor``, the
        token at position ``ctx.length`` (float32)."""
        device = ctx.positions.device
        anchor_t = torch.tensor([anchor], dtype=torch.long, device=device)
        positions = torch.arange(ctx.length, ctx.length + self.config.block_size, device=device)
        return self._block(anchor_t, positions, ctx.keys, ctx.values, ctx.positions)

    def _block(self, anchor: torch.Tensor, positions: torch.Tensor, keys: list[torch.Tensor],
               values: list[torch.Tensor], key_pos: torch.Tensor) -> torch.Tensor:
        """``propose``'s logits for ``anchor [1]`` (a device tensor) at ``positions``."""
        c, target = self.config, self.target
        ids = torch.cat((anchor, torch.full((c.block_size - 1,), c.mask_token_id,
                                            dtype=torch.long, device=anchor.device)))[None]
        x = target.tok_embeddings(ids).to(self.act_dtype)   # raw: no norm, no scale
        rot = self._rot(positions)
        for layer, k, v in zip(self.layers, keys, values):
            x = layer(x, rot, positions, k, v, key_pos)
        return target.output(self.norm(x[:, 1:]))[0].float()

    # -- the same two steps over a ring of static buffers (models/draft_rounds.py) ---------

    def new_ring(self, capacity: int) -> DraftRing:
        """An empty ring of ``capacity`` entries on the draft's device."""
        c, device = self.config, self.inv_freq.device
        shape = (1, capacity, c.n_kv_heads, c.head_dim)
        return DraftRing([torch.zeros(shape, dtype=self.act_dtype, device=device) for _ in self.layers],
                         [torch.zeros(shape, dtype=self.act_dtype, device=device) for _ in self.layers],
                         torch.full((capacity,), -1, dtype=torch.long, device=device),
                         torch.zeros(1, dtype=torch.long, device=device))

    @torch.no_grad()
    def extend_ring(self, ring: DraftRing, tapped: torch.Tensor, keep: torch.Tensor) -> None:
        """``extend`` into ``ring``: the first ``keep`` (a ``[1]`` device tensor)
        of the rows ``tapped [1, n, taps x hidden]`` are the next positions; the
        others are written as empty entries (n static, so a recorded round
        always writes its whole block). Of n > capacity rows the last
        capacity are kept, which a ring of at least the window plus a block
        holds for every later block."""
        n = tapped.shape[1]
        if n > ring.capacity:
            skip = n - ring.capacity   # positions no later block looks back to
            tapped, n = tapped[:, skip:], ring.capacity
            ring.length += skip
            keep = keep - skip
        rows = torch.arange(n, device=tapped.device)
        positions = ring.length + rows
        entries = positions % ring.capacity
        x = self.enc_norm(self.fc(tapped.to(self.act_dtype)))
        rot = self._rot(positions)
        for layer, keys, values in zip(self.layers, ring.keys, ring.values):
            k, v = layer.attention.keys(x, rot)
            keys[0].index_copy_(0, entries, k[0].to(keys.dtype))
            values[0].index_copy_(0, entries, v[0].to(values.dtype))
        ring.positions.index_copy_(0, entries, torch.where(rows < keep, positions, -1))
        ring.length += keep

    def propose_ring(self, ring: DraftRing, anchor: torch.Tensor) -> torch.Tensor:
        """``propose`` over ``ring``: ``anchor [1]`` on the device."""
        positions = ring.length + torch.arange(self.config.block_size, device=anchor.device)
        return self._block(anchor, positions, ring.keys, ring.values, ring.positions)


def check_fit(c: DFlashConfig, target: Any, where: str) -> None:
    """DraftMismatchError naming the first thing of the draft that does not fit the target."""
    tc = getattr(target, "config", None)
    if tc is None or not hasattr(target, "tok_embeddings") or not hasattr(target, "output"):
        raise DraftMismatchError(f"{where}: target is {type(target).__name__}, expected a model "
                                 f"from muser_torch.from_gguf")
    if c.vocab_size != tc.vocab_size:
        raise DraftMismatchError(f"{where}: the draft's vocabulary has {c.vocab_size:,} tokens, its "
                                 f"target's {tc.vocab_size:,}")
    if c.hidden != tc.hidden:
        raise DraftMismatchError(f"{where}: dflash.embedding_length is {c.hidden}, its target's hidden "
                                 f"size is {tc.hidden}")
    bad = [t for t in c.target_layers if not 1 <= t < tc.n_layers]
    if bad:
        raise DraftMismatchError(f"{where}: dflash.target_layers {list(c.target_layers)} taps layer "
                                 f"input {bad[0]}, but the target's {tc.n_layers} layers have inputs "
                                 f"1 .. {tc.n_layers - 1} past the embedding")
