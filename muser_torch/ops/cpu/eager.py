"""The eager CPU path of the packed modules: a prepared call of the native
library that skips torch's dispatcher when nothing needs it.

A call of ``torch.ops.muser.qmatmul`` from Python costs tens of µs before any
kernel runs (the custom op's Python autograd and device kernels, the argument
checks, the ladder's reshapes and casts), as long as the kernel itself at a
small model's shapes. :class:`Projection` holds what a weight's call needs,
checked once when it is built (the module's own weight, validated by its
constructor), and calls the library with data pointers.

:func:`plain_eager` decides, per call, whether the prepared call may stand in
for the op: a plain CPU tensor, no gradient to record, and none of torch's
machinery that must see the op (torch.compile or jit tracing, torch-function
or dispatch modes, functorch transforms, the Metal emulator). Otherwise the
module calls the op, so what is traced, checked by ``opcheck`` and
differentiated is always ``muser::qmatmul``. Both paths run the same kernel
on the same arguments, so they give the same values. Under torch.profiler a
prepared call records itself under the op's name.
"""
from __future__ import annotations

import ctypes

import torch

from ...formats.types import NEEDS_COMPANIONS, GGMLType
from ..backend_choice import chosen_backend
from ...formats import scale_byte_table
from . import BACK_TO_BACK_THREAD_MIN_BYTES, FUSED_MAX_TOKENS, _native_for, qmatmul as _cpu_qmatmul
from . import block

__all__ = ["plain_eager", "profiling", "recorded", "Projection"]

_C = torch._C
_is_compiling = torch.compiler.is_compiling
_wrapped = _C._functorch.is_functorch_wrapped_tensor


def plain_eager(x: torch.Tensor) -> bool:
    """Whether a call on ``x`` may skip the dispatcher (see the module docstring)."""
    return (type(x) is torch.Tensor and x.is_cpu
            and not (x.requires_grad and _C.is_grad_enabled())
            and not _is_compiling() and _C._get_tracing_state() is None
            and _C._len_torch_dispatch_stack() == 0 and not _C._is_torch_function_mode_enabled()
            and not _C._are_functorch_transforms_active() and not _wrapped(x)
            and chosen_backend() == "native")


def profiling() -> bool:
    """Whether torch.profiler records: the prepared calls then record
    themselves under the op's name (:func:`recorded`)."""
    return torch.autograd.profiler._is_profiler_enabled


def recorded(name: str, fn, *args):
    """``fn(*args)`` recorded by the profiler as ``name`` (a user annotation:
    a profile of the eager path shows each native call where the op was)."""
    with torch.profiler.record_function(name):
        return fn(*args)


class Projection:
    """``x @ W.T`` for one packed weight as the op computes it, on the library
    (``decode.c``'s ``muser_linear``): float32 contiguous x of up to
    ``FUSED_MAX_TOKENS`` rows (any rows in ggml's integer numerics); in the exact
    numerics more rows (a speculative verify block, a prefill) run the op's own
    CPU function without the dispatcher's cost. (A custom op's first call
    through the dispatcher also imports torch._dynamo, and with it Triton:
    about 170 MB of resident memory and 1.4-1.6 s of import that a CPU run
    never needs.) :meth:`__call__` returns None for
    anything else, and the caller takes the op. Points at the weight's tensors: build it again when they are replaced
    (``QLinear`` keys it on the data pointers)."""

    __slots__ = ("key", "_args", "_linear", "_ref", "_n_in", "_n_out", "_max_rows", "_scale_2",
                 "_lut", "_run")

    def __init__(self, packed: torch.Tensor, qtype: GGMLType, n_out: int, n_in: int,
                 scales: torch.Tensor | None, scale_2: torch.Tensor | None, numerics: str,
                 repacked: torch.Tensor | None = None) -> None:
        self.key = (packed.data_ptr(), None if scales is None else scales.data_ptr(), numerics,
                    None if repacked is None else repacked.data_ptr())
        self._args = (packed, qtype, n_out, n_in, scales, scale_2, numerics, repacked)
        self._n_in, self._n_out = n_in, n_out
        lib = _native_for(qtype) if packed.is_cpu else None
        self._linear = None if lib is None else block.linear(packed, qtype, n_out, n_in, scales,
                                                             scale_2, numerics, None, repacked)
        if self._linear is None:
            return
        self._ref, self._run = ctypes.byref(self._linear), lib.muser_linear
        self._lut = scale_byte_table(qtype)   # kept alive: the library reads it by pointer
        integer = self._linear.mul in (block.MUL["q8"], block.MUL["q8p"])   # any rows
        self._max_rows = None if integer else FUSED_MAX_TOKENS
        # NVFP4_E2M1's global scale is read at each call (load_state_dict writes it in place)
        self._scale_2 = scale_2 if qtype in NEEDS_COMPANIONS else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        if self._linear is None or x.dtype is not torch.float32 or not x.is_contiguous():
            return None
        shape = x.shape
        if not shape or shape[-1] != self._n_in:
            return None
        rows = x.numel() // self._n_in
        if rows < 1:
            return None
        if self._max_rows is not None and rows > self._max_rows:
            return _cpu_qmatmul(x, *self._args[:6]) if self._args[6] == "exact" else None
        if self._scale_2 is not None:
            self._linear.s2 = float(self._scale_2)
        y = torch.empty(*shape[:-1], self._n_out)
        if self._run(self._ref, x.data_ptr(), rows, y.data_ptr(), torch.get_num_threads(),
                     BACK_TO_BACK_THREAD_MIN_BYTES):
            return None
        return y

    def __reduce__(self):
        # rebuilt from its weight (copy.deepcopy, pickling): the library's
        # function pointers do not copy
        return Projection, self._args
