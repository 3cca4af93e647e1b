"""One-token ``mul_mat`` against ggml with each side timed alone: blocks of 40
back-to-back calls after 10 untimed ones and a 0.3 s pause, ggml and muser's
ggml-mode ``QLinear`` in turn, 4 rounds, medians; at 1 and 2 threads.

``muser-torch bench ops --against ggml`` interleaves single calls of the
contenders. On a host with as many cores as threads that measures each side
beside the other's pool, still spinning for work after its call (ggml's poll,
``ops/cpu/pool.c``'s 200 µs), so its 2-thread ratios on the 2-core host are not
the kernels' (docs/types.md). This script times each side in its own regime.

    python tools/mulmat_alone.py [TYPE ...]      (default: IQ4_XS IQ3_XXS IQ3_S Q4_K)
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from muser_torch.bench import ggml_mulmat  # noqa: E402
from muser_torch.formats import random_weight  # noqa: E402
from muser_torch.formats.types import GGMLType  # noqa: E402
from muser_torch.nn import QLinear  # noqa: E402

N_IN, N_OUT = 4096, 14336


def main(types: list[str]) -> None:
    dll = ggml_mulmat.load(None)
    if dll is None:
        raise SystemExit("tools/mulmat_alone.py: needs libggml-python (pip install libggml-python)")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for name in types:
            qtype = GGMLType[name]
            w = random_weight(qtype, N_OUT, N_IN, generator=torch.Generator().manual_seed(0))
            q = QLinear.from_weight(w)
            q.numerics = "ggml"
            x = torch.randn(1, N_IN)
            mm = ggml_mulmat.MulMat(dll, w.packed, qtype, N_OUT, N_IN, 1, threads)
            mm.set_x(x)
            seconds = {"ggml": [], "muser": []}
            with torch.no_grad():
                for _ in range(4):
                    for side, fn in (("ggml", mm.compute), ("muser", lambda: q(x))):
                        time.sleep(0.3)              # the other side's threads stop spinning
                        for _ in range(10):
                            fn()
                        start = time.perf_counter()
                        for _ in range(40):
                            fn()
                        seconds[side].append((time.perf_counter() - start) / 40)
            mm.close()
            g, m = (statistics.median(seconds[s]) for s in ("ggml", "muser"))
            print(f"{threads} threads  {name:8s} {N_IN}->{N_OUT}  ggml {g * 1e6:7.0f} us  "
                  f"muser ggml mode {m * 1e6:7.0f} us  ratio {m / g:.2f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["IQ4_XS", "IQ3_XXS", "IQ3_S", "Q4_K"])
