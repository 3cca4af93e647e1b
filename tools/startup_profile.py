"""Where a CUDA load's seconds go: ``from_gguf(FILE, device="cuda")`` in this
process, timed in phases (import, the file's parse, the load and its kernel
warm-up), with the Triton kernels it compiled or loaded and, with
``--profile``, the functions that took the most time (cProfile, cumulative).

Run it twice on a fresh machine (the first compiles and fills Triton's cache,
the second reads it):
    python tools/startup_profile.py FILE [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path


def triton_cache_entries() -> int:
    root = Path(os.environ.get("TRITON_CACHE_DIR", "~/.triton/cache")).expanduser()
    return sum(1 for _ in root.iterdir()) if root.is_dir() else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--profile", action="store_true", help="print the top functions (cProfile)")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    before = triton_cache_entries()
    t0 = time.perf_counter()
    import torch
    import muser_torch
    t_import = time.perf_counter() - t0
    torch.cuda.init()
    t1 = time.perf_counter()
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    model = muser_torch.from_gguf(args.file, device="cuda")
    torch.cuda.synchronize()
    if profiler:
        profiler.disable()
    t_load = time.perf_counter() - t1
    warm = getattr(model, "warm_up_s", 0.0) or 0.0
    print(f"startup {args.file.name}: import {t_import:.2f} s, from_gguf {t_load:.2f} s "
          f"(kernel warm-up {warm:.2f} s); Triton cache entries {before} -> {triton_cache_entries()}")
    if profiler:
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.sort_stats("cumulative").print_stats(args.top)
        stats.sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
