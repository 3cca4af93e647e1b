"""The decode step's layers on the CPU library: one call of ``decode.c``'s
``muser_decode_block`` per layer instead of about a hundred torch ops; and
the same for a short run of new tokens of one sequence (``muser_extend_block``:
a speculative verify block, a short prompt).

``Decoder.forward`` asks :func:`native_layers` for a runner when a step is
one token per sequence, or up to ``EXTEND_MAX_TOKENS`` tokens of one sequence
that fit every layer's ring, on plain eager CPU float32 tensors (``ops.cpu.eager``'s
rule: nothing that must see the ops is active) and every layer is one this
module can describe: a ``PreNormBlock`` or ``SandwichBlock`` of the shared
``Attention`` and ``GatedMLP`` (their own forwards, not a subclass's), packed
``QLinear`` projections the library runs as the ops would, float32 norms, a
float32 KV cache, a RoPE of ``parts`` or ``rope_scaling.rotate`` and a SiLU or
GELU-tanh MLP. Anything else (and any step with gradients to record) runs the
torch modules, so compiled, traced and differentiated steps always do.

The description holds data pointers, so it is rebuilt whenever a module of
the model changes (``muser_torch.changes``: a count compared each step).
A layer's forward hooks marked :func:`output_hook` (speculative decoding's
taps) are called with the layer's output; any other hook keeps the step on
the torch modules. A KV cache's journal (a verify that may be taken back)
records what the library overwrites, as ``KVCache.update`` does.
"""
from __future__ import annotations

import ctypes
import functools
import math

import torch
import torch.nn.functional as F

from .. import changes
from ..nn import QLinear
from ..ops.native import BACK_TO_BACK_THREAD_MIN_BYTES, FUSED_MAX_TOKENS, plain_eager, profiling, recorded
from ..ops.native import block as cb
from ..ops.native import native_lib as _native_lib
from .parts import (Attention, GatedMLP, KVCache, PreNormBlock, RMSNorm, SandwichBlock, gelu_tanh,
                    no_rope, rope_neox, rope_normal)
from .rope_scaling import rotate

__all__ = ["native_layers", "NativeLayers", "output_hook", "EXTEND_MAX_TOKENS"]

# The longest run of one sequence's new tokens a step runs on the library: a
# DFlash verify block (16 rows). Longer prefills take the torch modules' GEMMs.
EXTEND_MAX_TOKENS = 16

_ACTIVATIONS = {F.silu: "silu", gelu_tanh: "gelu_tanh"}
_ATTENTION_PARTS = ("wq", "wk", "wv", "wgate", "wo")
_MLP_PARTS = ("w_gate", "w_up", "w_down")


def _rope(att: Attention, n_rot_default: int) -> tuple[str, int, float] | None:
    """(mode, features rotated, mscale) of the layer's RoPE, None if unknown."""
    r = att.rope
    if r is rope_neox:
        return "neox", n_rot_default, 1.0
    if r is rope_normal:
        return "normal", n_rot_default, 1.0
    if r is no_rope:
        return "none", 0, 1.0
    if isinstance(r, functools.partial) and r.func is rotate and not r.args:
        kw = r.keywords
        if kw.get("mode") in ("neox", "normal") and isinstance(kw.get("n_rot"), int):
            return kw["mode"], kw["n_rot"], float(kw.get("mscale", 1.0))
    return None


def _plain_f32(t: torch.Tensor | None) -> bool:
    return t is None or (t.dtype is torch.float32 and t.is_cpu and t.is_contiguous())


def _norm(n: RMSNorm | None) -> cb.Norm | None:
    if n is None:
        return cb.norm(None, 0.0)
    if type(n).forward is not RMSNorm.forward or not _plain_f32(n.weight):
        return None
    return cb.norm(n.weight, n.eps)


def _linear(m) -> cb.Linear | None:
    if m is None:
        return cb.ABSENT
    if type(m) is not QLinear or not m.packed.is_cpu or not _plain_f32(m.bias):
        return None
    return cb.linear(m.packed, m.qtype, m.n_out, m.n_in, m.scales, m.scale_2, m.numerics, m.bias,
                     m.repacked())


