"""mv.cu's kernels once per row count (one row: the matvec cuda_mv; more: the
tensor-core matmul cuda_mm), for a profiler.

    ncu --kernel-name regex:'_m[mv]_kernel' --section WarpStateStats ... python3 tools/mm_profile.py --rows 1 8 16

Muse Glimmer's ffn_gate/up shape (Q4_K, 6656 -> 19968) by default; each row count
runs twice (the first call compiles nothing here: the extension is built by then,
so both are the kernel as a model would run it).
"""
from __future__ import annotations

import argparse

import torch

from muser_torch.formats import random_weight
from muser_torch.formats.types import GGMLType


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--type", default="Q4_K")
    p.add_argument("--n-in", type=int, default=6656)
    p.add_argument("--n-out", type=int, default=19968)
    p.add_argument("--rows", type=int, nargs="+", default=[8, 16])
    args = p.parse_args()
    from muser_torch.ops import cuda
    qt = GGMLType[args.type]
    w = random_weight(qt, args.n_out, args.n_in, generator=torch.Generator().manual_seed(0)).to("cuda")
    for m in args.rows:
        x = torch.randn(m, args.n_in, device="cuda", dtype=torch.float16)
        rung = "cuda_mv" if m == 1 else "cuda_mm"     # one row: the matvec the ladder runs
        for _ in range(2):
            cuda.run_rung(rung, x, w.packed, qt, args.n_out, args.n_in)
    torch.cuda.synchronize()
    print("ran cuda_mv / cuda_mm at", args.rows, "rows of", qt.name, args.n_in, "->", args.n_out)


if __name__ == "__main__":
    main()
