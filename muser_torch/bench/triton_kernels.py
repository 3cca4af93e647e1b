"""``muser-torch bench triton`` (or ``python -m muser_torch.bench.triton_kernels``):
the Triton kernels on a CUDA device, each timed in a CUDA graph over rotating
weight copies (``cuda_timing``).

Sections (``--what``):
  ops    Muse Glimmer's shapes (``bench.ops.SHAPES``) x token counts: time, GB/s of
         packed bytes, fraction of read bandwidth, the rung that ran, and the
         ratios to dequantize-in-torch + F.linear and to a dense fp16 F.linear
         of the same shape (both timed in the same run).
  types  every type of ``ops.cuda.SUPPORTED`` at one 4096 x 4096 matrix, plus
         Gemma 3 270M's tied Q8_0 lm_head (640 -> 262144), same columns.
  rungs  every one-token rung that serves each shape (Glimmer's and Llama-3-8B's),
         side by side: the CUDA C++ matvec against the Triton rungs.
  batches  each shape at 1, 2, 4, 8 and 16 activation rows: the rung the ladder
         runs beside its Triton fallback, and the time over the one-row time.
  prefill  each shape at 64-512 rows: the tensor-core tiles beside ``dense`` (the
         weight decoded to x's dtype, then cuBLAS) and a dense float16 F.linear.
  sweep  launch parameters (BN, warps, split target) of the one-token K-quant
         rung; the best per shape is then used for that shape's one-token row
         in ``ops``.
  peer, i8sweep, qmmsweep   test-backend-ops' shape beside llama.cpp's own
         test-backend-ops, run in the same call (``--test-backend-ops BINARY``), and
         the sweeps of the int8-dot and tensor-core rungs (``triton_peer``).

Whole-model decode on CUDA is ``muser-torch bench model seed --device cuda``.
Numbers are measured in this run and printed, never asserted.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import replace

import torch
import torch.nn.functional as F

from ..formats import dequantize_reference, random_weight
from ..formats.types import GGMLType
from .cuda_timing import ROTATE_BYTES, copies_for, copy_bandwidth, event_time, graph_time, read_bandwidth
from .ops import SHAPES, Shape

# Sweep grid of the one-token K-quant rung (Q6_K's 210-byte blocks favour narrower tiles).
SWEEP_BN = {GGMLType.Q4_K: (64, 128), GGMLType.Q5_K: (64, 128), GGMLType.Q6_K: (32, 64)}
SWEEP_WARPS = (4, 8)
SWEEP_PER_SM = (4, 8)
SWEEP_SKIP = ("attn_k/v", "attn_v")     # launch-bound: every setting ties
DEVICE = "cuda"


def type_shapes() -> tuple[Shape, ...]:
    from ..ops import cuda
    return tuple(Shape("4096x4096", t, 4096, 4096) for t in sorted(cuda.SUPPORTED)) + (
        Shape("gemma3 lm_head", GGMLType.Q8_0, 640, 262144),)


def _weights(shape: Shape, gen: torch.Generator):
    """The packed weight on the GPU and enough copies of its op arguments to overflow the L2."""
    w = random_weight(shape.qtype, shape.n_out, shape.n_in, generator=gen, device=DEVICE)
    nbytes = w.packed.numel() + (0 if w.scales is None else w.scales.numel())
    args = [w.op_args()] + [replace(w, packed=w.packed.clone()).op_args()
                            for _ in range(copies_for(nbytes) - 1)]
    return w, nbytes, args


def bench_ops(shapes, tokens_list, bw, gen, dtype=torch.float16, baselines=True, best=None):
    from ..ops import cuda
    rows = []
    for shape in shapes:
        w, nbytes, args = _weights(shape, gen)
        qt = shape.qtype
        for T in tokens_list:
            x = torch.randn(T, shape.n_in, device=DEVICE, dtype=dtype, generator=gen)
            kw = (best or {}).get(shape.label) if T == 1 else None
            if kw:
                over = {k: kw[k] for k in ("bn", "warps", "per_sm")}
                t = graph_time([lambda a=a: cuda.run_rung("mv_kquant", x, a[0], qt, shape.n_out,
                                                          shape.n_in, **over) for a in args])
            else:
                t = graph_time([lambda a=a: cuda.qmatmul(x, *a) for a in args])
            r = dict(label=shape.label, qtype=qt.name, n_in=shape.n_in, n_out=shape.n_out, tokens=T,
                     rung=cuda.rung_for(qt, T, dtype).name, mb=nbytes / 1e6, us=t * 1e6,
                     gbps=nbytes / t / 1e9, of_bw=nbytes / t / bw)
            if baselines:
                def deq_linear():
                    return F.linear(x, dequantize_reference(w.packed, qt, shape.n_in,
                                                            **w.companions()).to(dtype))
                r["deq_linear_us"] = event_time(deq_linear, reps=3) * 1e6
                torch.cuda.empty_cache()
                wd = [torch.randn(shape.n_out, shape.n_in, device=DEVICE, dtype=torch.float16,
                                  generator=gen)
                      for _ in range(copies_for(2 * shape.n_out * shape.n_in, at_most=8))]
                xh = x.half()
                r["dense_us"] = graph_time([lambda d=d: F.linear(xh, d) for d in wd]) * 1e6
                del wd
                torch.cuda.empty_cache()
                r["x_deq"] = r["deq_linear_us"] / r["us"]
                r["x_dense"] = r["dense_us"] / r["us"]
            rows.append(r)
            base = (f" {r['x_deq']:7.1f}x {r['deq_linear_us']:9.1f}  {r['x_dense']:6.2f}x "
                    f"{r['dense_us']:8.1f}") if baselines else ""
            print(f"{shape.label:<15} {qt.name:<10} {shape.n_in:>6}->{shape.n_out:<6} {T:>4} "
                  f"{r['rung']:<10} {r['mb']:>8.2f} {r['us']:>9.1f} {r['gbps']:>7.0f} "
                  f"{r['of_bw']:>6.1%}{base}", flush=True)
        del args, w
        torch.cuda.empty_cache()
    return rows


LLAMA8B_SHAPES = (
    Shape("l8b ffn_up", GGMLType.Q4_K, 4096, 14336),
    Shape("l8b ffn_down", GGMLType.Q4_K, 14336, 4096),
    Shape("l8b down_q6", GGMLType.Q6_K, 14336, 4096),
    Shape("l8b attn_q", GGMLType.Q4_K, 4096, 4096),
    Shape("l8b attn_k", GGMLType.Q4_K, 4096, 1024),
)


def bench_rungs(bw, gen, shapes=SHAPES + LLAMA8B_SHAPES, dtype=torch.float16):
    """Each one-token rung serving each shape, timed in one CUDA graph apiece."""
    from ..ops import cuda
    rows = []
    for shape in shapes:
        qt = shape.qtype
        rungs = [r for r in cuda.LADDER if r.serves(qt, 1, dtype)
                 and r.max_tokens is not None and r.max_tokens <= 8]      # the vector kernels
        if len(rungs) < 2:
            continue
        w, nbytes, args = _weights(shape, gen)
        x = torch.randn(1, shape.n_in, device=DEVICE, dtype=dtype, generator=gen)
        line = []
        runs = [(r, {}) for r in rungs if r.name != "cuda_mv"]
        if rungs[0].name == "cuda_mv":      # its rows per warp, each
            runs = [(rungs[0], {"bn": n}) for n in (1, 2, 4)] + runs
        for r, over in runs:
            t = graph_time([lambda a=a, r=r, o=over: cuda.run_rung(r, x, a[0], qt, shape.n_out,
                                                                   shape.n_in, **o)
                            for a in args])
            name = r.name + "".join(f"/{v}" for v in over.values())
            rows.append(dict(label=shape.label, qtype=qt.name, rung=name, us=t * 1e6,
                             of_bw=nbytes / t / bw))
            line.append(f"{name} {t * 1e6:7.1f} us {nbytes / t / bw:5.1%}")
        print(f"rungs {shape.label:<13} {qt.name:<5} {shape.n_in:>6}->{shape.n_out:<6} "
              + " | ".join(line), flush=True)
        del args, w
        torch.cuda.empty_cache()
    return rows


SMALL_BATCHES = (1, 2, 4, 8, 16)
MM_SWEEP_ROWS, MM_SWEEP_PER_SM = (8, 16), (16, 64, 128)     # cuda_mm's per_sm at 8 and 16 rows
GEMMA_SHAPES = (
    Shape("g3 ffn_up", GGMLType.Q5_0, 640, 2048),
    Shape("g3 lm_head", GGMLType.Q8_0, 640, 262144),
)


# Types without cuda_mm at test-backend-ops' shape (m = 4096 rows, k = 14336): mv_tile_mt's
LOOKUP_SHAPES = tuple(Shape(f"tbo {t}", GGMLType[t], 14336, 4096)
                      for t in ("IQ3_XXS", "IQ3_S", "IQ4_XS", "Q3_K", "Q2_K", "MXFP4"))


def bench_small_batches(bw, gen, shapes=SHAPES + LLAMA8B_SHAPES + GEMMA_SHAPES + LOOKUP_SHAPES,
                        dtype=torch.float16):
    """Each shape at 1..16 activation rows: the rung the ladder runs beside the rung
    it would run without the CUDA C++ kernels (the Triton fallback), each in a CUDA
    graph; and each rung's 16-row time over the ladder's one-row time (the
    verify's cost: 1.0 would be rows for free)."""
    from ..ops import cuda
    rows = []
    for shape in shapes:
        qt = shape.qtype
        if shape.label in SWEEP_SKIP or qt not in cuda.SUPPORTED:
            continue
        w, nbytes, args = _weights(shape, gen)
        line, one = [], None
        for m in SMALL_BATCHES:
            x = torch.randn(m, shape.n_in, device=DEVICE, dtype=dtype, generator=gen)
            rung = cuda.rung_for(qt, m, dtype)
            fallback = rung.built or rung.name == "mv_tile_mt"     # what ran these rows before
            runs = [rung] + ([cuda._next_rung(rung.name, qt, m, dtype)] if fallback else [])
            mm = cuda.RUNGS["cuda_mm"]
            if mm not in runs and mm.built() and qt in mm.types:   # one row on the tensor cores
                runs.append(mm)
            cells = []
            for r in runs:
                t = graph_time([lambda a=a, r=r: cuda.run_rung(r, x, a[0], qt, shape.n_out, shape.n_in)
                                for a in args])
                one = t if (m == 1 and r is rung) else one
                rows.append(dict(label=shape.label, qtype=qt.name, tokens=m, rung=r.name, us=t * 1e6,
                                 of_bw=nbytes / t / bw, over_one=t / one))
                cells.append(f"{r.name} {t * 1e6:6.1f} us {nbytes / t / bw:4.0%} ({t / one:4.2f}x)")
            if m in MM_SWEEP_ROWS and mm.built() and qt in mm.types:   # cuda_mm's K split
                for per_sm in MM_SWEEP_PER_SM:
                    t = graph_time([lambda a=a, p=per_sm: cuda.run_rung(mm, x, a[0], qt, shape.n_out,
                                                                        shape.n_in, per_sm=p)
                                    for a in args])
                    rows.append(dict(label=shape.label, qtype=qt.name, tokens=m, rung=f"cuda_mm/{per_sm}",
                                     us=t * 1e6, of_bw=nbytes / t / bw, over_one=t / one))
                    cells.append(f"/{per_sm} {t * 1e6:6.1f}")
                if qt in cuda.MM_RUNS_OF_8:                # 16 or 32 rows a warp (32: two tiles
                    for bn in (16, 32):                     # share one activation fragment)
                        t = graph_time([lambda a=a, b=bn: cuda.run_rung(mm, x, a[0], qt, shape.n_out,
                                                                        shape.n_in, bn=b) for a in args])
                        rows.append(dict(label=shape.label, qtype=qt.name, tokens=m, rung=f"cuda_mm/bn{bn}",
                                         us=t * 1e6, of_bw=nbytes / t / bw, over_one=t / one))
                        cells.append(f"bn{bn} {t * 1e6:6.1f}")
            line.append(f"  {m:>2} rows: " + " | ".join(cells))
        print(f"batches {shape.label:<13} {qt.name:<5} {shape.n_in:>6}->{shape.n_out:<6} "
              f"(x: the time over the ladder's one-row time)\n" + "\n".join(line), flush=True)
        del args, w
        torch.cuda.empty_cache()
    return rows


PREFILL_TOKENS = (64, 128, 256, 512)


def bench_prefill(bw, gen, shapes=SHAPES + LLAMA8B_SHAPES + GEMMA_SHAPES, dtype=torch.float16):
    """Each shape at prompt-sized row counts: the ladder's rung, the tensor-core
    tile rungs and ``dense`` (the weight decoded to x's dtype, then cuBLAS) side by
    side, with a dense float16 ``F.linear`` of the shape (cuBLAS alone) for scale.
    TFLOP/s are 2 M n_in n_out over the time."""
    from ..ops import cuda
    rows = []
    for shape in shapes:
        qt = shape.qtype
        if shape.label in SWEEP_SKIP:
            continue
        w, nbytes, args = _weights(shape, gen)
        wd = [torch.randn(shape.n_out, shape.n_in, device=DEVICE, dtype=dtype, generator=gen)
              for _ in range(copies_for(2 * shape.n_out * shape.n_in, at_most=4))]
        line = []
        for m in PREFILL_TOKENS:
            x = torch.randn(m, shape.n_in, device=DEVICE, dtype=dtype, generator=gen)
            flop = 2 * m * shape.n_in * shape.n_out
            rung = cuda.rung_for(qt, m, dtype)
            names = [rung.name] + [n for n in ("qmm_tiled", "qmm_wide", "dense")
                                   if n != rung.name and (n != "qmm_tiled" or m <= 64)]
            cells = []
            for name in names:
                try:
                    t = graph_time([lambda a=a, n=name: cuda.run_rung(n, x, a[0], qt, shape.n_out,
                                                                      shape.n_in) for a in args])
                except Exception as e:  # noqa: BLE001 (report and go on)
                    cells.append(f"{name} failed: {e!r}"[:120])
                    continue
                rows.append(dict(label=shape.label, qtype=qt.name, tokens=m, rung=name, us=t * 1e6,
                                 tflops=flop / t / 1e12))
                cells.append(f"{name} {t * 1e6:7.1f} us {flop / t / 1e12:5.0f} TF")
            t = graph_time([lambda d=d: F.linear(x, d) for d in wd])
            rows.append(dict(label=shape.label, qtype=qt.name, tokens=m, rung="fp16 F.linear",
                             us=t * 1e6, tflops=flop / t / 1e12))
            cells.append(f"F.linear {t * 1e6:7.1f} us")
            line.append(f"  {m:>3} rows: " + " | ".join(cells))
        print(f"prefill {shape.label:<13} {qt.name:<5} {shape.n_in:>6}->{shape.n_out:<6} "
              f"(first: the ladder's rung)\n" + "\n".join(line), flush=True)
        del args, w, wd
        torch.cuda.empty_cache()
    return rows


def bench_sweep(bw, gen, shapes=SHAPES):
    """The one-token K-quant rung: BN x warps x split target per SM."""
    from ..ops import cuda
    best = {}
    for shape in shapes:
        qt = shape.qtype
        if shape.label in SWEEP_SKIP or qt not in cuda.RUNGS["mv_kquant"].types:
            continue
        w, nbytes, args = _weights(shape, gen)
        x = torch.randn(1, shape.n_in, device=DEVICE, dtype=torch.float16, generator=gen)
        res = []
        for bn in SWEEP_BN[qt]:
            for warps in SWEEP_WARPS:
                for per_sm in SWEEP_PER_SM:
                    try:
                        t = graph_time([lambda a=a: cuda.run_rung(
                            "mv_kquant", x, a[0], qt, shape.n_out, shape.n_in, bn=bn, warps=warps,
                            per_sm=per_sm) for a in args], reps=10)
                    except Exception as e:  # noqa: BLE001 (report and go on)
                        print(f"  {shape.label} bn={bn} warps={warps}: {e!r}"[:300])
                        continue
                    res.append((t, bn, warps, per_sm))
        res.sort()
        t, bn, warps, per_sm = res[0]
        dflt = cuda.RUNGS["mv_kquant"].launch[qt]
        best[shape.label] = dict(bn=bn, warps=warps, per_sm=per_sm, us=t * 1e6,
                                 of_bw=nbytes / t / bw, qtype=qt.name)
        top = ", ".join(f"{bn_}/{w_}/{s_}:{nbytes / t_ / bw:.0%}" for t_, bn_, w_, s_ in res[:5])
        print(f"sweep {shape.label:<12} {qt.name:<5} best BN/warps/per-SM: {top} "
              f"(default {dflt.bn}/{dflt.warps}/{dflt.per_sm})", flush=True)
        del args, w
        torch.cuda.empty_cache()
    return best


def main(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        raise ValueError("bench triton: needs a CUDA device")
    import triton
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device=DEVICE).manual_seed(args.seed)
    props = torch.cuda.get_device_properties(0)
    bw, cbw = read_bandwidth(), copy_bandwidth()
    res = {"device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
           "triton": triton.__version__, "read_bw": bw, "copy_bw": cbw, "argv": sys.argv}
    print(f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, triton "
          f"{triton.__version__}: read bandwidth {bw / 1e12:.3f} TB/s (sum over 1 GiB), "
          f"copy {cbw / 1e12:.3f} TB/s (read+write)", flush=True)
    if "rungs" in args.what:
        res["rungs"] = bench_rungs(bw, gen)
    if "batches" in args.what:
        res["batches"] = bench_small_batches(bw, gen)
    if "prefill" in args.what:
        res["prefill"] = bench_prefill(bw, gen)
    if "sweep" in args.what:
        res["sweep"] = bench_sweep(bw, gen)
    from . import triton_peer
    for what, fn in (("i8sweep", triton_peer.bench_i8_sweep), ("qmmsweep", triton_peer.bench_qmm_sweep),
                     ("peer", functools.partial(triton_peer.bench_peer,
                                                test_backend_ops=args.test_backend_ops))):
        if what in args.what:
            res[what] = fn(_weights, bw, gen)
            if args.json:      # after each section: a later failure keeps what ran
                with open(args.json, "w") as f:
                    json.dump(res, f, indent=1, default=str)
    head = (f"{'shape':<15} {'type':<10} {'n_in->n_out':>13} {'tok':>4} {'rung':<10} {'MB':>8} "
            f"{'us':>9} {'GB/s':>7} {'of bw':>6} {'vs deq+lin':>8} {'(us)':>9} {'vs fp16':>7} "
            f"{'(us)':>8}  [{args.dtype} activations, CUDA-graph replay over "
            f"{ROTATE_BYTES >> 20} MB of weight copies]")
    for what, shapes in (("ops", SHAPES), ("types", None)):
        if what in args.what:
            print(head)
            res[what] = bench_ops(shapes or type_shapes(), args.tokens, bw, gen, dtype,
                                  baselines=not args.no_baselines, best=res.get("sweep"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--what", nargs="+", default=["ops", "types"], choices=("ops", "types", "rungs", "batches", "prefill", "sweep", "peer", "i8sweep",
                            "qmmsweep"))
    p.add_argument("--tokens", nargs="+", type=int, default=[1, 2, 4, 8, 16, 64, 512])
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16")
    p.add_argument("--no-baselines", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write all results here")
    p.add_argument("--test-backend-ops", metavar="BINARY",
                   help="llama.cpp's test-backend-ops, which --what peer runs for its side of the table")


def register(subparsers) -> None:
    p = subparsers.add_parser("triton", help="the Triton kernels per shape, type and rung (CUDA)")
    add_arguments(p)
    p.set_defaults(func=main)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    raise SystemExit(main(ap.parse_args()))
