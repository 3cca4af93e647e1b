"""The ops' default implementations, for CPU tensors: per call, the backend
``use_backend`` chose (``ops/cpu``, or ``ops/metal`` through the emulator).

``CPU_DEFAULTS`` maps each op to its *picker*: given the op's arguments in
schema order (checked), it returns the backend function that runs them, or
raises for a call no backend here takes. ``ops/__init__.py`` registers them
behind the op boundary's checks (``checks.default_kernel``), whose kernel
calls the picker and then the function it returned, so a CPU call goes
torch.ops -> ``checks`` -> ``ops/cpu`` (or ``ops/metal``): the picker has
returned before the kernel runs, and no call comes back into a module it
left. Devices with kernels of their own (CUDA, MPS) reach only ``qmatmul_t``,
which their backends leave to the row tiles over their ``dequantize``.
"""
from __future__ import annotations

import importlib.util
from typing import Callable

import torch
from torch import Tensor

from .backend_choice import chosen_backend
from ..formats.types import GGMLType
from .checks import check_backend_type, check_ids_in_range
from . import layer as _layer_ops

__all__ = ["CPU_DEFAULTS"]

Kernel = Callable[..., Tensor]   # a backend function, taking the op's arguments in schema order


def _backend_for(op: str, device: torch.device, qtype: int):
    """The kernel module for a device with no registered kernel of its own;
    the emulated Metal backend refuses here, once, the types it has no kernel for."""
    if device.type != "cpu":
        raise ValueError(f"muser.{op}: no kernel for device {device.type!r} (CPU kernels are "
                         f"built in; cuda and mps need ops/cuda or ops/metal and the device)")
    if chosen_backend() == "metal-emulator":
        if importlib.util.find_spec(f"{__package__}.metal") is None:
            raise ValueError(f"muser.{op}: use_backend('metal-emulator'), but muser_torch/ops/metal "
                             "(the Metal kernels) is not installed")
        from . import metal
        if hasattr(metal, op):
            check_backend_type(GGMLType.parse(qtype), "metal-emulator", metal.SUPPORTED, op)
            return metal
    from . import cpu
    return cpu


def qmatmul(x: Tensor, packed: Tensor, qtype: int, n_out: int, n_in: int,
            scales: Tensor | None = None, scale_2: Tensor | None = None) -> Kernel:
    """``x[..., n_in] @ W.T`` in x's dtype: the chosen backend's ``qmatmul``."""
    return _backend_for("qmatmul", x.device, qtype).qmatmul


def qmatmul_ggml(x: Tensor, packed: Tensor, qtype: int, n_out: int, n_in: int,
                 scales: Tensor | None = None, scale_2: Tensor | None = None) -> Kernel:
    """``x[..., n_in] @ W.T`` in ggml's numerics: the native CPU kernels only."""
    if x.device.type != "cpu":
        raise ValueError(f"muser.qmatmul_ggml: ggml numerics run on the CPU, got a "
                         f"{x.device.type} tensor (use numerics='exact' there)")
    if chosen_backend() != "native":
        raise ValueError(f"muser.qmatmul_ggml: ggml numerics run on the native CPU kernels, not "
                         f"inside use_backend({chosen_backend()!r}) (use numerics='exact' there)")
    from . import cpu
    return cpu.qmatmul_ggml


def qmatmul_t(g: Tensor, packed: Tensor, qtype: int, n_out: int, n_in: int,
              scales: Tensor | None = None, scale_2: Tensor | None = None) -> Kernel:
    """``g[..., n_out] @ W`` in g's dtype: the chosen backend's on CPU tensors,
    W in row tiles on a device whose backend registers no ``qmatmul_t``."""
    if g.device.type == "cpu":
        return _backend_for("qmatmul_t", g.device, qtype).qmatmul_t
    return _qmatmul_t_tiled


def _qmatmul_t_tiled(g, packed, qtype, n_out, n_in, scales, scale_2, tile_bytes=16 << 20):
    """Any device with a ``muser::dequantize`` kernel: W in row tiles."""
    g2 = g.reshape(-1, n_out).to(torch.float32)
    out = torch.zeros(g2.shape[0], n_in, dtype=torch.float32, device=g.device)
    step = max(1, tile_bytes // (4 * n_in))
    for r0 in range(0, n_out, step):
        r1 = min(n_out, r0 + step)
        s = None if scales is None else scales[r0:r1]
        w = torch.ops.muser.dequantize(packed[r0:r1], qtype, r1 - r0, n_in, s, scale_2)
        out.addmm_(g2[:, r0:r1], w)
    return out.reshape(*g.shape[:-1], n_in).to(g.dtype)


def dequantize(packed: Tensor, qtype: int, n_out: int, n_in: int,
               scales: Tensor | None = None, scale_2: Tensor | None = None) -> Kernel:
    """W as float32 ``[n_out, n_in]``: the chosen backend's ``dequantize``."""
    return _backend_for("dequantize", packed.device, qtype).dequantize


def embedding(ids: Tensor, packed: Tensor, qtype: int, n_out: int, n_in: int,
              scales: Tensor | None = None, scale_2: Tensor | None = None) -> Kernel:
    """Rows ``ids`` of W as float32 ``[*ids.shape, n_in]``: the chosen
    backend's ``embedding``, once every id is in range."""
    check_ids_in_range("embedding", ids, n_out)
    return _backend_for("embedding", ids.device, qtype).embedding


# op -> its picker
CPU_DEFAULTS: dict[str, Callable[..., Kernel]] = {
    "qmatmul": qmatmul, "qmatmul_ggml": qmatmul_ggml, "qmatmul_t": qmatmul_t,
    "dequantize": dequantize, "embedding": embedding,
}


def _cpu_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor | None:
    """``ops.layer.rms_norm``'s eager shortcut on the CPU: the library's RMSNorm
    (one call of decode.c's) for plain eager float32 tensors, else None (the op runs)."""
    if not (x.dtype is torch.float32 and weight.dtype is torch.float32 and x.is_cpu
            and weight.is_cpu and x.is_contiguous() and weight.is_contiguous()
            and x.shape[-1:] == weight.shape and not weight.requires_grad):
        return None
    from .cpu import _native_lib, block
    from .cpu.eager import plain_eager
    lib = _native_lib() if plain_eager(x) else None
    return None if lib is None else block.rmsnorm(lib, x, weight, eps)


_layer_ops.EAGER_SHORTCUTS["cpu"] = {"rms_norm": _cpu_rms_norm}
