from __future__ import annotations

import os

import pytest

from muser_torch.gguf_io import load_gguf, save_gguf
from muser_torch.text.byte_tokenizer import ByteTokenizer



def test_bytes_round_trip():
    tok = ByteTokenizer()
    data = os.urandom(300) + "héllo ✓".encode()
    ids = tok.encode(data, bos=True, eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id and len(ids) == len(data) + 2
    assert tok.decode_bytes(ids) == data
    assert tok.decode(tok.encode("héllo ✓")) == "héllo ✓"


def test_metadata_round_trips_through_gguf(tmp_path):
    tok = ByteTokenizer()
    save_gguf(tmp_path / "t.gguf", tok.to_metadata(), {})
    md = load_gguf(tmp_path / "t.gguf").metadata
    assert isinstance(ByteTokenizer.from_metadata(md), ByteTokenizer)
    assert ByteTokenizer.from_metadata({}) is None


@pytest.mark.parametrize("key,value", [("tokenizer.ggml.model", "gpt2"),
                                       ("tokenizer.ggml.eos_token_id", 2),
                                       ("tokenizer.ggml.tokens", ["a"] * 258)])
def test_foreign_tokenizers_are_refused(key, value):
    md = ByteTokenizer().to_metadata() | {key: value}
    with pytest.raises(ValueError, match=key.split(".")[-1]):
        ByteTokenizer.from_metadata(md)
