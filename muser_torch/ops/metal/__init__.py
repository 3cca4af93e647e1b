"""Metal kernels for the ``muser`` ops (``torch.mps.compile_shader``).

The .metal sources beside this module are concatenated behind a
generated prelude that #defines every block's geometry and field offsets
(``formats.layout.c_header``) and the launch geometry below, compiled once,
and their kernel objects cached. ``SUPPORTED`` is the set of weight types
with Metal kernels; ``LADDER`` is the qmatmul ladder, rung -> kernel by token
count (:func:`rung_for`): ``mv`` for one token, ``ext`` for 2..8 (weights
read once for all tokens), ``mm`` (simdgroup-matrix tiles) above. Every type
also has a ``dequant`` and an ``embed`` kernel. See ``docs/metal.md``.

Inside ``ops.use_backend("metal-emulator")`` the same functions run on CPU tensors through
``muser_torch_metal_emulator.emulator``, which mirrors ``compile_shader``'s calling
convention: :func:`_compile` is the only place the two differ.
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ...formats.layout import c_header
from ...formats.types import GGMLType
from ..checks import check_ids_in_range, register_kernels
from ..backend_choice import chosen_backend
from ..ladder import no_rung, takes

__all__ = ["qmatmul", "dequantize", "embedding", "kernel_name", "rung_for", "source",
           "SUPPORTED", "LADDER", "KERNEL_KINDS"]

_SRC_DIR = Path(__file__).resolve().parent
_FILES = ("common.metal", "kquant.metal", "legacy.metal", "nvfp4.metal", "floats.metal", "lookup.metal",
          "grid.metal")


def _kernel_types() -> frozenset[GGMLType]:
    """The weight types with Metal kernels: each source's
    ``MUSER_DEFINE_KERNELS(name, Format)`` lines, ``name`` the type's in lower
    case (a test checks the compiled library has exactly their kernels)."""
    names = [n for f in _FILES for n in re.findall(r"^MUSER_DEFINE_KERNELS\((\w+),",
                                                     (_SRC_DIR / f).read_text(), re.M)]
    return frozenset(GGMLType[n.upper()] for n in names)


SUPPORTED = _kernel_types()

# Launch geometry, #defined into the source (common.metal static_asserts it).
CHUNK = 16             # elements every decoder produces at once
MV_SIMDGROUPS = 2      # mv/ext threadgroup: 2 simdgroups x 32 lanes
MV_LANES = 32
MV_ROWS = 2            # output rows per simdgroup
MV_ROWS_PER_GROUP = MV_SIMDGROUPS * MV_ROWS
MV_THREADS = MV_SIMDGROUPS * MV_LANES
MAX_EXT_TOKENS = 8     # the ext rung covers 2..8 tokens
MM_BM, MM_BN, MM_BK, MM_THREADS = 32, 32, 64, 128
FLAT_GROUP = 256       # dequant / embed: one thread per chunk
SIMD_WIDTH = 32        # the kernels assume 32-lane simdgroups


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Rung:
    """One qmatmul kernel (``ops.ladder.Rung``'s shape): its kind (the kernel
    is ``kernel_name(qtype, name)``), the largest token count it takes (None:
    any above the rung before) and its launch, threads and group size for
    (n_tok, n_out). Every rung serves every type of ``SUPPORTED``, any dtype."""
    name: str
    max_tokens: int | None
    launch: Callable[[int, int], tuple[tuple[int, ...], tuple[int, ...]]]

    def serves(self, qtype: GGMLType, tokens: int, dtype: torch.dtype = torch.float32) -> bool:
        return qtype in SUPPORTED and takes(self.max_tokens, tokens)


def _rows_launch(n_tok: int, n_out: int):
    return (_cdiv(n_out, MV_ROWS_PER_GROUP) * MV_THREADS,), (MV_THREADS,)


def _tiles_launch(n_tok: int, n_out: int):
    # x: token tiles (fastest), y: row tiles; see matmul_impl.
    return (_cdiv(n_tok, MM_BN) * MM_THREADS, _cdiv(n_out, MM_BM)), (MM_THREADS, 1)


LADDER = (
    Rung("mv", 1, _rows_launch),
    Rung("ext", MAX_EXT_TOKENS, _rows_launch),
    Rung("mm", None, _tiles_launch),
)
# Every kernel a supported type has: the ladder's rungs, dequantize, embedding.
KERNEL_KINDS = tuple(r.name for r in LADDER) + ("dequant", "embed")
_GROUP_OF = {"mv": MV_THREADS, "ext": MV_THREADS, "mm": MM_THREADS, "dequant": FLAT_GROUP, "embed": FLAT_GROUP}


def rung_for(qtype: GGMLType, tokens: int, dtype: torch.dtype = torch.float32) -> Rung:
    """The qmatmul rung for ``tokens`` activation rows against a ``qtype`` weight."""
    for rung in LADDER:
        if rung.serves(qtype, tokens, dtype):
            return rung
    raise ValueError(no_rung("the Metal ladder", qtype, tokens, dtype))


def kernel_name(qtype: "GGMLType | int", kind: str) -> str:
    """The kernel for (type, kind); common.metal's MUSER_DEFINE_KERNELS names them alike."""
    qt = GGMLType.parse(qtype)
    if qt not in SUPPORTED:
        raise ValueError(f"{qt.name} has no Metal kernels")
    if kind not in KERNEL_KINDS:
        raise ValueError(f"unknown kernel kind {kind!r}; expected one of {KERNEL_KINDS}")
    return f"muser_{kind}_{qt.name.lower()}"


