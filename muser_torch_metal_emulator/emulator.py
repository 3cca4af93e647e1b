"""Run Metal Shading Language compute kernels on the CPU, strictly.

``compile_shader(source)`` mirrors ``torch.mps.compile_shader``: it takes
the same unmodified source and returns a library whose attributes are
kernels, called as ``lib.name(*args, threads=..., group_size=...,
arg_casts=...)`` with PyTorch's contract (``torch/csrc/mps/Module.cpp``,
``MetalKernelFunction::dispatch``):

- positional argument i binds buffer index i (``[[buffer(i)]]``, or the i-th
  buffer parameter in declaration order when the kernel gives no indices);
- a tensor binds at its data pointer; a Python int binds as int64, a float
  as float32, a list as an array of either, a list of tensors as an array of
  their addresses; ``arg_casts`` (a string for every scalar, or
  ``{index: str}``) converts to ``fp16``, ``bf16``, ``int32``, ``int16``,
  ``int8`` or ``uint8``;
- ``threads`` defaults to the first tensor's numel; ``group_size`` must
  have as many dimensions; a group above the kernel's
  ``max_threads_per_threadgroup`` is refused (ValueError); an unknown kernel
  name raises RuntimeError.

Stricter than Metal, never looser: a scalar whose bytes the parameter would
misread (a float for an int, an int64 too large for ``constant int&``, a
float32 for ``constant half&``) is refused, as are non-contiguous and
partially overlapping tensors. Tensors must be contiguous CPU tensors; each
is copied into a buffer whose last byte touches a guard page and copied back
if a parameter can write it (buffers only const parameters see are made
read-only). Lane order comes from :func:`schedule` or
``MUSER_METAL_SCHEDULE`` (forward | reverse | random, seeded by
``MUSER_METAL_SEED``). See ``docs/metal.md``.

``new_library_with_source(source, macros=...)`` is the Metal API's door, as
llama.cpp's ggml-metal uses it (UTF-8 source, preprocessor macros); kernels
then take ``function_constants={index: value}`` per dispatch. Both take
``kernels=[...]`` to build only some kernels.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import operator
import os
import threading
from pathlib import Path

import torch

from .msl_build import build
from .msl_source import Kernel, MetalCompileError, MetalEmulatorError, check_source

__all__ = ["compile_shader", "new_library_with_source", "schedule", "MetalEmulatorError", "MetalCompileError",
           "SCHEDULES", "MAX_THREADS_PER_THREADGROUP", "THREAD_EXECUTION_WIDTH"]

SCHEDULES = ("forward", "reverse", "random")
MAX_THREADS_PER_THREADGROUP = 1024   # Apple GPUs' limit; a kernel may lower it with an attribute
THREAD_EXECUTION_WIDTH = 32
_CASTS = {"fp16": torch.float16, "bf16": torch.bfloat16, "int32": torch.int32, "int16": torch.int16,
          "int8": torch.int8, "uint8": torch.uint8}


# ------------------------------------------------------------------ schedules
_sched = threading.local()


def _current_schedule() -> tuple[str, int]:
    name = getattr(_sched, "name", None) or os.environ.get("MUSER_METAL_SCHEDULE", "forward")
    if name not in SCHEDULES:
        raise ValueError(f"MUSER_METAL_SCHEDULE must be one of {SCHEDULES}, got {name!r}")
    seed = getattr(_sched, "seed", None)
    return name, int(os.environ.get("MUSER_METAL_SEED", "0")) if seed is None else seed


@contextlib.contextmanager
def schedule(name: str, seed: int = 0):
    """Run emulated dispatches in this block with lane order ``name``:
    ``forward`` (lane 0 first), ``reverse`` or ``random`` (seeded)."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {name!r}")
    old = getattr(_sched, "name", None), getattr(_sched, "seed", None)
    _sched.name, _sched.seed = name, int(seed)
    try:
        yield
    finally:
        _sched.name, _sched.seed = old


# ------------------------------------------------------------------ arguments
def _sizes(v, what: str) -> list[int] | None:
    """optional_vec_from_pyobject: None, an int, or a sequence of 1 to 3 sizes."""
    if v is None:
        return None
    vals = [v] if isinstance(v, int) else list(v)
    if not 0 < len(vals) < 4:
        raise RuntimeError(f"{what} must have 1 to 3 dimensions, got {len(vals)}")
    try:
        vals = [operator.index(x) for x in vals]
    except TypeError:
        raise TypeError(f"{what} must be integers, got {vals}") from None
    if any(x < 1 for x in vals):
        # Metal's dispatchThreads takes no empty grid (the emulator refuses rather than guess).
        raise ValueError(f"{what} must be positive, got {vals}")
    return vals


