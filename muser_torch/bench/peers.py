"""``muser-torch bench model FILE --peers``: muser against transformers' GGUF
path and llama.cpp on the same file, threads and prompt, side by side.

Each contender runs in a fresh subprocess (this module's ``--one``), so its
load time and peak RSS are its own: the time from nothing to a model ready
to run, and the process's high-water resident memory (``ru_maxrss``), which
for transformers includes the float copies it dequantizes every weight into.
Then a prefill of ``--prompt-len`` tokens and ``--decode`` greedy decode
steps, timed on the host clock. The prompt is the same seeded random ids for
everyone.

llama.cpp comes from ``llama-cpp-python`` when it is installed, or from a
``llama-bench`` binary given with ``--llama-bench`` (``shared/tools/peers``
builds one; its own pp/tg tok/s, no load time); otherwise its row says why
it is absent. Numbers are printed, never asserted.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

CONTENDERS = ("muser", "transformers", "llama.cpp")


def _peak_rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024      # Linux reports KiB


def _rss_now_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _prompt(vocab: int, n: int) -> list[int]:
    import random
    rng = random.Random(0)
    return [rng.randrange(10, min(vocab, 30000)) for _ in range(n)]


# ---- one contender, in its own process -------------------------------------------

def _setting(device: str):
    """(torch device, activation dtype): float32 on the CPU, bfloat16 on CUDA, for everyone."""
    import torch
    return torch.device(device), (torch.float32 if device == "cpu" else torch.bfloat16)


def _run_muser(path: str, threads: int, prompt_len: int, decode: int, device: str) -> dict:
    import torch

    from ..run import synchronize

    from ..models import from_gguf
    torch.set_num_threads(threads)
    dev, dtype = _setting(device)
    t0 = time.perf_counter()
    model = from_gguf(path, device=dev, dtype=dtype)
    synchronize(dev)
    load_s = time.perf_counter() - t0
    ids = torch.tensor([_prompt(model.config.vocab_size, prompt_len)], device=dev)
    graph_steps = 5 * 4 + 1 if dev.type == "cuda" else 0   # cuda_timing.graph_time's replays
    model.setup_cache(1, prompt_len + 2 * decode + graph_steps + 4)
    slots = torch.zeros(1, dtype=torch.long, device=dev)
    out = {}
    with torch.no_grad():
        model(ids[:, :8], slots)            # first calls compile kernels / page weights in
        model.reset()
        synchronize(dev)
        t0 = time.perf_counter()
        tok = model(ids, slots, last_only=True)[:, -1].argmax(-1, keepdim=True)
        synchronize(dev)
        prefill_s = time.perf_counter() - t0
        for _ in range(min(decode, 4)):     # warm the one-token kernels
            tok = model(tok, slots)[:, -1].argmax(-1, keepdim=True)
        synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(decode):
            tok = model(tok, slots)[:, -1].argmax(-1, keepdim=True)
        synchronize(dev)
        decode_s = time.perf_counter() - t0
        if dev.type == "cuda":
            from .cuda_timing import graph_time
            out["graph_decode_tps"] = 1.0 / graph_time([lambda: model(tok, slots)], reps=4)
    out.update(load_s=load_s, prefill_tps=prompt_len / prefill_s, decode_tps=decode / decode_s)
    return out


def _run_transformers(path: str, threads: int, prompt_len: int, decode: int, device: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from ..run import synchronize
    torch.set_num_threads(threads)
    dev, dtype = _setting(device)
    p = Path(path)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=dtype)
    model.to(dev).eval()
    synchronize(dev)
    load_s = time.perf_counter() - t0
    ids = torch.tensor([_prompt(model.config.vocab_size, prompt_len)], device=dev)
    with torch.no_grad():
        model(ids[:, :8], use_cache=True)   # warm-up, as for muser
        synchronize(dev)
        t0 = time.perf_counter()
        out = model(ids, use_cache=True)
        synchronize(dev)
        prefill_s = time.perf_counter() - t0
        past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(min(decode, 4)):
            out = model(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(decode):
            out = model(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        synchronize(dev)
        decode_s = time.perf_counter() - t0
    return {"load_s": load_s, "prefill_tps": prompt_len / prefill_s, "decode_tps": decode / decode_s}


def _run_llama_cpp(path: str, threads: int, prompt_len: int, decode: int, device: str) -> dict:
    import llama_cpp
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=path, n_threads=threads, n_ctx=prompt_len + decode + 8,
                          verbose=False)
    load_s = time.perf_counter() - t0
    ids = _prompt(llm.n_vocab(), prompt_len)
    t0 = time.perf_counter()
    llm.eval(ids)
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(decode):
        tok = llm.sample(temp=0.0)
        llm.eval([tok])
    decode_s = time.perf_counter() - t0
    return {"load_s": load_s, "prefill_tps": prompt_len / prefill_s, "decode_tps": decode / decode_s}


_RUNNERS = {"muser": _run_muser, "transformers": _run_transformers, "llama.cpp": _run_llama_cpp}


def _child(argv: list[str]) -> int:
    """``python -m muser_torch.bench.peers --one NAME PATH THREADS PROMPT DECODE DEVICE``."""
    name, path, threads, prompt_len, decode, device = argv
    import torch  # noqa: F401  (the baseline every contender shares: Python and torch)
    base = _rss_now_mb()
    result = _RUNNERS[name](path, int(threads), int(prompt_len), int(decode), device)
    result["peak_rss_mb"] = _peak_rss_mb()
    result["growth_mb"] = result["peak_rss_mb"] - base
    print("RESULT " + json.dumps(result))
    return 0


# ---- the parent: one subprocess per contender ---------------------------------------

def _measure(name: str, path: Path, threads: int, prompt_len: int, decode: int,
             timeout_s: float, device: str = "cpu") -> dict:
    if name == "transformers" and not _importable("transformers"):
        return {"note": 'transformers is not installed (pip install -e ".[hf]")'}
    if name == "llama.cpp" and not _importable("llama_cpp"):
        return {"note": "llama-cpp-python is not installed; pass --llama-bench PATH for a native build"}
    if name == "llama.cpp" and device != "cpu":
        return {"note": "the llama.cpp CUDA peer is timed by shared/tools/peers/llamacpp_cuda_mulmat.sh"}
    cmd = [sys.executable, "-m", "muser_torch.bench.peers", "--one", name, str(path), str(threads),
           str(prompt_len), str(decode), device]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"note": f"did not finish within {timeout_s:.0f} s"}
    for line in res.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
    return {"note": f"failed (exit {res.returncode}): {tail[:200]}"}


def _llama_bench(binary: Path, path: Path, threads: int, prompt_len: int, decode: int,
                 timeout_s: float) -> dict:
    """llama.cpp's own ``llama-bench`` (pp and tg tok/s, mean of 3 repetitions)."""
    # Run through a small Python parent of its own, whose RUSAGE_CHILDREN is
    # llama-bench's alone (ours also holds the other contenders' processes).
    wrapper = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
               "sys.exit(r.returncode)")
    cmd = [sys.executable, "-c", wrapper, str(binary), "-m", str(path), "-t", str(threads),
           "-p", str(prompt_len), "-n", str(decode), "-r", "3", "-o", "json"]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"note": f"llama-bench did not finish within {timeout_s:.0f} s"}
    try:
        rows = json.loads(res.stdout)
        peak_kib = int(res.stderr.strip().splitlines()[-1])
    except (json.JSONDecodeError, ValueError, IndexError):
        return {"note": f"llama-bench failed (exit {res.returncode})"}
    out = {"peak_rss_mb": peak_kib / 1024, "build": rows[0].get("build_commit")}
    for row in rows:
        key = "prefill_tps" if row.get("n_prompt") else "decode_tps"
        out[key] = float(row["avg_ts"])
    return out


