"""A GGUF with another file's exact layout and random weights, for timing a
model on a machine the real file cannot be sent to.

``dump FILE`` writes the layout as JSON: every tensor's name, type and ``ne``
in file order, and the metadata except the tokenizer's vocabulary arrays
(the vocabulary size is kept as ``{arch}.vocab_size``, which the loaders
read when the arrays are absent). ``write LAYOUT OUT`` makes the file from
it: each tensor random packed blocks of its own type with sane scales
(``formats.random_weight``, std 1/sqrt(n_in); norms near 1), so every
reader decodes the same bytes to the same values. The tokenizer is left out:
timing needs token ids, not text. A server side by side needs text, so
``tokenizer FILE OUT`` writes a GGUF holding only FILE's ``tokenizer.*``
metadata (Gemma 3's: about 7 MB, small enough to send), and ``write`` with
``--tokenizer TOK`` puts it into the file it makes.

    python -m muser_torch.bench.shaped dump gemma-3-270m-q4_k_m.gguf > layout.json
    python -m muser_torch.bench.shaped write layout.json /tmp/gemma-shaped.gguf [--tokenizer TOK]
    python -m muser_torch.bench.shaped tokenizer gemma-3-270m-q4_k_m.gguf TOK.gguf
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from ..formats import GGMLType, random_weight

_VOCAB_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                 "tokenizer.ggml.merges")


def layout_of(path: str | Path) -> dict:
    """The JSON-able layout of a GGUF file (see the module docstring)."""
    from ..gguf_io import load_gguf
    f = load_gguf(path)
    md = {k: v for k, v in f.metadata.items()
          if k not in _VOCAB_ARRAYS and not k.startswith("tokenizer.")}
    arch = md.get("general.architecture")
    tokens = f.metadata.get("tokenizer.ggml.tokens")
    if arch and tokens is not None and f"{arch}.vocab_size" not in md:
        md[f"{arch}.vocab_size"] = len(tokens)
    types = {k: int(f.metadata_types[k]) for k in md if k in f.metadata_types}
    tensors = [{"name": t.name, "type": t.type_name, "ne": list(t.ne)} for t in f.tensors.values()]
    return {"source": Path(path).name, "metadata": md, "types": types, "tensors": tensors}


def tokenizer_metadata(path: str | Path) -> tuple[dict, dict]:
    """The ``tokenizer.*`` metadata of a GGUF and its value types."""
    from ..gguf_io import load_gguf
    f = load_gguf(path)
    md = {k: v for k, v in f.metadata.items() if k.startswith("tokenizer.")}
    if "tokenizer.ggml.tokens" not in md:
        raise ValueError(f"{Path(path).name} has no tokenizer.ggml.tokens")
    return md, {k: f.metadata_types[k] for k in md if k in f.metadata_types}


def write_tokenizer(source: str | Path, out: str | Path) -> Path:
    """A GGUF of ``source``'s tokenizer metadata alone, no tensors."""
    from ..gguf_io import save_gguf
    md, types = tokenizer_metadata(source)
    save_gguf(out, md, {}, types=types)
    return Path(out)


def write_like(layout: dict, out: str | Path, seed: int = 0,
               tokenizer: str | Path | None = None) -> Path:
    """Write a random-weight GGUF with ``layout``'s tensors and metadata (and
    the ``tokenizer.*`` metadata of the GGUF ``tokenizer``, if given)."""
    from gguf.constants import GGUFValueType

    from ..gguf_io import save_gguf
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for t in layout["tensors"]:
        qtype = GGMLType.parse(t["type"])
        n_in = t["ne"][0]
        n_out = 1
        for d in t["ne"][1:]:
            n_out *= d
        if qtype == GGMLType.F32:   # norms: near 1, the way trained norm weights sit
            w = 1.0 + 0.1 * torch.randn(n_out, n_in, generator=gen)
            tensors[t["name"]] = (qtype, w.reshape(tuple(reversed(t["ne"]))).contiguous())
            continue
        w = random_weight(qtype, n_out, n_in, generator=gen, std=n_in ** -0.5)
        tensors[t["name"]] = (qtype, w.packed, tuple(t["ne"]))
    types = {k: GGUFValueType(v) for k, v in layout.get("types", {}).items()}
    metadata = dict(layout["metadata"])
    if tokenizer is not None:
        tok_md, tok_types = tokenizer_metadata(tokenizer)
        metadata |= tok_md
        types |= {k: GGUFValueType(int(v)) for k, v in tok_types.items()}
    save_gguf(out, metadata, tensors, types=types)
    return Path(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "dump":
        json.dump(layout_of(argv[1]), sys.stdout, indent=1)
        print()
        return 0
    if len(argv) in (3, 5) and argv[0] == "write" and (len(argv) == 3 or argv[3] == "--tokenizer"):
        out = write_like(json.loads(Path(argv[1]).read_text()), argv[2],
                         tokenizer=argv[4] if len(argv) == 5 else None)
        print(f"wrote {out} ({out.stat().st_size / 1e6:.0f} MB)")
        return 0
    if len(argv) == 3 and argv[0] == "tokenizer":
        out = write_tokenizer(argv[1], argv[2])
        print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")
        return 0
    print("usage: python -m muser_torch.bench.shaped dump FILE | write LAYOUT.json OUT.gguf "
          "[--tokenizer TOK.gguf] | tokenizer FILE OUT.gguf", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
