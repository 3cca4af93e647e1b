"""Gemma 3 270M Q4_K_M's projections at 1 and 8 tokens: the ggml-numerics
kernels called straight through ctypes (no Python module around them) against
ggml's own ``mul_mat`` on the same bytes, in interleaved rounds.

Contenders, each timed as a block of back-to-back calls (>= 3 ms; at one thread
of this thread's CPU time, so that other jobs on a shared host are not counted) per round,
the order rotating every round, median over rounds:
  ggml     ggml's mul_mat (bench/ggml_mulmat.py: libggml-python unless --ggml-lib)
  rows     muser_matmul_q8 on the file's row layout (qdot.c)
  packed   muser_matmul_q8p on the load-time repack (qdot_packed.c), for the
           types it serves; '-' otherwise
Ratios are muser / ggml (<= 1.0: muser as fast or faster). Random weights at
the file's shapes and types (speed does not depend on the values).

    python tools/gemma_kernels.py [--threads 1] [--rounds 7] [--tokens 1 8]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from muser_torch.bench import ggml_mulmat  # noqa: E402
from muser_torch.formats import random_weight  # noqa: E402
from muser_torch.formats.types import GGMLType  # noqa: E402
try:
    from muser_torch.ops.cpu import packed as cpu_packed  # noqa: E402
except ImportError:          # a tree before the repack
    cpu_packed = None
from muser_torch.ops.cpu.build import _native_lib  # noqa: E402

# (type, n_in, n_out, tensors per token) of gemma-3-270m-q4_k_m.gguf (`muser-torch inspect`);
# the lm_head is token_embd, tied.
GEMMA = (("Q8_0", 640, 262144, 1), ("Q5_0", 640, 2048, 36), ("Q5_0", 640, 1024, 18),
         ("Q5_0", 640, 256, 27), ("Q8_0", 640, 256, 9), ("Q4_K", 1024, 640, 18),
         ("Q4_K", 2048, 640, 9), ("Q6_K", 2048, 640, 9))


def _block(fn, clock, min_s: float = 3e-3) -> float:
    """Seconds per call of fn over a block of calls lasting at least min_s."""
    n, start = 0, clock()
    while True:
        fn()
        n += 1
        el = clock() - start
        if el >= min_s:
            return el / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--ggml-lib", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", default=None, help="types to run")
    ap.add_argument("--clock", choices=("thread", "wall"), default=None,
                    help="thread: this thread's CPU time (1 thread only: time the other jobs on "
                         "a shared host take is not counted); default thread at 1 thread, else wall")
    a = ap.parse_args()
    clock_name = a.clock or ("thread" if a.threads == 1 else "wall")
    if clock_name == "thread" and a.threads != 1:
        raise SystemExit("--clock thread times one thread: use it with --threads 1")
    clock = time.thread_time if clock_name == "thread" else time.perf_counter
    lib = _native_lib()
    dll = ggml_mulmat.load(a.ggml_lib)
    print(f"ggml: {ggml_mulmat.describe(dll)}; {a.threads} threads; clock {clock_name}; load {os.getloadavg()}; "
          f"packed ISA: {cpu_packed.isa_name() if cpu_packed else '-'}")
    print(f"{'type':<5} {'n_in->n_out':>12} {'tok':>3} {'ggml us':>9} {'rows us':>9} {'ratio':>6} "
          f"{'packed us':>9} {'ratio':>6}")
    gen = torch.Generator().manual_seed(a.seed)
    for name, n_in, n_out, count in GEMMA:
        if a.only and name not in a.only:
            continue
        qtype = GGMLType[name]
        w = random_weight(qtype, n_out, n_in, generator=gen)
        rep = cpu_packed.repack(w.packed, qtype) if cpu_packed and cpu_packed.serves(qtype) else None
        for t in a.tokens:
            x = torch.randn(t, n_in, generator=gen)
            y = torch.empty(t, n_out)
            mm = ggml_mulmat.MulMat(dll, w.packed, qtype, n_out, n_in, t, a.threads)
            mm.set_x(x)
            px, py, pw = x.data_ptr(), y.data_ptr(), w.packed.data_ptr()
            fns = {"ggml": mm.compute,
                   "rows": lambda: lib.muser_matmul_q8(int(qtype), pw, n_out, n_in, px, t, py,
                                                       a.threads)}
            if rep is not None:
                pr = rep.data_ptr()
                fns["packed"] = lambda: lib.muser_matmul_q8p(int(qtype), pr, n_out, n_in, px, t, py,
                                                             a.threads)
            times = {k: [] for k in fns}
            order = list(fns)
            for r in range(a.rounds):
                for k in order[r % len(order):] + order[:r % len(order)]:
                    times[k].append(_block(fns[k], clock))
            mm.close()
            med = {k: statistics.median(v) for k, v in times.items()}
            p = (f"{med['packed'] * 1e6:>9.1f} {med['packed'] / med['ggml']:>6.2f}"
                 if "packed" in med else f"{'-':>9} {'-':>6}")
            print(f"{name:<5} {f'{n_in}->{n_out}':>12} {t:>3} {med['ggml'] * 1e6:>9.1f} "
                  f"{med['rows'] * 1e6:>9.1f} {med['rows'] / med['ggml']:>6.2f} {p}", flush=True)
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
