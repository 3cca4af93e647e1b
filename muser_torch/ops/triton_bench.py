"""CUDA benchmark of the Triton kernels: ``python -m muser_torch.ops.triton_bench``.

Timing method (DESIGN.md, "CUDA (Triton) lessons"): every op is captured in
a CUDA graph that cycles through enough copies of the weights (>= 512 MB) that
nothing is served from the 50 MB L2, and the graph's replays are timed with
CUDA events; time per call = replay time / calls. The device's read bandwidth
is a ``sum`` over 2 GiB, timed the same way.

Sections (``--what``):
  ops    Figure 6.6 shapes x token counts: time, GB/s of packed bytes, fraction of
         read bandwidth, and ratios to dequantize-in-torch + F.linear and to a
         dense fp16 F.linear of the same shape (both timed in the same run).
  sweep  launch parameters of the one-token K-quant kernel (BN, warps, split).
  decode full-size Glimmer (random packed weights at the seed's shapes, built on
         the GPU), one decode step captured in a CUDA graph: tok/s.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

from ..formats.types import GGMLType
from . import cuda as kc

SHAPES = (  # Chapter 6, Figure 6.6 (release path): label, type, n_in, n_out
    ("attn_q/gate", GGMLType.Q4_K, 6656, 4096),
    ("attn_k/v", GGMLType.Q4_K, 6656, 256),
    ("attn_v", GGMLType.Q6_K, 6656, 256),
    ("attn_output", GGMLType.Q4_K, 4096, 6656),
    ("ffn_gate/up", GGMLType.Q4_K, 6656, 19968),
    ("ffn_down", GGMLType.Q4_K, 19968, 6656),
    ("ffn_down_q6", GGMLType.Q6_K, 19968, 6656),
    ("lm_head", GGMLType.Q5_K, 6656, 202048),
)
ROTATE_BYTES = 512 << 20


def random_packed_cuda(qt: GGMLType, n_out: int, n_in: int, gen: torch.Generator):
    """Random packed rows made on the GPU, f16 scale fields in [1e-3, 1e-2]."""
    dev = gen.device
    if qt is GGMLType.F16:
        w = torch.randn(n_out, n_in, device=dev, generator=gen) * 0.05
        return w.half().view(torch.uint8), None, None
    if qt is GGMLType.NVFP4_E2M1:
        payload = torch.randint(0, 256, (n_out, n_in // 2), device=dev, generator=gen,
                                dtype=torch.uint8)
        scales = torch.randint(0x28, 0x48, (n_out, n_in // 16), device=dev, generator=gen,
                               dtype=torch.uint8)
        return payload, scales, torch.full((1,), 0.01, device=dev)
    blocks = torch.randint(0, 256, (n_out * (n_in // qt.block_elems), qt.block_bytes),
                           device=dev, generator=gen, dtype=torch.uint8)
    offs = {GGMLType.Q4_K: (0, 2), GGMLType.Q5_K: (0, 2), GGMLType.Q6_K: (208,),
            GGMLType.Q8_0: (0,)}[qt]
    for o in offs:
        v = torch.rand(blocks.shape[0], device=dev, generator=gen) * 9e-3 + 1e-3
        blocks[:, o:o + 2] = v.half().view(torch.uint8).reshape(-1, 2)
    return blocks.reshape(n_out, -1), None, None


def graph_time(fns, reps: int = 20) -> float:
    """Seconds per call of the callables ``fns`` captured once each in one CUDA
    graph, replayed ``reps`` times (median of 5 timings)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:            # warm up: compile, allocate
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / reps / len(fns))
    del g
    return sorted(times)[2]


