"""Builds the CPU kernels' C library (the ``.c``/``.h`` files beside this
module) with the system C compiler on first use, caches it under
``~/.cache/muser_torch`` keyed by every source file, the generated layout
header, the compiler, its flags and the CPU, and loads it through ctypes.
The dispatch that calls it is ``ops/cpu/__init__.py``."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from ...cache import cache_dir
from ...formats.layout import c_header as layout_header
from ...formats.types import GGMLType

_KERNEL_DIR = Path(__file__).parent


def _table_types() -> frozenset[GGMLType]:
    """The types of the library's own table: ``decoders.c``'s ``TYPE_ROW(T, ...)``
    lines, ``T`` a ``GGMLType`` name."""
    rows = re.findall(r"^\s*TYPE_ROW\((\w+),", (_KERNEL_DIR / "decoders.c").read_text(), re.M)
    return frozenset(GGMLType[name] for name in rows)


# The types the native library runs, for every op (dequantize, embedding,
# qmatmul on each native rung), read off its table; the loaded library's table
# is checked against it and formats/layout.py's geometry. Everything else
# takes the torch tiles.
NATIVE_TYPES = _table_types()

NATIVE_MAX_TOKENS = 64         # the fused kernel's cap (MUSER_MAX_TOKENS in the generated header)
# The fused rung's top (measured: cpu/__init__.py's LADDER); above it the ladder takes the
# GEMM. decode.c's projections follow the same ladder (MUSER_FUSED_MAX_TOKENS).
FUSED_MAX_TOKENS = 8

_HEADER = "muser_layout.h"     # generated into the build directory, included by kernels.h
_LIB = "libmuser_cpu" + (".dylib" if sys.platform == "darwin" else ".so")


# ---- the native library -----------------------------------------------------------

def _cpu_fingerprint() -> str:
    """CPU model and flags: -march=native code must not run on another CPU."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in info.splitlines()
                 if ln.startswith(("flags", "Features", "model name", "CPU part"))]
        return "\n".join(sorted(set(lines)))
    except OSError:
        return platform.processor() + platform.machine()


def _compiler() -> str:
    return os.environ.get("CC", "cc")


def _march_flags(cc: str) -> list[str]:
    """``-march=native`` where the compiler takes it. ``MUSER_CPU_MARCH=NAME``
    builds for ``-march=NAME`` instead (the tests build ``haswell`` and
    ``x86-64`` so the AVX2 and plain-C decoders run on an AVX-512 machine)."""
    if os.environ.get("MUSER_CPU_MARCH"):
        return [f"-march={os.environ['MUSER_CPU_MARCH']}"]
    flag = "-mcpu=native" if platform.machine().lower() in ("arm64", "aarch64") else "-march=native"
    probe = subprocess.run([cc, flag, "-x", "c", "-c", "-o", os.devnull, "-"], input=b"int x;",
                           capture_output=True)
    return [flag] if probe.returncode == 0 else []


def kernel_header() -> str:
    """The generated ``muser_layout.h``: every block's geometry and field offsets
    (``formats.layout.c_header``), the GGMLType ids as ``MUSER_ID_<TYPE>`` and
    the fused kernel's token cap and rung top. The C uses no other block numbers."""
    ids = "".join(f"#define MUSER_ID_{t.name} {int(t)}\n" for t in GGMLType)
    return (layout_header("MUSER_") + ids + f"#define MUSER_MAX_TOKENS {NATIVE_MAX_TOKENS}\n"
            f"#define MUSER_FUSED_MAX_TOKENS {FUSED_MAX_TOKENS}\n")


def kernel_sources() -> list[Path]:
    """Every file the library is built from (the .c files and their headers)."""
    return sorted(p for p in _KERNEL_DIR.iterdir() if p.suffix in (".c", ".h"))


