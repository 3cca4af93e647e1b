"""muser-torch against llama.cpp on the CPU, side by side on one GGUF, in one
command; prints one markdown report with ratios.

1. Builds llama.cpp's ``llama-bench`` (and its shared ggml libraries) for this
   CPU outside the repository (``--build``, default /root/lcpp-cpu-build;
   kept between runs). CPU features are read from /proc/cpuinfo and named one
   by one, AMX off (``-march=native`` turns on AMX, whose instructions are
   illegal on some VMs); ``--native`` builds with GGML_NATIVE instead.
2. For ``--rounds`` rounds, alternating which goes first: ``llama-bench -p P
   -n N -t T1,T2 -r 1`` (prompt processing of P tokens, generation of N), and
   in this process muser's prefill of the same P tokens (warm: the second call
   of the round) and N greedy decode steps after two warm-up steps, at each
   thread count in both numerics (``exact``, ``ggml``). Medians over rounds.
3. muser's host overhead per decode step (torch.profiler, the last round).
4. The small-shape kernel table: muser's QLinear (both numerics) against the
   built ggml's own ``mul_mat`` (``bench/against_ggml.py``), one token, at
   the first thread count.

    python tools/cpu_side_by_side.py LLAMA_SRC MODEL.gguf               # the lead's run
    python tools/cpu_side_by_side.py - MODEL.gguf --no-llama --rounds 1 --prompt-len 32 --decode 8

LLAMA_SRC is llama.cpp's source (``/work/shared/tools/peers/fetch_llamacpp.sh``);
``-`` with ``--no-llama`` skips llama.cpp (the kernel table then uses
libggml-python's ggml). About 5 minutes on a quiet 16-core machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NUMERICS = ("exact", "ggml")
# /proc/cpuinfo flag -> llama.cpp's CMake option (as /work/shared/tools/peers/llamacpp_cpu_bench.sh)
CPU_FLAGS = {"avx": "GGML_AVX", "avx2": "GGML_AVX2", "fma": "GGML_FMA", "f16c": "GGML_F16C",
             "bmi2": "GGML_BMI2", "avx512f": "GGML_AVX512", "avx512_vnni": "GGML_AVX512_VNNI",
             "avx512vbmi": "GGML_AVX512_VBMI", "avx512_bf16": "GGML_AVX512_BF16",
             "avx_vnni": "GGML_AVX_VNNI"}


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def build_llama(src: Path, build: Path, native: bool) -> tuple[Path, str]:
    """llama-bench built in ``build`` (reused when present) and how it was configured."""
    flags = set(Path("/proc/cpuinfo").read_text().split())
    if native:
        opts = ["-DGGML_NATIVE=ON"]
    else:
        opts = ["-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF",
                "-DGGML_AMX_BF16=OFF"]
        opts += [f"-D{opt}={'ON' if flag in flags else 'OFF'}" for flag, opt in CPU_FLAGS.items()]
    how = "GGML_NATIVE" if native else "+".join(f for f in CPU_FLAGS if f in flags) + ", no AMX"
    bench = build / "bin" / "llama-bench"
    if not bench.exists():
        subprocess.run(["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                        "-DGGML_CUDA=OFF", "-DBUILD_SHARED_LIBS=ON", *opts, "-DLLAMA_CURL=OFF",
                        "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                        "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF"],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", str(build), "--target", "llama-bench", "-j",
                        str(os.cpu_count() or 2)], check=True, stdout=subprocess.DEVNULL)
    return bench, how


def llama_round(bench: Path, model: Path, threads: list[int], prompt: int, decode: int) -> dict:
    """{(threads, "pp" | "tg"): tok/s} of one llama-bench run."""
    out = subprocess.run([str(bench), "-m", str(model), "-p", str(prompt), "-n", str(decode),
                          "-t", ",".join(map(str, threads)), "-r", "1", "-o", "json"],
                         check=True, capture_output=True, text=True).stdout
    got = {}
    for rec in json.loads(out[out.find("["):out.rfind("]") + 1]):   # the JSON array, whatever precedes it
        kind = "pp" if rec["n_prompt"] and not rec["n_gen"] else "tg"
        got[(rec["n_threads"], kind)] = rec["avg_ts"]
    return got


class Muser:
    """The model loaded once; one measurement per (threads, numerics) per round."""

    def __init__(self, path: Path, prompt: int, decode: int) -> None:
        import muser_torch
        self.model = muser_torch.from_gguf(path, dtype=torch.float32)
        self.prompt_len, self.decode = prompt, decode
        self.model.setup_cache(1, prompt + decode + 2)
        gen = torch.Generator().manual_seed(0)
        self.prompt = torch.randint(0, self.model.config.vocab_size, (1, prompt), generator=gen)
        self.slots = torch.tensor([0])

    def _set(self, threads: int, numerics: str) -> None:
        from muser_torch.nn import set_numerics
        torch.set_num_threads(threads)
        set_numerics(self.model, numerics)
        self.model.reset()

    def round(self, threads: int, numerics: str) -> dict:
        from muser_torch.bench.model import measure
        self._set(threads, numerics)
        with torch.no_grad():
            t, _ = measure(self.model, self.prompt, self.slots, self.decode, 2, prefill_reps=1)
        return {"pp": self.prompt_len / t.prefill_s, "tg": self.decode / t.decode_s}

    def host_overhead(self, threads: int, numerics: str) -> tuple[float, float]:
        """(host share of a decode step, recorded ops per step)."""
        from muser_torch.bench.model import profile_steps
        self._set(threads, numerics)
        with torch.no_grad():
            logits = self.model(self.prompt[:, :8], self.slots)
            tok = logits[:, -1].argmax(-1, keepdim=True)
            self.model(tok, self.slots)
            prof = profile_steps(lambda: self.model(tok, self.slots), torch.device("cpu"))
        return prof.host_share, prof.ops_per_step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("llama_src", help="llama.cpp's source folder ('-' with --no-llama)")
    ap.add_argument("model", type=Path, help="the GGUF (e.g. Gemma 3 270M Q4_K_M)")
    ap.add_argument("--build", type=Path, default=Path("/root/lcpp-cpu-build"))
    ap.add_argument("--native", action="store_true", help="build llama.cpp with GGML_NATIVE")
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--no-llama", action="store_true", help="muser only (no build, no llama-bench)")
    args = ap.parse_args()
    if not args.model.is_file():
        raise SystemExit(f"cpu_side_by_side: {args.model} is not a file")
    if args.rounds < 1 or min(args.threads) < 1 or args.prompt_len < 1 or args.decode < 1:
        raise SystemExit("cpu_side_by_side: --rounds, --threads, --prompt-len and --decode must be >= 1")
    start = time.perf_counter()
    bench, how = None, "(llama.cpp not run)"
    if not args.no_llama:
        bench, how = build_llama(Path(args.llama_src), args.build, args.native)
    built = time.perf_counter()
    muser = Muser(args.model, args.prompt_len, args.decode)
    lcpp: dict = {}
    ours: dict = {}
    for r in range(args.rounds):
        def run_llama():
            if bench is not None:
                for k, v in llama_round(bench, args.model, args.threads, args.prompt_len,
                                        args.decode).items():
                    lcpp.setdefault(k, []).append(v)

        def run_muser():
            for t in args.threads:
                for n in NUMERICS:
                    for kind, v in muser.round(t, n).items():
                        ours.setdefault((t, n, kind), []).append(v)
        for part in ((run_llama, run_muser) if r % 2 == 0 else (run_muser, run_llama)):
            part()
        print(f"round {r + 1}/{args.rounds} done ({time.perf_counter() - start:.0f} s)",
              file=sys.stderr, flush=True)
    host = {(t, n): muser.host_overhead(t, n) for t in args.threads for n in NUMERICS}

    med = {k: statistics.median(v) for k, v in (lcpp | ours).items()}
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    P, N = args.prompt_len, args.decode
    print(f"\n### {args.model.name}: muser-torch {commit} against llama.cpp, CPU\n")
    print(f"{cpu_name()}, {os.cpu_count()} CPUs; llama.cpp built with {how}; "
          f"median of {args.rounds} interleaved rounds; ratio = muser / llama.cpp "
          f"(>= 1.0: muser as fast or faster); host overhead from torch.profiler over 8 decode steps\n")
    print(f"| threads | numerics | llama.cpp tg{N} tok/s | muser decode tok/s | ratio "
          f"| llama.cpp pp{P} tok/s | muser prefill tok/s | ratio | muser host overhead (ops per step) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for t in args.threads:
        for n in NUMERICS:
            tg, pp = med[(t, n, "tg")], med[(t, n, "pp")]
            ltg, lpp = med.get((t, "tg")), med.get((t, "pp"))
            cell = (lambda mine, theirs: f"{theirs:.1f} | {mine:.1f} | {mine / theirs:.2f}"
                    if theirs else f"- | {mine:.1f} | -")
            share, ops = host[(t, n)]
            print(f"| {t} | {n} | {cell(tg, ltg)} | {cell(pp, lpp)} | {share:.1%} ({ops:.0f}) |")
    timed = time.perf_counter()

    from muser_torch.bench.against_ggml import CALL_COST, GEMMA3_270M, run
    from muser_torch.bench.ops import read_bandwidth
    lib_dir = args.build / "bin" if bench is not None else None
    if lib_dir is not None and not (lib_dir / "libggml-cpu.so").exists():
        lib_dir = None
    print("\nkernel table (stderr carries its log):", file=sys.stderr)
    stdout, sys.stdout = sys.stdout, sys.stderr
    try:
        rows = run(args.threads[0], (1,), None, None if lib_dir is None else str(lib_dir), 5, 0,
                   read_bandwidth, CALL_COST + GEMMA3_270M)
    finally:
        sys.stdout = stdout
    which = f"llama.cpp's build in {lib_dir}" if lib_dir else "libggml-python's AVX2 build"
    print(f"\nOne token, {args.threads[0]} threads, ggml's `mul_mat` ({which}) against muser's "
          f"QLinear (a Python call each; inside a decode step muser calls them from C) and, last, "
          f"the op through torch's dispatcher; 640->8 is a call's fixed cost; median of >= 5 "
          f"interleaved rounds; ratio = muser / ggml time (<= 1.0: muser as fast)\n")
    print("| type | n_in->n_out | ggml us | muser ggml us | ratio | muser exact us | ratio "
          "| op (dispatcher) us |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['type']} | {r['n_in']}->{r['n_out']} | {r['ggml_s'] * 1e6:.1f} | "
              f"{r['muser_s'] * 1e6:.1f} | {r['muser_s'] / r['ggml_s']:.2f} | "
              f"{r['exact_s'] * 1e6:.1f} | {r['exact_s'] / r['ggml_s']:.2f} | "
              f"{r['op_s'] * 1e6:.1f} |")
    end = time.perf_counter()
    print(f"\n(build {built - start:.0f} s, models {timed - built:.0f} s, kernels {end - timed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
