"""``muser-torch bench model [MODEL]``: prefill and decode throughput of a whole
Glimmer, with the weight bytes each decode token reads and the bandwidth that
implies.

MODEL is a GGUF file, ``demo`` (the bundled demo, default) or ``seed``: random
packed weights in the full 52-layer geometry of docs/muse-glimmer.md
(``Glimmer.random``, made on the device, no file), with ``--layers`` of the
52 so it fits the machine at hand.
Numbers are measured in this run and printed, never asserted.

On CUDA it also replays one decode step captured in a CUDA graph, which
leaves out Python's per-kernel launch cost (a timing, not generation: every
replay feeds the same token, and the cache grows by one per replay).
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import torch

from ..run import (DEMO, add_dtype_arg, add_numerics_arg, add_threads_arg, apply_threads,
                   model_path, resolve_device, resolve_dtype, synchronize)


def register(subparsers) -> None:
    p = subparsers.add_parser("model", help="whole-model prefill / decode tok/s and GB/s")
    p.add_argument("model", nargs="?", default="demo",
                   help="a GGUF path, 'demo' (bundled demo, default) or 'seed' (random seed-geometry layers)")
    p.add_argument("--lane", choices=tuple(DEMO), default="q4_k_xl")
    p.add_argument("--layers", type=int, default=2, help="layers of the 52-layer geometry (with 'seed')")
    p.add_argument("--device", default="cpu")
    add_dtype_arg(p)
    add_numerics_arg(p)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--decode", type=int, default=32, help="decode steps to time")
    p.add_argument("--batch", type=int, default=1, help="sequences (cache slots) decoded together")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--compile", action="store_true", help="torch.compile the decode step (fullgraph)")
    p.add_argument("--peers", action="store_true",
                   help="CPU: load time, peak RSS, prefill and decode tok/s of muser, transformers' "
                        "GGUF path and llama.cpp on FILE, each in its own process (bench/peers.py)")
    p.add_argument("--llama-bench", type=Path, default=None,
                   help="with --peers: a llama.cpp llama-bench binary to time as the llama.cpp peer")
    p.add_argument("--profile", action="store_true",
                   help="also print where a decode step's host time goes, per op kind (torch.profiler)")
    add_threads_arg(p)
    p.set_defaults(func=main)


def build(args: argparse.Namespace, device: torch.device, dtype: torch.dtype):
    from ..models import Glimmer, from_gguf
    from ..nn import set_numerics
    from ..tiny import SEED_CONFIG

    numerics = args.numerics
    if args.model == "seed":
        from ..arch.muse_glimmer import reference_pattern
        config = replace(SEED_CONFIG, n_layers=args.layers, weight_precision=args.lane,
                         sliding_window_pattern=reference_pattern(args.layers))
        model = Glimmer.random(config, device=device, dtype=dtype, seed=0)
        return set_numerics(model, numerics), f"seed geometry x{args.layers} layers ({args.lane})"
    path = model_path(None if args.model == "demo" else Path(args.model), args.lane)
    return from_gguf(path, device=device, dtype=dtype, numerics=numerics), f"{path.name} ({numerics})"


GRAPH_REPS = 4   # bench/cuda_timing.graph_time replays 5 x GRAPH_REPS + 1 times
PREFILL_REPS = 3  # warm prefills timed after the first call; the best is printed


def main(args: argparse.Namespace) -> int:
    if args.peers:
        return _peers(args)
    device = resolve_device(args.device)
    apply_threads(args.threads)
    dtype = resolve_dtype(args.dtype, device)
    for what, v in (("--prompt-len", args.prompt_len), ("--decode", args.decode),
                    ("--batch", args.batch), ("--layers", args.layers)):
        if v < 1:
            raise ValueError(f"bench model: {what} must be >= 1, got {v}")
    if args.warmup < 0:
        raise ValueError(f"bench model: --warmup must be >= 0, got {args.warmup}")
    t_load = time.perf_counter()
    model, label = build(args, device, dtype)
    load_s = time.perf_counter() - t_load
    warm_s = getattr(model, "warm_up_s", None)
    load_note = (f" (load {load_s:.2f} s, of which compiling kernels {warm_s:.2f} s)"
                 if warm_s else "")
    c = model.config
    total = args.prompt_len + args.warmup + args.decode
    if device.type == "cuda":
        total += 5 * GRAPH_REPS + 3     # the graph timing's steps also write the cache
    if total > c.context_length:
        raise ValueError(f"bench model: prompt + steps = {total} exceeds context_length {c.context_length}")
    model.setup_cache(args.batch, total)
    slots = torch.arange(args.batch, device=device)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, c.vocab_size, (args.batch, args.prompt_len), generator=gen).to(device)
    step = torch.compile(model.forward, fullgraph=True) if args.compile else model.forward

    with torch.no_grad():
        synchronize(device)
        t0 = time.perf_counter()
        model(prompt, slots)                  # the first call: any compile left is in here
        synchronize(device)
        cold_s = time.perf_counter() - t0
        prefill_s = float("inf")
        for _ in range(PREFILL_REPS):         # warm: the same prompt into a fresh cache
            model.reset()
            synchronize(device)
            t0 = time.perf_counter()
            logits = model(prompt, slots)
            synchronize(device)
            prefill_s = min(prefill_s, time.perf_counter() - t0)
        tok = logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(args.warmup):  # first calls compile / page weights in
            tok = step(tok, slots)[:, -1].argmax(-1, keepdim=True)
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(args.decode):
            tok = step(tok, slots)[:, -1].argmax(-1, keepdim=True)
        synchronize(device)
        decode_s = time.perf_counter() - t0
        if args.profile:
            _profile(lambda: step(tok, slots), device)
        graph_ms = None
        if device.type == "cuda":
            from .cuda_timing import graph_time
            graph_ms = graph_time([lambda: step(tok, slots)], reps=GRAPH_REPS) * 1e3

    per_token = model.weight_bytes_per_token()
    prefill_tps = args.batch * args.prompt_len / prefill_s
    steps_per_s = args.decode / decode_s
    print(f"bench model: {label} on {device} ({str(dtype).removeprefix('torch.')}), {c.n_layers} layers, hidden {c.hidden}, "
          f"batch {args.batch}{', compiled' if args.compile else ''}")
    print(f"  prefill  {args.prompt_len:>5} tokens x {args.batch}: {prefill_tps:10.1f} tok/s "
          "(warm: the best of several calls after the first)")
    print(f"  first prefill call: {cold_s * 1e3:.1f} ms = {cold_s / prefill_s:.2f}x a warm one{load_note}")
    print(f"  decode   {args.decode:>5} steps  x {args.batch}: {steps_per_s * args.batch:10.1f} tok/s "
          f"({1e3 / steps_per_s:.2f} ms/step)")
    if graph_ms is not None:
        print(f"  decode, one step in a CUDA graph: {args.batch * 1e3 / graph_ms:10.1f} tok/s "
              f"({graph_ms:.2f} ms/step, {per_token / graph_ms / 1e6:.1f} GB/s of weights)")
    kv = model.kv_bytes_per_token() * args.batch
    print(f"  weights read per decode step: {per_token / 1e6:.3g} MB "
          f"-> {per_token * steps_per_s / 1e9:.3g} GB/s implied; "
          f"plus {kv / 1e6:.3g} MB of KV cache ({(per_token + kv) * steps_per_s / 1e9:.3g} GB/s in all)")
    return 0


def _peers(args: argparse.Namespace) -> int:
    from . import peers
    if args.model in ("demo", "seed") or not Path(args.model).is_file():
        raise ValueError(f"bench model --peers: needs a GGUF file the peers can read, got {args.model!r}")
    if args.device not in ("cpu", "cuda"):
        raise ValueError(f"bench model --peers: --device must be cpu or cuda, got {args.device!r}")
    if args.llama_bench is not None and not args.llama_bench.is_file():
        raise ValueError(f"bench model: --llama-bench {args.llama_bench} is not a file")
    threads = args.threads or torch.get_num_threads()
    if threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    peers.run(Path(args.model), threads, args.prompt_len, args.decode, args.llama_bench,
              device=args.device)
    return 0


def _profile(step, device: torch.device, steps: int = 8) -> None:
    """Host time of ``steps`` decode steps by op kind (self time, so nothing counts twice)."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        synchronize(device)
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in rows) or 1
    print(f"  where a decode step's host time goes ({steps} steps, self time per step):")
    print(f"    {'op':40} {'calls':>6} {'us/step':>9} {'share':>6}")
    for e in rows[:15]:
        print(f"    {e.key[:40]:40} {e.count // steps:6d} {e.self_cpu_time_total / steps:9.1f} "
              f"{e.self_cpu_time_total / total:6.1%}")
