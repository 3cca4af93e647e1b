"""Where one decode token's GPU time goes (CUDA): every kernel of an eager
decode step, with launches and GPU microseconds per token, after a prompt
(``--prefill``: of the prompt's prefill instead).

    python tools/decode_kernels.py FILE.gguf|seed [--prompt 512] [--steps 8] [--top 25] [--prefill]

``seed`` is Muse Glimmer's full 52-layer geometry with random packed weights
made on the GPU (``bench model seed``). Prints kernels per token and per
layer, GPU-busy time, and the shares of the quantized matmuls, attention and
everything else."""
from __future__ import annotations

import argparse
import collections
import time
from dataclasses import replace

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

MATMUL = ("qmm", "_mv_", "_i8_", "quantize_x", "permute_x", "_mm_q45k")
ATTENTION = ("attn", "sdpa", "flash", "fmha")


def load(what: str):
    from muser_torch.models import Glimmer, from_gguf
    if what == "seed":
        from muser_torch.arch.muse_glimmer import reference_pattern
        from muser_torch.tiny import SEED_CONFIG
        cfg = replace(SEED_CONFIG, sliding_window_pattern=reference_pattern(SEED_CONFIG.n_layers))
        return Glimmer.random(cfg, device="cuda", dtype=torch.float16, seed=0)
    return from_gguf(what, device=torch.device("cuda"), dtype=torch.float16)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--prefill", action="store_true",
                    help="profile the prompt's prefill (one call, into a fresh cache) instead")
    a = ap.parse_args()
    m = load(a.model)
    c = m.config
    m.setup_cache(1, a.prompt + a.steps + 8)
    slots = torch.arange(1, device="cuda")
    prompt = torch.randint(0, c.vocab_size, (1, a.prompt), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        tok = m(prompt.cuda(), slots)[:, -1].argmax(-1, keepdim=True)
        for _ in range(3):
            tok = m(tok, slots)[:, -1].argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(a.steps):
                if a.prefill:
                    m.reset()
                    m(prompt.cuda(), slots, last_only=True)
                else:
                    tok = m(tok, slots)[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / a.steps
    k = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            k[e.name][0] += 1
            k[e.name][1] += getattr(e, "device_time_total", 0.0)
    n = a.steps
    launches = sum(v[0] for v in k.values()) / n
    busy = sum(v[1] for v in k.values()) / n

    def share(keys):
        return sum(t for name, (_, t) in k.items() if any(s in name.lower() for s in keys)) / n
    mm, att = share(MATMUL), share(ATTENTION)
    what = f"per {a.prompt}-token prefill" if a.prefill else "per token"
    print(f"{a.model}: {c.n_layers} layers; {what}: {launches:.0f} kernels "
          f"({launches / c.n_layers:.1f} per layer), GPU busy {busy:.0f} us, wall {wall * 1e6:.0f} us "
          f"(profiled, eager); quantized matmuls {mm:.0f} us ({mm / busy:.0%}), attention {att:.0f} us "
          f"({att / c.n_layers:.1f} us per layer), everything else {busy - mm - att:.0f} us "
          f"({(busy - mm - att) / busy:.0%})")
    print(f"  {'kernel':70} {'per tok':>7} {'us/tok':>8} {'share':>6}")
    for name, (cnt, t) in sorted(k.items(), key=lambda kv: -kv[1][1])[:a.top]:
        print(f"  {name[:70]:70} {cnt / n:7.1f} {t / n:8.1f} {t / n / busy:6.1%}")


if __name__ == "__main__":
    main()
