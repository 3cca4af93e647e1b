"""CPU kernels for the ``muser`` ops.

Two paths compute every op, and both are tested against the float64
reference:

* native: the C library beside this module (``build.py`` builds it) (decoders, thread pool, fused
  matvec, GEMM), compiled with the system C compiler on first use (about two
  seconds, one compiler call, cached under ``~/.cache/muser_torch`` keyed by
  every source file, the generated layout header, compiler, flags and CPU)
  and called through ctypes with data pointers. Its block decoders are
  bit-identical to ``muser_torch.formats.dequantize_reference``. It runs every
  type in ``NATIVE_TYPES`` for every op.
* torch: the reference dequantizer on row tiles. It is the fallback when no
  compiler is available or ``MUSER_CPU_NATIVE=0``, and serves the types the
  native library does not run (F32, F8_E4M3FN).

``qmatmul`` picks its kernel from ``LADDER`` (rung -> kernel by token count,
``rung_for``): up to ``FUSED_MAX_TOKENS`` rows the fused kernel reads the
packed bytes once, threads taking chunks of weight rows, decoding each row in
registers (the K-quants, the legacy Q4_0 .. Q8_0 and NVFP4_E2M1 on AVX2+FMA
CPUs) or 256 elements at a time into an L1 scratch (every other type, and
every type on other CPUs), and dotting it with groups of
up to 8 tokens while it sits in L1; above, ``muser_gemm``, a register-blocked
GEMM that decodes each block of weight rows once, 256 columns at a time into
an L1 tile, for all tokens (x packed into token panels); without the library,
the torch tiles: a tile of weight rows dequantized (``TILE_BYTES`` of float32
scratch) and multiplied with torch's matmul. Either way the whole float
matrix never exists. ``qmatmul_t`` (the gradient for x) uses the tiles;
``dequantize`` decodes the whole matrix in one call (so each thread fills
whole pages of a fresh output); ``embedding`` decodes only the rows asked for.

Threads: torch's intra-op count, but at least ``THREAD_MIN_BYTES`` of work per
thread, run by the library's own pool, whose caller never waits for a helper
that has not started (see pool.c); on a machine shared with other
processes an OpenMP-style barrier there costs a scheduler slice per call.
Arguments arrive validated by ``muser_torch.ops`` (the op boundary).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
from dataclasses import dataclass
from typing import Callable

import torch

from ...formats import dequantize_reference as _ref_dequantize
from ...formats import scale_byte_table
from ...formats.types import GGMLType
from ..ladder import no_rung, takes
from .build import FUSED_MAX_TOKENS, NATIVE_MAX_TOKENS, NATIVE_TYPES, _native_lib, native_available  # noqa: F401
TILE_BYTES = 4 << 20           # float32 scratch of the tiled paths
# Packed (or decoded) bytes per native thread, at least. On a quiet 2-core
# machine a second thread already pays off at 1 MB: Q6_K 6656->256 (1.4 MB)
# 0.202 -> 0.113 ms, Q4_K 6656->1024 (3.8 MB) 0.40 -> 0.22 ms. The pool never
# waits for a helper that has not started, so a busy machine loses little.
THREAD_MIN_BYTES = 512 << 10
# The same minimum for the calls that come back to back, µs apart: the eager
# QLinear path (eager.py) and the decode blocks (decode.c), whose pool helpers
# are still spinning from the previous call (pool.c), so a split pays off far
# below THREAD_MIN_BYTES. Gemma 3 270M, 2 threads, decode steps interleaved
# on the loaded 2-core host: 512 KiB 1.00, 128 KiB 0.94, 32 KiB 0.95, 8 KiB
# 0.95 of the step time.
BACK_TO_BACK_THREAD_MIN_BYTES = 32 << 10

_native_enabled = os.environ.get("MUSER_CPU_NATIVE", "1") != "0"


def build_now() -> None:
    """Build (or load) the native kernels now when they are in use. A command
    calls it before it writes any output, so that a first run's compile notice
    stands on its own line and its seconds are counted apart (``run``)."""
    if _native_enabled:
        native_available()


@contextlib.contextmanager
def use_native(enabled: bool):
    """Temporarily force (``True``) or forbid (``False``) the native kernels."""
    global _native_enabled
    old, _native_enabled = _native_enabled, enabled
    try:
        yield
    finally:
        _native_enabled = old


def _native_for(qtype: GGMLType) -> ctypes.CDLL | None:
    """The library, when it is enabled, loads and runs ``qtype``; else None."""
    if not _native_enabled or qtype not in NATIVE_TYPES:
        return None
    return _native_lib()


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _weight_ptrs(qtype: GGMLType, packed: torch.Tensor, scales, scale_2) -> tuple:
    """The leading (type, packed, scales, lut, s2) arguments of every library call."""
    s2 = float(scale_2) if scale_2 is not None else 0.0
    return int(qtype), _ptr(packed), _ptr(scales), _ptr(scale_byte_table(qtype)), s2


def _threads(nbytes: int) -> int:
    """torch's thread count, but at least ``THREAD_MIN_BYTES`` of work per
    thread: a fork-join costs microseconds, or a scheduler slice on a busy
    machine, which a small matrix cannot repay."""
    return max(1, min(torch.get_num_threads(), nbytes // THREAD_MIN_BYTES))


# ---- tiles ---------------------------------------------------------------------------

def _tile_rows(n_in: int) -> int:
    return max(1, TILE_BYTES // (4 * n_in))


def dequantize_rows(packed: torch.Tensor, qtype: GGMLType, n_in: int, scales, scale_2,
                    out: torch.Tensor | None = None, threads: int | None = None) -> torch.Tensor:
    """Rows of ``packed`` (and their companions) to float32 ``[rows, n_in]``,
    native when possible, into ``out`` (contiguous) when given. Arguments
    arrive validated. Tiles feeding a torch matmul decode on one thread
    (``threads=1``): the decode is a small part of the tile's time, and two
    thread pools taking turns would each spin while the other works."""
    lib = _native_for(qtype)
    if lib is None:
        w = _ref_dequantize(packed, qtype, n_in, scales=scales, scale_2=scale_2)
        return w if out is None else out.copy_(w)
    if out is None:
        out = _empty_huge(packed.shape[0], n_in)
    rc = lib.muser_dequant_rows(*_weight_ptrs(qtype, packed, scales, scale_2),
                                packed.shape[0], n_in, _ptr(out),
                                threads or _threads(out.numel() * 4))
    if rc:
        raise RuntimeError(f"native dequantize rejected {qtype.name} n_in={n_in}")
    return out


def _row_slice(packed, scales, r0: int, r1: int):
    return packed[r0:r1], (None if scales is None else scales[r0:r1])


def _weight_tiles(packed: torch.Tensor, qtype: GGMLType, n_in: int, scales, scale_2):
    """``(r0, r1, W[r0:r1])`` in float32 for successive row tiles of W; every
    tile reuses one scratch buffer, so use each before taking the next."""
    n_out = packed.shape[0]
    step = _tile_rows(n_in)
    scratch = torch.empty(min(step, n_out), n_in, dtype=torch.float32)
    for r0 in range(0, n_out, step):
        r1 = min(n_out, r0 + step)
        p, s = _row_slice(packed, scales, r0, r1)
        yield r0, r1, dequantize_rows(p, qtype, n_in, s, scale_2, out=scratch[:r1 - r0], threads=1)


# ---- the ops (signatures follow the schemas in muser_torch.ops) --------------------------

def dequantize(packed: torch.Tensor, qtype: int, n_out: int, n_in: int,
               scales: torch.Tensor | None = None, scale_2: torch.Tensor | None = None) -> torch.Tensor:
    w = dequantize_rows(packed, GGMLType(qtype), n_in, scales, scale_2)
    # an op's output may not alias its input (F32's reference is a view of the bytes)
    same = w.untyped_storage().data_ptr() == packed.untyped_storage().data_ptr()
    return w.clone() if same else w


_MADV_HUGEPAGE = 14  # Linux <sys/mman.h>


@functools.lru_cache(maxsize=None)
def _madvise():
    if sys.platform != "linux":
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def _empty_huge(rows: int, cols: int) -> torch.Tensor:
    """An uninitialized float32 ``[rows, cols]`` whose pages the kernel may back
    with 2 MB huge pages. A fresh ~100 MB output otherwise costs ~25,000 page
    faults, which take several times longer than decoding into it. Advisory
    only: where it is refused, the plain pages are used."""
    out = torch.empty(rows, cols, dtype=torch.float32)
    nbytes = out.numel() * 4
    madvise = _madvise()
    if madvise is not None and nbytes >= (4 << 20):
        page = 4096
        start = (out.data_ptr() + page - 1) & ~(page - 1)
        end = (out.data_ptr() + nbytes) & ~(page - 1)
        madvise(start, end - start, _MADV_HUGEPAGE)
    return out


def embedding(ids: torch.Tensor, packed: torch.Tensor, qtype: int, n_out: int, n_in: int,
              scales: torch.Tensor | None = None, scale_2: torch.Tensor | None = None) -> torch.Tensor:
    """Dequantize only the requested rows (repeats decoded once)."""
    qtype = GGMLType(qtype)
    flat = ids.reshape(-1).long()
    uniq, inverse = torch.unique(flat, return_inverse=True)
    p = packed.index_select(0, uniq)
    s = None if scales is None else scales.index_select(0, uniq)
    rows = dequantize_rows(p, qtype, n_in, s, scale_2)
    return rows.index_select(0, inverse).reshape(*ids.shape, n_in)


# ---- the matmul ladder ---------------------------------------------------------------
# Each kernel takes (x2, packed, qtype, n_out, n_in, scales, scale_2), x2 a
# contiguous float32 [tokens, n_in] with tokens >= 1, and returns float32
# [tokens, n_out].

def _fused(x2, packed, qtype, n_out, n_in, scales, scale_2) -> torch.Tensor:
    """muser_matmul: every weight row decoded once, dotted with every token."""
    y = torch.empty(x2.shape[0], n_out, dtype=torch.float32)
    rc = _native_lib().muser_matmul(*_weight_ptrs(qtype, packed, scales, scale_2), n_out, n_in,
                                    _ptr(x2), x2.shape[0], _ptr(y), _threads(packed.numel()))
    if rc:
        raise RuntimeError(f"native qmatmul rejected {qtype.name} n_in={n_in}")
    return y


def _gemm(x2, packed, qtype, n_out, n_in, scales, scale_2) -> torch.Tensor:
    """muser_gemm; its work grows with the tokens, so a small matrix at 256
    tokens still splits across threads."""
    tokens = x2.shape[0]
    y = torch.empty(tokens, n_out, dtype=torch.float32)
    rc = _native_lib().muser_gemm(*_weight_ptrs(qtype, packed, scales, scale_2), n_out, n_in,
                                  _ptr(x2), tokens, _ptr(y), _threads(packed.numel() * tokens // 2))
    if rc:
        raise RuntimeError(f"native gemm failed ({rc}) for {qtype.name} n_in={n_in}")
    return y


def _tiles(x2, packed, qtype, n_out, n_in, scales, scale_2) -> torch.Tensor:
    """y.T in row tiles: each tile of W rows gives a contiguous slice of y.T."""
    yt = torch.empty(n_out, x2.shape[0], dtype=torch.float32)
    xt = x2.t()
    for r0, r1, w in _weight_tiles(packed, qtype, n_in, scales, scale_2):
        torch.mm(w, xt, out=yt[r0:r1])
    return yt.t().contiguous()


@dataclass(frozen=True)
class Rung:
    """One rung of the CPU matmul ladder (``ops.ladder.Rung``'s shape)."""
    name: str
    max_tokens: int | None              # the most activation rows it takes (None: any)
    native: bool                        # runs in the native library (NATIVE_TYPES only)
    kernel: Callable[..., torch.Tensor]

    def serves(self, qtype: GGMLType, tokens: int, dtype: torch.dtype = torch.float32) -> bool:
        """Native rungs serve the types the library runs, the others the rest; any dtype."""
        return self.native == (_native_for(qtype) is not None) and takes(self.max_tokens, tokens)


# qmatmul runs the first rung whose max_tokens covers the call, among the
# native rungs when the library runs the type, else among the torch ones.
#
# The fused/gemm cut was measured on the 2-core AMD EPYC (AVX-512) dev box,
# 2026-11-30, best of 5, in ms, random Q4_K / Q6_K / NVFP4_E2M1 at 6656->4096
# and 4096->6656 (ranges over the six):
#   threads tokens   tile (torch mm)   fused, 64-token chunks    gemm
#   1        65         42-51              53-73                21-29
#   1       128         66-79             100-137               31-37
#   1       256        131-140            193-285               60-66
#   1       512        259-277            404-592              118-127
#   2        65         23-40              31-42                11-14
#   2       128         36-52              59-80                16-20
#   2       256         70-85             117-163               32-35
#   2       512        138-173            241-327               61-68
# (with the other core busy, the tiles' OpenMP barrier also stalled: 170-620 ms
# where gemm took 25-130). At 8 tokens or fewer the fused kernel wins (one
# weight decode per row); from 9 on gemm does, and the fused kernel's time
# grows faster than linearly (x no longer fits in L2):
#   1 thread, tokens    8         9-10       12        16        32        64
#   fused            4.9-6.5   6.4-9.2   8.2-10.8  9.9-13.1  20.3-29.7  49.5-71.9
#   gemm             5.7-7.6   5.7-7.9   5.7-7.7   5.8-7.6   9.4-12.5   17.4-23.0
# and the same at the demo's 256x768 shapes (9 tokens: 48-76 us vs 48-55 us).
#
# F16 and BF16 take the native rungs too, which beat the tiles: random 2048x2048,
# native rung vs tiles, best of 15 interleaved,
# on the 2-core AMD EPYC (AVX2, no AVX-512) host with its neighbours busy, ms:
#   1 thread (CPU time)  tokens 1       4        8        128
#   F16  native / tiles     0.80/1.49  1.23/2.65  2.48/5.47  15.5/15.9
#   BF16 native / tiles     1.00/1.70  1.42/3.24  2.04/3.49  16.3/16.8
#   2 threads (wall)
#   F16  native / tiles     1.39/1.92  1.18/84.9  2.34/3.79  56.8/82.6
#   BF16 native / tiles     0.48/1.09  1.65/25.6  1.67/11.0  61.6/157
# (the tiles' outliers at 2 threads are torch's OpenMP barrier waiting for a
# descheduled thread).
LADDER: tuple[Rung, ...] = (
    Rung("fused", FUSED_MAX_TOKENS, True, _fused),
    Rung("gemm", None, True, _gemm),
    Rung("tiles", None, False, _tiles),
)


def rung_for(qtype: GGMLType, tokens: int, dtype: torch.dtype = torch.float32) -> Rung:
    """The ladder's rung for ``tokens`` activation rows of ``dtype`` against a ``qtype`` weight."""
    for rung in LADDER:
        if rung.serves(qtype, tokens, dtype):
            return rung
    raise ValueError(no_rung("the CPU ladder", qtype, tokens, dtype))


def qmatmul(x: torch.Tensor, packed: torch.Tensor, qtype: int, n_out: int, n_in: int,
            scales: torch.Tensor | None = None, scale_2: torch.Tensor | None = None) -> torch.Tensor:
    qtype = GGMLType(qtype)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, n_in).to(torch.float32).contiguous()
    if x2.shape[0] == 0:
        return x.new_zeros(*lead, n_out)
    y = rung_for(qtype, x2.shape[0]).kernel(x2, packed, qtype, n_out, n_in, scales, scale_2)
    return y.reshape(*lead, n_out).to(x.dtype)