def _caster(arg_casts) -> tuple[str, dict[int, str]]:
    if arg_casts is None:
        return "", {}
    if isinstance(arg_casts, str):
        return arg_casts, {}
    if isinstance(arg_casts, dict):
        if any(not isinstance(k, int) or k < 0 or not isinstance(v, str) for k, v in arg_casts.items()):
            raise RuntimeError(f"arg_casts must map argument indices to cast names, got {arg_casts!r}")
        return "", dict(arg_casts)
    raise RuntimeError(f"Unexpected caster arg type {type(arg_casts).__name__}")


class _Bytes:
    """A setBytes argument: its bytes, element kind ('i' | 'f'), element size, values."""

    def __init__(self, t: torch.Tensor, kind: str):
        self.raw = t.contiguous().view(torch.uint8).numpy().tobytes()
        self.kind, self.elem, self.values = kind, t.element_size(), t.tolist()
        self.describe = ""


def _scalar_bytes(name: str, i: int, a, cast: str) -> _Bytes:
    if isinstance(a, (list, tuple)):
        if not a:
            raise RuntimeError("Empty list/tuple can not be an argument to metal kernel")
        if isinstance(a[0], int):
            if not all(isinstance(x, int) for x in a):
                raise RuntimeError(f"{name}: argument {i}: a list that starts with an int must hold only ints")
            t, kind = torch.tensor(a, dtype=torch.int64), "i"
        elif isinstance(a[0], float):
            t, kind = torch.tensor(a, dtype=torch.float32), "f"
        else:
            raise RuntimeError("Unexpected argument types")
        what = f"a list of {len(a)} {'ints' if kind == 'i' else 'floats'}"
    elif isinstance(a, float):
        t, kind, what = torch.tensor([a], dtype=torch.float32), "f", "a Python float"
    elif isinstance(a, int):
        t, kind, what = torch.tensor([int(a)], dtype=torch.int64), "i", "a Python int"
    else:
        raise RuntimeError(f"Unsupported argument type {type(a).__name__} (argument {i} of {name})")
    if cast:
        if cast not in _CASTS:
            raise RuntimeError(f"Unsupported cast instruction {cast}")
        if _CASTS[cast].is_floating_point and kind == "i":
            t = t.to(torch.float32)      # c10::Half / BFloat16 are built from a float
        t, kind = t.to(_CASTS[cast]), "f" if _CASTS[cast].is_floating_point else "i"
    b = _Bytes(t, kind)
    b.describe = f"{what} bound as {str(t.dtype).replace('torch.', '')}"
    return b


def _check_scalar(kname: str, i: int, b: _Bytes, decl: str, meta) -> None:
    """Refuse bytes the parameter would misread."""
    cat, size, indirect = meta.category.decode(), meta.elem_bytes, meta.indirect
    elem_size = size // max(1, meta.lanes)
    where = f"{kname}: argument {i} ({b.describe}) for parameter '{decl}'"
    if cat == "o":
        if indirect == 2 and len(b.raw) < size:
            raise MetalEmulatorError(f"{where}: the parameter reads {size} bytes, the argument has {len(b.raw)}")
        return
    if (cat == "f") != (b.kind == "f"):
        given, read = ("an integer", "a float") if b.kind == "i" else ("a float", "an integer")
        raise MetalEmulatorError(f"{where}: Metal would read the bits of {given} as {read}; pass the other kind "
                                 f"or use arg_casts")
    if indirect == 2 and len(b.raw) < size:
        raise MetalEmulatorError(f"{where}: the parameter reads {size} bytes, the argument has {len(b.raw)}")
    if elem_size != b.elem:
        if indirect == 2 and meta.lanes == 1 and len(b.values) == 1 and b.kind == "i" and elem_size < b.elem:
            lo, hi = (-(1 << (8 * elem_size - 1)), (1 << (8 * elem_size - 1)) - 1) if cat == "i" else \
                (0, (1 << (8 * elem_size)) - 1)
            if cat == "b":
                lo, hi = 0, 1
            if lo <= b.values[0] <= hi:
                return       # little-endian: the parameter reads the low bytes, which hold the value
            raise MetalEmulatorError(f"{where}: {b.values[0]} does not fit the parameter's {elem_size} bytes")
        raise MetalEmulatorError(f"{where}: elements of {b.elem} bytes, the parameter reads elements of "
                                 f"{elem_size}; use arg_casts")