def _prelude() -> str:
    defines = {
        "MUSER_CHUNK": CHUNK,
        "MUSER_MV_SIMDGROUPS": MV_SIMDGROUPS,
        "MUSER_MV_LANES": MV_LANES,
        "MUSER_MV_ROWS": MV_ROWS,
        "MUSER_MV_THREADS": MV_THREADS,
        "MUSER_MAX_EXT_TOKENS": MAX_EXT_TOKENS,
        "MUSER_MM_BM": MM_BM, "MUSER_MM_BN": MM_BN, "MUSER_MM_BK": MM_BK,
        "MUSER_MM_THREADS": MM_THREADS,
    }
    lines = ["// generated by muser_torch/ops/metal/__init__.py: block layouts from formats/layout.py, then launch geometry",
             c_header("MUSER_").rstrip()]
    lines += [f"#define {k} {v}" for k, v in defines.items()]
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=None)
def source() -> str:
    """The whole Metal source: prelude, then each file behind a #line marker
    so compiler messages and emulator reports name the real file and line."""
    parts = [_prelude()]
    for name in _FILES:
        parts.append(f'#line 1 "{name}"\n' + (_SRC_DIR / name).read_text())
    return "\n".join(parts)


# ---- compiling and caching --------------------------------------------------------------

def _emulating() -> bool:
    return chosen_backend() == "metal-emulator"


def _compile(src: str, emulate: bool):
    """The one seam between real Metal and the CPU emulator: both return a
    library whose attributes are kernels with compile_shader's calling convention."""
    fast = os.environ.get("PYTORCH_MPS_FAST_MATH")
    if fast is not None and fast != "0":
        # PyTorch compiles with safe math unless this is set; the E4M3 decoder's
        # NaN branch, the -0.0 table entries and the bit identity of mv and ext
        # depend on safe math.
        raise RuntimeError("muser: PYTORCH_MPS_FAST_MATH is set; the Metal kernels need safe math "
                           "(unset it, or set it to 0)")
    if emulate:
        from muser_torch_metal_emulator import emulator
        return emulator.compile_shader(src)
    return torch.mps.compile_shader(src)


_LIBS: dict[bool, object] = {}
_KERNELS: dict[tuple[bool, str], object] = {}


def _check_limits(k, name: str, kind: str) -> None:
    """The launch geometry assumes 32-lane simdgroups and groups the pipeline accepts."""
    width, limit = k.thread_execution_width, k.max_threads_per_threadgroup
    if width != SIMD_WIDTH:
        raise RuntimeError(f"muser: {name} runs with {width}-wide simdgroups; the Metal kernels assume "
                           f"{SIMD_WIDTH}")
    if limit < _GROUP_OF[kind]:
        raise RuntimeError(f"muser: {name} allows {limit} threads per threadgroup; it is launched with "
                           f"{_GROUP_OF[kind]}")


def _kernel(device: torch.device, name: str, op: str):
    emulate = device.type == "cpu"
    if emulate and not _emulating():
        raise ValueError(f"muser.{op}: the Metal kernels run on mps tensors, or on CPU tensors "
                         f"inside ops.use_backend('metal-emulator'); got a {device.type} tensor")
    if not emulate and device.type != "mps":
        raise ValueError(f"muser.{op}: the Metal kernels need mps tensors, got {device.type}")
    k = _KERNELS.get((emulate, name))
    if k is None:
        lib = _LIBS.get(emulate)
        if lib is None:
            lib = _LIBS[emulate] = _compile(source(), emulate)
        # compile_shader builds a new wrapper per attribute access: keep one.
        k = getattr(lib, name)
        _check_limits(k, name, name.split("_")[1])
        _KERNELS[(emulate, name)] = k
    return k