def _describe(layer) -> cb.Block | None:
    """The layer as decode.c's block, or None when it is not one it runs."""
    kind = type(layer).forward
    if kind not in (PreNormBlock.forward, SandwichBlock.forward):
        return None
    att, mlp = layer.attention, layer.feed_forward
    if (type(att).forward is not Attention.forward or type(mlp).forward is not GatedMLP.forward
            or not isinstance(att.kv_cache, KVCache) or mlp.act not in _ACTIVATIONS):
        return None
    cache = att.kv_cache
    ring = (cache.capacity, att.n_kv, att.head_dim)
    if not (_plain_f32(cache.k) and _plain_f32(cache.v) and cache.k.shape[1:] == ring
            and cache.v.shape == cache.k.shape):
        return None
    rope = _rope(att, att.head_dim)
    sandwich = kind is SandwichBlock.forward
    norms = {"attn_norm": layer.attention_norm, "q_norm": att.q_norm, "k_norm": att.k_norm,
             "post_attn_norm": layer.post_attention_norm if sandwich else None,
             "ffn_norm": layer.ffn_norm, "post_ffw_norm": layer.post_ffw_norm if sandwich else None}
    norms = {k: _norm(n) for k, n in norms.items()}
    linears = {name: _linear(getattr(att, name)) for name in _ATTENTION_PARTS}
    linears |= {name: _linear(getattr(mlp, name)) for name in _MLP_PARTS}
    if rope is None or None in norms.values() or None in linears.values():
        return None
    mode, n_rot, mscale = rope
    return cb.Block(hidden=layer.attention_norm.weight.numel(), n_heads=att.n_heads, n_kv=att.n_kv,
                    head_dim=att.head_dim, ffn=mlp.w_gate.n_out, **norms, **linears,
                    rope=cb.ROPE[mode], act=cb.ACTIVATIONS[_ACTIVATIONS[mlp.act]], n_rot=n_rot,
                    mscale=mscale,
                    scale=att.scale if att.scale is not None else 1.0 / math.sqrt(att.head_dim),
                    k_cache=cache.k.data_ptr(), v_cache=cache.v.data_ptr(),
                    capacity=cache.capacity)


def _unfit(block: cb.Block | None, slot: int, inv_freqs: list[torch.Tensor]) -> str | None:
    """Why a layer cannot run on the library (None: it can)."""
    if block is None:
        return "a module, dtype or weight type the blocks do not describe"
    if block.rope == cb.ROPE["none"]:
        return None
    # a rotating layer's table holds its n_rot / 2 frequencies, as float32
    if slot >= len(inv_freqs) or not _plain_f32(inv_freqs[slot]):
        return f"RoPE table {slot} is missing or not float32"
    if 2 * inv_freqs[slot].numel() != block.n_rot:
        return f"RoPE table {slot} has {inv_freqs[slot].numel()} frequencies for {block.n_rot} features"
    return None


def output_hook(fn):
    """Marks a forward hook ``fn(module, args, output)`` that reads only the
    output, so a step on the library may call it with ``args=None``."""
    fn.output_only = True
    return fn


def _only_output_hooks(layer) -> bool:
    """Whether every hook of the layer is an ``output_hook`` (none is too)."""
    if layer._forward_pre_hooks or getattr(layer, "_forward_hooks_with_kwargs", None):
        return False
    return all(getattr(h, "output_only", False) for h in layer._forward_hooks.values())