def _function_constants(kname: str, values) -> tuple:
    """ctypes arguments of emu_set_function_constants for ``{index: bool | int | float}``
    (what MTLFunctionConstantValues would hold for the pipeline)."""
    values = dict(values or {})
    n = len(values)
    index, kind = (ctypes.c_int64 * max(1, n))(), ctypes.create_string_buffer(max(1, n))
    ival, fval = (ctypes.c_int64 * max(1, n))(), (ctypes.c_double * max(1, n))()
    for k, (i, v) in enumerate(sorted(values.items())):
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < 65536:
            raise ValueError(f"{kname}: function constant index {i!r}: Metal's indices are 0..65535")
        index[k] = i
        if isinstance(v, bool):
            kind[k], ival[k] = b"b", int(v)
        elif isinstance(v, int):
            if not -(1 << 63) <= v < (1 << 63):
                raise ValueError(f"{kname}: function constant {i}: {v} does not fit 64 bits")
            kind[k], ival[k] = b"i", v
        elif isinstance(v, float):
            kind[k], fval[k] = b"f", v
        else:
            raise TypeError(f"{kname}: function constant {i} must be a bool, int or float, got {type(v).__name__}")
    return index, kind, ival, fval, n


class _Meta(ctypes.Structure):
    _fields_ = [("indirect", ctypes.c_int), ("writable", ctypes.c_int), ("elem_bytes", ctypes.c_int),
                ("category", ctypes.c_char), ("lanes", ctypes.c_int)]


