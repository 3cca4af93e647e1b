"""``muser-torch bench compile [MODEL]``: ``torch.compile`` of a model's decode
step in each mode, beside eager.

For eager and every ``--modes`` entry (default: ``default``,
``reduce-overhead``, ``max-autotune-no-cudagraphs``, ``max-autotune``) it
prints: graph breaks (Dynamo's own count; 0 is the contract: the ``muser``
custom ops and the model trace whole), the compile time of the first
compiled step, recompiles over ``--decode`` further positions and after a
change of batch size (Dynamo's frame compiles past the first), decode tok/s
(the steps after the first), and the largest relative difference of the
compiled step's logits from eager's at the same position. Only the decode
step is compiled; prefill runs eager. ``--backend metal-emulator`` runs the
ops through the Metal kernels' CPU emulator (correctness and graph breaks;
its speed means nothing). Measured in this run and printed, never asserted
(the logits check is also a test, ``tests/models/test_compile_modes.py``).
"""
from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import torch

from ..run import DEMO, model_path, resolve_device, resolve_dtype, synchronize

MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")


def register(subparsers) -> None:
    p = subparsers.add_parser("compile", help="torch.compile modes of the decode step: graph "
                                              "breaks, recompiles, compile time, tok/s")
    p.add_argument("model", nargs="?", default="demo", help="a GGUF path or 'demo' (default)")
    p.add_argument("--lane", choices=tuple(DEMO), default="q4_k_xl")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"))
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--decode", type=int, default=8, help="timed decode steps after the first")
    p.add_argument("--backend", choices=("native", "metal-emulator"), default="native",
                   help="metal-emulator: the CPU path through ops/metal's emulated kernels")
    p.set_defaults(func=main)


def _counters():
    from torch._dynamo.utils import counters
    return counters


def _breaks() -> int:
    return sum(_counters()["graph_break"].values())


def _frames() -> int:
    return _counters()["frames"]["ok"]


def run_mode(model, mode: str | None, prompt: torch.Tensor, decode: int, device) -> dict:
    """One mode (None: eager): the numbers ``bench compile`` prints, and the first
    compiled step's logits next to eager's at the same position."""
    import torch._dynamo
    torch._dynamo.reset()
    _counters().clear()
    batch = prompt.shape[0]
    total = prompt.shape[1] + decode + 4
    model.setup_cache(batch, total)
    slots = torch.arange(batch, device=device)
    step = model.forward if mode is None else torch.compile(model.forward, mode=mode)
    out: dict = {"mode": mode or "eager"}
    with torch.no_grad():
        logits = model(prompt, slots)
        tok = logits[:, -1].argmax(-1, keepdim=True)
        ref = model(tok, slots).float()                       # eager, then rewind one position
        model.lengths -= 1
        synchronize(device)
        t0 = time.perf_counter()
        got = step(tok, slots).float()
        synchronize(device)
        out["first_step_s"] = time.perf_counter() - t0
        out["logits_rel_diff"] = ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        frames = _frames()
        tok = got[:, -1].argmax(-1, keepdim=True)
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(decode):
            tok = step(tok, slots)[:, -1].argmax(-1, keepdim=True)
        synchronize(device)
        out["tok_s"] = batch * decode / (time.perf_counter() - t0)
        out["recompiles_positions"] = _frames() - frames
        frames = _frames()
        model.setup_cache(batch + 1, total)                   # another batch size
        slots2 = torch.arange(batch + 1, device=device)
        model(torch.cat([prompt, prompt[:1]]), slots2)
        step(torch.cat([tok, tok[:1]]), slots2)
        synchronize(device)
        out["recompiles_batch"] = _frames() - frames
    out["graph_breaks"] = _breaks()
    out["break_reasons"] = sorted({str(k)[:120] for k in _counters()["graph_break"]})
    return out


def main(args: argparse.Namespace) -> int:
    from .. import ops
    from ..models import from_gguf
    if args.backend == "metal-emulator" and args.device != "cpu":
        raise ValueError("bench compile: --backend metal-emulator runs on --device cpu")
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype)
    for what, v in (("--prompt-len", args.prompt_len), ("--decode", args.decode)):
        if v < 1:
            raise ValueError(f"bench compile: {what} must be >= 1, got {v}")
    path = model_path(None if args.model == "demo" else Path(args.model), args.lane)
    model = from_gguf(path, device=device, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt_len), generator=gen)
    prompt = prompt.to(device)
    backend = (ops.use_backend("metal-emulator") if args.backend == "metal-emulator"
               else contextlib.nullcontext())
    emu = ", metal-emulator" if args.backend == "metal-emulator" else ""
    print(f"bench compile: {path.name} on {device} ({str(model.activation_dtype).removeprefix('torch.')}{emu}), "
          f"torch {torch.__version__}")
    print(f"  {'mode':<28} {'breaks':>6} {'compile s':>9} {'recompiles':>10} {'(batch)':>7} "
          f"{'tok/s':>9} {'logits vs eager':>15}")
    rows = []
    with backend:
        for mode in (None, *args.modes):
            try:
                r = run_mode(model, mode, prompt, args.decode, device)
            except Exception as e:  # noqa: BLE001 (a mode that fails is a result too)
                print(f"  {mode:<28} failed: {type(e).__name__}: {str(e)[:200]}")
                continue
            rows.append(r)
            print(f"  {r['mode']:<28} {r['graph_breaks']:>6} {r['first_step_s']:>9.2f} "
                  f"{r['recompiles_positions']:>10} {r['recompiles_batch']:>7} {r['tok_s']:>9.1f} "
                  f"{r['logits_rel_diff']:>15.2e}", flush=True)
            for reason in r["break_reasons"]:
                print(f"      break: {reason}")
    return 0
