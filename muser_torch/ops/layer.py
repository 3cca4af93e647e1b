"""The layer ops: the work a decoder layer does between its projections
(RMSNorm with its residual adds, per-head norm with RoPE, decode attention),
as ``muser`` ops so a backend can run each as one kernel.

Each op has one reference, the torch composite below, which is what the
models computed before the ops existed and what every device without a
kernel of its own runs. Devices with kernels (``ops/cuda/layer.py``,
registered through ``checks.register_layer_kernels``) get the op; the CPU
calls the composite directly, so an eager CPU step pays no dispatcher cost.

Schemas (namespace ``muser``)::

    decode_mask(Tensor lengths, int capacity, int window) -> (Tensor, Tensor)
    gated_act(Tensor gate, Tensor up, int act) -> Tensor
    rms_norm(Tensor x, Tensor weight, float eps) -> Tensor
    add_rms_norm(Tensor residual, Tensor a, Tensor? post_weight, float post_eps,
                 Tensor? weight, float eps) -> (Tensor, Tensor)
    norm_rope(Tensor x, Tensor? weight, float eps, Tensor cos, Tensor sin, int style) -> Tensor
    decode_attention(Tensor q, Tensor k, Tensor v, Tensor mask, float scale,
                     Tensor? valid) -> Tensor
    kv_store(Tensor(a!) cache_k, Tensor(b!) cache_v, Tensor slots, Tensor positions,
             Tensor k, Tensor v) -> ()

``add_rms_norm`` is ``h = residual + norm(a; post_weight)`` (``a`` itself
when ``post_weight`` is None), then ``y = norm(h; weight)`` (``y`` empty when
``weight`` is None); it returns ``(h, y)``. ``style`` is ``ROPE_NONE``,
``ROPE_NEOX`` or ``ROPE_NORMAL``.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .checks import LAYER_DEVICES, LAYER_OPS   # LAYER_DEVICES: filled as backends register

__all__ = ["ring_positions", "decode_mask", "gated_act", "ACT_SILU", "ACT_GELU_TANH", "ACT_SIGMOID", "rms_norm", "add_rms_norm", "norm_rope", "decode_attention", "kv_store",
           "ROPE_NONE", "ROPE_NEOX", "ROPE_NORMAL"]

ROPE_NONE, ROPE_NEOX, ROPE_NORMAL = 0, 1, 2
ACT_SILU, ACT_GELU_TANH, ACT_SIGMOID = 0, 1, 2


# ---- the references --------------------------------------------------------------------

def _norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    # Statistics in float32 whatever the activation dtype: an f16 sum of
    # squares over 6656 features overflows.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.float()).to(x.dtype)


def _add_rms_norm(residual: Tensor, a: Tensor, post_weight: Tensor | None, post_eps: float,
                  weight: Tensor | None, eps: float) -> tuple[Tensor, Tensor]:
    h = residual + (a if post_weight is None else _norm(a, post_weight, post_eps))
    return h, (h.new_empty(0) if weight is None else _norm(h, weight, eps))


def _rope(x: Tensor, cos: Tensor, sin: Tensor, style: int) -> Tensor:
    if style == ROPE_NONE:
        return x
    if style == ROPE_NEOX:    # feature i pairs with i + D/2
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
    # llama.cpp's "normal" RoPE: features 2i and 2i+1 form a pair
    xf = x.float().unflatten(-1, (-1, 2))
    x1, x2 = xf[..., 0], xf[..., 1]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2).to(x.dtype)


def _norm_rope(x: Tensor, weight: Tensor | None, eps: float, cos: Tensor, sin: Tensor,
               style: int) -> Tensor:
    return _rope(x if weight is None else _norm(x, weight, eps), cos, sin, style)


def _decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float,
                      valid: Tensor | None) -> Tensor:
    # ``valid`` only lets a kernel skip empty entries; the mask already hides them.
    return F.scaled_dot_product_attention(q.to(k.dtype), k.transpose(1, 2), v.transpose(1, 2),
                                          attn_mask=mask, scale=scale).to(q.dtype)


def _kv_store(cache_k: Tensor, cache_v: Tensor, slots: Tensor, positions: Tensor, k: Tensor,
              v: Tensor) -> None:
    m = min(k.shape[1], cache_k.shape[1])
    idx = positions[:, -m:] % cache_k.shape[1]
    rows = slots.unsqueeze(-1).expand_as(idx)
    cache_k.index_put_((rows, idx), k[:, -m:].to(cache_k.dtype))
    cache_v.index_put_((rows, idx), v[:, -m:].to(cache_v.dtype))


_ACTS = {ACT_SILU: F.silu, ACT_GELU_TANH: lambda g: F.gelu(g, approximate="tanh"),
         ACT_SIGMOID: torch.sigmoid}


def _gated_act(gate: Tensor, up: Tensor, act: int) -> Tensor:
    return _ACTS[act](gate) * up


def ring_positions(lengths: Tensor, capacity: int) -> Tensor:
    """``[B]`` cached lengths -> ``[B, capacity]``: the position each entry of a
    ring holding positions 0..L-1 keeps, ``i + capacity * floor((L-1-i) /
    capacity)``, or -1 for an entry still empty."""
    i = torch.arange(capacity, device=lengths.device)
    last = lengths.unsqueeze(-1) - 1
    pos = i + capacity * torch.div(last - i, capacity, rounding_mode="floor")
    return torch.where(i <= last, pos, torch.full_like(pos, -1))


def _decode_mask(lengths: Tensor, capacity: int, window: int) -> tuple[Tensor, Tensor]:
    pos = ring_positions(lengths + 1, capacity)   # after this step's write
    keep = pos >= 0
    if window:
        keep = keep & (lengths.unsqueeze(-1) - pos < window)   # the new token is at ``lengths``
    return keep, (lengths + 1).clamp(max=capacity)


REFERENCES = {"decode_mask": _decode_mask, "gated_act": _gated_act, "rms_norm": _norm,
              "add_rms_norm": _add_rms_norm, "norm_rope": _norm_rope,
              "decode_attention": _decode_attention, "kv_store": _kv_store}


# ---- the ops --------------------------------------------------------------------------------

_SCHEMAS = {
    "decode_mask": "(Tensor lengths, int capacity, int window) -> (Tensor, Tensor)",
    "gated_act": "(Tensor gate, Tensor up, int act) -> Tensor",
    "rms_norm": "(Tensor x, Tensor weight, float eps) -> Tensor",
    "add_rms_norm": "(Tensor residual, Tensor a, Tensor? post_weight, float post_eps, "
                    "Tensor? weight, float eps) -> (Tensor, Tensor)",
    "norm_rope": "(Tensor x, Tensor? weight, float eps, Tensor cos, Tensor sin, int style) -> Tensor",
    "decode_attention": "(Tensor q, Tensor k, Tensor v, Tensor mask, float scale, Tensor? valid) "
                        "-> Tensor",
    "kv_store": "(Tensor(a!) cache_k, Tensor(b!) cache_v, Tensor slots, Tensor positions, "
                "Tensor k, Tensor v) -> ()",
}
_MUTATES = {"kv_store": ("cache_k", "cache_v")}


def _define(op: str):
    check, reference = LAYER_OPS[op], REFERENCES[op]

    def default(*args):
        check(*args)
        return reference(*args)

    default.__name__ = f"default_{op}"
    lib_op = torch.library.custom_op(f"muser::{op}", mutates_args=_MUTATES.get(op, ()),
                                     schema=_SCHEMAS[op])(default)

    @lib_op.register_fake
    def _(*args):
        check(*args)
        if op in _MUTATES:
            return None
        out = reference(*(a.to("meta") if isinstance(a, Tensor) else a for a in args))
        if isinstance(out, tuple):
            return tuple(o.new_empty(o.shape, device=args[0].device) for o in out)
        return out.new_empty(out.shape, device=args[0].device)
    return lib_op


for _op in _SCHEMAS:
    _define(_op)

# device type -> op -> a shortcut an eager call tries first: it returns the
# op's result, or None where it does not apply. The CPU backend registers its
# library's RMSNorm (ops/cpu/__init__.py), so this module names no backend.
EAGER_SHORTCUTS: dict[str, dict[str, Callable]] = {}


def _call(op: str, *args):
    if args[0].device.type in LAYER_DEVICES:
        return getattr(torch.ops.muser, op)(*args)
    return REFERENCES[op](*args)


def decode_mask(lengths: Tensor, capacity: int, window: int) -> tuple[Tensor, Tensor]:
    """For a one-token step of rows with ``lengths[B]`` cached tokens over a
    ring of ``capacity`` (after the step's write): ``keep[B, capacity]``, the
    entries the new token attends to (causal, within ``window`` when it is
    not 0), and ``valid[B]``, the leading entries that may hold a key."""
    return _call("decode_mask", lengths, capacity, window)


def gated_act(gate: Tensor, up: Tensor, act: int) -> Tensor:
    """``act(gate) * up`` (``ACT_SILU``: SwiGLU, ``ACT_GELU_TANH``: GeGLU,
    ``ACT_SIGMOID``: an output gate), rounded to the dtype after ``act`` as the
    composite rounds."""
    return _call("gated_act", gate, up, act)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight``, statistics in float32, out in x's dtype."""
    shortcut = EAGER_SHORTCUTS.get(x.device.type, {}).get("rms_norm")
    if shortcut is not None and (y := shortcut(x, weight, eps)) is not None:
        return y
    return _call("rms_norm", x, weight, eps)


def add_rms_norm(residual: Tensor, a: Tensor, weight: Tensor | None, eps: float,
                 post_weight: Tensor | None = None, post_eps: float = 0.0) -> tuple[Tensor, Tensor]:
    """``h = residual + norm(a; post_weight)`` (``a`` without ``post_weight``) and
    ``y = norm(h; weight)`` (empty without ``weight``): a block's residual add
    with the norms on either side of it."""
    return _call("add_rms_norm", residual, a, post_weight, post_eps, weight, eps)


def norm_rope(x: Tensor, weight: Tensor | None, eps: float, cos: Tensor, sin: Tensor,
              style: int) -> Tensor:
    """Per-head RMSNorm of ``x[B, T, H, D]`` (none when ``weight`` is None), then
    RoPE of ``style`` with ``cos``/``sin`` ``[B, T, 1, D/2]``."""
    return _call("norm_rope", x, weight, eps, cos, sin, style)


def kv_store(cache_k: Tensor, cache_v: Tensor, slots: Tensor, positions: Tensor, k: Tensor,
             v: Tensor) -> None:
    """Store the last ``min(T, capacity)`` new keys and values ``[B, T, n_kv, D]``
    in the rings ``cache_k/v[slots, capacity, n_kv, D]`` at entries
    ``positions % capacity``, in the cache's dtype, in place."""
    _call("kv_store", cache_k, cache_v, slots, positions, k, v)


def decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float,
                     valid: Tensor | None = None) -> Tensor:
    """Attention of ``q[B, n_kv, G, D]`` (G query rows per KV head) over keys and
    values ``[B, S, n_kv, D]`` where ``mask[B, 1, G, S]`` is True; ``valid[B]``
    (optional) counts the leading entries that may be non-empty. Output in q's dtype."""
    return _call("decode_attention", q, k, v, mask, scale, valid)
