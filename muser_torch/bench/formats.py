"""``muser-torch bench formats``: dequantize and quantize throughput per type.

For one matrix per type (4096 x 6656 by default) it prints MB/s of packed
bytes for our two CPU dequantizers -- the vectorized-torch reference
``muser_torch.dequantize`` (portable, traceable) and the ``muser::dequantize``
op's native CPU kernel, with a fresh output ("op") and into a reused buffer
("reuse", which leaves out the page faults of a new ~100 MB allocation) --
and for quantize, gguf's numpy dequantize of the same bytes in the same run,
and the ratio of each dequantizer to gguf. Then
it times quantizing a 6656 x 19968 matrix to Q4_K (the issue's target: under
30 s on 2 cores). Numbers are reported, never asserted.

Both dequantizers write a fresh 109 MB float32 matrix, so page faults and
memory bandwidth weigh heavily at the default size; torch's CPU allocator
takes transparent huge pages with ``THP_MEM_ALLOC_ENABLE=1``.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from .. import ops
from ..ops import cpu as cpu_ops
from ..formats import GGMLType, dequantize, quantize

TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
         "F16", "BF16", "NVFP4", "NVFP4_E2M1")


def register(subparsers) -> None:
    p = subparsers.add_parser("formats", help="dequantize/quantize throughput per GGML type (CPU)")
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=6656)
    p.add_argument("--types", default=",".join(TYPES), help="comma-separated type names")
    p.add_argument("--repeat", type=int, default=3, help="dequantize timings: best of N")
    p.add_argument("--big", default="6656x19968",
                   help="ROWSxCOLS of the Q4_K quantize timing, or 'none' to skip")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: torch's own choice)")
    p.set_defaults(func=main)


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _gguf_dequantize(packed: np.ndarray, qtype: GGMLType):
    """gguf's numpy dequantize as a callable, or None when gguf lacks the type."""
    try:
        import gguf
        gtype = gguf.GGMLQuantizationType[qtype.name]
    except (ImportError, KeyError):
        return None
    if int(gtype) != int(qtype):
        return None
    return lambda: gguf.dequantize(packed, gtype)


def bench_type(qtype: GGMLType, x: torch.Tensor, repeat: int) -> dict:
    n_in = x.shape[1]
    t0 = time.perf_counter()
    out = quantize(x, qtype)
    t_quant = time.perf_counter() - t0
    packed, scales, scale_2 = out if isinstance(out, tuple) else (out, None, None)
    # the companion scales (NVFP4_E2M1) are part of the weight
    nbytes = packed.numel() + (0 if scales is None else scales.numel())
    deq = lambda: dequantize(packed, qtype, n_in, scales=scales, scale_2=scale_2)  # noqa: E731
    op = lambda: ops.dequantize(packed, qtype, packed.shape[0], n_in, scales, scale_2)  # noqa: E731
    out_buf = torch.empty(packed.shape[0], n_in)
    into = lambda: cpu_ops.dequantize_into(out_buf, packed, qtype, n_in, scales, scale_2)  # noqa: E731
    deq(), op(), into()                                 # warm up (tables, allocator, native build)
    t_deq = _best(deq, repeat)
    t_op = _best(op, repeat)
    t_into = _best(into, repeat)
    ref = _gguf_dequantize(packed.numpy(), qtype)
    t_ref = _best(ref, repeat) if ref is not None else None
    return {"type": qtype.name, "bytes": nbytes, "deq": nbytes / t_deq / 1e6,
            "op": nbytes / t_op / 1e6, "into": nbytes / t_into / 1e6,
            "into_ratio": None if t_ref is None else t_ref / t_into,
            "op_ratio": None if t_ref is None else t_ref / t_op,
            "quant": nbytes / t_quant / 1e6, "quant_s": t_quant,
            "gguf": None if t_ref is None else nbytes / t_ref / 1e6,
            "ratio": None if t_ref is None else t_ref / t_deq}


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.1f}x"


def main(args: argparse.Namespace) -> int:
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    names = [t.strip() for t in args.types.split(",") if t.strip()]
    qtypes = [GGMLType.parse(t) for t in names]
    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.rows, args.cols, generator=gen)
    print(f"muser-torch bench formats: {args.rows}x{args.cols} float32, CPU, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'type':<11} {'packed MB':>9} {'gguf MB/s':>9} {'torch MB/s':>10} {'vs gguf':>8} "
          f"{'op MB/s':>8} {'vs gguf':>8} {'reuse MB/s':>10} {'vs gguf':>8} "
          f"{'quant MB/s':>10} {'quant s':>8}")
    for qtype in qtypes:
        r = bench_type(qtype, x, args.repeat)
        gguf_rate = "-" if r["gguf"] is None else f"{r['gguf']:.0f}"
        ratio, op_ratio, into_ratio = (_times(r[k]) for k in ("ratio", "op_ratio", "into_ratio"))
        print(f"{r['type']:<11} {r['bytes'] / 1e6:>9.1f} {gguf_rate:>9} {r['deq']:>10.0f} {ratio:>8} "
              f"{r['op']:>8.0f} {op_ratio:>8} {r['into']:>10.0f} {into_ratio:>8} "
              f"{r['quant']:>10.1f} {r['quant_s']:>8.2f}", flush=True)
    if args.big != "none":
        rows, cols = (int(v) for v in args.big.lower().split("x"))
        big = torch.randn(rows, cols, generator=gen)
        t0, c0 = time.perf_counter(), time.process_time()
        quantize(big, GGMLType.Q4_K)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(f"Q4_K quantize {rows}x{cols}: {wall:.1f} s wall, {cpu:.1f} s CPU "
              f"(target: under 30 s on 2 cores)")
    return 0
