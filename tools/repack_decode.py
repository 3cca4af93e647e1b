"""Whole-model decode and prefill in the ggml numerics, the repacked kernels
(ops/cpu/packed.py) on and off, in one process, interleaved rounds.

The model is loaded once; each round runs both settings in turn (the order
alternating): a warm prefill of --prompt-len tokens into a reset cache, two
untimed decode steps, then --decode timed greedy steps. At one thread the
times are this thread's CPU time (the library's pool is not used), so other
jobs on a shared host are not counted; at more threads, wall time. It also
checks that both settings give the same logits bit for bit (the repack
changes no arithmetic), and prints the process's peak RSS beside the file.

    python tools/repack_decode.py FILE [--threads 1] [--rounds 5] [--decode 32] [--prompt-len 64]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import muser_torch  # noqa: E402
from muser_torch.nn import set_numerics, set_repack  # noqa: E402
from muser_torch.ops.cpu import packed as cpu_packed  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    clock = time.thread_time if a.threads == 1 else time.perf_counter
    model = muser_torch.from_gguf(a.file, dtype=torch.float32)
    set_numerics(model, "ggml")
    model.setup_cache(1, a.prompt_len + a.decode + 4)
    prompt = torch.randint(0, model.config.vocab_size, (1, a.prompt_len),
                           generator=torch.Generator().manual_seed(0))
    slots = torch.tensor([0])
    print(f"{a.file.name}: ggml numerics, {a.threads} threads, clock "
          f"{'thread CPU' if a.threads == 1 else 'wall'}, packed ISA {cpu_packed.isa_name()}, "
          f"load {os.getloadavg()}")

    def one(flag: bool) -> tuple[float, float, torch.Tensor]:
        set_repack(flag)
        model.reset()
        model(prompt, slots)                     # the first call (a repack is made here)
        model.reset()
        t0 = clock()
        logits = model(prompt, slots)
        pp = a.prompt_len / (clock() - t0)
        tok = logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(2):
            tok = model(tok, slots)[:, -1].argmax(-1, keepdim=True)
        t0 = clock()
        for _ in range(a.decode):
            last = model(tok, slots)
            tok = last[:, -1].argmax(-1, keepdim=True)
        return pp, a.decode / (clock() - t0), torch.cat([logits[:, -1], last[:, -1]])

    res = {False: [], True: []}
    with torch.no_grad():
        for r in range(a.rounds):
            for flag in ((False, True) if r % 2 == 0 else (True, False)):
                pp, tg, logits = one(flag)
                res[flag].append((pp, tg, logits))
    same = all(torch.equal(x[2].view(torch.int32), y[2].view(torch.int32))
               for x, y in zip(res[False], res[True]))
    print("| setting | prefill tok/s (median, range) | decode tok/s (median, range) |")
    print("|---|---|---|")
    for flag, name in ((False, "row layout (before)"), (True, "repacked (after)")):
        pp, tg = [x[0] for x in res[flag]], [x[1] for x in res[flag]]
        print(f"| {name} | {statistics.median(pp):.1f} ({min(pp):.1f}-{max(pp):.1f}) "
              f"| {statistics.median(tg):.1f} ({min(tg):.1f}-{max(tg):.1f}) |")
    ratios_tg = [y[1] / x[1] for x, y in zip(res[False], res[True])]
    ratios_pp = [y[0] / x[0] for x, y in zip(res[False], res[True])]
    print(f"same-round ratio after/before, median: decode {statistics.median(ratios_tg):.2f}, "
          f"prefill {statistics.median(ratios_pp):.2f}")
    print(f"logits equal bit for bit (prefill's last and the last step's, every round): {same}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"peak RSS {rss / 1e6:.0f} MB, file {a.file.stat().st_size / 1e6:.0f} MB; "
          f"load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
