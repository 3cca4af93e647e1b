"""Perplexity of GGUF files over this repository's README.md, and an
importance matrix recorded on the same text: the measurements behind
docs/types.md's "A real file" table.

    python tools/readme_perplexity.py perplexity FILE.gguf [FILE.gguf ...]
    python tools/readme_perplexity.py imatrix FILE.gguf OUT.imatrix.gguf

The text is ``tools/data/perplexity-text.txt``: this repository's README.md as
it stood when the table's first rows were measured (commit 9e2b586), kept as a
file so that every row scores the same tokens, in any checkout.

perplexity: the README's first 2,048 tokens as the file's tokenizer encodes it
(its BOS first), cut into 4 windows of 512; each window runs after a BOS of
its own through our float32 model, which scores all 512 of its tokens. Prints
the file's size in MB (10^6 bytes) and the perplexity.

imatrix: llama.cpp's importance matrix in its GGUF form (what ``llama-imatrix``
writes and ``llama-quantize --imatrix`` reads): for every projection of the
file, ``NAME.in_sum2`` (the sum over the same 4 windows' tokens of each input
column's square, ``[n_in, 1]`` f32) and ``NAME.counts`` (the token count,
``[1, 1]`` f32), with ``imatrix.datasets``, ``imatrix.chunk_count`` and
``imatrix.chunk_size``. The activations are those our float32 model computes
from the file's own weights, recorded at each QLinear's input, over the
README's next 2,048 tokens (4 windows after BOS, as llama-imatrix's chunks):
text the perplexity does not score.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TEXT = ROOT / "tools" / "data" / "perplexity-text.txt"
TOKENS = 2048
WINDOW = 512
# The imatrix is recorded on the README's next 2,048 tokens, so no perplexity
# is measured on the text its weights were fitted to.
CALIBRATION = TOKENS


def readme_text() -> str:
    return TEXT.read_text(encoding="utf-8")


def readme_windows(tokenizer, start: int = 0) -> torch.Tensor:
    """``[TOKENS // WINDOW, WINDOW + 1]`` token ids: BOS, then each window of
    the README's ``TOKENS`` tokens from ``start``."""
    ids = tokenizer.encode(readme_text())
    if len(ids) < start + TOKENS:
        raise ValueError(f"{TEXT.name} has {len(ids)} tokens, fewer than "
                         f"the {start + TOKENS} measured")
    body = torch.tensor(ids[start:start + TOKENS]).view(TOKENS // WINDOW, WINDOW)
    bos = torch.full((body.shape[0], 1), tokenizer.bos_id, dtype=body.dtype)
    return torch.cat([bos, body], 1)


def perplexity(model, windows: torch.Tensor) -> float:
    """exp of the mean negative log-likelihood of every token after each window's BOS."""
    nll, count = 0.0, 0
    with torch.no_grad():
        for row in windows:
            logits = model(row[None])[0, :-1].double()
            nll += float(torch.nn.functional.cross_entropy(logits, row[1:], reduction="sum"))
            count += row.numel() - 1
    return math.exp(nll / count)


def _gguf_names(model) -> dict[str, str]:
    """module path -> GGUF tensor name, for every projection the file holds."""
    from muser_torch.arch.names import TENSOR_NAMES
    from muser_torch.arch.spec import Role
    patterns = []
    for spec in TENSOR_NAMES.values():
        if spec.role is Role.PROJECTION:
            rx = re.escape(spec.module).replace(r"\{i\}", r"(\d+)")
            patterns.append((re.compile(rx + "$"), spec.name))
    out = {}
    for path, module in model.named_modules():
        if not hasattr(module, "qtype"):
            continue
        for rx, name in patterns:
            if m := rx.match(path):
                out[path] = name.replace("{i}", m.group(1)) if m.groups() else name
    return out


def record_imatrix(model, windows: torch.Tensor,
                   tensor_names: set[str]) -> dict[str, tuple[np.ndarray, int]]:
    """GGUF tensor name -> (sum of each input column's square, tokens seen),
    for the model of the file whose tensors are ``tensor_names``."""
    names = _gguf_names(model)
    sums: dict[str, tuple[np.ndarray, int]] = {}

    def hook(name):
        def record(module, args):
            x = args[0].detach().double().reshape(-1, args[0].shape[-1])
            s, n = sums.get(name, (np.zeros(x.shape[1]), 0))
            sums[name] = (s + (x * x).sum(0).numpy(), n + x.shape[0])
        return record

    modules = dict(model.named_modules())
    handles = [modules[path].register_forward_pre_hook(hook(name)) for path, name in names.items()]
    try:
        with torch.no_grad():
            for row in windows:
                model(row[None])
    finally:
        for h in handles:
            h.remove()
    # A tied lm_head runs as "output" over token_embd's bytes; llama-imatrix
    # records that product under the tensor the file holds.
    if "output.weight" in sums and "output.weight" not in tensor_names:
        sums["token_embd.weight"] = sums.pop("output.weight")
    return sums


def tensor_names(path: Path) -> set[str]:
    from muser_torch.gguf_io import load_gguf
    return set(load_gguf(path).tensors)


def write_imatrix(path: Path, sums: dict[str, tuple[np.ndarray, int]], chunks: int) -> None:
    """``sums`` in llama.cpp's imatrix GGUF form (the metadata types inferred:
    chunk_count and chunk_size UINT32, datasets an array of strings, as
    llama.cpp's loader reads them)."""
    from muser_torch.gguf_io import save_gguf
    tensors = {}
    for name, (s, n) in sorted(sums.items()):
        tensors[f"{name}.in_sum2"] = ("F32", torch.from_numpy(s.astype(np.float32))[None, :])
        tensors[f"{name}.counts"] = ("F32", torch.tensor([[float(n)]]))
    md = {"general.type": "imatrix",
          "imatrix.datasets": [f"{TEXT.name} tokens {CALIBRATION}..{CALIBRATION + TOKENS}"],
          "imatrix.chunk_count": chunks, "imatrix.chunk_size": WINDOW}
    save_gguf(path, md, tensors, progress=False)


def make_imatrix(src: Path, out: Path) -> Path:
    """The imatrix of the file ``src``, written to ``out``."""
    import muser_torch
    model = muser_torch.from_gguf(src, dtype=torch.float32)
    windows = readme_windows(model.tokenizer, start=CALIBRATION)
    write_imatrix(out, record_imatrix(model, windows, tensor_names(src)), len(windows))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("perplexity")
    p.add_argument("files", nargs="+", type=Path)
    i = sub.add_parser("imatrix")
    i.add_argument("file", type=Path)
    i.add_argument("out", type=Path)
    args = ap.parse_args()

    import muser_torch
    if args.cmd == "perplexity":
        for f in args.files:
            model = muser_torch.from_gguf(f, dtype=torch.float32)
            ppl = perplexity(model, readme_windows(model.tokenizer))
            print(f"{f.name}\t{f.stat().st_size / 1e6:.0f} MB\tperplexity {ppl:.1f}", flush=True)
    else:
        make_imatrix(args.file, args.out)
        print(f"{args.out}: {TOKENS // WINDOW} chunks of {WINDOW}")


if __name__ == "__main__":
    main()
