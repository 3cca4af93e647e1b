"""``muser-torch bench ops``: time ``muser::qmatmul`` at Muse Glimmer's shapes.

Shapes and types are the q4_k_xl artifact's (docs/muse-glimmer.md, "The
benchmark shapes"). For every
shape and token count it prints, measured in the same run: time per call,
GB/s of packed weight bytes, that rate as a fraction of the device's read
bandwidth (a large ``sum`` over uint8 viewed as int64), and the speed-up over
a baseline: on CPU gguf's numpy ``dequantize`` + numpy matmul of the same
bytes; on CUDA/MPS dequantize-in-torch + ``F.linear`` and a dense fp16
``F.linear`` of the same shape.

The CPU baseline of a big matrix is timed on its first rows and scaled by row
count (it dequantizes the whole float matrix, 5 GB for lm_head); the row count
it ran is printed.

On CUDA the op and the dense baseline are timed inside a CUDA graph that
calls them once for each of several copies of the weights (>= 512 MB in all,
so the 50 MB L2 holds none of them): the cost inside a decode graph, without
Python's ~0.2 ms per eager call. The read bandwidth there is the same graph
of ``sum``s over 1 GiB buffers (bench/cuda_timing.py).
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..formats import random_weight
from ..formats.types import GGMLType


@dataclass(frozen=True)
class Shape:
    label: str
    qtype: GGMLType
    n_in: int
    n_out: int


# --tokens above this is a typo, not a benchmark: at 2048 the lm_head's
# float32 output alone is 1.65 GB.
MAX_TOKENS = 2048

# docs/muse-glimmer.md, "The benchmark shapes": one decoded token of the q4_k_xl artifact.
SHAPES = (
    Shape("attn_q", GGMLType.Q4_K, 6656, 4096),
    Shape("attn_k/v", GGMLType.Q4_K, 6656, 256),
    Shape("attn_v", GGMLType.Q6_K, 6656, 256),
    Shape("attn_output", GGMLType.Q4_K, 4096, 6656),
    Shape("ffn_gate/up", GGMLType.Q4_K, 6656, 19968),
    Shape("ffn_down", GGMLType.Q4_K, 19968, 6656),
    Shape("ffn_down_q6", GGMLType.Q6_K, 19968, 6656),
    Shape("lm_head", GGMLType.Q5_K, 6656, 202048),
)

# ---- measurement ---------------------------------------------------------------------------

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "mps":
        torch.mps.synchronize()


def _time(fn, device: torch.device, min_s: float = 0.3, max_iters: int = 50) -> float:
    """Median seconds per call after one warm-up call."""
    fn()
    _sync(device)
    times = []
    start = time.perf_counter()
    while len(times) < max_iters and (len(times) < 3 or time.perf_counter() - start < min_s):
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def _cuda_graph_time(fn, weights: list) -> float:
    """Seconds per call of ``fn(w)`` for each ``w`` in one CUDA graph."""
    from .cuda_timing import graph_time
    return graph_time([lambda w=w: fn(w) for w in weights])


def _copies(t: torch.Tensor) -> list:
    """``t`` and enough copies of it to overflow the GPU's L2 when read in turn."""
    from .cuda_timing import copies_for
    n = copies_for(t.numel() * t.element_size(), at_most=16)
    return [t] + [t.clone() for _ in range(n - 1)]


