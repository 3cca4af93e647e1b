"""Time to first token of a second chat turn with prompt-prefix reuse against
the same turn sent cold, in one run (``serve``'s scheduler, no HTTP).

    python tools/prefix_bench.py FILE.gguf [--tokens 2000] [--device cpu] [--threads N] [--rounds 3]

Turn 1 is a user message of about ``--tokens`` tokens of tools/data/perplexity-text.txt
and a greedy answer of 32 tokens; turn 2 adds that answer and a short question.
"reused" sends turn 2 to the scheduler that served turn 1 (its slot holds turn 1),
"cold" to a fresh scheduler. Each row is the median of ``--rounds``; the ratio is
reused / cold. Prints ``cached_tokens`` as ``usage`` reports it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from muser_torch.models import from_gguf  # noqa: E402
from muser_torch.serve.prompts import chat_prompt  # noqa: E402
from muser_torch.serve.sampling import SamplingParams  # noqa: E402
from muser_torch.serve.scheduler import Failure, Finish, Job, Piece, Scheduler  # noqa: E402
from muser_torch.text.chat_limits import ChatLimits  # noqa: E402

TEXT = ROOT / "tools" / "data" / "perplexity-text.txt"


class FirstToken:
    """A job's sink: when its first token came, its text, and its end."""

    def __init__(self):
        self.start = time.perf_counter()
        self.first: float | None = None
        self.tokens: list[int] = []
        self.end: Finish | None = None
        self.done = threading.Event()

    def __call__(self, ev) -> None:
        if isinstance(ev, Piece) and ev.tokens and self.first is None:
            self.first = time.perf_counter()
        if isinstance(ev, Piece):
            self.tokens += ev.tokens
        if isinstance(ev, (Finish, Failure)):
            self.end = ev if isinstance(ev, Finish) else None
            self.done.set()


def ask(sched: Scheduler, ids: list[int], n: int) -> FirstToken:
    sink = FirstToken()
    sched.submit(Job(ids, SamplingParams(max_tokens=n, temperature=0.0), sink))
    if not sink.done.wait(600) or sink.end is None:
        raise SystemExit("the job failed or hung")
    return sink


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file", type=Path)
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = from_gguf(args.file, device=args.device)
    tok = model.tokenizer
    words = TEXT.read_text().split()
    user = " ".join(words[:int(args.tokens * 0.43)])   # about 2.3 Gemma tokens a word here
    turn1 = [{"role": "user", "content": user}]
    ids1 = chat_prompt(tok, turn1, ChatLimits())[0]
    context = len(ids1) + 256
    reused_s, cold_s, cached = [], [], None
    for _ in range(args.rounds):
        warm = Scheduler(model, 1, 4, context)
        warm.start()
        answer = tok.decode([t for t in ask(warm, ids1, 32).tokens if t not in tok.stop_ids])
        turn2 = turn1 + [{"role": "assistant", "content": answer},
                         {"role": "user", "content": "Summarise that in one line."}]
        ids2 = chat_prompt(tok, turn2, ChatLimits())[0]
        again = ask(warm, ids2, 1)
        warm.stop()
        cold = Scheduler(model, 1, 4, context)
        cold.start()
        fresh = ask(cold, ids2, 1)
        cold.stop()
        reused_s.append(again.first - again.start)
        cold_s.append(fresh.first - fresh.start)
        cached = again.end.cached_tokens
        assert again.tokens == fresh.tokens, "the reused turn answered differently"
    r, c = statistics.median(reused_s), statistics.median(cold_s)
    print(f"{args.file.name} on {args.device}, {torch.get_num_threads()} threads: turn 2 has "
          f"{len(ids2)} prompt tokens, {cached} reused")
    print(f"  time to first token: reused {r * 1e3:.1f} ms, cold {c * 1e3:.1f} ms, "
          f"ratio {r / c:.3f} (median of {args.rounds})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
