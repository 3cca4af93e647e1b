"""The ``muser`` operators: every torch.library schema, its fake (meta)
implementation and its autograd formula live here, with the Python wrappers.
The argument checks and the one way kernels are registered behind them are
``checks.py``; the default implementations for CPU tensors ``defaults.py``
and the choice of CPU backend ``backend_choice.py``; the loaded accelerator
backends and the questions the model layer asks them (``backend``,
``warm_up``) ``backends.py``; the layer ops ``layer.py``; kernels live
beside it, one folder per backend (``cpu/``, ``cuda/``, ``metal/``), each
holding its dispatch, its ladder table (``ladder.Rung``'s shape) and its
kernel sources.

Schemas (namespace ``muser``)::

    qmatmul(Tensor x, Tensor packed, int qtype, int n_out, int n_in,
            Tensor? scales=None, Tensor? scale_2=None) -> Tensor
    qmatmul_ggml(Tensor x, Tensor packed, int qtype, int n_out, int n_in,
                 Tensor? scales=None, Tensor? scale_2=None) -> Tensor
    qmatmul_t(Tensor g, Tensor packed, int qtype, int n_out, int n_in,
              Tensor? scales=None, Tensor? scale_2=None) -> Tensor
    dequantize(Tensor packed, int qtype, int n_out, int n_in,
               Tensor? scales=None, Tensor? scale_2=None) -> Tensor
    embedding(Tensor ids, Tensor packed, int qtype, int n_out, int n_in,
              Tensor? scales=None, Tensor? scale_2=None) -> Tensor

``packed`` is a contiguous uint8 ``[n_out, row_bytes]`` matrix W of ``qtype``
(a ``GGMLType`` id; any type the format registry computes). NVFP4_E2M1 also
takes ``scales`` (E4M3FN bytes, uint8 ``[n_out, n_in/16]``, on packed's device)
and ``scale_2`` (float32, one element); other types take neither.

* ``qmatmul``: ``x[..., n_in] @ W.T`` for float32/float16/bfloat16 x, output in
  x's dtype, accumulated in float32. Differentiable in x (through
  ``qmatmul_t``); the packed bytes get no gradient.
* ``qmatmul_ggml``: ``qmatmul`` in ggml's numerics (CPU): x quantized per
  block as ggml-cpu quantizes it for the weight type (Q8_0, Q8_1, Q8_K; F16
  and BF16 round x to their type), then integer dot products, so the result
  matches ggml's ``mul_mat`` on the same bytes (``cpu.GGML_NUMERICS_TYPES``;
  other types compute as ``qmatmul``). Its gradient is qmatmul's.
* ``qmatmul_t``: ``g[..., n_out] @ W`` in g's dtype, the gradient of qmatmul for
  x, computed over row tiles of W. Backends that do not register it get a
  generic version built on their ``dequantize``.
* ``dequantize``: W as float32 ``[n_out, n_in]``, bit-exact with gguf.
* ``embedding``: rows ``ids`` of W as float32 ``[*ids.shape, n_in]``
  (float32 so the caller picks the activation dtype; the rows are exact).

Backends: the default implementation (``defaults.CPU_DEFAULTS``) runs
``cpu/`` on CPU tensors and raises ValueError for a device with no kernel. ``cuda/`` and ``metal/``
register theirs with ``checks.register_kernels("cuda" | "mps", {op: fn}, types)``,
``fn`` taking the schema's arguments in order; ``backends.load_backends``
imports them when present and their device is available. Every kernel, the default
implementation included (``checks.default_kernel``), is built by ``checks.checked``, so every
backend runs ``check_args`` (the fake kernels call it too).

Metal emulation is chosen explicitly, never by an environment variable:
inside ``with use_backend("metal-emulator"):`` (``backend_choice.py``) the CPU path calls
``ops/metal``'s function of the same name on the CPU tensors, which runs
the .metal kernels through the CPU emulator (an op metal/ does not define,
such as ``qmatmul_t``, stays on the CPU kernels); without ops/metal it
raises ValueError.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..formats.companions import companion_args
from .checks import (MAX_DIM, check_args, check_call, check_dims, check_ids_in_range,  # noqa: F401
                     check_qtype, default_kernel, implemented_types)
from .backend_choice import CPU_BACKENDS, chosen_backend, use_backend
from .backends import backend, graph_capture, layer_step, load_backends, warm_up
from .defaults import CPU_DEFAULTS

__all__ = ["qmatmul", "qmatmul_ggml", "qmatmul_t", "dequantize", "embedding", "check_args", "backend", "warm_up", "graph_capture",
           "implemented_types", "use_backend", "chosen_backend", "CPU_BACKENDS"]

_COMPANIONS = "Tensor? scales=None, Tensor? scale_2=None"
_WEIGHT = f"Tensor packed, int qtype, int n_out, int n_in, {_COMPANIONS}"


def _normalize(where, qtype, scales, scale_2, device, n_out=None, n_in=None):
    """Wrapper-side conveniences: a GGMLType or its name for qtype, float8
    scales, a Python float for scale_2. Errors are prefixed with ``where``.
    The type and the dimensions are checked here too, before torch's
    dispatcher converts them (a bool to 0/1, an int past 64 bits to its own
    error)."""
    try:
        qtype = int(check_qtype(qtype))
        if n_out is not None or n_in is not None:
            check_dims(n_out, n_in)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    scales, scale_2 = companion_args(scales, scale_2, device)
    return qtype, scales, scale_2


def _define(op: str, operand: str):
    """Define ``muser::<op>`` (``operand`` leads the weight; "" for none) with
    ``defaults``' choice of CPU-tensor backend behind the op's checks as its
    default implementation."""
    head = f"Tensor {operand}, " if operand else ""
    return torch.library.custom_op(f"muser::{op}", mutates_args=(), schema=f"({head}{_WEIGHT}) -> Tensor")(
        default_kernel(op, CPU_DEFAULTS[op]))


# ---- qmatmul ------------------------------------------------------------------------------

_qmatmul = _define("qmatmul", "x")


@_qmatmul.register_fake
def _(x, packed, qtype, n_out, n_in, scales=None, scale_2=None):
    check_call("qmatmul", x, packed, qtype, n_out, n_in, scales, scale_2)
    return x.new_empty(*x.shape[:-1], n_out)


def _save_weight(ctx, inputs, output):
    """setup_context of qmatmul and qmatmul_t: keep the weight for the other op."""
    _, packed, qtype, n_out, n_in, scales, scale_2 = inputs
    ctx.save_for_backward(packed, scales, scale_2)
    ctx.meta = (qtype, n_out, n_in)


def _qmatmul_backward(ctx, grad):
    packed, scales, scale_2 = ctx.saved_tensors
    grad_x = torch.ops.muser.qmatmul_t(grad, packed, *ctx.meta, scales, scale_2)
    return grad_x, None, None, None, None, None, None


_qmatmul.register_autograd(_qmatmul_backward, setup_context=_save_weight)


# ---- qmatmul_ggml (ggml's 8-bit activations) -------------------------------------------------

_qmatmul_ggml = _define("qmatmul_ggml", "x")


@_qmatmul_ggml.register_fake
def _(x, packed, qtype, n_out, n_in, scales=None, scale_2=None):
    check_call("qmatmul_ggml", x, packed, qtype, n_out, n_in, scales, scale_2)
    return x.new_empty(*x.shape[:-1], n_out)


_qmatmul_ggml.register_autograd(_qmatmul_backward, setup_context=_save_weight)


# ---- qmatmul_t (the gradient for x) -------------------------------------------------------

_qmatmul_t = _define("qmatmul_t", "g")


@_qmatmul_t.register_fake
def _(g, packed, qtype, n_out, n_in, scales=None, scale_2=None):
    check_call("qmatmul_t", g, packed, qtype, n_out, n_in, scales, scale_2)
    return g.new_empty(*g.shape[:-1], n_in)


def _qmatmul_t_backward(ctx, grad):
    packed, scales, scale_2 = ctx.saved_tensors
    grad_g = torch.ops.muser.qmatmul(grad, packed, *ctx.meta, scales, scale_2)
    return grad_g, None, None, None, None, None, None


_qmatmul_t.register_autograd(_qmatmul_t_backward, setup_context=_save_weight)


# ---- dequantize ------------------------------------------------------------------------------

_dequantize = _define("dequantize", "")


@_dequantize.register_fake
def _(packed, qtype, n_out, n_in, scales=None, scale_2=None):
    check_call("dequantize", packed, qtype, n_out, n_in, scales, scale_2)
    return packed.new_empty(n_out, n_in, dtype=torch.float32)


# ---- embedding -------------------------------------------------------------------------------

_embedding = _define("embedding", "ids")


@_embedding.register_fake
def _(ids, packed, qtype, n_out, n_in, scales=None, scale_2=None):
    check_call("embedding", ids, packed, qtype, n_out, n_in, scales, scale_2)
    return packed.new_empty(*ids.shape, n_in, dtype=torch.float32)


# ---- Python wrappers (the public API) -----------------------------------------------------------

def qmatmul(x: Tensor, packed: Tensor, qtype, n_out: int, n_in: int,
            scales: Tensor | None = None, scale_2=None) -> Tensor:
    """``x[..., n_in] @ W.T`` with W packed as ``qtype``; output in x's dtype.
    ``qtype`` may be a GGMLType, its id or its name; ``scales`` may be
    float8_e4m3fn and ``scale_2`` a Python float (NVFP4_E2M1)."""
    qtype, scales, scale_2 = _normalize("muser.qmatmul", qtype, scales, scale_2, packed.device,
                                          n_out, n_in)
    return torch.ops.muser.qmatmul(x, packed, qtype, n_out, n_in, scales, scale_2)


def qmatmul_ggml(x: Tensor, packed: Tensor, qtype, n_out: int, n_in: int,
                 scales: Tensor | None = None, scale_2=None) -> Tensor:
    """:func:`qmatmul` in ggml's numerics (8-bit activations; CPU)."""
    qtype, scales, scale_2 = _normalize("muser.qmatmul_ggml", qtype, scales, scale_2,
                                          packed.device, n_out, n_in)
    return torch.ops.muser.qmatmul_ggml(x, packed, qtype, n_out, n_in, scales, scale_2)