# ---- ggml numerics -------------------------------------------------------------------

# The types whose matmul has a ggml mode (ggml's vec_dot_type: Q8_0 for
# Q4_0/Q5_0/Q8_0, IQ4_NL and MXFP4, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants
# and IQ4_XS, the type itself for F16/BF16). Others compute exactly (F32 is
# exact in ggml too).
GGML_NUMERICS_TYPES = frozenset({
    GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
    GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.F16, GGMLType.BF16,
    GGMLType.Q2_K, GGMLType.Q3_K,
    GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.MXFP4,
    GGMLType.IQ3_XXS, GGMLType.IQ3_S,
})
# F16 and BF16: ggml converts x to the weight's type (round to nearest even)
# and sums the exact products in float32, which is what the float kernels do
# with the rounded x.
_ROUND_X_TO = {GGMLType.F16: torch.float16, GGMLType.BF16: torch.bfloat16}


def qmatmul_ggml(x: torch.Tensor, packed: torch.Tensor, qtype: int, n_out: int, n_in: int,
                 scales: torch.Tensor | None = None,
                 scale_2: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T`` in ggml's numerics: x quantized per block as ggml-cpu does
    (qdot.c, q8_act.c), then integer dot products; needs the native library."""
    qtype = GGMLType(qtype)
    if qtype not in GGML_NUMERICS_TYPES:
        return qmatmul(x, packed, qtype, n_out, n_in, scales, scale_2)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, n_in).to(torch.float32)
    if qtype in _ROUND_X_TO:
        y = qmatmul(x2.to(_ROUND_X_TO[qtype]).to(torch.float32), packed, qtype, n_out, n_in)
        return y.reshape(*lead, n_out).to(x.dtype)
    lib = _native_for(qtype)
    if lib is None:
        raise RuntimeError(f"muser.qmatmul_ggml: ggml numerics for {qtype.name} need the native "
                           "CPU library (MUSER_CPU_NATIVE=0 or no C compiler); use numerics='exact'")
    x2 = x2.contiguous()
    tokens = x2.shape[0]
    y = torch.empty(tokens, n_out, dtype=torch.float32)
    if tokens:
        rc = lib.muser_matmul_q8(int(qtype), _ptr(packed), n_out, n_in, _ptr(x2), tokens, _ptr(y),
                                 _threads(packed.numel() * max(1, tokens // 4)))
        if rc:
            raise RuntimeError(f"native qmatmul_ggml failed ({rc}) for {qtype.name} n_in={n_in}")
    return y.reshape(*lead, n_out).to(x.dtype)


def qmatmul_t(g: torch.Tensor, packed: torch.Tensor, qtype: int, n_out: int, n_in: int,
              scales: torch.Tensor | None = None, scale_2: torch.Tensor | None = None) -> torch.Tensor:
    """``g[..., n_out] @ W``: the gradient of qmatmul for x, over row tiles of W."""
    qtype = GGMLType(qtype)
    lead = g.shape[:-1]
    g2 = g.reshape(-1, n_out).to(torch.float32)
    out = torch.zeros(g2.shape[0], n_in, dtype=torch.float32)
    for r0, r1, w in _weight_tiles(packed, qtype, n_in, scales, scale_2):
        out.addmm_(g2[:, r0:r1], w)
    return out.reshape(*lead, n_in).to(g.dtype)

