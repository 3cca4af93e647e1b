"""The building blocks every architecture shares: RMSNorm, RoPE (NeoX
rotate-half and llama.cpp's "normal" adjacent pairs), the KV cache ring,
attention over it, and the gated MLP.

Cache layout and positions. Every layer's cache is a ring of ``capacity``
entries per slot: the context for global layers, the window for sliding
window (SWA) layers; position p lives in entry ``p % capacity``. With ``L``
tokens already cached, entry i holds position
``i + capacity * floor((L-1-i)/capacity)`` (none when ``i >= L``), which for a
global layer (``L <= capacity``) is just i. A step of T new tokens writes its
keys into the ring in place and attends over the cache as it sits, masked by
that formula, when nothing it overwrites is still needed: a decode step
(T = 1 overwrites only the position that fell out of the window) and any step
of a global layer (its ring never wraps: ``check_room`` keeps every length
within it). A prefill chunk on an SWA layer may overwrite keys its own earlier
queries need (it may even be longer than the ring), so it attends over the
cached entries and its new keys together, then stores its last
``min(T, capacity)``. Shapes decide every branch, so the decode step compiles
with ``fullgraph=True``.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import changes
from ..nn import QLinear
from ..ops import layer as layer_ops

__all__ = ["join_projections", "RMSNorm", "rope_inv_freq", "rope_angles", "rope_neox", "rope_normal", "no_rope", "KVCache",
           "Attention", "GatedMLP", "gelu_tanh"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=torch.float32))

    def _apply(self, fn, recurse=True):
        changes.bump()   # .to()/.half() replace the weight without registering it
        return super()._apply(fn, recurse)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_ops.rms_norm(x, self.weight, self.eps)


# ---- RoPE -------------------------------------------------------------------------

def rope_inv_freq(head_dim: int, base: float, linear_scale: float = 1.0) -> torch.Tensor:
    """``base ** (-2i / head_dim) / linear_scale`` for i < head_dim/2 (float64
    math, float32 out). ``linear_scale`` is linear RoPE scaling (positions
    divided by the factor); other scalings plug in here."""
    # on the CPU even inside a meta-device build (tiny; a meta arange costs imports)
    half = torch.arange(0, head_dim, 2, dtype=torch.float64, device="cpu") / head_dim
    return (base ** -half / linear_scale).float()


def rope_angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) ``[B, T, 1, D/2]`` for positions ``[B, T]``: made once per
    forward and shared by every layer with these frequencies."""
    angles = positions.unsqueeze(-1).float() * inv_freq            # [B, T, D/2]
    return angles.cos().unsqueeze(2), angles.sin().unsqueeze(2)


def rope_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX (rotate-half) RoPE: feature i pairs with i + D/2. x ``[B, T, H, D]``."""
    return layer_ops.norm_rope(x, None, 0.0, cos, sin, layer_ops.ROPE_NEOX)


def rope_normal(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """llama.cpp's "normal" RoPE: features 2i and 2i+1 form a pair (what its
    converter's q/k permutation of Llama weights expects). x ``[B, T, H, D]``."""
    return layer_ops.norm_rope(x, None, 0.0, cos, sin, layer_ops.ROPE_NORMAL)


