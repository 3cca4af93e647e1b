"""Tokenizer metadata is checked before anything is built from it, in
bounded memory: an absurd vocabulary (a file claiming 300 million tokens; a
caller's dict past the limit), merges naming unknown tokens, a special id
outside the vocabulary and token types of the wrong length are each a
MetadataError naming the key, with memory measured."""
from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from muser_torch.errors import MetadataError
from muser_torch.text import tokenizer_from_metadata
from muser_torch.text.metadata import MAX_VOCAB

ROOT = Path(__file__).resolve().parents[2]
P = "tokenizer.ggml."
N_CLAIMED = 300_000_000


def _absurd_file(path: Path) -> int:
    """A GGUF whose ``tokenizer.ggml.tokens`` claims 300 million strings, the
    file long enough to hold them (8 bytes each: empty strings), sparse."""
    def s(text: str) -> bytes:
        b = text.encode()
        return struct.pack("<Q", len(b)) + b
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 2)
    head += s("general.architecture") + struct.pack("<I", 8) + s("llama")
    head += s(P + "tokens") + struct.pack("<IIQ", 9, 8, N_CLAIMED)
    size = len(head) + 8 * N_CLAIMED + 64
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return size


CHILD = r"""
import resource, sys, time
from muser_torch import load_gguf
from muser_torch.errors import MetadataError
with open("/proc/self/statm") as f:
    vm = int(f.read().split()[0]) * resource.getpagesize()
limit = vm + int(sys.argv[2]) + (256 << 20)      # the file's map plus 256 MB
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
t = time.process_time()
try:
    load_gguf(sys.argv[1])
    print("loaded")
except MetadataError as e:
    print(f"MetadataError {time.process_time() - t:.2f} {e}")
"""


def test_a_file_claiming_300_million_tokens_is_refused_in_bounded_memory(tmp_path):
    path = tmp_path / "absurd.gguf"
    size = _absurd_file(path)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), str(size)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    kind, cpu, msg = proc.stdout.strip().split(" ", 2)
    assert kind == "MetadataError", proc.stdout
    assert "tokenizer.ggml.tokens" in msg and "300,000,000 items" in msg, msg
    assert float(cpu) < 5.0


def _peak_of(call) -> tuple[BaseException | None, int]:
    tracemalloc.start()
    try:
        call()
        err = None
    except Exception as e:  # noqa: BLE001
        err = e
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return err, peak


def test_a_dict_past_the_vocabulary_limit_is_refused_before_any_work():
    md = {P + "model": "gpt2", P + "tokens": ["a"] * (MAX_VOCAB + 1), P + "pre": "qwen2",
          P + "merges": []}
    err, peak = _peak_of(lambda: tokenizer_from_metadata(md))
    assert isinstance(err, MetadataError) and f"{MAX_VOCAB + 1:,} entries" in str(err), err
    assert peak < 1 << 20, f"{peak / 1e6:.1f} MB traced"   # not even a copy of the list


GEMMA_SIZE = 262_144


@pytest.fixture(scope="module")
def big_vocab():
    """A Gemma-sized BPE vocabulary: byte pieces then made-up pieces, with
    merges that name only its tokens."""
    tokens = [f"t{i}" for i in range(GEMMA_SIZE)]
    merges = [f"t{i} t{i + 1}" for i in range(0, 20000, 2)]
    return {P + "model": "gpt2", P + "pre": "qwen2", P + "tokens": tokens, P + "merges": merges,
            P + "token_type": [1] * GEMMA_SIZE, P + "bos_token_id": 0, P + "eos_token_id": 1}


@pytest.mark.parametrize("edit,match", [
    (lambda md: md[P + "merges"].append("t5 zz"), r"merges\[10000\] is 't5 zz': 'zz' is not in"),
    (lambda md: md.update({P + "eos_token_id": GEMMA_SIZE}), "eos_token_id is 262144, outside"),
    (lambda md: md.update({P + "bos_token_id": 2 ** 40}), "bos_token_id is 1099511627776, outside"),
    (lambda md: md.update({P + "token_type": [1] * (GEMMA_SIZE - 1)}),
     "token_type has 262143 entries, expected one per token"),
    (lambda md: md.update({P + "token_type": [1] * (3 * GEMMA_SIZE)}),
     "token_type has 786432 entries"),
], ids=["merge-unknown", "eos-past-end", "bos-2^40", "types-short", "types-long"])
def test_bad_vocabulary_is_refused_in_bounded_memory(big_vocab, edit, match):
    md = {k: list(v) if isinstance(v, list) else v for k, v in big_vocab.items()}
    edit(md)
    err, peak = _peak_of(lambda: tokenizer_from_metadata(md))
    assert isinstance(err, MetadataError), err
    assert re.search(match, str(err)), str(err)
    # the checks copy the lists and build one set of the tokens: ~30 MB here
    assert peak < 64 << 20, f"{peak / 1e6:.1f} MB traced"


def test_the_unedited_big_vocabulary_passes_the_checks(big_vocab):
    """So the refusals above come from the edits."""
    from muser_torch.text.metadata import read_vocab_metadata
    vocab = read_vocab_metadata(big_vocab, "gpt2")
    assert len(vocab.tokens) == GEMMA_SIZE and json.dumps(vocab.special_ids)