# ------------------------------------------------------------------ kernels
class _Kernel:
    def __init__(self, lib: "_Library", n: int, info: Kernel):
        self._lib, self.name, self._info = lib, info.host_name, info
        dll = lib._dll
        self._fn = ctypes.cast(getattr(dll, f"muser_emu_k_{n}"), ctypes.c_void_p)
        metas = (_Meta * (len(info.params) + 1))()
        arity = getattr(dll, f"muser_emu_m_{n}")(metas)
        if arity != len(info.params):
            raise MetalCompileError(f"{self.name}: the emulator read {len(info.params)} parameters, C++ sees {arity}")
        self._meta = list(metas)[:arity]
        for p, m in zip(info.params, self._meta):
            if p.kind == "buffer" and m.indirect == 0:
                raise MetalCompileError(f"{info.file}:{info.line}: parameter '{p.decl}' of {self.name} binds a "
                                        f"buffer but is neither a pointer nor a reference")
        self._buffers = {p.index: (p, m) for p, m in zip(info.params, self._meta) if p.kind == "buffer"}
        self._n_buffers = 1 + max(self._buffers, default=-1)
        self._tg_params = sorted(p.index for p in info.params if p.kind == "threadgroup")
        self._static_tg: int | None = None

    @property
    def max_threads_per_threadgroup(self) -> int:
        return self._info.max_threads or MAX_THREADS_PER_THREADGROUP

    @property
    def thread_execution_width(self) -> int:
        return THREAD_EXECUTION_WIDTH

    @property
    def static_thread_group_memory_length(self) -> int:
        """Threadgroup memory the kernel's declarations took in its last dispatch
        (the emulator learns it by running the kernel; Metal knows it at compile time)."""
        if self._static_tg is None:
            raise MetalEmulatorError(f"{self.name}: the emulator knows the threadgroup memory length only after "
                                     f"a dispatch")
        return self._static_tg

    def __call__(self, *args, threads=None, group_size=None, arg_casts=None, error_buf_idx=None,
                 threadgroup_memory=None, function_constants=None):
        threads, group = _sizes(threads, "threads"), _sizes(group_size, "group_size")
        constants = _function_constants(self.name, function_constants)
        default_cast, cast_map = _caster(arg_casts)
        if error_buf_idx is not None:
            raise MetalEmulatorError(f"{self.name}: error_buf_idx (PyTorch's TORCH_CHECK error buffer) is not "
                                     f"supported by the emulator")
        if len(args) != self._n_buffers:
            raise TypeError(f"{self.name} binds {self._n_buffers} buffers, got {len(args)} arguments")
        if threads is None:
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is None:
                raise RuntimeError("Number of threads is undefined or has wrong dimension")
            threads = _sizes(first.numel(), "threads (the first tensor's numel)")
        if group is not None and len(group) != len(threads):
            raise RuntimeError(f"size and group_size must have same number of dimensions (threads {threads}, "
                               f"group_size {group})")
        limit = self.max_threads_per_threadgroup
        if group is None:
            group = [min(threads[0], limit)] if len(threads) == 1 else [limit]
        grid3 = threads + [1] * (3 - len(threads))
        group3 = group + [1] * (3 - len(group))
        if group3[0] * group3[1] * group3[2] > limit:
            raise ValueError(f"Threadgroup size exceeds {limit} limit")
        tg_bytes = [0] * (max(self._tg_params, default=-1) + 1)
        for t in self._tg_params:
            n = (threadgroup_memory or {}).get(t)
            if n is None:
                raise MetalEmulatorError(
                    f"{self.name}: [[threadgroup({t})]] needs a threadgroup memory length, which "
                    f"torch.mps.compile_shader never sets (setThreadgroupMemoryLength); the emulator takes "
                    f"threadgroup_memory={{{t}: bytes}}")
            tg_bytes[t] = int(n)
        with _DISPATCH_LOCK:
            self._lib._dll.emu_set_function_constants(*constants)
            self._dispatch(args, default_cast, cast_map, grid3, group3, tg_bytes)

    # One guarded buffer per distinct tensor (identical tensors share one), copied
    # back if any parameter bound to it can write; the rest become read-only.
    def _dispatch(self, args, default_cast, cast_map, grid, group, tg_bytes):
        dll = self._lib._dll
        bufs = (ctypes.c_void_p * max(1, len(args)))()
        live: list[int] = []
        tensors: dict[tuple[int, int], list] = {}      # (address, bytes) -> [buffer, tensor, writable, arg]

        def alloc(raw, nbytes: int, align: int, index: int) -> int:
            ptr = dll.emu_buffer_alloc(nbytes, align, index)
            if not ptr:
                raise MemoryError(f"{self.name}: cannot map a guarded buffer of {nbytes} bytes")
            live.append(ptr)
            if nbytes:
                ctypes.memmove(ptr, raw, nbytes)
            return ptr

        def tensor_buffer(i: int, t: torch.Tensor, writable: bool) -> int:
            if t.device.type != "cpu":
                raise ValueError(f"{self.name}: argument {i} is on {t.device}; the emulator runs CPU tensors")
            if not t.is_contiguous():
                raise ValueError(f"{self.name}: argument {i} must be contiguous (compile_shader binds the raw "
                                 f"storage, ignoring strides)")
            nbytes = t.numel() * t.element_size()
            key = (t.data_ptr(), nbytes)
            if key not in tensors:
                for (lo, n), entry in tensors.items():
                    if nbytes and n and t.data_ptr() < lo + n and lo < t.data_ptr() + nbytes:
                        raise MetalEmulatorError(f"{self.name}: arguments {entry[3]} and {i} overlap in memory; "
                                                 f"the emulator copies each argument and cannot model partial "
                                                 f"aliasing")
                tensors[key] = [alloc(t.data_ptr(), nbytes, max(1, t.element_size()), i), t, False, i]
            tensors[key][2] |= writable
            return tensors[key][0]

        try:
            for i, a in enumerate(args):
                if isinstance(a, torch.Tensor):
                    bufs[i] = tensor_buffer(i, a, i in self._buffers and bool(self._buffers[i][1].writable))
                elif isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
                    if not all(isinstance(t, torch.Tensor) for t in a):
                        raise RuntimeError(f"{self.name}: argument {i}: a list that starts with a tensor must "
                                           f"hold only tensors")
                    # The kernel can reach these tensors only through addresses: all writable.
                    ptrs = [tensor_buffer(i, t, True) for t in a]
                    bufs[i] = alloc((ctypes.c_uint64 * len(ptrs))(*ptrs), 8 * len(ptrs), 8, i)
                else:
                    b = _scalar_bytes(self.name, i, a, cast_map.get(i, default_cast))
                    if i in self._buffers:
                        p, m = self._buffers[i]
                        _check_scalar(self.name, i, b, p.decl, m)
                    bufs[i] = alloc(b.raw, len(b.raw), b.elem, i)
                    dll.emu_buffer_protect(ctypes.c_void_p(bufs[i]))
            for ptr, _, writable, _ in tensors.values():
                if not writable:
                    dll.emu_buffer_protect(ctypes.c_void_p(ptr))
            name, seed = _current_schedule()
            err = ctypes.create_string_buffer(2048)
            high = ctypes.c_uint64(0)
            tgb = (ctypes.c_uint64 * max(1, len(tg_bytes)))(*tg_bytes)
            rc = dll.emu_dispatch(self._fn, self.name.encode(), bufs, (ctypes.c_uint * 3)(*grid),
                                  (ctypes.c_uint * 3)(*group), SCHEDULES.index(name), ctypes.c_uint64(seed),
                                  tgb, len(tg_bytes), ctypes.byref(high), err, len(err))
            if rc:
                raise MetalEmulatorError(err.value.decode(errors="replace"))
            self._static_tg = int(high.value) - sum(tg_bytes)
            for ptr, t, writable, _ in tensors.values():
                if writable and t.numel():
                    ctypes.memmove(t.data_ptr(), ptr, t.numel() * t.element_size())
        finally:
            for ptr in live:
                dll.emu_buffer_free(ctypes.c_void_p(ptr))


