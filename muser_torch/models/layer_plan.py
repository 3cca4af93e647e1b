"""A step's layers described in backend-neutral terms, for a backend that runs
a whole layer in one call of its own: the CPU library's ``decode.c``
(``ops/cpu/step.py``) runs a decode step's layers, and a short run of one
sequence's new tokens (a DFlash verify block, a short prompt), in one call
per layer instead of about a hundred torch ops.

``describe(layer)`` says what a layer computes: its norms, its packed
projections, its RoPE, activation, attention scale and KV cache, as plain
values and tensors; a layer this module cannot describe (a block or
attention of another kind, a projection that is not a ``QLinear``, an
unknown RoPE or activation) gets the reason instead. ``layer_runner``, asked
by ``Decoder.forward`` at each step, hands the described layers to the
backend's runner (``ops.layer_step``), which takes the step or declines it
(a dtype, device or shape it does not run, a dispatch mode that must see the
ops); declined, the step runs the torch modules, so compiled, traced and
differentiated steps always do.

A runner holds data pointers, so it is rebuilt whenever a module of the model
changes (``muser_torch.changes``: a count compared each step). A layer's
forward hooks marked :func:`output_hook` (speculative decoding's taps) are
called with the layer's output; any other hook keeps the step on the torch
modules. A KV cache's journal (a verify that may be taken back) records what
the runner overwrites, as ``KVCache.update`` does.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .. import changes, ops
from ..nn import QLinear
from .parts import (Attention, GatedMLP, KVCache, PreNormBlock, RMSNorm, SandwichBlock, gelu_tanh,
                    no_rope, rope_neox, rope_normal)
from .rope_scaling import rotate

__all__ = ["NormPlan", "LinearPlan", "LayerPlan", "describe", "layer_runner", "output_hook",
           "EXTEND_MAX_TOKENS"]

# The longest run of one sequence's new tokens a step hands to a layer runner:
# a DFlash verify block (16 rows). Longer prefills take the torch modules' GEMMs,
# except in ggml's numerics, whose runner takes a sequence's run of any length
# (its blocks compute llama.cpp's arithmetic, which the torch modules do not).
EXTEND_MAX_TOKENS = 16

ACTIVATIONS = {F.silu: "silu", gelu_tanh: "gelu_tanh"}
ATTENTION_PARTS = ("wq", "wk", "wv", "wgate", "wo")
MLP_PARTS = ("w_gate", "w_up", "w_down")
NORMS = ("attn_norm", "q_norm", "k_norm", "post_attn_norm", "ffn_norm", "post_ffw_norm")


@dataclass(frozen=True)
class NormPlan:
    """An RMSNorm: ``weight`` (None: the norm is absent) and ``eps``."""
    weight: torch.Tensor | None
    eps: float


@dataclass(frozen=True)
class LinearPlan:
    """A packed projection as ``QLinear`` holds it, with the numerics it runs in
    and, where the weight has one, its load-time repack (``QLinear.repacked``:
    the same bytes moved into the layout a backend's kernels read)."""
    packed: torch.Tensor
    qtype: Any
    n_out: int
    n_in: int
    scales: torch.Tensor | None
    scale_2: torch.Tensor | None
    numerics: str
    bias: torch.Tensor | None
    repacked: torch.Tensor | None = None


@dataclass(frozen=True)
class LayerPlan:
    """One pre-norm or sandwich decoder layer: attention over a KV cache ring,
    then a gated MLP. ``norms`` are keyed by ``NORMS``, ``linears`` by
    ``ATTENTION_PARTS + MLP_PARTS`` (None: a part the layer lacks)."""
    hidden: int
    n_heads: int
    n_kv: int
    head_dim: int
    ffn: int
    norms: dict[str, NormPlan]
    linears: dict[str, LinearPlan | None]
    rope: str              # "neox", "normal" or "none"
    n_rot: int             # features rotated
    mscale: float          # the RoPE's magnitude scale (YaRN)
    rope_slot: int         # which of the model's frequency tables
    act: str               # "silu" or "gelu_tanh"
    scale: float           # of q.k
    scale_q: bool          # the scale multiplies q before attention (Attention.scale_q)
    k_cache: torch.Tensor  # [slots, capacity, n_kv, head_dim]
    v_cache: torch.Tensor


def _rope(att: Attention) -> tuple[str, int, float] | None:
    """(mode, features rotated, mscale) of the layer's RoPE, None if unknown."""
    r = att.rope
    if r is rope_neox:
        return "neox", att.head_dim, 1.0
    if r is rope_normal:
        return "normal", att.head_dim, 1.0
    if r is no_rope:
        return "none", 0, 1.0
    if isinstance(r, functools.partial) and r.func is rotate and not r.args:
        kw = r.keywords
        if kw.get("mode") in ("neox", "normal") and isinstance(kw.get("n_rot"), int):
            return kw["mode"], kw["n_rot"], float(kw.get("mscale", 1.0))
    return None


def _norm(n: RMSNorm | None) -> NormPlan | None:
    if n is None:
        return NormPlan(None, 0.0)
    if type(n).forward is not RMSNorm.forward:
        return None
    return NormPlan(n.weight, n.eps)


_NOT_DESCRIBED = object()


def _linear(m) -> "LinearPlan | None | object":
    if m is None:
        return None
    if type(m) is not QLinear:
        return _NOT_DESCRIBED
    return LinearPlan(m.packed, m.qtype, m.n_out, m.n_in, m.scales, m.scale_2, m.numerics, m.bias,
                      m.repacked())


def describe(layer: torch.nn.Module) -> "LayerPlan | str":
    """The layer's plan, or why it has none."""
    kind = type(layer).forward
    if kind not in (PreNormBlock.forward, SandwichBlock.forward):
        return f"a {type(layer).__name__}, not a pre-norm or sandwich block"
    att, mlp = layer.attention, layer.feed_forward
    if type(att).forward is not Attention.forward or type(mlp).forward is not GatedMLP.forward:
        return "an attention or MLP of another kind"
    if not isinstance(att.kv_cache, KVCache):
        return "no KV cache"
    if mlp.act not in ACTIVATIONS:
        return f"the activation {getattr(mlp.act, '__name__', mlp.act)}"
    rope = _rope(att)
    if rope is None:
        return "a RoPE of another kind"
    sandwich = kind is SandwichBlock.forward
    modules = {"attn_norm": layer.attention_norm, "q_norm": att.q_norm, "k_norm": att.k_norm,
               "post_attn_norm": layer.post_attention_norm if sandwich else None,
               "ffn_norm": layer.ffn_norm, "post_ffw_norm": layer.post_ffw_norm if sandwich else None}
    norms = {k: _norm(n) for k, n in modules.items()}
    if None in norms.values():
        return "a norm of another kind"
    linears = {name: _linear(getattr(att, name)) for name in ATTENTION_PARTS}
    linears |= {name: _linear(getattr(mlp, name)) for name in MLP_PARTS}
    if _NOT_DESCRIBED in linears.values():
        return "a projection that is not a QLinear"
    mode, n_rot, mscale = rope
    cache = att.kv_cache
    return LayerPlan(hidden=layer.attention_norm.weight.numel(), n_heads=att.n_heads, n_kv=att.n_kv,
                     head_dim=att.head_dim, ffn=mlp.w_gate.n_out, norms=norms, linears=linears,
                     rope=mode, n_rot=n_rot, mscale=mscale, rope_slot=att.rope_slot,
                     act=ACTIVATIONS[mlp.act],
                     scale=att.scale if att.scale is not None else 1.0 / math.sqrt(att.head_dim),
                     scale_q=att.scale_q, k_cache=cache.k, v_cache=cache.v)


def output_hook(fn):
    """Marks a forward hook ``fn(module, args, output)`` that reads only the
    output, so a layer runner may call it with ``args=None``."""
    fn.output_only = True
    return fn


def _only_output_hooks(layer) -> bool:
    """Whether every hook of the layer is an ``output_hook`` (none is too)."""
    if layer._forward_pre_hooks or getattr(layer, "_forward_hooks_with_kwargs", None):
        return False
    return all(getattr(h, "output_only", False) for h in layer._forward_hooks.values())


class PlannedLayers:
    """A model's layers as plans, and the backend's runner of them (or why none)."""

    def __init__(self, model: torch.nn.Module, runner_type: type):
        self.version = changes.count()
        self.layers = list(model.layers)
        self.caches = [layer.attention.kv_cache for layer in self.layers]
        self.params = [p for layer in self.layers for p in layer.parameters()]
        plans = [describe(layer) for layer in self.layers]
        self.runner, self.why_not = None, next(
            (f"layer {i}: {p}" for i, p in enumerate(plans) if isinstance(p, str)), None)
        if self.why_not is None:
            tables = [getattr(model, name) for name in model._rope_names]
            self.runner = runner_type(plans, tables, EXTEND_MAX_TOKENS)
            self.why_not = self.runner.why_not

    def __reduce__(self):
        # a copied or unpickled model builds its own (the runner holds this one's pointers)
        return _rebuilt_later, ()

    def run(self, x: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor,
            inv_freqs: list[torch.Tensor]) -> torch.Tensor:
        """x ``[B, T, hidden]`` through every layer on the runner; then, as the
        modules would have, each journaling cache records what the step
        overwrote and wrote, and each layer's output hooks see its output."""
        B, T = x.shape[:2]
        positions = (lengths.view(B, 1) + torch.arange(T)).view(B, T)
        # each layer writes only its own cache, so the entries before and after the run are its own
        overwritten = [None if c.journal is None else c.entries(slots, positions) for c in self.caches]
        hooked = [i for i, layer in enumerate(self.layers) if layer._forward_hooks]
        x, outputs = self.runner(x, slots, lengths, inv_freqs, hooked)
        for cache, old in zip(self.caches, overwritten):
            if old is not None:   # every new key is in the ring: T <= capacity
                cache.journal.append((slots, positions, *old, *cache.entries(slots, positions)))
        for i in hooked:
            layer = self.layers[i]
            for hook in layer._forward_hooks.values():
                hook(layer, None, outputs[i])
        return x


def _rebuilt_later() -> None:
    return None


def layer_runner(model, x: torch.Tensor, slots: torch.Tensor | None) -> "Callable | None":
    """The step's layers on the backend's layer runner (``run(x, slots,
    lengths, inv_freqs)``), or None for the torch modules."""
    B, T = x.shape[:2]
    if slots is None or not (T == 1 or B == 1):
        return None
    runner_type = ops.layer_step(x.device.type)
    if runner_type is None or not runner_type.accepts(x):
        return None   # before any plan is built: a compiled or traced step builds nothing
    planned = model.__dict__.get("_planned_layers")
    if planned is None or planned.version != changes.count():
        planned = PlannedLayers(model, runner_type)
        model.__dict__["_planned_layers"] = planned
    if planned.runner is None or not planned.runner.takes(x, model.lengths.numel()):
        return None
    if not all(_only_output_hooks(layer) for layer in planned.layers):
        return None   # the runner would skip them
    if torch.is_grad_enabled() and any(p.requires_grad for p in planned.params):
        return None
    return planned.run