def _importable(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


def _fmt(v, spec: str) -> str:
    """``v`` formatted by ``spec``; a missing value is "-" right-aligned in the
    spec's width, so its row keeps the table's columns."""
    if v is None:
        width = "".join(itertools.takewhile(str.isdigit, spec))
        return "-".rjust(int(width or 0))
    return format(v, spec)


def run(path: Path, threads: int, prompt_len: int, decode: int, llama_bench: Path | None = None,
        timeout_s: float = 1800.0, device: str = "cpu") -> dict[str, dict]:
    """Measure every contender on ``path``; print the table; return the rows."""
    rows = {}
    for name in CONTENDERS:
        if name == "llama.cpp" and llama_bench is not None and device == "cpu":
            rows[name] = _llama_bench(llama_bench, path, threads, prompt_len, decode, timeout_s)
        else:
            rows[name] = _measure(name, path, threads, prompt_len, decode, timeout_s, device)
    size_mb = path.stat().st_size / 1e6
    where = f"CPU, {threads} threads, float32" if device == "cpu" else f"{device}, bfloat16"
    print(f"bench model --peers: {path.name} ({size_mb:.0f} MB), {where}, "
          f"prefill {prompt_len} tokens, decode {decode} greedy steps (eager)")
    print(f"  {'':13} {'load s':>8} {'peak RSS MB':>12} {'over torch':>11} {'x file':>7} "
          f"{'prefill tok/s':>14} {'decode tok/s':>13} {'muser decode / this':>20}")
    mine = rows["muser"].get("decode_tps")
    for name, r in rows.items():
        if "note" in r:
            print(f"  {name:13} {r['note']}")
            continue
        rss, growth = r.get("peak_rss_mb"), r.get("growth_mb")
        ratio = None if mine is None or not r.get("decode_tps") else mine / r["decode_tps"]
        print(f"  {name:13} {_fmt(r.get('load_s'), '8.2f')} {_fmt(rss, '12.0f')} "
              f"{_fmt(growth, '11.0f')} "
              f"{_fmt(None if growth is None else growth * 2**20 / 1e6 / size_mb, '7.2f')} "
              f"{_fmt(r.get('prefill_tps'), '14.1f')} {_fmt(r.get('decode_tps'), '13.2f')} "
              f"{_fmt(ratio, '20.2f')}")
    if "graph_decode_tps" in rows["muser"]:
        g = rows["muser"]["graph_decode_tps"]
        other = rows["transformers"].get("decode_tps")
        print(f"  muser decode step in a CUDA graph: {g:.1f} tok/s"
              + (f" ({g / other:.2f}x transformers' eager decode)" if other else ""))
    print("  peak RSS: the process's high-water mark; over torch: that minus the process's RSS "
          "after `import torch`; x file: the latter over the file's size")
    if "build" in rows["llama.cpp"]:
        print(f"  llama.cpp: llama-bench {llama_bench} (build {rows['llama.cpp']['build']}); "
              "its peak RSS is the largest child process this bench started")
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--one"]:
        return _child(argv[1:])
    p = argparse.ArgumentParser(prog="python -m muser_torch.bench.peers")
    p.add_argument("model", type=Path)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--decode", type=int, default=64)
    p.add_argument("--llama-bench", type=Path)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    a = p.parse_args(argv)
    run(a.model, a.threads, a.prompt_len, a.decode, a.llama_bench, device=a.device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