def read_bandwidth(device: torch.device, nbytes: int = 512 << 20) -> float:
    """Bytes per second of a sum over a large buffer (read once per call)."""
    if device.type == "cuda":
        from .cuda_timing import read_bandwidth as cuda_read_bandwidth
        return cuda_read_bandwidth()
    buf = torch.ones(nbytes // 8, dtype=torch.int64, device=device)
    dt = _time(lambda: buf.sum(), device, min_s=0.5, max_iters=10)
    return nbytes / dt


def _gguf_baseline(packed: torch.Tensor, qtype: GGMLType, x: torch.Tensor,
                   max_bytes: int) -> tuple[float, int]:
    """Seconds for gguf numpy dequantize + numpy matmul of all rows, timed on at
    most ``max_bytes`` of them and scaled; also the row count timed."""
    import gguf
    import numpy as np
    n_out = packed.shape[0]
    rows = max(1, min(n_out, max_bytes // packed.shape[1]))
    raw = packed[:rows].numpy()
    xn = x.reshape(-1, x.shape[-1]).float().numpy()
    gtype = gguf.GGMLQuantizationType(int(qtype))

    def run():
        w = gguf.dequantize(raw, gtype).reshape(rows, -1).astype(np.float32, copy=False)
        return xn @ w.T

    dt = _time(run, torch.device("cpu"), min_s=0.0, max_iters=1 if rows * 8 > n_out else 3)
    return dt * n_out / rows, rows


def bench_shape(shape: Shape, tokens: int, device: torch.device, bandwidth: float,
                baseline_bytes: int, gen: torch.Generator) -> dict:
    from .. import ops
    weight = random_weight(shape.qtype, shape.n_out, shape.n_in, generator=gen)
    packed = weight.packed
    x = torch.randn(tokens, shape.n_in, generator=gen)
    nbytes = packed.numel() + (weight.scales.numel() if weight.scales is not None else 0)
    dx = x.to(device)
    dp, _, _, _, ds, d2 = weight.to(device).op_args()
    if device.type != "cpu":
        dx = dx.half()
    if device.type == "cuda":
        dt = _cuda_graph_time(lambda w: ops.qmatmul(dx, w, shape.qtype, shape.n_out, shape.n_in, ds, d2),
                              _copies(dp))
    else:
        dt = _time(lambda: ops.qmatmul(dx, dp, shape.qtype, shape.n_out, shape.n_in, ds, d2), device)
    row = {"label": shape.label, "qtype": shape.qtype.name, "n_in": shape.n_in,
           "n_out": shape.n_out, "tokens": tokens, "bytes": nbytes, "time_s": dt,
           "gbps": nbytes / dt / 1e9, "of_bw": nbytes / dt / bandwidth}
    if device.type == "cpu":
        base, rows = _gguf_baseline(packed, shape.qtype, x, baseline_bytes)
        row.update(baseline="gguf-numpy", baseline_s=base, baseline_rows=rows, speedup=base / dt)
    else:
        from ..formats import dequantize_reference as dequantize   # dequantize in torch ops
        w16 = torch.randn(shape.n_out, shape.n_in, device=device, dtype=torch.float16, generator=None)

        def deq_linear():
            w = dequantize(dp, shape.qtype, shape.n_in, scales=ds, scale_2=d2)
            return F.linear(dx, w.to(dx.dtype))

        base = _time(deq_linear, device)
        if device.type == "cuda":
            dense = _cuda_graph_time(lambda w: F.linear(dx, w), _copies(w16))
        else:
            dense = _time(lambda: F.linear(dx, w16), device)
        del w16
        if device.type == "cuda":
            torch.cuda.empty_cache()
        row.update(baseline="dequant+F.linear", baseline_s=base, speedup=base / dt,
                   dense_fp16_s=dense, vs_dense=dense / dt)
    return row


def main(args: argparse.Namespace) -> int:
    if args.against == "ggml":
        if args.device != "cpu":
            raise ValueError("bench ops --against ggml: ggml's mul_mat runs on --device cpu")
        if args.threads is not None and args.threads < 1:
            raise ValueError(f"bench ops: --threads must be >= 1, got {args.threads}")
        from .against_ggml import CASE_SETS, TOKENS, run
        run(args.threads or torch.get_num_threads(), tuple(args.tokens_against or TOKENS),
            tuple(args.types or ()), args.ggml_lib, args.rounds, args.seed, read_bandwidth,
            CASE_SETS[args.cases])
        return 0
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("bench ops: --device cuda, but CUDA is not available")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError("bench ops: --device mps, but MPS is not available")
    shapes = SHAPES
    if args.shapes:
        known = {s.label: s for s in SHAPES}
        unknown = [s for s in args.shapes if s not in known]
        if unknown:
            raise ValueError(f"bench ops: unknown shape(s) {unknown}; choose from {list(known)}")
        shapes = tuple(known[s] for s in args.shapes)
    bad_tokens = [t for t in args.tokens if not 1 <= t <= MAX_TOKENS]
    if bad_tokens:
        raise ValueError(f"bench ops: --tokens must each be in 1..{MAX_TOKENS}, got {bad_tokens}")
    if args.baseline_mb < 1:
        raise ValueError(f"bench ops: --baseline-mb must be >= 1, got {args.baseline_mb}")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"bench ops: --threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    bw = read_bandwidth(device)
    how = "sums over 1 GiB in a CUDA graph" if device.type == "cuda" else "sum over 512 MiB"
    print(f"device {device} ({torch.get_num_threads()} threads): read bandwidth "
          f"{bw / 1e9:.1f} GB/s ({how})")
    gen = torch.Generator().manual_seed(args.seed)
    head = (f"{'shape':<12} {'type':<5} {'n_in->n_out':>14} {'tok':>4} {'MB':>7} {'ms':>9} "
            f"{'GB/s':>7} {'of bw':>6}  baseline")
    print(head)
    for shape in shapes:
        for tokens in args.tokens:
            r = bench_shape(shape, tokens, device, bw, args.baseline_mb << 20, gen)
            if device.type == "cpu":
                scaled = "" if r["baseline_rows"] == r["n_out"] else \
                    f", timed on {r['baseline_rows']} rows"
                base = f"{r['speedup']:.1f}x gguf numpy ({r['baseline_s'] * 1e3:.0f} ms{scaled})"
            else:
                base = (f"{r['speedup']:.1f}x dequant+F.linear, "
                        f"{r['vs_dense']:.2f}x dense fp16 ({r['dense_fp16_s'] * 1e3:.3f} ms)")
            dims = f"{r['n_in']}->{r['n_out']}"
            print(f"{r['label']:<12} {r['qtype']:<5} {dims:>14} "
                  f"{tokens:>4} {r['bytes'] / 1e6:>7.1f} {r['time_s'] * 1e3:>9.3f} "
                  f"{r['gbps']:>7.2f} {r['of_bw']:>6.1%}  {base}", flush=True)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("ops", help="qmatmul at Muse Glimmer's shapes (docs/muse-glimmer.md)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"))
    p.add_argument("--shapes", nargs="+", metavar="LABEL",
                   help=f"subset of: {' '.join(s.label for s in SHAPES)}")
    p.add_argument("--tokens", nargs="+", type=int, default=[1], metavar="T",
                   help="activation rows per call (default: 1)")
    p.add_argument("--baseline-mb", type=int, default=64,
                   help="CPU baseline: time gguf numpy on at most this many MB of rows, "
                        "scaled by row count (default 64)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads for the run (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--against", choices=("gguf", "ggml"), default="gguf",
                   help="ggml: muser's ggml and exact modes against ggml's own mul_mat on the same "
                        "bytes, every type llama.cpp's files use (bench/against_ggml.py)")
    p.add_argument("--ggml-lib", default=None, metavar="DIR",
                   help="with --against ggml: a folder with another ggml build's libggml-base.so "
                        "and libggml-cpu.so (default: libggml-python's)")
    p.add_argument("--types", nargs="+", metavar="TYPE", help="with --against ggml: only these types")
    p.add_argument("--cases", choices=("large", "gemma3-270m", "call-cost"), default="large",
                   help="with --against ggml: the large shapes of every type, Gemma 3 270M's "
                        "small projections, or one 640->8 weight (a call's fixed cost)")
    p.add_argument("--tokens-against", nargs="+", type=int, metavar="T",
                   help="with --against ggml: token counts (default 1 2 4 8 128)")
    p.add_argument("--rounds", type=int, default=5, help="with --against ggml: interleaved rounds")
    p.set_defaults(func=main)
