"""A soak of ``muser-torch serve`` run as the command (a child process on the
bundled demo, 127.0.0.1, a free port): 200 requests from 8 concurrent
clients, whole and streamed, chat and text, few tokens each. None may be
lost, and the server's resident memory may not grow by more than
``RSS_GROWTH`` from after the first 40 to the end. Then Ctrl-C ends it
cleanly (exit 130, the CLI's answer to Ctrl-C). Counts and bytes are the verdicts; wall time is only a hang guard."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import psutil

from muser_torch.run import DEMO

from .harness import HANG_S, wait_until

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = 8
WARMUP, TOTAL = 40, 200
MAX_TOKENS = 3
RSS_GROWTH = 100 << 20


def _ask(client: openai.OpenAI, i: int) -> tuple[str, int]:
    """Request ``i`` of the soak, of one of four kinds; its finish reason and tokens."""
    kw = dict(model="demo", max_tokens=MAX_TOKENS, temperature=0.7, seed=i)
    messages = [{"role": "user", "content": f"request {i}"}]
    kind = i % 4
    if kind == 0:
        res = client.completions.create(prompt=f"def f{i}(", **kw)
        return res.choices[0].finish_reason, res.usage.completion_tokens
    if kind == 1:
        res = client.chat.completions.create(messages=messages, **kw)
        return res.choices[0].finish_reason, res.usage.completion_tokens
    create = client.completions.create if kind == 2 else client.chat.completions.create
    arg = {"prompt": f"x{i} = "} if kind == 2 else {"messages": messages}
    chunks = list(create(stream=True, stream_options={"include_usage": True}, **arg, **kw))
    return chunks[-2].choices[0].finish_reason, chunks[-1].usage.completion_tokens


def test_soak_loses_nothing_and_keeps_memory_flat(tmp_path):
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "muser_torch.cli", "serve",
                                 str(DEMO["q4_k_xl"]), "--host", "127.0.0.1", "--port", "0",
                                 "--slots", "4", "--queue", str(TOTAL), "--ctx-size", "128"],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                # Ctrl-C as in a terminal, even under a suite run with SIGINT ignored
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_until(lambda: "Application startup complete" in log_path.read_text()
                   or proc.poll() is not None, "the server's start")
        url = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", log_path.read_text())
        assert url and proc.poll() is None, log_path.read_text()
        client = openai.OpenAI(base_url=url.group(1) + "/v1", api_key="unused", max_retries=0,
                               timeout=HANG_S)
        server = psutil.Process(proc.pid)
        with ThreadPoolExecutor(CLIENTS) as pool:
            results = list(pool.map(lambda i: _ask(client, i), range(WARMUP)))
            before = server.memory_info().rss
            results += list(pool.map(lambda i: _ask(client, i), range(WARMUP, TOTAL)))
            after = server.memory_info().rss
        assert len(results) == TOTAL
        for i, (reason, n) in enumerate(results):
            assert reason in ("length", "stop") and 1 <= n <= MAX_TOKENS, f"request {i}"
            assert reason == "stop" or n == MAX_TOKENS, f"request {i}"
        print(f"server RSS {before / 2**20:.1f} MiB after {WARMUP}, {after / 2**20:.1f} MiB "
              f"after {TOTAL}")
        assert after - before < RSS_GROWTH, f"RSS grew {(after - before) / 2**20:.1f} MiB"
        health = httpx.get(url.group(1) + "/health").json()
        assert health == {"status": "ok", "slots_idle": 4, "slots_processing": 0, "queued": 0}
        proc.send_signal(signal.SIGINT)     # Ctrl-C: a clean shutdown, the CLI's exit 130
        assert proc.wait(HANG_S) == 130, log_path.read_text()[-2000:]
        assert "Application shutdown complete" in log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
