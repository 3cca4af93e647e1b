"""``muser-torch bench formats``: dequantize and quantize throughput per type.

For one matrix per type (4096 x 6656 by default) it prints MB/s of packed
bytes for gguf's numpy ``dequantize`` and for ours, each with its ratio to
gguf's time on the same bytes:

* ``reference``: ``dequantize_reference``, the vectorized torch that runs on
  any device and under ``torch.compile``;
* ``dequantize``: ``muser_torch.dequantize`` on CPU, i.e. the native kernel,
  returning a fresh tensor;
* ``out=``: the same into a reused buffer, which is the kernel's throughput:
  a fresh 109 MB output first costs the OS zero-filling its pages, ~2-7 ms on
  the 2-core dev box depending on the neighbours, as long as the decode.

The four run in turn, best of ``--repeat`` rounds, so a slow spell on a
shared machine hits them alike. Then quantize throughput per type, and the
time to quantize a 6656 x 19968 matrix to Q4_K (the issue's target: under
30 s on 2 cores). Numbers are reported, never asserted.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from ..formats import GGMLType, dequantize_reference, quantize
from ..ops.dequant import dequantize

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


def _interleaved_best(fns: dict, repeat: int) -> dict:
    """Best time of each callable over ``repeat`` rounds that run them in turn,
    so a slow spell on a shared machine hits every contender alike. Each timed
    call follows an untimed one of its own, so it finds the allocator as its
    previous call left it (numpy's temporaries then reuse freed heap)."""
    best = {name: float("inf") for name in fns}
    for _ in range(max(1, repeat)):
        for name, fn in fns.items():
            fn()
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


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
    out_buf = torch.empty(packed.shape[0], n_in)
    fns = {
        "ref": lambda: dequantize_reference(packed, qtype, n_in, scales=scales, scale_2=scale_2),
        "op": lambda: dequantize(packed, qtype, n_in, scales=scales, scale_2=scale_2),
        "into": lambda: dequantize(packed, qtype, n_in, scales=scales, scale_2=scale_2, out=out_buf),
    }
    gguf_fn = _gguf_dequantize(packed.numpy(), qtype)
    if gguf_fn is not None:
        fns["gguf"] = gguf_fn
    t = _interleaved_best(fns, repeat)
    t_ref = t.get("gguf")
    row = {"type": qtype.name, "bytes": nbytes, "quant": nbytes / t_quant / 1e6, "quant_s": t_quant,
           "gguf": None if t_ref is None else nbytes / t_ref / 1e6}
    for key in ("ref", "op", "into"):
        row[key] = nbytes / t[key] / 1e6
        row[key + "_ratio"] = None if t_ref is None else t_ref / t[key]
    return row


def _print_output_cost(rows: int, cols: int, repeat: int) -> None:
    """What a fresh output costs before any decoding: every dequantizer that
    returns a new tensor (gguf's too) pays the OS for zero-filling its pages."""
    buf = torch.empty(rows, cols)
    t = _interleaved_best({"fresh": lambda: torch.empty(rows, cols).fill_(1.0),
                           "reused": lambda: buf.fill_(1.0)}, max(3, repeat))
    print(f"the output alone ({rows}x{cols} float32, torch fill_): fresh tensor "
          f"{_g(t['fresh'] * 1e3)} ms, reused buffer {_g(t['reused'] * 1e3)} ms")


def _big_shape(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts) or int(parts[1]) % 256:
        raise ValueError(f"bench formats: --big must be ROWSxCOLS with COLS a multiple of 256 "
                         f"(Q4_K blocks), or 'none'; got {text!r}")
    return int(parts[0]), int(parts[1])


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.3g}x"


def _g(x: float) -> str:
    """Three significant digits: small sizes and slow paths never print as 0."""
    return f"{x:.3g}"


def main(args: argparse.Namespace) -> int:
    for what, v in (("--rows", args.rows), ("--cols", args.cols), ("--repeat", args.repeat),
                    ("--threads", 1 if args.threads is None else args.threads)):
        if v < 1:
            raise ValueError(f"bench formats: {what} must be >= 1, got {v}")
    big_shape = None if args.big == "none" else _big_shape(args.big)   # refuse a bad one early
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    names = [t.strip() for t in args.types.split(",") if t.strip()]
    qtypes = [GGMLType.parse(t) for t in names]
    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.rows, args.cols, generator=gen)
    print(f"muser-torch bench formats: {args.rows}x{args.cols} float32, CPU, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'':<21} {'gguf':>9} {'reference':>19} {'dequantize':>19} {'dequantize(out=)':>19}")
    print(f"{'type':<11} {'packed MB':>9} {'MB/s':>9} {'MB/s':>10} {'vs gguf':>8} "
          f"{'MB/s':>10} {'vs gguf':>8} {'MB/s':>10} {'vs gguf':>8} "
          f"{'quant MB/s':>10} {'quant s':>8}")
    for qtype in qtypes:
        r = bench_type(qtype, x, args.repeat)
        gguf_rate = "-" if r["gguf"] is None else _g(r["gguf"])
        ratio, op_ratio, into_ratio = (_times(r[k]) for k in ("ref_ratio", "op_ratio", "into_ratio"))
        print(f"{r['type']:<11} {_g(r['bytes'] / 1e6):>9} {gguf_rate:>9} {_g(r['ref']):>10} {ratio:>8} "
              f"{_g(r['op']):>10} {op_ratio:>8} {_g(r['into']):>10} {into_ratio:>8} "
              f"{_g(r['quant']):>10} {_g(r['quant_s']):>8}", flush=True)
    _print_output_cost(args.rows, args.cols, args.repeat)
    if big_shape is not None:
        rows, cols = big_shape
        big = torch.randn(rows, cols, generator=gen)
        t0, c0 = time.perf_counter(), time.process_time()
        quantize(big, GGMLType.Q4_K)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(f"Q4_K quantize {rows}x{cols}: {_g(wall)} s wall, {_g(cpu)} s CPU "
              f"(target: under 30 s on 2 cores)")
    return 0
