"""What a JSON-schema mask costs per token beside a decode step, in one run.

    python tools/schema_bench.py FILE.gguf [--steps 40] [--threads N]

Greedy decoding of a chat answer under a nested schema (tests/serve/test_structured.py's),
one token at a time: the mask (llguidance's bitmask, unpacked and applied to the logits
row) and the decode step are timed apart; prints their medians and the ratio.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from muser_torch.models import from_gguf  # noqa: E402
from muser_torch.serve.grammar import Grammars  # noqa: E402
from muser_torch.serve.prompts import chat_prompt  # noqa: E402
from muser_torch.text.chat_limits import ChatLimits  # noqa: E402
from tests.serve.test_structured import NESTED  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file", type=Path)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = from_gguf(args.file)
    tok = model.tokenizer
    t0 = time.perf_counter()
    grammars = Grammars(tok, model.config.vocab_size)
    constraint = grammars.constraint(json.dumps(NESTED))
    build_s = time.perf_counter() - t0
    ids = chat_prompt(tok, [{"role": "user", "content": "Describe a point as JSON."}], ChatLimits())[0]
    model.setup_cache(1, len(ids) + args.steps + 1)
    slot = torch.tensor([0])
    mask_s, step_s = [], []
    with torch.no_grad():
        logits = model(torch.tensor([ids]), slot, last_only=True)[:, -1]
        for _ in range(args.steps):
            t0 = time.perf_counter()
            masked = constraint.mask(logits)
            mask_s.append(time.perf_counter() - t0)
            token = int(masked.argmax(-1))
            if token in tok.stop_ids:
                break
            constraint.take(token)
            t0 = time.perf_counter()
            logits = model(torch.tensor([[token]]), slot)[:, -1]
            step_s.append(time.perf_counter() - t0)
    m, s = statistics.median(mask_s), statistics.median(step_s)
    print(f"{args.file.name}: vocabulary {model.config.vocab_size:,}, {torch.get_num_threads()} threads; "
          f"token bytes and the schema compiled in {build_s:.2f} s")
    print(f"  per token: mask {m * 1e3:.2f} ms, decode step {s * 1e3:.2f} ms, "
          f"ratio {m / s:.3f} (medians of {len(step_s)} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
