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


def checked(op: str, fn: Callable) -> Callable:
    """``fn`` (taking ``muser.<op>``'s arguments in schema order) behind the op's
    checks: the arguments are checked, NVFP4 companions normalised once
    (uint8 scales, float32 ``[1]`` scale_2 on packed's device), then ``fn`` runs."""
    if op not in OPS:
        raise ValueError(f"checked: unknown op {op!r}; expected one of {tuple(OPS)}")
    check = OPS[op]

    if op == "dequantize":
        def kernel(packed, qtype, n_out, n_in, scales=None, scale_2=None):
            if check(packed, qtype, n_out, n_in, scales, scale_2) in NEEDS_COMPANIONS:
                scales, scale_2 = companion_args(scales, scale_2, packed.device)
            return fn(packed, qtype, n_out, n_in, scales, scale_2)
    else:
        def kernel(a, packed, qtype, n_out, n_in, scales=None, scale_2=None):
            if check(a, packed, qtype, n_out, n_in, scales, scale_2) in NEEDS_COMPANIONS:
                scales, scale_2 = companion_args(scales, scale_2, packed.device)
            return fn(a, packed, qtype, n_out, n_in, scales, scale_2)
    kernel.__name__ = kernel.__qualname__ = f"checked_{op}"
    kernel.__doc__ = fn.__doc__
    kernel.unchecked = fn
    return kernel


def default_kernel(op: str, fn: Callable) -> Callable:
    """``fn`` behind the checks as ``muser.<op>``'s default implementation (the
    CPU one, which ``ops/__init__.py`` hands to ``torch.library.custom_op``)."""
    KERNELS[(op, "default")] = kernel = checked(op, fn)
    return kernel


def register_kernels(device_type: str, kernels: Mapping[str, Callable]) -> dict[str, Callable]:
    """Register ``kernels`` (op name -> function in schema order) as the
    ``device_type`` kernels of the ``muser`` ops, each behind its checks; the
    one way a backend registers (``ops/cuda``, ``ops/metal``). Returns the
    checked functions registered."""
    out = {}
    for op, fn in kernels.items():
        kernel = checked(op, fn)
        torch.library.register_kernel(f"muser::{op}", device_type, kernel)
        KERNELS[(op, device_type)] = out[op] = kernel
    return out
