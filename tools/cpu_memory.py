"""Resident memory and first-call cost of a model on the CPU, each setting in
a fresh process: the file's size, then VmRSS, RssFile and RssAnon
(/proc/self/status) after ``import muser_torch``, after ``from_gguf``, after
a prefill of --prompt-len tokens and after --decode greedy steps; and the
first call after load against the second (one process whose first call is
the prefill, one whose first call is a one-token decode step).

    python tools/cpu_memory.py FILE [--numerics exact ggml] [--repack on off]
        [--prompt-len 512] [--decode 8] [--threads 1] [--prompt text|random]

"over import" is RSS less the RSS after the imports (Python and torch: about
227 MiB here), the model's own share. The prompt is the tokenized text of
this repository's README (--prompt text; cut to --prompt-len tokens) or
seeded random ids over the whole vocabulary (--prompt random: nearly every
id its own embedding row, the worst case for an embedding that reads the
file's rows). The children inherit the environment (MALLOC_MMAP_THRESHOLD_,
docs/cpu.md). RSS figures do not depend on the machine's load; the times do
(the load average is printed beside them).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATUS_KEYS = ("VmRSS", "RssFile", "RssAnon", "VmHWM")
POINTS = ("import", "load", "prefill", "decode")


def status_mb() -> dict[str, float]:
    """VmRSS, RssFile, RssAnon and VmHWM of this process, MiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in STATUS_KEYS:
                out[key] = int(value.split()[0]) / 1024     # kB
    return out


def _prompt_ids(model, kind: str, n: int):
    import torch
    if kind == "random" or model.tokenizer is None:     # a file without a vocabulary: random ids
        return torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
    text = (ROOT / "README.md").read_text()
    ids = model.tokenizer.encode(text)
    while len(ids) < n:
        ids = ids + ids
    return torch.tensor(ids[:n]).view(1, n)


def child(a: argparse.Namespace) -> dict:
    """One setting in this (fresh) process; returns what it measured."""
    a.numerics, a.repack = a.numerics[0], a.repack[0]
    if a.repack == "off":
        os.environ["MUSER_CPU_REPACK"] = "0"      # read when the package is imported
    sys.path.insert(0, str(ROOT))
    import torch
    import muser_torch
    torch.set_num_threads(a.threads)
    rss = {"import": status_mb()}
    t0 = time.perf_counter()
    model = muser_torch.from_gguf(a.file, numerics=a.numerics)
    load_s = time.perf_counter() - t0
    rss["load"] = status_mb()
    first = a.first_call
    model.setup_cache(1, a.prompt_len + a.decode + 2)
    slots = torch.arange(1)
    prompt = _prompt_ids(model, a.prompt, a.prompt_len)
    times = {}
    with torch.no_grad():
        if first == "decode":                 # the first call after load: one token
            for i in range(2):
                model.reset()
                t0 = time.perf_counter()
                model(prompt[:, :1], slots)
                times[f"decode{i}"] = time.perf_counter() - t0
            model.reset()
        for i in range(2):                    # the first (or a later) prefill, then a warm one
            model.reset()
            t0 = time.perf_counter()
            logits = model(prompt, slots, last_only=True)
            times[f"prefill{i}"] = time.perf_counter() - t0
        rss["prefill"] = status_mb()
        tok = logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(a.decode):
            tok = model(tok, slots)[:, -1].argmax(-1, keepdim=True)
        rss["decode"] = status_mb()
    return {"rss": rss, "times": times, "load_s": load_s, "load_avg": os.getloadavg()}


def _run_child(a: argparse.Namespace, numerics: str, repack: str, first: str) -> dict:
    argv = [sys.executable, __file__, str(a.file), "--child", "--numerics", numerics,
            "--repack", repack, "--first-call", first, "--prompt-len", str(a.prompt_len),
            "--decode", str(a.decode), "--threads", str(a.threads), "--prompt", a.prompt]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"cpu_memory child {numerics}/{repack} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--numerics", nargs="+", default=["exact", "ggml"], choices=("exact", "ggml"))
    ap.add_argument("--repack", nargs="+", default=["on", "off"], choices=("on", "off"),
                    help="the ggml numerics' repack (MUSER_CPU_REPACK); exact runs none")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt", choices=("text", "random"), default="text")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--first-call", choices=("prefill", "decode"), default="prefill",
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not a.file.is_file():
        raise SystemExit(f"cpu_memory: {a.file} is not a file")
    if not os.path.exists("/proc/self/status"):
        raise SystemExit("cpu_memory: reads /proc/self/status, which this system lacks (Linux only)")
    for what, v in (("--prompt-len", a.prompt_len), ("--decode", a.decode), ("--threads", a.threads)):
        if v < 1:
            raise SystemExit(f"cpu_memory: {what} must be >= 1, got {v}")
    if a.child:
        print(json.dumps(child(a)))
        return 0
    size_mb = a.file.stat().st_size / 2**20
    settings = [(n, r) for n in a.numerics for r in (a.repack if n == "ggml" else ["on"])]
    print(f"{a.file.name}: {size_mb:.0f} MiB (every figure below in MiB); {a.prompt_len}-token "
          f"{a.prompt} prompt, {a.decode} decode steps, {a.threads} thread(s); load average "
          f"before {os.getloadavg()[0]:.2f}")
    rows, timing = [], []
    for numerics, repack in settings:
        label = numerics if numerics == "exact" else f"ggml, repack {repack}"
        p = _run_child(a, numerics, repack, "prefill")
        d = _run_child(a, numerics, repack, "decode")
        base = p["rss"]["import"]["VmRSS"]
        for point in POINTS:
            s = p["rss"][point]
            rows.append((label, point, s["VmRSS"], s["RssFile"], s["RssAnon"], s["VmHWM"],
                         s["VmRSS"] / size_mb, (s["VmRSS"] - base) / size_mb))
        t, u = p["times"], d["times"]
        timing.append((label, p["load_s"], t["prefill0"] * 1e3, t["prefill1"] * 1e3,
                       u["decode0"] * 1e3, u["decode1"] * 1e3,
                       max(p["load_avg"][0], d["load_avg"][0])))
    print("\n| setting | after | VmRSS | RssFile | RssAnon | VmHWM | x file | over import, x file |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for label, point, rss, file_, anon, hwm, x, over in rows:
        print(f"| {label} | {point} | {rss:.0f} | {file_:.0f} | {anon:.0f} | {hwm:.0f} | "
              f"{x:.2f} | {over:.2f} |")
    print("\n| setting | load s | first prefill ms | second | ratio | first decode step ms | "
          "second | ratio | load average |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, load_s, p0, p1, d0, d1, load_avg in timing:
        print(f"| {label} | {load_s:.2f} | {p0:.0f} | {p1:.0f} | {p0 / p1:.2f} | {d0:.1f} | "
              f"{d1:.1f} | {d0 / d1:.2f} | {load_avg:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