def no_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NoPE: q and k are not rotated (Muse Glimmer's global layers)."""
    return x


# A RoPE function with a ``style`` is one of ``layer_ops.norm_rope``'s, so
# Attention runs the per-head norm and the rotation as that one op; any other
# callable (Llama's scaled and partial rotations) runs after the norm.
rope_neox.style, rope_normal.style, no_rope.style = (layer_ops.ROPE_NEOX, layer_ops.ROPE_NORMAL,
                                                     layer_ops.ROPE_NONE)


# ---- KV cache -----------------------------------------------------------------------

class KVCache(nn.Module):
    """One layer's keys and values: ``[slots, capacity, n_kv, head_dim]`` rings."""

    def __init__(self, slots: int, capacity: int, n_kv: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str | None):
        super().__init__()
        self.capacity = capacity
        shape = (slots, capacity, n_kv, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        # While a list, each update also records what it overwrote, so that a
        # speculative verify can be taken back (``rewind``).
        self.journal: list | None = None

    def _apply(self, fn, recurse=True):
        changes.bump()   # .to()/.half() replace the buffers without registering them
        return super()._apply(fn, recurse)

    def entry_positions(self, lengths: torch.Tensor) -> torch.Tensor:
        """``[B]`` cached lengths -> ``[B, capacity]`` position held by each entry
        (-1 when the entry is still empty)."""
        return layer_ops.ring_positions(lengths, self.capacity)

    def entries(self, slots: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the keys and values at the ring entries of ``positions
        [B, T]`` in ``slots [B]`` (what a write there overwrites, or wrote)."""
        idx = positions % self.capacity
        rows = slots.unsqueeze(-1).expand_as(idx)
        return self.k[rows, idx], self.v[rows, idx]

    def update(self, slots: torch.Tensor, positions: torch.Tensor,
               k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the last ``min(T, capacity)`` of the new keys ``[B, T, n_kv, D]``
        at their ring entries, in place."""
        if self.journal is not None:
            self.journal.append((slots, positions, *self.entries(slots, positions),
                                 k.to(self.k.dtype), v.to(self.v.dtype)))
        layer_ops.kv_store(self.k, self.v, slots, positions, k, v)

    def rewind(self, keep: int) -> None:
        """Take back the journaled step but its first ``keep`` positions: every
        entry it wrote gets its old key back, then the kept positions are
        stored again (a ring entry then holds the newest position below the
        rewound length, as ``entry_positions`` says). Ends the journal."""
        for slots, positions, old_k, old_v, k, v in reversed(self.journal or []):
            idx = positions % self.capacity
            rows = slots.unsqueeze(-1).expand_as(idx)
            self.k.index_put_((rows, idx), old_k)   # a repeated entry got one old value
            self.v.index_put_((rows, idx), old_v)
            if keep:
                layer_ops.kv_store(self.k, self.v, slots, positions[:, :keep], k[:, :keep], v[:, :keep])
        self.journal = None

    def rewind_on_device(self, keep: torch.Tensor) -> None:
        """``rewind`` with ``keep`` a ``[1]`` device tensor, in a fixed set of
        kernels (a recorded DFlash round): each journaled entry gets its new
        key where its row is below ``keep``, else its old one. Exact when no two
        rows of a step share an entry (a ring of at least the step's rows,
        which ``draft_rounds`` checks)."""
        for slots, positions, old_k, old_v, k, v in self.journal or []:
            kept = (torch.arange(positions.shape[1], device=keep.device) < keep).view(1, -1, 1, 1)
            layer_ops.kv_store(self.k, self.v, slots, positions, torch.where(kept, k, old_k),
                               torch.where(kept, v, old_v))
        self.journal = None

    def rows(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[B, capacity, n_kv, D]`` of the batch's slots: the
        buffers themselves when the batch holds every slot (``Decoder.forward``
        then passes them in slot order), else a gather of those slots."""
        if slots.shape[0] == self.k.shape[0]:
            return self.k, self.v
        # index_select, not self.k[slots]: advanced indexing on CPU takes a
        # parallel path that costs milliseconds on a busy machine.
        return self.k.index_select(0, slots), self.v.index_select(0, slots)


# ---- attention ----

class Mask(NamedTuple):
    """One window's attention mask for a step (``Attention.make_mask``)."""
    keep: torch.Tensor
    valid: torch.Tensor | None


# ---- attention (the layer) ------------------------------------------------------------------------

class Attention(nn.Module):
    """Multi-head attention with GQA over a ``KVCache``.

    Options: ``window`` (sliding window; None is global), ``rope`` (a RoPE
    function) with ``rope_slot`` (which of the model's frequency tables this
    layer uses), ``qk_norm_eps`` (per-head RMSNorm of q and k before RoPE),
    ``gate`` (Glimmer's sigmoid output gate from the normed input), ``bias``
    (q/k/v biases), ``scale`` (of q.k; None is 1/sqrt(head_dim)) and
    ``scale_q`` (llama.cpp's graph multiplies q by the scale before attention,
    as for Gemma, rather than the scores: the same in float, but ggml's
    numerics round q to f16 after it)."""

    def __init__(self, hidden: int, n_heads: int, n_kv: int, head_dim: int, *,
                 window: int | None = None, rope: Callable = rope_neox, rope_slot: int = 0,
                 qk_norm_eps: float | None = None, gate: bool = False, bias: bool = False,
                 scale: float | None = None, scale_q: bool = False):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = n_heads, n_kv, head_dim
        self.window, self.rope, self.rope_slot, self.scale = window, rope, rope_slot, scale
        self.scale_q = scale_q
        q_dim, kv_dim = n_heads * head_dim, n_kv * head_dim
        self.wq = nn.Linear(hidden, q_dim, bias=bias)
        self.wk = nn.Linear(hidden, kv_dim, bias=bias)
        self.wv = nn.Linear(hidden, kv_dim, bias=bias)
        self.wgate = nn.Linear(hidden, q_dim, bias=False) if gate else None
        self.wo = nn.Linear(q_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.kv_cache: KVCache | None = None
        self.joined = JoinedProjections()

    def join_projections(self) -> int:
        return self.joined.join(self, ("wq", "wk", "wv", "wgate"))

    @staticmethod
    def _head_norm(norm: "RMSNorm | None") -> tuple[torch.Tensor | None, float]:
        return (None, 0.0) if norm is None else (norm.weight, norm.eps)

    def in_place(self, T: int) -> bool:
        """Whether a step of T tokens writes its keys before attending over the
        cache as it sits (see the module docstring): nothing it overwrites is
        needed by its own queries."""
        return T == 1 or self.window is None

    def make_mask(self, positions: torch.Tensor, lengths: torch.Tensor | None) -> "Mask":
        """``keep [B, 1, group*T, S]``: which keys each query row may see: the T new
        ones without ``lengths``; with it the ring after this step's write, or
        (an SWA prefill chunk) the ring before it and then the T new ones. It
        depends only on the layer's window and T, so ``Decoder.forward`` makes
        one per window. ``valid [B]``, for a step that attends over the ring as it
        sits, counts its leading entries that may hold a key (the rest are
        empty), so a kernel can skip reading them."""
        (B, T), group = positions.shape, self.n_heads // self.n_kv
        if self.kv_cache is not None and lengths is not None and T == 1:   # a decode step
            keep, valid = layer_ops.decode_mask(lengths, self.kv_cache.capacity, self.window or 0)
            return Mask(keep[:, None, None, :].expand(B, 1, group, keep.shape[1]), valid)
        key_pos, valid = positions, None
        if self.kv_cache is not None and lengths is not None:
            if self.in_place(T):  # the ring after this step's write
                key_pos = self.kv_cache.entry_positions(lengths + T)
                valid = (lengths + T).clamp(max=self.kv_cache.capacity)
            else:                 # the ring before it, then the new keys
                key_pos = torch.cat((self.kv_cache.entry_positions(lengths), positions), dim=1)
        # Causal, within the window, and never an empty entry (position -1).
        qp, kp = positions.unsqueeze(-1), key_pos.unsqueeze(1)              # [B,T,1], [B,1,S]
        mask = (kp <= qp) & (kp >= 0)
        if self.window is not None:
            mask = mask & (qp - kp < self.window)
        S = key_pos.shape[1]
        return Mask(mask.unsqueeze(1).expand(B, group, T, S).reshape(B, 1, group * T, S), valid)

    def forward(self, x: torch.Tensor, positions: torch.Tensor,
                rot: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor,
                slots: torch.Tensor | None) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v, gate = self.joined.project(self, x, ("wq", "wk", "wv", "wgate"))
        q = q.view(B, T, self.n_heads, self.head_dim)
        k = k.view(B, T, self.n_kv, self.head_dim)
        v = v.view(B, T, self.n_kv, self.head_dim)
        style = getattr(self.rope, "style", None)
        if style is not None:  # per-head norms (Qwen3, Gemma 3) and RoPE as one op each
            q = layer_ops.norm_rope(q, *self._head_norm(self.q_norm), *rot, style)
            k = layer_ops.norm_rope(k, *self._head_norm(self.k_norm), *rot, style)
        else:
            if self.q_norm is not None:  # per-head norms come before RoPE
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = self.rope(q, *rot), self.rope(k, *rot)

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
        scale = self.scale if self.scale is not None else 1 / math.sqrt(D)
        if T == 1 and group <= 64:  # one query position: the decode-attention op
            o = layer_ops.decode_attention(q, keys, values, mask.keep, scale, mask.valid)
        else:
            # In the cache's dtype when attending over it as it sits (a bfloat16 model
            # with its f16 cache), so the cache is never converted.
            o = F.scaled_dot_product_attention(q.to(keys.dtype), keys.transpose(1, 2),
                                               values.transpose(1, 2), attn_mask=mask.keep,
                                               scale=scale).to(x.dtype)
        o = o.view(B, self.n_kv, group, T, D).permute(0, 3, 1, 2, 4).reshape(B, T, -1)
        if gate is not None:   # Glimmer's gate from the normed input x, per feature
            o = layer_ops.gated_act(gate, o, layer_ops.ACT_SIGMOID)
        return self.wo(o)


# ---- MLP --------------------------------------------------------------------------------

def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation (Gemma's ``gelu_pytorch_tanh``, llama.cpp's GELU)."""
    return F.gelu(x, approximate="tanh")


class GatedMLP(nn.Module):
    """``w_down(act(w_gate(x)) * w_up(x))``: SwiGLU with ``F.silu``, GeGLU with ``gelu_tanh``."""

    def __init__(self, hidden: int, ffn: int, act: Callable = F.silu):
        super().__init__()
        self.act = act
        self.w_gate = nn.Linear(hidden, ffn, bias=False)
        self.w_up = nn.Linear(hidden, ffn, bias=False)
        self.w_down = nn.Linear(ffn, hidden, bias=False)
        self.joined = JoinedProjections()

    def join_projections(self) -> int:
        return self.joined.join(self, ("w_gate", "w_up"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.joined.project(self, x, ("w_gate", "w_up"))
        act = _GATED_ACTS.get(self.act)
        if act is None:
            return self.w_down(self.act(gate) * up)
        return self.w_down(layer_ops.gated_act(gate, up, act))


def join_projections(model: nn.Module) -> int:
    """Join each attention's q/k/v(/gate) and each MLP's gate/up into packed
    matrices that read x once, wherever their types allow (``QLinear.concat``);
    returns how many joined matrices were made. For weights that are copies on an accelerator: on the CPU the
    packed bytes are the file's memory map, which a join would copy."""
    return sum(m.join_projections() for m in model.modules() if isinstance(m, (Attention, GatedMLP)))


JOIN_MAX_TOKENS = 16   # activation rows up to which joined matrices run (decode, DFlash's verify)


class JoinedProjections(nn.Module):
    """Projections of one input that share a packed matrix: the parts that can
    join (same type, width, numerics; ``QLinear.concat``) are grouped, each
    group one matrix whose output's column slices are the parts' outputs."""

    def __init__(self):
        super().__init__()
        self.groups = nn.ModuleList()
        self.members: list[tuple[str, ...]] = []

    def join(self, owner: nn.Module, names: tuple[str, ...]) -> int:
        if self.members:   # joined already
            return len(self.members)
        by_kind: dict[tuple, list[str]] = {}
        for name in names:
            p = getattr(owner, name)
            if isinstance(p, QLinear) and p.scales is None:
                by_kind.setdefault((p.qtype, p.n_in, p.numerics, p.bias is None), []).append(name)
        for group in by_kind.values():
            joined = QLinear.concat([getattr(owner, n) for n in group]) if len(group) > 1 else None
            if joined is not None:
                self.groups.append(joined)
                self.members.append(tuple(group))
        return len(self.members)

    def project(self, owner: nn.Module, x: torch.Tensor,
                names: tuple[str, ...]) -> list[torch.Tensor | None]:
        """Each named projection of x (None for an absent one). Past
        ``JOIN_MAX_TOKENS`` rows the parts run alone (over the same bytes): the
        join saves launches and reads of x, which matter at decode sizes, while
        the tensor-core tiles of a prefill ran slower on the joined shapes (H200,
        docs/performance.md)."""
        out: dict[str, torch.Tensor] = {}
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        for joined, group in zip(self.groups, self.members):
            if rows > JOIN_MAX_TOKENS:
                break
            y, col = joined(x), 0
            for name in group:
                n = getattr(owner, name).n_out
                out[name] = y[..., col:col + n]
                col += n
        # a loop, not a comprehension: on Python 3.11 a comprehension is one more
        # frame on every projection's walk (docs/architecture.md counts them)
        result = []
        for n in names:
            m = getattr(owner, n)
            result.append(out[n] if n in out else (None if m is None else m(x)))
        return result


# the activations ``layer_ops.gated_act`` computes with the multiply, as one op
_GATED_ACTS = {F.silu: layer_ops.ACT_SILU, gelu_tanh: layer_ops.ACT_GELU_TANH}


class PreNormBlock(nn.Module):
    """``h = x + attention(norm(x))``, then ``h + mlp(norm(h))``: the block of
    the llama family (Gemma 3 and Muse Glimmer use ``SandwichBlock``)."""

    def __init__(self, hidden: int, eps: float, attention: nn.Module, feed_forward: nn.Module):
        super().__init__()
        self.attention_norm = RMSNorm(hidden, eps)
        self.attention = attention
        self.ffn_norm = RMSNorm(hidden, eps)
        self.feed_forward = feed_forward

    def forward(self, x, positions, rot, mask, slots):
        a = self.attention(self.attention_norm(x), positions, rot, mask, slots)
        h, y = layer_ops.add_rms_norm(x, a, self.ffn_norm.weight, self.ffn_norm.eps)
        return h + self.feed_forward(y)


class SandwichBlock(nn.Module):
    """``h = x + post_norm(attention(norm(x)))``, then the same around the MLP:
    the block of Gemma 3 and Muse Glimmer (``post_eps``: the post-norms' eps)."""

    def __init__(self, hidden: int, eps: float, post_eps: float, attention: nn.Module,
                 feed_forward: nn.Module):
        super().__init__()
        self.attention_norm = RMSNorm(hidden, eps)
        self.attention = attention
        self.post_attention_norm = RMSNorm(hidden, post_eps)
        self.ffn_norm = RMSNorm(hidden, eps)
        self.feed_forward = feed_forward
        self.post_ffw_norm = RMSNorm(hidden, post_eps)

    def forward(self, x, positions, rot, mask, slots):
        a = self.attention(self.attention_norm(x), positions, rot, mask, slots)
        post, pre = self.post_attention_norm, self.ffn_norm
        h, y = layer_ops.add_rms_norm(x, a, pre.weight, pre.eps, post.weight, post.eps)
        post = self.post_ffw_norm
        return layer_ops.add_rms_norm(h, self.feed_forward(y), None, 0.0, post.weight, post.eps)[0]
