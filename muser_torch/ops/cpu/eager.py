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

import torch

from ...formats.types import NEEDS_COMPANIONS, GGMLType
from ..choice import chosen_backend
from . import FUSED_MAX_TOKENS, GGML_NUMERICS_TYPES, _lut, _native_for, _threads

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
    """``x @ W.T`` for one packed weight on the native fused or ggml kernel:
    float32 contiguous x of up to ``FUSED_MAX_TOKENS`` rows (any rows in the
    ggml numerics); :meth:`__call__` returns None for anything else, and the
    caller takes the op. Holds the weight's tensors, not copies: build it
    again when they are replaced (``QLinear`` keys it on the data pointers)."""

    __slots__ = ("key", "_args", "_fn", "_head", "_tail", "_n_in", "_n_out", "_max_rows",
                 "_nbytes", "_scale_2", "_lut")

    def __init__(self, packed: torch.Tensor, qtype: GGMLType, n_out: int, n_in: int,
                 scales: torch.Tensor | None, scale_2: torch.Tensor | None, numerics: str) -> None:
        self.key = (packed.data_ptr(), None if scales is None else scales.data_ptr(), numerics)
        self._args = (packed, qtype, n_out, n_in, scales, scale_2, numerics)
        self._scale_2 = scale_2
        self._n_in, self._n_out = n_in, n_out
        self._nbytes = packed.numel()
        lib = _native_for(qtype) if packed.is_cpu and packed.is_contiguous() else None
        self._fn = None
        if lib is None:
            return
        if numerics == "ggml" and qtype in GGML_NUMERICS_TYPES and qtype not in (GGMLType.F16,
                                                                                 GGMLType.BF16):
            # muser_matmul_q8(type, packed, n_out, n_in, x, T, y, threads)
            self._fn, self._max_rows = lib.muser_matmul_q8, None
            self._head, self._tail = (int(qtype), packed.data_ptr(), n_out, n_in), ()
        elif numerics == "exact" or qtype not in GGML_NUMERICS_TYPES:
            # muser_matmul(type, packed, scales, lut, s2, n_out, n_in, x, T, y, threads)
            self._fn, self._max_rows = lib.muser_matmul, FUSED_MAX_TOKENS
            lut = _lut(qtype)
            self._lut = lut   # kept alive: the library reads it by pointer
            self._head = (int(qtype), packed.data_ptr(), None if scales is None else scales.data_ptr(),
                          None if lut is None else lut.data_ptr())
            self._tail = (n_out, n_in)
            if qtype not in NEEDS_COMPANIONS:
                self._head, self._scale_2 = self._head + (0.0,) + self._tail, None
                self._tail = ()
        # F16/BF16 in the ggml numerics round x first: left to the op

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        fn = self._fn
        if fn is None or x.dtype is not torch.float32 or not x.is_contiguous():
            return None
        shape = x.shape
        if not shape or shape[-1] != self._n_in:
            return None
        rows = x.numel() // self._n_in
        if rows < 1 or (self._max_rows is not None and rows > self._max_rows):
            return None
        y = torch.empty(*shape[:-1], self._n_out)
        # as ops/cpu's qmatmul and qmatmul_ggml size their pools
        threads = _threads(self._nbytes if self._max_rows else self._nbytes * max(1, rows // 4))
        if self._scale_2 is None:
            rc = fn(*self._head, x.data_ptr(), rows, y.data_ptr(), threads)
        else:   # NVFP4_E2M1: its global scale is read at each call (load_state_dict writes it in place)
            rc = fn(*self._head, float(self._scale_2), *self._tail, x.data_ptr(), rows,
                    y.data_ptr(), threads)
        return None if rc else y

    def __reduce__(self):
        # rebuilt from its weight (copy.deepcopy, pickling): the library's
        # function pointers do not copy
        return Projection, self._args
