"""Run Metal Shading Language kernels on the CPU, strictly.

``compile_shader(source)`` mirrors ``torch.mps.compile_shader``: it returns a
library whose attributes are kernels, called as
``lib.name(*args, threads=..., group_size=..., arg_casts=...)`` with
positional argument i bound to ``[[buffer(i)]]``, a tensor bound at its data
pointer, a Python int as int64 (``constant long&``), a float as float32, and
``dispatchThreads`` semantics (an edge threadgroup may be partial).

The source is compiled unmodified by g++ against ``metal_shim.h`` into a
shared library (cached by source hash under ``MUSER_METAL_CACHE``, default
``~/.cache/muser_torch/metal-emu``), each lane runs as a fiber
(``emu_runtime.cpp``), and the checks are strict: see ``docs/metal.md``.
Lane order comes from :func:`schedule` or ``MUSER_METAL_SCHEDULE``
(forward | reverse | random, seeded by ``MUSER_METAL_SEED``).
Tensors must be contiguous CPU tensors; each is copied into a buffer whose
last byte touches a guard page, and written back if the kernel's parameter
is a non-const pointer.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import re
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["compile_shader", "schedule", "MetalEmulatorError", "SCHEDULES"]

_HERE = Path(__file__).resolve().parent
_SHIM = _HERE / "metal_shim.h"
_RUNTIME = _HERE / "emu_runtime.cpp"
SCHEDULES = ("forward", "reverse", "random")
_CXX = os.environ.get("CXX", "g++")
# No -march: without FMA instructions g++ cannot contract a*b+c, so float
# arithmetic rounds per operation exactly as written.
_CFLAGS = ["-std=c++17", "-O2", "-fPIC", "-Wno-attributes", "-ffp-contract=off",
           "-fno-strict-aliasing", "-U_FORTIFY_SOURCE"]

_BUILTINS = {
    "thread_position_in_grid": "L->tpig",
    "threadgroup_position_in_grid": "L->tgpig",
    "thread_position_in_threadgroup": "L->tptg",
    "thread_index_in_threadgroup": "metal::uint3(L->tid, 0, 0)",
    "thread_index_in_simdgroup": "metal::uint3(L->simd_lane, 0, 0)",
    "simdgroup_index_in_threadgroup": "metal::uint3(L->simd_index, 0, 0)",
    "threads_per_threadgroup": "L->tptg_dims",
    "threadgroups_per_grid": "L->groups",
    "threads_per_grid": "L->grid",
    "threads_per_simdgroup": "metal::uint3(32, 0, 0)",
    "simdgroups_per_threadgroup": "metal::uint3(L->simds, 0, 0)",
}

_SCALAR_CASTS = {
    torch.int64: ctypes.c_int64, torch.int32: ctypes.c_int32, torch.int16: ctypes.c_int16,
    torch.int8: ctypes.c_int8, torch.uint8: ctypes.c_uint8, torch.float32: ctypes.c_float,
    torch.bool: ctypes.c_bool,
}
_CAST_NAMES = {"int64": torch.int64, "long": torch.int64, "int32": torch.int32, "int": torch.int32,
               "int16": torch.int16, "short": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
               "float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
               "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
               "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "bool": torch.bool}


class MetalEmulatorError(RuntimeError):
    """A kernel broke a Metal rule the emulator checks (divergence, bounds, limits)."""


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


# ------------------------------------------------------------------ parsing
@dataclass(frozen=True)
class _Param:
    type: str
    name: str
    buffer: int | None      # [[buffer(i)]]
    builtin: str | None     # attribute name of a builtin input
    writable: bool


def _strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


_RAW_TG = re.compile(r"\bthreadgroup\s+(?:const\s+)?[A-Za-z_][\w:<>]*\s+[A-Za-z_]\w*\s*\[")


def _check_portable(src: str) -> None:
    """Reject what the emulator would silently get wrong."""
    body = _strip_comments(src)
    for lineno, line in enumerate(body.split("\n"), 1):
        if line.lstrip().startswith("#"):
            continue
        if _RAW_TG.search(line):
            raise MetalEmulatorError(
                f"line {lineno} of the source declares a threadgroup array directly; declare it "
                f"with MUSER_TG_ARRAY(type, name, count) so the emulator can share it between "
                f"lanes: {line.strip()}")


def _split_top(s: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "([<":
            depth += 1
        elif ch in ")]>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return parts


def _parse_kernels(pre: str) -> dict[str, list[_Param]]:
    kernels: dict[str, list[_Param]] = {}
    for m in re.finditer(r"__emu_kernel__\s+void\s+(\w+)\s*\(", pre):
        i, depth = m.end(), 1
        while depth:
            depth += {"(": 1, ")": -1}.get(pre[i], 0)
            i += 1
        params = []
        for raw in _split_top(pre[m.end():i - 1]):
            attrs = re.findall(r"\[\[\s*(.*?)\s*\]\]", raw)
            decl = re.sub(r"\[\[.*?\]\]", "", raw).strip()
            nm = re.search(r"([A-Za-z_]\w*)\s*$", decl)
            if not nm or not attrs:
                raise MetalEmulatorError(f"kernel {m.group(1)}: cannot bind parameter {raw.strip()!r} "
                                         f"(every parameter needs [[buffer(i)]] or a builtin attribute)")
            ptype = decl[:nm.start()].strip()
            buf = re.fullmatch(r"buffer\s*\(\s*(\d+)\s*\)", attrs[0])
            if buf:
                writable = "*" in ptype and not re.search(r"\bconst\b", ptype.split("*")[0])
                params.append(_Param(ptype, nm.group(1), int(buf.group(1)), None, writable))
            elif attrs[0] in _BUILTINS:
                params.append(_Param(ptype, nm.group(1), None, attrs[0], False))
            else:
                raise MetalEmulatorError(f"kernel {m.group(1)}: unsupported attribute [[{attrs[0]}]]")
        kernels[m.group(1)] = params
    return kernels


def _wrappers(kernels: dict[str, list[_Param]]) -> str:
    out = ["\n// ---- generated by muser_torch/metal/emulator.py ----"]
    for name, params in kernels.items():
        args = []
        for p in params:
            if p.buffer is not None:
                args.append(f"emu_bind<{p.type}>(b[{p.buffer}])")
            else:
                args.append(f"emu_attr<{p.type}>({_BUILTINS[p.builtin]})")
        out.append(f'extern "C" void muser_emu_k_{name}(void** b) {{\n'
                   f"  EmuLane* L = emu_current_lane(); (void)L; (void)b;\n"
                   f"  {name}({', '.join(args)});\n}}")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ building
def _cache_root() -> Path:
    root = os.environ.get("MUSER_METAL_CACHE")
    if root:
        return Path(root)
    home = Path.home() / ".cache" / "muser_torch" / "metal-emu"
    try:
        home.mkdir(parents=True, exist_ok=True)
        if os.access(home, os.W_OK):
            return home
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"muser_torch-metal-emu-{os.getuid()}"


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if r.returncode:
        raise MetalEmulatorError(f"{what} failed ({' '.join(cmd[:3])} ...):\n{r.stderr[-6000:]}")
    return r.stderr


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def _runtime_object(root: Path) -> Path:
    key = _digest(_SHIM.read_text(), _RUNTIME.read_text(), _CXX, *_CFLAGS)
    obj = root / f"runtime-{key}.o"
    if not obj.exists():
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            tmp_obj = Path(tmp) / "runtime.o"
            _run([_CXX, *_CFLAGS, "-I", str(_HERE), "-c", str(_RUNTIME), "-o", str(tmp_obj)],
                 "compiling the emulator runtime")
            os.replace(tmp_obj, obj)
    return obj


def _build(source: str) -> tuple[Path, dict[str, list[_Param]]]:
    _check_portable(source)
    root = _cache_root()
    key = _digest(source, _SHIM.read_text(), _RUNTIME.read_text(), Path(__file__).read_text(),
                  _CXX, *_CFLAGS)
    out = root / key
    lib, meta = out / "kernels.so", out / "kernels.json"
    if lib.exists() and meta.exists():
        raw = json.loads(meta.read_text())
        return lib, {k: [_Param(**p) for p in v] for k, v in raw.items()}
    runtime = _runtime_object(root)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        tmp = Path(tmp)
        (tmp / "source.metal").write_text(source)
        (tmp / "metal_stdlib").write_text("// the shim is force-included instead\n")
        # Run in tmp with a relative name so call sites read "source.metal:LINE"
        # (ops/mps.py adds #line directives naming the real files).
        warnings = _run([_CXX, *_CFLAGS, "-E", "-x", "c++", "-I", ".", "-I", str(_HERE),
                         "-include", "metal_shim.h", "source.metal", "-o", "source.ii"],
                        "preprocessing the Metal source", cwd=tmp)
        if "MUSER_TG_ARRAY" in warnings and "redefined" in warnings:
            raise MetalEmulatorError(
                "the source redefines MUSER_TG_ARRAY; guard its Metal definition with "
                "#ifndef MUSER_TG_ARRAY so the emulator's shared version is used")
        pre = (tmp / "source.ii").read_text()
        kernels = _parse_kernels(pre)
        if not kernels:
            raise MetalEmulatorError("the source defines no kernel functions")
        (tmp / "unit.cpp").write_text("#define __emu_kernel__\n#include \"source.ii\"\n" + _wrappers(kernels))
        _run([_CXX, *_CFLAGS, "-shared", "-I", str(tmp), "-I", str(_HERE), str(tmp / "unit.cpp"),
              str(runtime), "-o", str(tmp / "kernels.so")], "compiling the Metal source with g++")
        (tmp / "kernels.json").write_text(json.dumps(
            {k: [p.__dict__ for p in v] for k, v in kernels.items()}))
        out.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / "kernels.json", meta)
        os.replace(tmp / "kernels.so", lib)
    return lib, kernels


# ------------------------------------------------------------------ running
def _dims(v, what: str) -> tuple[int, int, int]:
    if isinstance(v, int):
        v = (v,)
    v = tuple(int(x) for x in v)
    if not 1 <= len(v) <= 3 or any(x < 1 for x in v):
        raise ValueError(f"{what} must be 1 to 3 positive sizes, got {v}")
    return v + (1,) * (3 - len(v))


class _Kernel:
    def __init__(self, lib: "_Library", name: str, params: list[_Param]):
        self._lib, self.name, self._params = lib, name, params
        self._fn = ctypes.cast(getattr(lib._dll, f"muser_emu_k_{name}"), ctypes.c_void_p)
        self._n_buffers = 1 + max((p.buffer for p in params if p.buffer is not None), default=-1)
        self._writable = {p.buffer for p in params if p.writable}

    def __call__(self, *args, threads=None, group_size=None, arg_casts=None):
        if len(args) != self._n_buffers:
            raise TypeError(f"{self.name} binds {self._n_buffers} buffers, got {len(args)} arguments")
        casts = {int(k): (_CAST_NAMES[v] if isinstance(v, str) else v)
                 for k, v in (arg_casts or {}).items()}
        if threads is None:
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is None:
                raise TypeError(f"{self.name}: threads= is required when no tensor is passed")
            threads = first.numel()
        grid = _dims(threads, "threads")
        group = _dims(group_size if group_size is not None else min(grid[0], 1024), "group_size")
        with _DISPATCH_LOCK:
            self._dispatch(args, casts, grid, group)

    def _dispatch(self, args, casts, grid, group):
        dll = self._lib._dll
        bufs = (ctypes.c_void_p * max(1, len(args)))()
        held: list[tuple[int, int, torch.Tensor | None]] = []
        try:
            for i, a in enumerate(args):
                data, nbytes, align = self._marshal(i, a, casts.get(i))
                ptr = dll.emu_buffer_alloc(nbytes, align, i)
                if not ptr:
                    raise MemoryError(f"{self.name}: cannot map a guarded buffer of {nbytes} bytes")
                if nbytes:
                    ctypes.memmove(ptr, data, nbytes)
                bufs[i] = ptr
                held.append((ptr, nbytes, a if isinstance(a, torch.Tensor) and i in self._writable else None))
            name, seed = _current_schedule()
            err = ctypes.create_string_buffer(2048)
            g3, t3 = (ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*group)
            rc = dll.emu_dispatch(self._fn, self.name.encode(), bufs, g3, t3, SCHEDULES.index(name),
                                  ctypes.c_uint64(seed), err, len(err))
            if rc:
                raise MetalEmulatorError(err.value.decode(errors="replace"))
            for ptr, nbytes, t in held:
                if t is not None and nbytes:
                    ctypes.memmove(t.data_ptr(), ptr, nbytes)
        finally:
            for ptr, _, _ in held:
                dll.emu_buffer_free(ctypes.c_void_p(ptr))

    def _marshal(self, i: int, a, cast):
        """(address or bytes, nbytes, alignment) of argument i."""
        if isinstance(a, torch.Tensor):
            if a.device.type != "cpu":
                raise ValueError(f"{self.name}: argument {i} is on {a.device}; the emulator runs CPU tensors")
            if not a.is_contiguous():
                raise ValueError(f"{self.name}: argument {i} must be contiguous (compile_shader binds the "
                                 f"raw storage, ignoring strides)")
            return a.data_ptr(), a.numel() * a.element_size(), max(1, a.element_size())
        if isinstance(a, (list, tuple)):
            t = torch.tensor(a, dtype=cast or (torch.float32 if any(isinstance(x, float) for x in a)
                                               else torch.int64))
            raw = t.numpy().tobytes()
            return raw, len(raw), t.element_size()
        if isinstance(a, bool) or isinstance(a, (int, float)):
            dtype = cast or (torch.bool if isinstance(a, bool) else
                             torch.int64 if isinstance(a, int) else torch.float32)
            raw = torch.tensor([a], dtype=dtype).view(torch.uint8).numpy().tobytes()
            return raw, len(raw), len(raw)
        raise TypeError(f"{self.name}: argument {i} has unsupported type {type(a).__name__}")


class _Library:
    def __init__(self, path: Path, kernels: dict[str, list[_Param]]):
        self._dll = ctypes.CDLL(str(path))
        self._dll.emu_buffer_alloc.restype = ctypes.c_void_p
        self._dll.emu_buffer_alloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]
        self._dll.emu_buffer_free.argtypes = [ctypes.c_void_p]
        self._dll.emu_dispatch.restype = ctypes.c_int
        self._dll.emu_dispatch.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p,
                                           ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                           ctypes.c_uint64, ctypes.c_char_p, ctypes.c_int]
        self._kernels = kernels
        self._cache: dict[str, _Kernel] = {}

    def __getattr__(self, name: str) -> _Kernel:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._kernels:
            raise AttributeError(f"the Metal library has no kernel {name!r}")
        k = self._cache.get(name)
        if k is None:
            k = self._cache[name] = _Kernel(self, name, self._kernels[name])
        return k

    def __dir__(self):
        return list(self._kernels)


_LIBS: dict[str, _Library] = {}
_LOCK = threading.Lock()
_DISPATCH_LOCK = threading.Lock()   # the runtime keeps one dispatch's state in globals


def compile_shader(source: str) -> _Library:
    """Compile MSL ``source`` for the CPU emulator (cached); see the module docstring."""
    key = hashlib.sha256(source.encode()).hexdigest()
    with _LOCK:
        lib = _LIBS.get(key)
        if lib is None:
            lib = _LIBS[key] = _Library(*_build(source))
        return lib