class _Library:
    def __init__(self, path, kernels: list[Kernel]):
        self._dll = dll = ctypes.CDLL(str(path))
        dll.emu_buffer_alloc.restype = ctypes.c_void_p
        dll.emu_buffer_alloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]
        dll.emu_buffer_free.argtypes = [ctypes.c_void_p]
        dll.emu_buffer_protect.argtypes = [ctypes.c_void_p]
        dll.emu_set_function_constants.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p,
                                                   ctypes.c_void_p, ctypes.c_int]
        dll.emu_dispatch.restype = ctypes.c_int
        dll.emu_dispatch.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_int,
                                     ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
        self._kernels = {k.host_name: (n, k) for n, k in enumerate(kernels)}
        self._cache: dict[str, _Kernel] = {}

    def __getattr__(self, name: str) -> _Kernel:
        if name.startswith("__"):
            raise AttributeError(name)
        if name not in self._kernels:
            raise RuntimeError(f"Failed to create function state object for: {name} (the library has "
                               f"{', '.join(sorted(self._kernels)) or 'no kernels'})")
        k = self._cache.get(name)
        if k is None:
            k = self._cache[name] = _Kernel(self, *self._kernels[name])
        return k

    def __dir__(self):
        return list(self._kernels)


_LIBS: dict[str, _Library] = {}
_LOCK = threading.Lock()
_DISPATCH_LOCK = threading.Lock()   # the runtime keeps one dispatch's state in globals


def compile_shader(source: str, *, kernels=None) -> _Library:
    """Compile MSL ``source`` for the CPU emulator (cached); see the module docstring.

    ``kernels`` (an emulator extension): build only the kernels of these host
    names. Metal compiles a whole library at once; g++ would spend minutes on
    template instantiations a test never calls (llama.cpp's libraries hold
    hundreds)."""
    fast = os.environ.get("PYTORCH_MPS_FAST_MATH")
    if fast is not None and fast != "0":
        raise MetalEmulatorError("PYTORCH_MPS_FAST_MATH is set: PyTorch would compile with fast math, which the "
                                 "emulator does not model (it runs safe math); unset it")
    return _compile(source, _embed_torch_headers, kernels, ascii_only=True)


def new_library_with_source(source: str, *, macros: dict[str, str] | None = None, kernels=None) -> _Library:
    """What ``MTLDevice newLibraryWithSource:options:`` takes, as llama.cpp's ggml-metal calls it:
    UTF-8 source (compile_shader's is ASCII) and ``MTLCompileOptions.preprocessorMacros``
    (``macros``, given to the preprocessor). ``kernels`` as in :func:`compile_shader`.
    Function constants are set per dispatch (``function_constants={index: value}``), as
    ``newFunctionWithName:constantValues:`` sets them per pipeline."""
    for k, v in (macros or {}).items():
        if not isinstance(k, str) or not k.isidentifier() or not isinstance(v, str) or "\n" in v:
            raise ValueError(f"macros must map identifiers to one-line strings, got {k!r}: {v!r}")
    return _compile(source, lambda s: s, kernels, ascii_only=False, macros=tuple(sorted((macros or {}).items())))


def _compile(source: str, prepare, kernels, ascii_only: bool, macros: tuple = ()) -> _Library:
    """The cached library of ``source``; ``prepare(source)`` gives what is built (on a cache miss)."""
    only = None
    if kernels is not None:
        only = frozenset([kernels] if isinstance(kernels, str) else kernels)
        if not only or not all(isinstance(k, str) for k in only):
            raise ValueError(f"kernels must be kernel names, got {kernels!r}")
    key = hashlib.sha256(source.encode()).hexdigest() + repr((ascii_only, sorted(only) if only else None, macros))
    with _LOCK:
        lib = _LIBS.get(key)
        if lib is None:
            check_source(source, ascii_only)
            lib = _LIBS[key] = _Library(*build(prepare(source), only, macros))
        return lib


def _embed_torch_headers(source: str) -> str:
    """What torch.mps.compile_shader does first: inline #include <c10/metal/...> and
    other headers found under torch's include directory."""
    from torch.utils._cpp_embed_headers import _embed_headers
    include = Path(torch.__file__).resolve().parent / "include"
    return _embed_headers([line + "\n" for line in source.split("\n")], [include], set())
