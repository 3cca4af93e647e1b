"""The op boundary: the argument checks of the ``muser`` ops, and the one way
a backend's functions become kernels (behind those checks).

Every kernel of every backend is built by :func:`checked`: the CPU default
implementations (:func:`default_kernel`, from ``ops/__init__.py``), CUDA's
(``register_kernels("cuda", ...)`` in ``ops/cuda``) and Metal's
(``register_kernels("mps", ...)`` in ``ops/metal``). So no backend can skip :func:`check_args`, and the
companions arrive at every backend in one form (uint8 scales, float32 ``[1]``
scale_2 on packed's device, ``formats.companions.companion_args``).

The checks read no tensor data (fake kernels call them too) and cost a few
attribute reads per argument: they run on every eager call.
"""
from __future__ import annotations

import functools
from typing import Callable, Mapping

import torch
from torch import Tensor

from ..formats import FLOAT_DTYPES
from ..formats.companions import check_companions, companion_args
from ..formats.reference import check_packed
from ..formats.registry import format_for
from ..formats.types import NEEDS_COMPANIONS, GGMLType

__all__ = ["check_args", "check_call", "check_ids_in_range", "check_qtype", "check_dims",
           "implemented_types", "checked", "default_kernel", "register_kernels", "KERNELS", "OPS",
           "MAX_DIM"]

_INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)

# A weight dimension past this is a corrupt or confused argument, not a matrix:
# the largest real ones (vocabularies, FFN widths) are under 2**20, and the
# schema's int is 64-bit, so torch.ops refuses 2**63 with its own message.
MAX_DIM = 2**31 - 1


@functools.lru_cache(maxsize=None)
def implemented_types() -> frozenset[GGMLType]:
    """The types the ops compute: those with a block format in the registry
    (``formats.registry``; every backend falls back to its reference decoder
    for what it has no kernel of its own for)."""
    def registered(t: GGMLType) -> bool:
        try:
            format_for(t)
            return True
        except ValueError:
            return False
    return frozenset(t for t in GGMLType if registered(t))


@functools.lru_cache(maxsize=None)
def _by_id() -> dict[int, GGMLType]:
    return {int(t): t for t in implemented_types()}


def check_qtype(qtype) -> GGMLType:
    """The GGMLType of ``qtype`` (a GGMLType, id or name), refused by id unless
    the ops compute it. A bool is refused: ``True`` is not F16.

    ``torch.ops.muser.*`` receive ints only: torch's dispatcher turns a bool
    into 0/1 before any Python sees it, so there only the Python wrappers
    can tell ``True`` from ``1``."""
    if type(qtype) is int:          # the dispatcher's case: one dict lookup
        qt = _by_id().get(qtype)
        if qt is not None:
            return qt
    if isinstance(qtype, bool):
        raise ValueError(f"qtype must be a GGMLType, its int id or its name, got the bool {qtype}")
    try:
        qt = GGMLType.parse(qtype)
    except ValueError as e:
        raise ValueError(f"qtype: {e}; the ops compute {_implemented_list()}") from None
    if qt not in implemented_types():
        raise ValueError(f"qtype: {qt.name} (id {int(qt)}) has no block format here; "
                         f"the ops compute {_implemented_list()}")
    return qt


def _implemented_list() -> str:
    return ", ".join(f"{t.name} ({int(t)})" for t in sorted(implemented_types()))