def _compile(cc: str, flags: list[str], sources: list[Path], header: bytes, build: Path) -> None:
    """Compile every .c file in one call into a fresh directory holding the
    generated header, then rename it to ``build`` (atomic: concurrent builders
    race harmlessly, the loser's directory is dropped)."""
    build.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=build.name + ".", dir=build.parent))
    try:
        (tmp / _HEADER).write_bytes(header)
        c_files = [str(p) for p in sources if p.suffix == ".c"]
        res = subprocess.run([cc, *flags, f"-I{tmp}", *c_files, "-o", str(tmp / _LIB)],
                             capture_output=True)
        if res.returncode:
            raise OSError(f"{cc} failed: {res.stderr.decode(errors='replace')[-2000:]}")
        try:
            os.rename(tmp, build)
        except OSError:
            if not (build / _LIB).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _build() -> ctypes.CDLL:
    cc = _compiler()
    version = subprocess.run([cc, "--version"], capture_output=True, check=True).stdout
    header = kernel_header().encode()
    sources = kernel_sources()
    flags = ["-O3", "-fPIC", "-shared", "-pthread", "-ffp-contract=off", "-std=gnu11",
             *_march_flags(cc)]
    parts = [header, version, _cpu_fingerprint().encode(), " ".join(flags).encode()]
    parts += [p.name.encode() + b"\0" + p.read_bytes() for p in sources]
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    build = cache_dir() / f"cpu_kernels-{key}"
    if not (build / _LIB).exists():   # the one wait of a first run: say so, only then
        print(f"muser-torch: compiling CPU kernels (once, cached in {build.parent})",
              file=sys.stderr, flush=True)
        start = time.perf_counter()
        _compile(cc, flags, sources, header, build)
        # its own line with its time, so no caller counts it as its own work
        print(f"muser-torch: compiled CPU kernels in {time.perf_counter() - start:.1f} s",
              file=sys.stderr, flush=True)
    lib = ctypes.CDLL(str(build / _LIB))
    p, i, i64, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
    lib.muser_geometry.argtypes = [i, i, i]
    lib.muser_max_tokens.argtypes = []
    lib.muser_dequant_rows.argtypes = [i, p, p, p, f, i64, i64, p, i]
    lib.muser_matmul.argtypes = [i, p, p, p, f, i64, i64, p, i64, p, i]
    lib.muser_gemm.argtypes = [i, p, p, p, f, i64, i64, p, i64, p, i]
    lib.muser_matmul_q8.argtypes = [i, p, i64, i64, p, i64, p, i]
    lib.muser_matmul_q8p.argtypes = [i, p, i64, i64, p, i64, p, i]
    lib.muser_packed_isa.argtypes = [i]
    lib.muser_packed_rows.argtypes = []
    lib.muser_attn_isa.argtypes = [i]
    lib.muser_fa_row.argtypes = [p, p, p, i64, i64, i64, f, f, i, p, p]
    lib.muser_f16_round_check.argtypes, lib.muser_f16_round_check.restype = [p, i64], i64
    lib.muser_linear.argtypes = [p, p, i64, p, i, i64]
    lib.muser_rmsnorm.argtypes = [p, p, f, i64, i64, p]
    lib.muser_rmsnorm_ggml.argtypes = [p, p, f, i64, i64, p]
    lib.muser_rope_angles.argtypes = [p, i64, p, i64, p, p]
    lib.muser_rope_angles_ggml.argtypes = [p, i64, f, f, i64, p, p]
    lib.muser_block_size.argtypes = []
    lib.muser_block_work.argtypes, lib.muser_block_work.restype = [p, i64], i64
    lib.muser_decode_block.argtypes = [p, p, i64, p, p, p, p, p, i, i64]
    lib.muser_extend_block.argtypes = [p, p, i64, i64, i64, p, p, p, i, i64]
    if lib.muser_max_tokens() != NATIVE_MAX_TOKENS:
        raise OSError("the native library's MAX_TOKENS does not match cpu.NATIVE_MAX_TOKENS")
    # the library's type table against NATIVE_TYPES and formats/layout.py's geometry
    claimed = {t for t in GGMLType
               if lib.muser_geometry(int(t), t.block_elems, t.block_bytes) == 0}
    if claimed != NATIVE_TYPES:
        raise OSError(f"the native library runs {sorted(t.name for t in claimed)}, "
                      f"cpu.NATIVE_TYPES says {sorted(t.name for t in NATIVE_TYPES)}")
    return lib


@functools.lru_cache(maxsize=1)
def _native_lib() -> ctypes.CDLL | None:
    try:
        return _build()
    except (OSError, subprocess.SubprocessError) as e:
        warnings.warn(f"muser_torch: native CPU kernels unavailable ({e}); "
                      "using the slower pure-torch path", RuntimeWarning, stacklevel=3)
        return None


def native_available() -> bool:
    """Whether the compiled kernels load (builds them on the first call)."""
    return _native_lib() is not None
