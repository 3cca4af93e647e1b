"""``bench.shaped``: a file with another's layout and random weights, and
(for a server side by side) a tokenizer carried over from a third file: the
tokenizer-only GGUF holds the source's ``tokenizer.*`` metadata and nothing
else, and the written model encodes and decodes text exactly as the source."""
from __future__ import annotations

import pytest

import muser_torch
from muser_torch.bench import shaped
from muser_torch.gguf_io import load_gguf

from .family_files import hf_file  # noqa: F401  (fixture)

TEXT = "Hello, lighthouse keeper! 123 \u00e9t\u00e9 \u4f60\u597d"


def test_a_tokenizer_travels_into_a_shaped_file(hf_file, tmp_path):  # noqa: F811
    source = hf_file("llama")
    tok_path = shaped.write_tokenizer(source, tmp_path / "tok.gguf")
    tok_file, src_file = load_gguf(tok_path), load_gguf(source)
    assert not tok_file.tensors
    assert set(tok_file.metadata) - {"general.alignment"} == \
        {k for k in src_file.metadata if k.startswith("tokenizer.")}
    layout = shaped.layout_of(source)
    assert not any(k.startswith("tokenizer.") for k in layout["metadata"])
    out = shaped.write_like(layout, tmp_path / "shaped.gguf", tokenizer=tok_path)
    want, got = muser_torch.from_gguf(source).tokenizer, muser_torch.from_gguf(out).tokenizer
    ids = want.encode(TEXT)
    assert got.encode(TEXT) == ids and got.decode(ids) == want.decode(ids)
    plain = muser_torch.from_gguf(shaped.write_like(layout, tmp_path / "plain.gguf"))
    assert plain.tokenizer is None


def test_a_file_without_a_tokenizer_is_refused(tmp_path):
    demo = shaped.write_like({"metadata": {"general.architecture": "llama"}, "types": {},
                              "tensors": [{"name": "x", "type": "F32", "ne": [4, 2]}]},
                             tmp_path / "bare.gguf")
    with pytest.raises(ValueError, match="bare.gguf has no tokenizer.ggml.tokens"):
        shaped.write_tokenizer(demo, tmp_path / "tok.gguf")
    assert shaped.main(["tokenizer", str(demo)]) == 2
