"""``muser-torch bench model [MODEL]``: prefill and decode throughput of a whole
Glimmer, with the weight bytes each decode token reads and the bandwidth that
implies.

MODEL is a GGUF file, ``demo`` (the bundled demo, default) or ``seed``: random
packed weights in the full 52-layer geometry of docs/muse-glimmer.md
(``Glimmer.random``, made on the device, no file), with ``--layers`` of the
52 so it fits the machine at hand.
Numbers are measured in this run and printed, never asserted. With
``--mmproj`` and ``--image`` it times the vision forward per image instead
(``bench/vision.py``).

On CUDA it also replays one decode step captured in a CUDA graph, which
leaves out Python's per-kernel launch cost (a timing, not generation: every
replay feeds the same token, and the cache grows by one per replay).
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

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
    p.add_argument("--draft", type=Path, default=None, metavar="DRAFT",
                   help="a DFlash draft GGUF for the model: also time greedy generation of --decode "
                        "tokens with it and without it, and print its mean accepted tokens per round")
    p.add_argument("--compile", action="store_true", help="torch.compile the decode step (fullgraph)")
    p.add_argument("--q5-0-as-q8-0", action="store_true",
                   help="load Q5_0 weights as Q8_0 of the same values (from_gguf(q5_0_as_q8_0=True)): "
                        "more bytes, a simpler kernel; run with and without to compare")
    p.add_argument("--generate", type=int, default=0, metavar="N",
                   help="also time model.stream / generate, greedy, N new tokens after a "
                        "32-token prompt, as run and serve decode (the decode engine: CUDA graphs "
                        "on CUDA), beside the eager engine")
    p.add_argument("--peers", action="store_true",
                   help="CPU: load time, peak RSS, prefill and decode tok/s of muser, transformers' "
                        "GGUF path and llama.cpp on FILE, each in its own process (bench/peers.py)")
    p.add_argument("--llama-bench", type=Path, default=None,
                   help="with --peers: a llama.cpp llama-bench binary to time as the llama.cpp peer")
    p.add_argument("--mmproj", type=Path, default=None, metavar="MMPROJ",
                   help="the model's vision projector (Muse Glimmer; make-tiny --mmproj writes a random "
                        "one of the released geometry); with --image")
    p.add_argument("--image", type=Path, action="append", default=None, metavar="PATH",
                   help="time the vision forward of this image instead of the text model (repeatable; "
                        "needs --mmproj; bench/vision.py)")
    p.add_argument("--image-reps", type=int, default=3, metavar="N",
                   help="warm vision forwards per image after the first; the best is printed "
                        "(default %(default)s)")
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
        model = Glimmer.random(config, device=device, dtype=dtype or Glimmer.default_dtype(device),
                               seed=0)
        return set_numerics(model, numerics), f"seed geometry x{args.layers} layers ({args.lane})"
    path = model_path(None if args.model == "demo" else Path(args.model), args.lane)
    vision = {} if getattr(args, "mmproj", None) is None else {"mmproj": args.mmproj}
    model = from_gguf(path, device=device, dtype=dtype, numerics=numerics,
                      q5_0_as_q8_0=args.q5_0_as_q8_0, **vision)
    return model, f"{path.name} ({numerics}{', Q5_0 as Q8_0' if args.q5_0_as_q8_0 else ''})"


GRAPH_REPS = 4   # bench/cuda_timing.graph_time replays 5 x GRAPH_REPS + 1 times
VERIFY_ROWS = 16  # DFlash's verify block (the seed's M = 16 shapes)
PREFILL_REPS = 3  # warm prefills timed after the first call; the best is printed


class Timing(NamedTuple):
    cold_s: float      # the first prefill call
    prefill_s: float   # the best warm prefill
    decode_s: float    # all the timed decode steps


def measure(model, prompt: torch.Tensor, slots: torch.Tensor, decode: int, warmup: int,
            step=None, device: torch.device = torch.device("cpu"),
            prefill_reps: int = PREFILL_REPS) -> tuple[Timing, torch.Tensor]:
    """Prefill ``prompt`` into ``slots`` (a first call, then ``prefill_reps``
    warm ones into a reset cache), then ``warmup`` untimed and ``decode`` timed
    greedy steps of ``step`` (default ``model.forward``); returns the timing
    and the last tokens. The cache must hold them all; call under no_grad.

    A prefill computes the last position's logits only (``last_only``), as
    ``generate``'s does and as llama.cpp's llama-bench pp test asks of
    ``llama_decode``: the lm_head over every prompt position (Gemma 3: 262,144
    rows) is work neither side needs."""
    step = step or model.forward
    synchronize(device)
    t0 = time.perf_counter()
    logits = model(prompt, slots, last_only=True)   # the first call: any compile left is in here
    synchronize(device)
    cold_s = time.perf_counter() - t0
    prefill_s = cold_s if prefill_reps < 1 else float("inf")
    for _ in range(prefill_reps):             # warm: the same prompt into a fresh cache
        model.reset()
        synchronize(device)
        t0 = time.perf_counter()
        logits = model(prompt, slots, last_only=True)
        synchronize(device)
        prefill_s = min(prefill_s, time.perf_counter() - t0)
    tok = logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(warmup):                   # first calls compile / page weights in
        tok = step(tok, slots)[:, -1].argmax(-1, keepdim=True)
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(decode):
        tok = step(tok, slots)[:, -1].argmax(-1, keepdim=True)
    synchronize(device)
    return Timing(cold_s, prefill_s, time.perf_counter() - t0), tok


def main(args: argparse.Namespace) -> int:
    if args.peers:
        return _peers(args)
    if args.image or args.mmproj is not None:
        return _vision(args)
    device = resolve_device(args.device)
    apply_threads(args.threads)
    dtype = resolve_dtype(args.dtype)
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
        total += 5 * GRAPH_REPS + 3 + VERIFY_ROWS   # the graph timings' steps also write the cache
    if total > c.context_length:
        raise ValueError(f"bench model: prompt + steps = {total} exceeds context_length {c.context_length}")
    model.setup_cache(args.batch, total)
    slots = torch.arange(args.batch, device=device)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, c.vocab_size, (args.batch, args.prompt_len), generator=gen).to(device)
    step = torch.compile(model.forward, fullgraph=True) if args.compile else model.forward

    with torch.no_grad():
        timing, tok = measure(model, prompt, slots, args.decode, args.warmup, step, device)
        cold_s, prefill_s, decode_s = timing
        if args.profile:
            _profile(lambda: step(tok, slots), device)
        graph_ms = verify_ms = recorded_s = None
        if device.type == "cuda":
            from .cuda_timing import graph_time
            graph_ms = graph_time([lambda: step(tok, slots)], reps=GRAPH_REPS) * 1e3
            # DFlash's verify: a block of VERIFY_ROWS rows at the same positions each replay
            block, at = tok.expand(-1, VERIFY_ROWS).contiguous(), model.lengths.clone()

            def verify():
                model.lengths.copy_(at)
                return step(block, slots)
            verify_ms = graph_time([verify], reps=GRAPH_REPS) * 1e3
            recorded_s = _recorded_prefill(model, prompt, slots, device) if args.batch == 1 else None

    per_token = model.weight_bytes_per_token()
    prefill_tps = args.batch * args.prompt_len / prefill_s
    steps_per_s = args.decode / decode_s
    print(f"bench model: {label} on {device} ({str(model.activation_dtype).removeprefix('torch.')}), {c.n_layers} layers, hidden {c.hidden}, "
          f"batch {args.batch}{', compiled' if args.compile else ''}")
    print(f"  prefill  {args.prompt_len:>5} tokens x {args.batch}: {prefill_tps:10.1f} tok/s "
          "(warm: the best of several calls after the first; the last position's logits)")
    print(f"  first prefill call: {cold_s * 1e3:.1f} ms = {cold_s / prefill_s:.2f}x a warm one{load_note}")
    print(f"  decode   {args.decode:>5} steps  x {args.batch}: {steps_per_s * args.batch:10.1f} tok/s "
          f"({1e3 / steps_per_s:.2f} ms/step)")
    if graph_ms is not None:
        print(f"  decode, one step in a CUDA graph: {args.batch * 1e3 / graph_ms:10.1f} tok/s "
              f"({graph_ms:.2f} ms/step, {per_token / graph_ms / 1e6:.1f} GB/s of weights)")
        print(f"  verify, {VERIFY_ROWS} rows per sequence in a CUDA graph: {verify_ms:.2f} ms/step "
              f"= {verify_ms / graph_ms:.2f}x the one-token step")
        if recorded_s is not None:
            print(f"  prefill  {args.prompt_len:>5} tokens recorded per length bucket (models/prefill.py): "
                  f"{args.prompt_len / recorded_s:10.1f} tok/s = {prefill_s / recorded_s:.2f}x the eager prefill")
    kv = model.kv_bytes_per_token() * args.batch
    print(f"  weights read per decode step: {per_token / 1e6:.3g} MB "
          f"-> {per_token * steps_per_s / 1e9:.3g} GB/s implied; "
          f"plus {kv / 1e6:.3g} MB of KV cache ({(per_token + kv) * steps_per_s / 1e9:.3g} GB/s in all)")
    if args.generate:
        _generation(model, args.generate, prompt[0, :32], device,
                    None if graph_ms is None else args.batch * 1e3 / graph_ms)
    if args.draft is not None:
        _drafted(model, args, prompt[0], device)
    return 0


def _recorded_prefill(model, prompt: torch.Tensor, slots: torch.Tensor, device: torch.device,
                      reps: int = PREFILL_REPS) -> float:
    """The best warm time of ``prompt``'s prefill on the recording prefill engine (the
    first two calls eager and recording, untimed); the cache is left reset."""
    from ..models.engine import engine_recorder
    from ..models.prefill import prefill_engine
    engine = prefill_engine(model, engine_recorder("graph", device, "prompt prefills"))
    best = float("inf")
    for i in range(2 + reps):
        model.reset()
        synchronize(device)
        t0 = time.perf_counter()
        engine.prefill(prompt, slots)
        synchronize(device)
        if i >= 2:
            best = min(best, time.perf_counter() - t0)
    model.reset()
    return best


def stream_rate(model, prompt: torch.Tensor, n: int, engine: str) -> tuple[float, float]:
    """(prefill seconds, decode tok/s) of ``model.stream``, greedy, ``n`` new tokens
    and no stop: decode from the first token handed over to the last, as ``run``
    reports it."""
    start = time.perf_counter()
    first = last = None
    count = 0
    for _ in model.stream(prompt, n, stop=[], engine=engine):
        last = time.perf_counter()
        first = first or last
        count += 1
    return first - start, (count - 1) / (last - first) if count > 1 else float("nan")


def _generation(model, n: int, prompt: torch.Tensor, device: torch.device,
                graph_tps: float | None) -> None:
    """``model.stream``'s decode rate on the default engine and the eager one
    (each after an untimed first run, which compiles and records)."""
    if n < 2:
        raise ValueError(f"bench model: --generate needs at least 2 tokens, got {n}")
    with torch.no_grad():
        rates = {}
        for engine, tokens in (("auto", n), ("eager", max(2, n // 4))):   # eager: slow, fewer
            stream_rate(model, prompt, tokens, engine)
            rates[engine] = stream_rate(model, prompt, tokens, engine)[1]
    ratio = f", {rates['auto'] / graph_tps:.2f}x the graph step above" if graph_tps else ""
    print(f"  stream/generate, {len(prompt)}-token prompt, {n} new tokens, greedy: "
          f"{rates['auto']:.1f} tok/s (engine auto{ratio}); eager {rates['eager']:.1f} tok/s")


def _drafted(model, args: argparse.Namespace, prompt: torch.Tensor, device: torch.device) -> None:
    """Greedy generation of ``--decode`` tokens after the prompt, plain and with
    the draft, each timed whole (prefill included) in the same run."""
    from ..models import from_gguf
    draft = from_gguf(args.draft, target=model, numerics=args.numerics)
    times = {}
    with torch.no_grad():
        for name, kw in (("plain", {}), ("draft", {"draft": draft, "return_stats": True})):
            synchronize(device)
            start = time.perf_counter()
            result = model.generate(prompt, args.decode, **kw)
            synchronize(device)
            times[name] = time.perf_counter() - start
    _, stats = result
    plain_tps, draft_tps = args.decode / times["plain"], args.decode / times["draft"]
    print(f"  draft {args.draft.name}: {stats.rounds} rounds, mean accepted {stats.mean_accepted:.2f} "
          f"tokens per round (+1 of the target's own)")
    print(f"  generate {args.decode} tokens, greedy, prefill included: plain {plain_tps:.1f} tok/s, "
          f"with the draft {draft_tps:.1f} tok/s ({draft_tps / plain_tps:.2f}x)")


def _vision(args: argparse.Namespace) -> int:
    """``--image``: the vision forward per image (``bench/vision.py``)."""
    from .vision import print_images, time_images
    if not args.image or args.mmproj is None:
        raise ValueError("bench model: --image and --mmproj go together (the images' vision forward "
                         "runs on the model's projector)")
    if args.model in ("demo", "seed"):
        raise ValueError(f"bench model --image: needs the GGUF file the projector belongs to, got {args.model!r}")
    for what, path in [("--mmproj", args.mmproj)] + [("--image", p) for p in args.image]:
        if not path.is_file():
            raise ValueError(f"bench model: {what} {path}: no such file")
    if args.image_reps < 1:
        raise ValueError(f"bench model: --image-reps must be >= 1, got {args.image_reps}")
    device = resolve_device(args.device)
    apply_threads(args.threads)
    t_load = time.perf_counter()
    model, label = build(args, device, resolve_dtype(args.dtype))
    load_s = time.perf_counter() - t_load
    v = model.vision.config
    print(f"bench model --image: {label} with {args.mmproj.name} ({v.n_layers} layer{'s' if v.n_layers > 1 else ''}, width {v.hidden}) on "
          f"{device} ({str(model.activation_dtype).removeprefix('torch.')}); load {load_s:.2f} s")
    print_images(time_images(model, args.image, args.image_reps, device), args.image_reps)
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


class StepProfile(NamedTuple):
    rows: list          # torch.profiler's key averages, by self time, largest first
    ops_per_step: float # recorded ops (torch ops and the native calls) per step
    host_share: float   # of the step's wall time, outside the matmul and attention kernels


def profile_steps(step, device: torch.device, steps: int = 8) -> StepProfile:
    """``steps`` calls of ``step`` under torch.profiler. Host overhead is the
    wall time (with the profiler's own per-op cost in it) less the self time
    of the matmul and attention kernels (:func:`_is_kernel`)."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(device)
        wall_us = (time.perf_counter() - t0) * 1e6
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    kernels = sum(e.self_cpu_time_total for e in rows if _is_kernel(e.key))
    return StepProfile(rows, sum(e.count for e in rows) / steps, 1 - kernels / wall_us)


def _profile(step, device: torch.device, steps: int = 8) -> None:
    """Print where ``steps`` decode steps' host time goes, by op kind (self time)."""
    prof = profile_steps(step, device, steps)
    total = sum(e.self_cpu_time_total for e in prof.rows) or 1
    print(f"  where a decode step's host time goes ({steps} steps, self time per step):")
    print(f"    {prof.ops_per_step:.0f} recorded ops per step; host overhead {prof.host_share:.1%} "
          f"of the step (its wall time outside muser::* and scaled_dot_product_attention)")
    print(f"    {'op':40} {'calls':>6} {'us/step':>9} {'share':>6}")
    for e in prof.rows[:15]:
        print(f"    {e.key[:40]:40} {e.count // steps:6d} {e.self_cpu_time_total / steps:9.1f} "
              f"{e.self_cpu_time_total / total:6.1%}")


def _is_kernel(key: str) -> bool:
    """A profiler row that is matmul or attention work (the native decode
    blocks hold both), not host overhead."""
    return key.startswith("muser::") or "scaled_dot_product" in key