class NativeLayers:
    """The layers of one model as decode.c blocks, and the scratch they share."""

    def __init__(self, layers, inv_freqs: list[torch.Tensor], lib) -> None:
        self.lib = lib
        self.version = changes.count()
        self.blocks = [_describe(layer) for layer in layers]
        # every storage a block points at, kept alive (see muser_torch/changes.py)
        self.storages = [t.untyped_storage() for layer in layers
                         for t in (*layer.parameters(), *layer.buffers())] + \
            [t.untyped_storage() for t in inv_freqs]
        self.rope_slots = [layer.attention.rope_slot for layer in layers]
        self.why_not = next((f"layer {i}: {why}" for i, (b, k) in
                             enumerate(zip(self.blocks, self.rope_slots))
                             if (why := _unfit(b, k, inv_freqs))), None)
        self.ok = self.why_not is None
        # what each step's rows must fit: the slots every cache holds, the hidden width
        self.slots = min((layer.attention.kv_cache.k.shape[0] for layer in layers), default=0) \
            if self.ok else 0
        self.capacity = min((layer.attention.kv_cache.capacity for layer in layers), default=0) \
            if self.ok else 0
        self.layers, self.caches = list(layers), [layer.attention.kv_cache for layer in layers]
        self.hidden = {b.hidden for b in self.blocks} if self.ok else set()
        self.params = [p for layer in layers for p in layer.parameters()]
        self.work = self.refs = None
        if self.ok:
            rows = max(FUSED_MAX_TOKENS, EXTEND_MAX_TOKENS)
            need = max(cb.block_work(lib, b, rows) for b in self.blocks)
            self.work = torch.empty(need)
            self.refs = [ctypes.byref(b) for b in self.blocks]

    def __reduce__(self):
        # a copied or unpickled model builds its own (the pointers are this one's)
        return _rebuilt_later, ()

    def __call__(self, x: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor,
                 inv_freqs: list[torch.Tensor]) -> torch.Tensor:
        """x ``[B, T, hidden]`` through every layer (a new tensor); slots and
        lengths ``[B]`` int64 as ``Decoder.forward`` has them, ``inv_freqs`` the
        model's RoPE tables. ``T`` is 1 (B sequences, each at its length), or
        B is 1 (T new tokens of one sequence: positions length .. length+T-1)."""
        B, T, _ = x.shape
        x = x.contiguous().clone()
        slots, lengths = slots.contiguous(), lengths.contiguous()
        positions = lengths if T == 1 else torch.arange(T) + lengths
        lib, rows = self.lib, B * T
        angles = []
        for inv in inv_freqs:   # cos and sin of each table, as parts.rope_angles (no torch ops)
            inv = inv.contiguous()
            half = inv.numel()
            cos, sin = torch.empty(rows, half), torch.empty(rows, half)
            lib.muser_rope_angles(positions.data_ptr(), rows, inv.data_ptr(), half, cos.data_ptr(),
                                  sin.data_ptr())
            angles.append((cos.data_ptr(), sin.data_ptr(), cos, sin))
        threads, xp, wp = torch.get_num_threads(), x.data_ptr(), self.work.data_ptr()
        if T == 1:
            run, name, where = lib.muser_decode_block, "muser::decode_block", (B, slots.data_ptr(),
                                                                              lengths.data_ptr())
        else:
            run, name, where = lib.muser_extend_block, "muser::extend_block", (T, int(slots[0]),
                                                                              int(lengths[0]))
        # a journaling cache (a verify) records what each layer's call overwrites and writes
        step_positions = positions.view(B, T)
        overwritten = [None if c.journal is None else c.entries(slots, step_positions)
                       for c in self.caches]
        for i, (ref, k) in enumerate(zip(self.refs, self.rope_slots)):
            c, s = angles[k][:2] if angles else (None, None)
            args = (ref, xp, *where, c, s, wp, threads, BACK_TO_BACK_THREAD_MIN_BYTES)
            rc = recorded(name, run, *args) if profiling() else run(*args)
            if rc:
                raise RuntimeError(f"{name} failed ({rc}: -1 a projection it does not run, "
                                   f"-2 no memory, -3 a negative length or slot)")
            if overwritten[i] is not None:   # every new key is in the ring: T <= capacity
                cache = self.caches[i]
                cache.journal.append((slots, step_positions, *overwritten[i],
                                      *cache.entries(slots, step_positions)))
            layer = self.layers[i]
            if layer._forward_hooks:
                out = x.clone()
                for hook in layer._forward_hooks.values():
                    hook(layer, None, out)
        return x


def _rebuilt_later() -> None:
    return None


def native_layers(model, x: torch.Tensor, slots: torch.Tensor | None) -> NativeLayers | None:
    """The model's layers on the library for this step, or None for the torch modules."""
    B, T = x.shape[:2]
    if (slots is None or x.dtype is not torch.float32 or not plain_eager(x)
            or not (T == 1 and B <= FUSED_MAX_TOKENS or B == 1 and T <= EXTEND_MAX_TOKENS)):
        return None
    if not all(_only_output_hooks(layer) for layer in model.layers):
        return None   # the library would skip them
    lib = _native_lib()
    if lib is None:
        return None
    plan = model.__dict__.get("_native_layers")
    if plan is None or plan.version != changes.count():
        plan = NativeLayers(model.layers, [getattr(model, name) for name in model._rope_names], lib)
        model.__dict__["_native_layers"] = plan
    # Decoder.forward has read lengths[slots] (so every slot is < lengths.numel())
    if (not plan.ok or model.lengths.numel() > plan.slots or plan.hidden != {x.shape[-1]}
            or T > plan.capacity):
        return None
    if torch.is_grad_enabled() and any(p.requires_grad for p in plan.params):
        return None
    return plan