def event_time(fn, reps: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3 / reps


def read_bandwidth() -> float:
    bufs = [torch.ones((1 << 30) // 8, dtype=torch.int64, device="cuda") for _ in range(2)]
    t = graph_time([lambda b=b: b.sum() for b in bufs], reps=10)
    del bufs
    return (1 << 30) / t


def copy_bandwidth() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").fill_(1)
    b = torch.empty_like(a)
    t = graph_time([lambda: b.copy_(a)], reps=10)
    return 2 * (1 << 30) / t


def _copies(nbytes: int) -> int:
    return max(1, math.ceil(ROTATE_BYTES / nbytes))


def bench_ops(tokens_list, bw, gen, dtype=torch.float16, shapes=SHAPES, baselines=True, best=None):
    rows = []
    for label, qt, n_in, n_out in shapes:
        p, s, s2 = random_packed_cuda(qt, n_out, n_in, gen)
        nbytes = p.numel() + (0 if s is None else s.numel())
        nc = _copies(nbytes)
        ws = [p] + [p.clone() for _ in range(nc - 1)]
        for T in tokens_list:
            x = torch.randn(T, n_in, device="cuda", dtype=dtype, generator=gen)
            kw = (best or {}).get(label) if T == 1 else None
            if kw:
                kw = {k: kw[k] for k in ("version", "bn", "warps", "target")}
                t = graph_time([lambda w=w: kc.matvec(x, w, qt, n_out, n_in, **kw) for w in ws])
            else:
                t = graph_time([lambda w=w: kc.qmatmul(x, w, int(qt), n_out, n_in, s, s2) for w in ws])
            r = dict(label=label, qtype=qt.name, n_in=n_in, n_out=n_out, tokens=T, mb=nbytes / 1e6,
                     us=t * 1e6, gbps=nbytes / t / 1e9, of_bw=nbytes / t / bw)
            if baselines:
                from ..formats import dequantize_reference as dequantize  # torch ops

                def deq_linear():
                    return F.linear(x, dequantize(p, qt, n_in, scales=s, scale_2=s2).to(dtype))
                r["deq_linear_us"] = event_time(deq_linear, reps=3) * 1e6
                torch.cuda.empty_cache()
                dense_bytes = 2 * n_out * n_in
                nd = max(1, min(8, math.ceil(ROTATE_BYTES / dense_bytes)))
                wd = [torch.randn(n_out, n_in, device="cuda", dtype=torch.float16, generator=gen)
                      for _ in range(nd)]
                xh = x.half()
                r["dense_us"] = graph_time([lambda w=w: F.linear(xh, w) for w in wd]) * 1e6
                del wd
                torch.cuda.empty_cache()
                r["x_deq"] = r["deq_linear_us"] / r["us"]
                r["x_dense"] = r["dense_us"] / r["us"]
            rows.append(r)
            base = (f" {r['x_deq']:7.1f}x {r['deq_linear_us']:9.1f}  {r['x_dense']:6.2f}x "
                    f"{r['dense_us']:8.1f}") if baselines else ""
            print(f"{label:<12} {qt.name:<5} {n_in:>6}->{n_out:<6} {T:>4} {r['mb']:>8.2f} "
                  f"{r['us']:>9.1f} {r['gbps']:>7.0f} {r['of_bw']:>6.1%}{base}", flush=True)
        del ws
        torch.cuda.empty_cache()
    return rows


def bench_sweep(bw, gen, shapes=SHAPES):
    """One-token K-quant kernel: version x BN x warps x split target."""
    best = {}
    for label, qt, n_in, n_out in shapes:
        if label in ("attn_k/v", "attn_v"):
            continue
        p, _, _ = random_packed_cuda(qt, n_out, n_in, gen)
        ws = [p] + [p.clone() for _ in range(_copies(p.numel()) - 1)]
        x = torch.randn(1, n_in, device="cuda", dtype=torch.float16, generator=gen)
        res = []
        for version in kc.MV_VERSIONS[qt]:
            for bn in (64, 128) if qt is not GGMLType.Q6_K else (32, 64):
                for warps in (4, 8):
                    for per_sm in (4, 8):
                        try:
                            t = graph_time([lambda w=w: kc.matvec(x, w, qt, n_out, n_in, bn=bn, warps=warps,
                                                                  target=132 * per_sm, version=version)
                                            for w in ws], reps=10)
                        except Exception as e:  # noqa: BLE001 (report and go on)
                            print(f"  {label} v{version} bn={bn} warps={warps}: {e!r}"[:300])
                            continue
                        res.append((t, version, bn, warps, per_sm))
        res.sort()
        t, version, bn, warps, per_sm = res[0]
        best[label] = dict(version=version, bn=bn, warps=warps, target=132 * per_sm, per_sm=per_sm,
                           us=t * 1e6, of_bw=p.numel() / t / bw, qtype=qt.name)
        top = ", ".join(f"v{v_}/{bn_}/{w_}/{s_}:{p.numel() / t_ / bw:.0%}"
                        for t_, v_, bn_, w_, s_ in res[:5])
        per_v = {}
        for t_, v_, *_ in res:
            per_v.setdefault(v_, p.numel() / t_ / bw)
        print(f"sweep {label:<12} {qt.name:<5} best version/BN/warps/per-SM: {top}; best per version "
              + ", ".join(f"v{k}:{v:.0%}" for k, v in sorted(per_v.items())), flush=True)
        del ws
        torch.cuda.empty_cache()
    return best


def bench_decode(layers: int, dtype=torch.float16, steps: int = 50, compile_: bool = False):
    from dataclasses import replace

    from ..glimmer import Glimmer
    from ..tiny import SEED_CONFIG
    cfg = replace(SEED_CONFIG, n_layers=layers)
    t0 = time.time()
    model = Glimmer.random(cfg, device="cuda", dtype=dtype, seed=0)
    torch.cuda.synchronize()
    build_s = time.time() - t0
    per_token = model.weight_bytes_per_token()
    model.setup_cache(1, 512)
    slots = torch.zeros(1, dtype=torch.long, device="cuda")
    prompt = torch.randint(0, cfg.vocab_size, (1, 64), device="cuda")
    tok = torch.randint(0, cfg.vocab_size, (1, 1), device="cuda")
    out = {"layers": layers, "build_s": build_s, "weight_bytes_per_token": per_token}
    with torch.no_grad():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model(prompt, slots)
        torch.cuda.synchronize()
        out["prefill_64_tok_s"] = 64 / (time.perf_counter() - t0)
        fwd = model.forward
        if compile_:
            fwd = torch.compile(model.forward, fullgraph=True)
        # eager, no graph
        for _ in range(2):
            fwd(tok, slots)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            fwd(tok, slots)
        torch.cuda.synchronize()
        out["eager_ms"] = (time.perf_counter() - t0) / 5 * 1e3
        # CUDA graph of one decode step (each replay also advances the cache)
        ms = graph_time([lambda: fwd(tok, slots)], reps=max(1, steps // 5)) * 1e3
        logits = fwd(tok, slots)
        out.update(graph_ms=ms, tok_s=1e3 / ms, gbps=per_token / ms / 1e6,
                   finite=bool(torch.isfinite(logits.float()).all()))
    del model
    torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--what", nargs="+", default=["ops", "decode"], choices=("ops", "sweep", "decode"))
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 2, 4, 8, 16, 64, 512])
    ap.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16")
    ap.add_argument("--layers", type=int, nargs="+", default=[52])
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--compile", action="store_true", help="torch.compile the decode step too")
    ap.add_argument("--json", help="write all results here")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    import triton
    bw, cbw = read_bandwidth(), copy_bandwidth()
    res = {"device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
           "triton": triton.__version__, "read_bw": bw, "copy_bw": cbw, "argv": sys.argv}
    print(f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, triton "
          f"{triton.__version__}: read bandwidth {bw / 1e12:.3f} TB/s (sum over 1 GiB), "
          f"copy {cbw / 1e12:.3f} TB/s (read+write)", flush=True)
    if "sweep" in args.what:
        res["sweep"] = bench_sweep(bw, gen)
    if "ops" in args.what:
        print(f"{'shape':<12} {'type':<5} {'n_in->n_out':>13} {'tok':>4} {'MB':>8} {'us':>9} "
              f"{'GB/s':>7} {'of bw':>6} {'vs deq+lin':>8} {'(us)':>9} {'vs fp16':>7} {'(us)':>8}  "
              f"[{args.dtype} activations, CUDA-graph replay over {ROTATE_BYTES >> 20} MB of weight copies]")
        res["ops"] = bench_ops(args.tokens, bw, gen, dtype, baselines=not args.no_baselines,
                               best=res.get("sweep"))
    if res.get("sweep"):   # the decode uses the best one-token settings per type
        for label in ("ffn_gate/up", "ffn_down_q6", "lm_head"):
            b = res["sweep"].get(label)
            if b:
                kc.MV_KQUANT[GGMLType[b["qtype"]]] = (b["bn"], b["warps"], b["per_sm"], b["version"])
        print("one-token settings (BN, warps, per-SM, version):",
              {k.name: v for k, v in kc.MV_KQUANT.items()}, flush=True)
    if "decode" in args.what:
        for L in args.layers:
            for comp in ([False, True] if args.compile else [False]):
                try:
                    r = bench_decode(L, dtype, compile_=comp)
                except Exception:  # noqa: BLE001 (the model is another module; report, go on)
                    import traceback
                    traceback.print_exc()
                    continue
                r["compiled"] = comp
                res.setdefault("decode", []).append(r)
                print(f"decode {L} layers{' compiled' if comp else ''}: {r['graph_ms']:.3f} ms/token "
                      f"= {r['tok_s']:.1f} tok/s in a CUDA graph ({r['gbps']:.0f} GB/s of "
                      f"{r['weight_bytes_per_token'] / 1e9:.3f} GB/token; floor "
                      f"{bw / r['weight_bytes_per_token']:.0f} tok/s); eager {r['eager_ms']:.1f} ms; "
                      f"prefill {r['prefill_64_tok_s']:.0f} tok/s; finite {r['finite']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