def qmatmul_t(g: Tensor, packed: Tensor, qtype, n_out: int, n_in: int,
              scales: Tensor | None = None, scale_2=None) -> Tensor:
    """``g[..., n_out] @ W`` (the gradient of :func:`qmatmul` for x)."""
    qtype, scales, scale_2 = _normalize("muser.qmatmul_t", qtype, scales, scale_2, packed.device,
                                          n_out, n_in)
    return torch.ops.muser.qmatmul_t(g, packed, qtype, n_out, n_in, scales, scale_2)


def dequantize(packed: Tensor, qtype, n_out: int, n_in: int,
               scales: Tensor | None = None, scale_2=None) -> Tensor:
    """W as float32 ``[n_out, n_in]`` (bit-exact with gguf)."""
    qtype, scales, scale_2 = _normalize("muser.dequantize", qtype, scales, scale_2, packed.device,
                                          n_out, n_in)
    return torch.ops.muser.dequantize(packed, qtype, n_out, n_in, scales, scale_2)


def embedding(ids: Tensor, packed: Tensor, qtype, n_out: int, n_in: int,
              scales: Tensor | None = None, scale_2=None) -> Tensor:
    """Rows ``ids`` of W as float32 ``[*ids.shape, n_in]``."""
    qtype, scales, scale_2 = _normalize("muser.embedding", qtype, scales, scale_2, packed.device,
                                          n_out, n_in)
    return torch.ops.muser.embedding(ids, packed, qtype, n_out, n_in, scales, scale_2)


from . import layer  # noqa: E402,F401  (the layer ops, defined before the backends register)
load_backends()