def check_dims(n_out, n_in) -> None:
    """Raise ValueError unless both are positive ints no larger than ``MAX_DIM``."""
    for name, v in (("n_out", n_out), ("n_in", n_in)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
        if v > MAX_DIM:
            raise ValueError(f"{name} is {v}, past {MAX_DIM} (2**31 - 1): no weight matrix "
                             f"is that large")


def check_args(op: str, packed: Tensor, qtype: int, n_out: int, n_in: int,
               scales: Tensor | None, scale_2: Tensor | None, *,
               x: Tensor | None = None, x_name: str = "x", x_width: int | None = None,
               ids: Tensor | None = None, where: str | None = None) -> GGMLType:
    """Raise ValueError (naming ``muser.<op>``, or ``where`` when given, the
    argument and what was expected) unless the arguments describe a valid
    call; return the GGMLType. Reads no tensor data, so fake kernels call it too.

    The type is checked by id before any size: an id the ops do not compute
    is refused even when its rows happen to have the expected byte count."""
    try:
        qt = check_qtype(qtype)
        check_dims(n_out, n_in)
        check_packed(packed, qt, n_in, "packed", n_out=n_out)
        if qt in NEEDS_COMPANIONS:
            check_companions(scales, scale_2, n_out, n_in, packed.device)
        elif scales is not None or scale_2 is not None:
            raise ValueError(f"{qt.name} takes no scales/scale_2 companions (only "
                             f"{', '.join(t.name for t in NEEDS_COMPANIONS)} does)")
        if x is not None:
            if not isinstance(x, Tensor):
                raise ValueError(f"{x_name} must be a torch.Tensor, got {type(x).__name__}")
            if x.dtype not in FLOAT_DTYPES:
                raise ValueError(f"{x_name} must be float32, float16 or bfloat16, got {x.dtype}")
            shape = x.shape
            if not shape or shape[-1] != x_width:
                raise ValueError(f"{x_name} must have shape [..., {x_width}], got {tuple(shape)}")
            if x.device != packed.device:
                raise ValueError(f"{x_name} is on {x.device} but packed is on {packed.device}")
        if ids is not None:
            if not isinstance(ids, Tensor):
                raise ValueError(f"ids must be a torch.Tensor, got {type(ids).__name__}")
            if ids.dtype not in _INDEX_DTYPES:
                raise ValueError(f"ids must be an integer tensor, got {ids.dtype}")
            if ids.device != packed.device:
                raise ValueError(f"ids is on {ids.device} but packed is on {packed.device}")
    except ValueError as e:
        raise ValueError(f"{where or 'muser.' + op}: {e}") from None
    return qt


def check_ids_in_range(op: str, ids: Tensor, n_out: int) -> None:
    """Raise ValueError unless every id indexes a row (reads the ids: not for fakes)."""
    if ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= n_out:
            raise ValueError(f"muser.{op}: ids must lie in [0, {n_out}), got values "
                             f"from {lo} to {hi}")


# ---- one check per op, the schema's arguments in order ---------------------------------

def _check_qmatmul(x, packed, qtype, n_out, n_in, scales, scale_2) -> GGMLType:
    return check_args("qmatmul", packed, qtype, n_out, n_in, scales, scale_2, x=x, x_width=n_in)


def _check_qmatmul_ggml(x, packed, qtype, n_out, n_in, scales, scale_2) -> GGMLType:
    return check_args("qmatmul_ggml", packed, qtype, n_out, n_in, scales, scale_2, x=x, x_width=n_in)


def _check_qmatmul_t(g, packed, qtype, n_out, n_in, scales, scale_2) -> GGMLType:
    return check_args("qmatmul_t", packed, qtype, n_out, n_in, scales, scale_2, x=g, x_name="g",
                      x_width=n_out)


def _check_dequantize(packed, qtype, n_out, n_in, scales, scale_2) -> GGMLType:
    return check_args("dequantize", packed, qtype, n_out, n_in, scales, scale_2)


def _check_embedding(ids, packed, qtype, n_out, n_in, scales, scale_2) -> GGMLType:
    return check_args("embedding", packed, qtype, n_out, n_in, scales, scale_2, ids=ids)


# op -> its check; also the list of ops (each takes a leading operand but dequantize)
OPS: dict[str, Callable[..., GGMLType]] = {
    "qmatmul": _check_qmatmul, "qmatmul_ggml": _check_qmatmul_ggml, "qmatmul_t": _check_qmatmul_t,
    "dequantize": _check_dequantize, "embedding": _check_embedding,
}


def check_call(op: str, *args) -> GGMLType:
    """``check_args`` for a call of ``muser.<op>`` with the schema's arguments in order."""
    return OPS[op](*args)


# ---- registration -------------------------------------------------------------------------

# (op, where) -> the checked kernel registered there: "default" (the CPU default
# implementation), "cuda", "mps". The tests run bad arguments through each.
KERNELS: dict[tuple[str, str], Callable] = {}


# What the backends are called in their refusals, by device type.
BACKEND_NAMES = {"cuda": "CUDA", "mps": "Metal", "metal-emulator": "Metal"}


def check_backend_type(qt: GGMLType, where: str, types: frozenset[GGMLType], op: str) -> None:
    """Refuse, by name, a type the ``where`` backend has no ``muser.<op>`` kernel for."""
    if qt not in types:
        name = BACKEND_NAMES.get(where, where)
        raise ValueError(f"muser.{op}: {qt.name} has no {name} kernel (the {name} kernels run "
                         f"{', '.join(t.name for t in sorted(types))}; use the CPU for others)")


def checked(op: str, fn: Callable, types: frozenset[GGMLType] | None = None,
            where: str = "", *, picks: bool = False) -> Callable:
    """``fn`` (taking ``muser.<op>``'s arguments in schema order) behind the op's
    checks: the arguments are checked, a type outside ``types`` (when given) is
    refused for backend ``where``, companions are normalised once (uint8
    scales, float32 ``[1]`` scale_2 on packed's device), then ``fn`` runs: every
    kernel receives the one canonical weight. With ``picks``, ``fn`` returns
    the function to run (the default implementations choose a backend per
    call) and the kernel calls that, so ``fn``'s frame has returned first."""
    if op not in OPS:
        raise ValueError(f"checked: unknown op {op!r}; expected one of {tuple(OPS)}")
    check = OPS[op]

    def canonical(qt, packed, scales, scale_2):
        if types is not None:
            check_backend_type(qt, where, types, op)
        if qt in NEEDS_COMPANIONS:
            return companion_args(scales, scale_2, packed.device)
        return scales, scale_2

    if op == "dequantize":
        def kernel(packed, qtype, n_out, n_in, scales=None, scale_2=None):
            qt = check(packed, qtype, n_out, n_in, scales, scale_2)
            scales, scale_2 = canonical(qt, packed, scales, scale_2)
            run = fn(packed, qtype, n_out, n_in, scales, scale_2) if picks else fn
            return run(packed, qtype, n_out, n_in, scales, scale_2)
    else:
        def kernel(a, packed, qtype, n_out, n_in, scales=None, scale_2=None):
            qt = check(a, packed, qtype, n_out, n_in, scales, scale_2)
            scales, scale_2 = canonical(qt, packed, scales, scale_2)
            run = fn(a, packed, qtype, n_out, n_in, scales, scale_2) if picks else fn
            return run(a, packed, qtype, n_out, n_in, scales, scale_2)
    kernel.__name__ = kernel.__qualname__ = f"checked_{op}"
    kernel.__doc__ = fn.__doc__
    kernel.unchecked = fn
    return kernel


def default_kernel(op: str, pick: Callable) -> Callable:
    """``muser.<op>``'s default implementation (the CPU one, which
    ``ops/__init__.py`` hands to ``torch.library.custom_op``): behind the
    checks, ``pick`` (``defaults.py``) returns the backend function that runs
    the call."""
    KERNELS[(op, "default")] = kernel = checked(op, pick, picks=True)
    return kernel


def register_kernels(device_type: str, kernels: Mapping[str, Callable],
                     types: frozenset[GGMLType]) -> dict[str, Callable]:
    """Register ``kernels`` (op name -> function in schema order) as the
    ``device_type`` kernels of the ``muser`` ops, each behind its checks and
    refusing types outside ``types``; the one way a backend registers
    (``ops/cuda``, ``ops/metal``). Returns the checked functions registered."""
    out = {}
    for op, fn in kernels.items():
        kernel = checked(op, fn, types, device_type)
        torch.library.register_kernel(f"muser::{op}", device_type, kernel)
        KERNELS[(op, device_type)] = out[op] = kernel
    return out


# ---- the layer ops (ops/layer.py) -----------------------------------------------------------

def _float(name: str, op: str, t: Tensor) -> None:
    if not isinstance(t, Tensor) or not t.is_floating_point():
        raise ValueError(f"muser.{op}: {name} must be a float tensor, got "
                         f"{t.dtype if isinstance(t, Tensor) else type(t).__name__}")


def _norm_weight(op: str, name: str, w: Tensor | None, x: Tensor) -> None:
    if w is None:
        return
    _float(name, op, w)
    if w.shape != (x.shape[-1],) or w.device != x.device:
        raise ValueError(f"muser.{op}: {name} must be [{x.shape[-1]}] on {x.device}, "
                         f"got {list(w.shape)} on {w.device}")


def _check_rms_norm(x, weight, eps) -> None:
    _float("x", "rms_norm", x)
    _norm_weight("rms_norm", "weight", weight, x)


def _check_add_rms_norm(residual, a, post_weight, post_eps, weight, eps) -> None:
    _float("a", "add_rms_norm", a)
    if not isinstance(residual, Tensor) or residual.shape != a.shape \
            or residual.dtype != a.dtype or residual.device != a.device:
        raise ValueError("muser.add_rms_norm: residual must match a's shape, dtype and device")
    _norm_weight("add_rms_norm", "post_weight", post_weight, a)
    _norm_weight("add_rms_norm", "weight", weight, a)


def _check_norm_rope(x, weight, eps, cos, sin, style) -> None:
    _float("x", "norm_rope", x)
    _norm_weight("norm_rope", "weight", weight, x)
    if x.dim() != 4 or x.shape[-1] % 2:
        raise ValueError(f"muser.norm_rope: x must be [B, T, H, D] with D even, got {list(x.shape)}")
    want = (x.shape[0], x.shape[1], 1, x.shape[-1] // 2)
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor) or t.dtype != torch.float32 or tuple(t.shape) != want:
            raise ValueError(f"muser.norm_rope: {name} must be float32 {list(want)}")
    if style not in (0, 1, 2):
        raise ValueError(f"muser.norm_rope: style must be 0 (none), 1 (NeoX) or 2 (normal), "
                         f"got {style}")


def _check_decode_attention(q, k, v, mask, scale, valid) -> None:
    _float("q", "decode_attention", q)
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or k.shape[0] != q.shape[0] \
            or k.shape[2] != q.shape[1] or k.shape[3] != q.shape[3]:
        raise ValueError(f"muser.decode_attention: q must be [B, n_kv, G, D] and k, v "
                         f"[B, S, n_kv, D]; got q {list(q.shape)}, k {list(k.shape)}, "
                         f"v {list(v.shape)}")
    B, n_kv, G, D = q.shape
    if mask.dtype != torch.bool or tuple(mask.shape) != (B, 1, G, k.shape[1]):
        raise ValueError(f"muser.decode_attention: mask must be bool [{B}, 1, {G}, {k.shape[1]}], "
                         f"got {mask.dtype} {list(mask.shape)}")
    if valid is not None and (valid.dtype not in (torch.int32, torch.int64)
                              or tuple(valid.shape) != (B,)):
        raise ValueError(f"muser.decode_attention: valid must be an integer [{B}] tensor")


def _check_kv_store(cache_k, cache_v, slots, positions, k, v) -> None:
    if cache_k.shape != cache_v.shape or cache_k.dim() != 4 or k.shape != v.shape or k.dim() != 4 \
            or k.shape[2:] != cache_k.shape[2:]:
        raise ValueError(f"muser.kv_store: caches must be [slots, capacity, n_kv, D] and k, v "
                         f"[B, T, n_kv, D]; got {list(cache_k.shape)}, {list(k.shape)}, {list(v.shape)}")
    B, T = k.shape[:2]
    if tuple(slots.shape) != (B,) or tuple(positions.shape) != (B, T) \
            or slots.dtype != torch.long or positions.dtype != torch.long:
        raise ValueError(f"muser.kv_store: slots must be long [{B}] and positions long [{B}, {T}]")


def _check_decode_mask(lengths, capacity, window) -> None:
    if not isinstance(lengths, Tensor) or lengths.dtype != torch.long or lengths.dim() != 1:
        raise ValueError("muser.decode_mask: lengths must be a 1-D long tensor")
    if capacity < 1 or window < 0:
        raise ValueError(f"muser.decode_mask: capacity must be >= 1 and window >= 0, got "
                         f"{capacity} and {window}")


def _check_gated_act(gate, up, act) -> None:
    _float("gate", "gated_act", gate)
    if not isinstance(up, Tensor) or up.shape != gate.shape or up.dtype != gate.dtype \
            or up.device != gate.device:
        raise ValueError("muser.gated_act: up must match gate's shape, dtype and device")
    if act not in (0, 1, 2):
        raise ValueError(f"muser.gated_act: act must be 0 (SiLU), 1 (tanh GELU) or 2 (sigmoid), "
                         f"got {act}")


# layer op -> its check (in schema order)
LAYER_OPS: dict[str, Callable[..., None]] = {
    "decode_mask": _check_decode_mask,
    "gated_act": _check_gated_act,
    "rms_norm": _check_rms_norm, "add_rms_norm": _check_add_rms_norm,
    "norm_rope": _check_norm_rope, "decode_attention": _check_decode_attention,
    "kv_store": _check_kv_store,
}
LAYER_DEVICES: set[str] = set()   # device types with layer-op kernels registered
LAYER_KERNELS: dict[tuple[str, str], Callable] = {}   # (op, device type) -> checked kernel


def register_layer_kernels(device_type: str, kernels: Mapping[str, Callable]) -> None:
    """Register a backend's kernels for the layer ops, each behind its check;
    from then on ``ops.layer`` sends that device's calls to the op."""
    for op, fn in kernels.items():
        check = LAYER_OPS[op]

        def kernel(*args, _fn=fn, _check=check):
            _check(*args)
            return _fn(*args)
        kernel.__name__ = f"checked_{op}"
        torch.library.register_kernel(f"muser::{op}", device_type, kernel)
        LAYER_KERNELS[(op, device_type)] = kernel
    LAYER_DEVICES.add(device_type)
