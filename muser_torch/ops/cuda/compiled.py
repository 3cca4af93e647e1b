"""The CUDA C++ kernels (``mv.cu``), built once through torch's extension
machinery and cached.

Triton's code for one-token K-quant matvecs leaves read bandwidth unused
(docs/performance.md), so ``Q4_K`` and ``Q6_K`` at one half-precision token
run hand-written kernels where a CUDA compiler is present. They are built on
first use with the block offsets of ``formats/layout.py`` as ``-D``
definitions, into ``cache_dir()/cuda-ext/<hash of source and offsets>``: a
second process loads the built library in well under a second. Where they
cannot be built (no ``nvcc``, ``MUSER_CUDA_CPP=0``), ``kernels()`` returns
None, the ladder's ``cuda_mv`` rung serves nothing and the Triton rungs run;
``reason()`` says why, and ``ops.warm_up`` prints it.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

from ...cache import cache_dir
from ...formats.layout import layout_constants

SOURCE = Path(__file__).with_name("mv.cu")
_NAMES = ("QK_K", "Q8_0_BYTES", "Q8_0_D", "Q8_0_QS", "Q5_0_BYTES", "Q5_0_D", "Q5_0_QH", "Q5_0_QS",
          "Q4_0_BYTES", "Q4_0_D", "Q4_0_QS", "Q4_K_BYTES", "Q4_K_D", "Q4_K_DMIN", "Q4_K_SCALES", "Q4_K_QS",
          "Q5_K_BYTES", "Q5_K_D", "Q5_K_DMIN", "Q5_K_SCALES", "Q5_K_QH", "Q5_K_QS",
          "Q6_K_BYTES", "Q6_K_QL", "Q6_K_QH", "Q6_K_SCALES", "Q6_K_D")
_why_not: str | None = None


def _defines() -> list[str]:
    c = layout_constants()
    return [f"-D{n}={c[n]}" for n in _NAMES]


def _not_built(why: str) -> None:
    global _why_not
    _why_not = why
    return None


@functools.lru_cache(maxsize=1)
def kernels() -> ModuleType | None:
    """The built extension (``q4k_mv``, ``q6k_mv``), or None with ``reason()`` set."""
    if os.environ.get("MUSER_CUDA_CPP", "1") == "0":
        return _not_built("MUSER_CUDA_CPP=0")
    import torch
    if not torch.cuda.is_available():
        return _not_built("no CUDA device")
    from torch.utils import cpp_extension
    if cpp_extension.CUDA_HOME is None and shutil.which("nvcc") is None:
        return _not_built("no CUDA compiler (nvcc) found; set CUDA_HOME")
    flags = _defines() + ["-O3"]   # no fast math: the float sums round as written
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode()
                            + torch.__version__.encode()).hexdigest()[:16]
    where = cache_dir() / "cuda-ext" / digest
    where.mkdir(parents=True, exist_ok=True)
    if not any(where.glob("*.so")):
        # about two minutes on the H200 machine's 16 cores (2026-12-05: a fresh load's
        # warm-up was 155 s, of which Triton's compile had been 34 s): torch's headers
        print(f"muser-torch: compiling the CUDA C++ kernels, about 2 minutes (once; cached in {where})",
              file=sys.stderr, flush=True)
    try:
        return cpp_extension.load(name=f"muser_cuda_mv_{digest}", sources=[str(SOURCE)],
                                  extra_cuda_cflags=flags, extra_cflags=["-O3"],
                                  build_directory=str(where), verbose=False)
    except Exception as e:   # a compiler or toolkit problem: say it, keep Triton
        return _not_built(f"building {SOURCE.name} failed: {str(e).splitlines()[0][:200]}")


def reason() -> str | None:
    """Why ``kernels()`` is None (after it was called), else None."""
    return _why_not
