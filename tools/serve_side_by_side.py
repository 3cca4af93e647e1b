"""``muser-torch serve`` and llama.cpp's ``llama-server`` on the same GGUF,
one after the other, driven by the same clients (``tools/serve_bench.py``):
aggregate decode tok/s at 1, 4 and 8 concurrent clients and the ratio.

    python tools/serve_side_by_side.py --llama-server BUILD/bin/llama-server FILE.gguf
        [--device cpu|cuda] [--threads N] [--slots 8] [--clients 1,4,8]
        [--requests 4] [--max-tokens 64] [--rounds 1] [--json OUT.json]

Each server gets ``--slots`` parallel sequences (``llama-server --parallel``)
of the same context per slot, the same thread count, greedy requests with
``ignore_eos`` (every request makes ``--max-tokens``; muser-torch ignores
the field, so a request it ends early at the end-of-turn token counts only
the tokens it made: tok/s counts the servers' own ``usage``). With
``--rounds`` > 1 the two servers alternate and each row reports the median.
Run it on a quiet machine: each server has the CPU (or GPU) to itself.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_bench import one_request, run_row  # noqa: E402

START_S = 600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, what: str) -> None:
    end = time.monotonic() + START_S
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited {proc.returncode} before it served")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if json.loads(r.read()).get("status") == "ok":
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"{what} did not answer /health within {START_S:g} s")


def commands(args: argparse.Namespace, port: int) -> dict[str, list[str]]:
    ctx = args.ctx_size
    return {
        "muser-torch": [sys.executable, "-m", "muser_torch.cli", "serve", str(args.file),
                        "--port", str(port), "--device", args.device, "--slots", str(args.slots),
                        "--ctx-size", str(ctx), "--threads", str(args.threads)],
        "llama-server": [str(args.llama_server), "-m", str(args.file), "--port", str(port),
                         "--parallel", str(args.slots), "-c", str(ctx * args.slots),
                         "-t", str(args.threads), "-tb", str(args.threads), "--no-webui",
                         *(["-ngl", "999"] if args.device == "cuda" else ["-ngl", "0"])],
    }


def measure(name: str, argv: list[str], port: int, args: argparse.Namespace) -> list[dict]:
    url = f"http://127.0.0.1:{port}"
    with open(os.devnull, "wb") as quiet:
        proc = subprocess.Popen(argv, stdout=quiet, stderr=quiet)
    try:
        wait_healthy(url, proc, name)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=3600)
        args.model = client.models.list().data[0].id
        one_request(client, args)     # warm-up: first-call compiles and caches
        return [run_row(client, c, args) for c in args.rows]
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("file", type=Path)
    p.add_argument("--llama-server", type=Path, required=True)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--ctx-size", type=int, default=512, help="tokens per slot")
    p.add_argument("--clients", default="1,4,8")
    p.add_argument("--requests", type=int, default=4, help="requests per client")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt", default="Write a short story about a lighthouse keeper.")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    args.rows = [int(c) for c in args.clients.split(",")]
    args.chat = False
    if not args.file.is_file() or not args.llama_server.is_file():
        p.error(f"need an existing FILE and --llama-server ({args.file}, {args.llama_server})")
    if min(args.rows) < 1 or min(args.requests, args.max_tokens, args.rounds, args.slots) < 1:
        p.error("--clients, --requests, --max-tokens, --rounds and --slots must be >= 1")
    results: dict[str, list[list[dict]]] = {"muser-torch": [], "llama-server": []}
    for _ in range(args.rounds):
        for name in results:
            port = free_port()
            results[name].append(measure(name, commands(args, port)[name], port, args))
    print(f"{args.file.name} on {args.device}, {args.threads} threads, {args.slots} slots, "
          f"{args.requests} requests per client of {args.max_tokens} tokens, "
          f"median of {args.rounds} round(s)")
    print("| clients | llama-server tok/s | muser-torch tok/s | ratio | llama-server mean s | "
          "muser-torch mean s |")
    print("|---:|---:|---:|---:|---:|---:|")
    table = []
    for i, c in enumerate(args.rows):
        med = {n: {k: statistics.median(r[i][k] for r in rs) for k in ("tok_s", "mean_s")}
               for n, rs in results.items()}
        ratio = med["muser-torch"]["tok_s"] / med["llama-server"]["tok_s"]
        table.append({"clients": c, **{f"{n}_{k}": v for n, d in med.items() for k, v in d.items()},
                      "ratio": ratio})
        print(f"| {c} | {med['llama-server']['tok_s']:.1f} | {med['muser-torch']['tok_s']:.1f} | "
              f"{ratio:.2f} | {med['llama-server']['mean_s']:.2f} | {med['muser-torch']['mean_s']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "rows": table, "raw": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
