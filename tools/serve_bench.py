"""Throughput of an OpenAI-compatible server at 1, 4 and 8 concurrent clients.

    python tools/serve_bench.py --url http://127.0.0.1:8080/v1 [--clients 1,4,8]
        [--requests 8] [--max-tokens 128] [--prompt TEXT] [--chat] [--warmup 1]

Each client sends ``--requests`` greedy requests one after another; all
clients of a row run at once. A row prints the generated tokens (the
server's own usage counts), the wall time, the aggregate decode rate
(tok/s) and the mean and worst request latency. The same command against
``muser-torch serve FILE`` and ``llama-server -m FILE --parallel 8`` on the
same file compares the two (``"ignore_eos": true`` is sent, which
llama-server honours so that every request makes ``--max-tokens``;
muser-torch ignores unknown fields). Needs the ``openai`` package.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import openai


def one_request(client: openai.OpenAI, args: argparse.Namespace) -> tuple[int, float]:
    """Generated tokens and seconds of one request."""
    start = time.perf_counter()
    kw = dict(model=args.model, max_tokens=args.max_tokens, temperature=0,
              extra_body={"ignore_eos": True})
    if args.chat:
        res = client.chat.completions.create(messages=[{"role": "user", "content": args.prompt}],
                                             **kw)
    else:
        res = client.completions.create(prompt=args.prompt, **kw)
    return res.usage.completion_tokens, time.perf_counter() - start


def run_row(client: openai.OpenAI, clients: int, args: argparse.Namespace) -> dict:
    def client_loop(_: int) -> list[tuple[int, float]]:
        return [one_request(client, args) for _ in range(args.requests)]

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        done = [r for rows in pool.map(client_loop, range(clients)) for r in rows]
    wall = time.perf_counter() - start
    tokens = sum(n for n, _ in done)
    latencies = [s for _, s in done]
    return {"clients": clients, "requests": len(done), "tokens": tokens, "wall_s": wall,
            "tok_s": tokens / wall, "mean_s": statistics.fmean(latencies), "max_s": max(latencies)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080/v1", help="the API's base URL")
    p.add_argument("--model", default=None, help="model id (default: the server's first)")
    p.add_argument("--clients", default="1,4,8", help="concurrent clients per row")
    p.add_argument("--requests", type=int, default=8, help="requests per client")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt", default="Write a short story about a lighthouse keeper.")
    p.add_argument("--chat", action="store_true", help="chat completions (default: completions)")
    p.add_argument("--warmup", type=int, default=1, help="requests sent first and not counted")
    args = p.parse_args(argv)
    rows = [int(c) for c in args.clients.split(",")]
    if min(rows) < 1 or args.requests < 1 or args.max_tokens < 1:
        p.error("--clients, --requests and --max-tokens must be >= 1")
    client = openai.OpenAI(base_url=args.url, api_key="unused", max_retries=0, timeout=3600)
    args.model = args.model or client.models.list().data[0].id
    for _ in range(args.warmup):
        one_request(client, args)
    print(f"{args.url} model {args.model}: {args.requests} requests per client, "
          f"max_tokens {args.max_tokens}, {'chat' if args.chat else 'completions'}")
    print(f"{'clients':>7} {'requests':>8} {'tokens':>7} {'wall s':>8} {'tok/s':>8} "
          f"{'mean s':>7} {'max s':>7}")
    for c in rows:
        r = run_row(client, c, args)
        print(f"{r['clients']:>7} {r['requests']:>8} {r['tokens']:>7} {r['wall_s']:>8.2f} "
              f"{r['tok_s']:>8.1f} {r['mean_s']:>7.2f} {r['max_s']:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