# ---- argument handling ------------------------------------------------------------------

def _fence(op: str, qtype, n_in: int) -> GGMLType:
    qt = GGMLType.parse(qtype)     # the boundary refused types outside SUPPORTED
    if n_in % CHUNK:
        raise ValueError(f"muser.{op} on Metal: n_in={n_in} must be a multiple of {CHUNK} "
                         f"for {qt.name}")
    return qt


@functools.lru_cache(maxsize=8)
def _one(device: torch.device) -> torch.Tensor:
    return torch.ones(1, dtype=torch.float32, device=device)


def _weights(qt: GGMLType, packed, scales, scale_2):
    """(W, S, S2) buffers 0..2; formats without companions get stand-ins they never read."""
    W = packed.contiguous()
    if scales is not None:        # as the boundary hands them (checks.checked)
        return W, scales.contiguous(), scale_2
    return W, W, _one(packed.device)


def _flat_threads(op: str, rows: int, n_in: int) -> int:
    """One thread per chunk; the kernels index chunks with 32-bit integers."""
    n = rows * (n_in // CHUNK)
    if n >= 1 << 32:
        raise ValueError(f"muser.{op} on Metal: {rows} rows of {n_in} make {n} chunks; at most 2^32 - 1 per call")
    return n


# ---- the ops ------------------------------------------------------------------------------

def qmatmul(x, packed, qtype, n_out, n_in, scales=None, scale_2=None):
    """``x[..., n_in] @ W.T`` in x's dtype, through the rung for the token count."""
    qt = _fence("qmatmul", qtype, n_in)
    lead = x.shape[:-1]
    xf = x.reshape(-1, n_in).to(torch.float32).contiguous()
    n_tok = xf.shape[0]
    y = torch.empty(n_tok, n_out, dtype=torch.float32, device=x.device)
    if n_tok:
        W, S, S2 = _weights(qt, packed, scales, scale_2)
        rung = rung_for(qt, n_tok, x.dtype)
        k = _kernel(x.device, kernel_name(qt, rung.name), "qmatmul")
        threads, group = rung.launch(n_tok, n_out)
        k(W, S, S2, xf, y, n_out, n_in, n_tok, threads=threads, group_size=group)
    return y.reshape(*lead, n_out).to(x.dtype)


def dequantize(packed, qtype, n_out, n_in, scales=None, scale_2=None):
    """W as float32 ``[n_out, n_in]``, decoded by the same chunk decoders as qmatmul."""
    qt = _fence("dequantize", qtype, n_in)
    out = torch.empty(n_out, n_in, dtype=torch.float32, device=packed.device)
    W, S, S2 = _weights(qt, packed, scales, scale_2)
    k = _kernel(packed.device, kernel_name(qt, "dequant"), "dequantize")
    k(W, S, S2, out, n_out, n_in, threads=_flat_threads("dequantize", n_out, n_in), group_size=FLAT_GROUP)
    return out


def embedding(ids, packed, qtype, n_out, n_in, scales=None, scale_2=None):
    """Rows ``ids`` of W as float32 ``[*ids.shape, n_in]``; only those rows are read."""
    qt = _fence("embedding", qtype, n_in)
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    out = torch.empty(flat.numel(), n_in, dtype=torch.float32, device=packed.device)
    if flat.numel():
        check_ids_in_range("embedding", flat, n_out)   # the kernel reads rows unchecked
        W, S, S2 = _weights(qt, packed, scales, scale_2)
        k = _kernel(packed.device, kernel_name(qt, "embed"), "embedding")
        k(W, S, S2, flat, out, flat.numel(), n_in, threads=_flat_threads("embedding", flat.numel(), n_in),
          group_size=FLAT_GROUP)
    return out.reshape(*ids.shape, n_in)


# ---- registration -------------------------------------------------------------------------

def register() -> None:
    """Register the Metal kernels for the ``muser`` ops, behind their checks."""
    register_kernels("mps", {"qmatmul": qmatmul, "dequantize": dequantize, "embedding": embedding},
                     SUPPORTED)


if torch.backends.mps.is_available():
    register()
