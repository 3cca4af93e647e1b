"""Decode beside busy processes: is the default thread count ever slower than
one thread? (issue 45: a user saw Gemma fall from 24.3 tok/s at ``--threads 1``
to 6.0 at the default 2 beside other multi-threaded work.)

Starts ``--busy`` spinning processes at the same priority as ours, then for
``--rounds`` rounds (the order alternating) times ``muser-torch bench model``'s
greedy decode at one thread and at the default thread count, each in a fresh
process. Prints the medians and their ratio, with the load average seen.

    python tools/contention.py MODEL.gguf [--busy 2] [--rounds 5] [--decode 48] [--numerics ggml]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

import torch

DECODE = re.compile(r"decode\s+\d+ steps\s+x 1:\s+([\d.]+) tok/s")


def decode_rate(model: str, threads: int, decode: int, numerics: str) -> float:
    out = subprocess.run([sys.executable, "-m", "muser_torch.cli", "bench", "model", model, "--numerics", numerics,
                          "--prompt-len", "16", "--decode", str(decode), "--threads", str(threads)],
                         capture_output=True, text=True, check=True).stdout
    match = DECODE.search(out)
    if match is None:
        raise RuntimeError(f"no decode rate in bench model's output:\n{out}")
    return float(match.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="spinning processes beside ours")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--decode", type=int, default=48)
    ap.add_argument("--numerics", choices=("exact", "ggml"), default="ggml")
    args = ap.parse_args()
    default = torch.get_num_threads()
    if default == 1:
        raise SystemExit("the default thread count here is 1: nothing to compare")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    rates: dict[int, list[float]] = {1: [], default: []}
    loads = []
    try:
        for r in range(args.rounds):
            for threads in ((1, default) if r % 2 == 0 else (default, 1)):
                rates[threads].append(decode_rate(args.model, threads, args.decode, args.numerics))
                loads.append(os.getloadavg()[0])
    finally:
        for p in busy:
            p.kill()
    one, many = statistics.median(rates[1]), statistics.median(rates[default])
    print(f"{args.model}, {args.numerics} numerics, beside {args.busy} spinning processes, "
          f"{args.rounds} rounds, load {min(loads):.1f}-{max(loads):.1f}\n")
    print("| threads | decode tok/s (median) | rounds |\n|---:|---:|---|")
    for threads, got in rates.items():
        print(f"| {threads} | {statistics.median(got):.1f} | {', '.join(f'{x:.1f}' for x in got)} |")
    print(f"\ndefault ({default} threads) / one thread: {many / one:.2f}")


if __name__ == "__main__":
    main()
