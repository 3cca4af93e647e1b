from __future__ import annotations

import os

import pytest

from muser_torch.gguf_io import load_gguf, save_gguf
from muser_torch.text.byte_tokenizer import ByteTokenizer

from ..text.family_templates import MUSE_TEMPLATE


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


# ---- Muse Glimmer files: the release's kind of tokenizer, and none ----------

def _muse_vocab() -> dict:
    """A byte-level BPE (``gpt2``) vocabulary shaped like the release's: the
    learned tokens, then control tokens with bos / eos among them and the
    turn ends ``<|eot|>`` (written as eot_token_id, as the converter does)
    and ``<|eom|>`` (written as nothing)."""
    from ..text.tiny_tokenizers import gpt2_metadata
    md = gpt2_metadata(seed=0, vocab_size=300)
    tokens = md["tokenizer.ggml.tokens"] + ["<|start|>", "<|eot|>", "<|eom|>"]
    md["tokenizer.ggml.tokens"] = tokens
    md["tokenizer.ggml.token_type"] = md["tokenizer.ggml.token_type"] + [3, 3, 3]
    md["tokenizer.ggml.eot_token_id"] = tokens.index("<|eot|>")
    md["tokenizer.chat_template"] = MUSE_TEMPLATE
    return md


def test_muse_glimmer_gpt2_tokenizer_and_turn_ends(tmp_path, capsys):
    """``model.tokenizer`` is the file's BPE, its stop ids hold eos, <|eot|>
    and <|eom|>, and ``run --chat`` renders the file's template."""
    pytest.importorskip("transformers")
    from muser_torch import from_gguf
    from muser_torch.cli import main as cli
    from ..formats.ggml_ref import lib
    from .muse_files import write_muse_gguf
    lib()
    vocab = _muse_vocab()
    tokens = vocab["tokenizer.ggml.tokens"]
    path, _ = write_muse_gguf(tmp_path / "chat.gguf", seed=1, types=("Q8_0",), n_layers=2,
                              vocab=len(tokens), tokenizer=vocab)
    model = from_gguf(path)
    tok = model.tokenizer
    assert tok is not None and tok.decode(tok.encode("def f(x):\n")) == "def f(x):\n"
    for name in ("<|eot|>", "<|eom|>", "<|im_end|>"):
        assert tokens.index(name) in tok.stop_ids, f"{name} does not stop generation"
    ids = tok.encode_chat([{"role": "user", "content": "hi"}])
    start, eot = tokens.index("<|start|>"), tokens.index("<|eot|>")
    assert ids[0] == start and eot in ids and ids.count(start) == 2, ids   # template's specials are tokens
    assert tok.decode(ids).endswith("assistant\n")
    assert cli(["run", str(path), "--chat", "--prompt", "hi", "--max-new-tokens", "3",
                "--temperature", "0"]) == 0
    assert "tok/s" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["none", "no_vocab"])
def test_no_vocab_file_loads_without_tokenizer(tmp_path, capsys, name):
    """llama.cpp's words for a file without a vocabulary load with no
    tokenizer (vocab_size sizes the model); ``run`` says it needs one."""
    from muser_torch import from_gguf
    from muser_torch.cli import main as cli
    from muser_torch.tiny import SEED_CONFIG, write_tiny
    from dataclasses import replace
    from muser_torch.arch.muse_glimmer import reference_pattern
    cfg = replace(SEED_CONFIG, n_layers=2, hidden=256, ffn=256, n_heads=2, n_kv_heads=1,
                  vocab_size=300, context_length=64, sliding_window=8,
                  sliding_window_pattern=reference_pattern(2))
    write_tiny(tmp_path / "a.gguf", cfg)
    g = load_gguf(tmp_path / "a.gguf")
    md = dict(g.metadata) | {"tokenizer.ggml.model": name}
    save_gguf(tmp_path / "b.gguf", md, dict(g.tensors))
    model = from_gguf(tmp_path / "b.gguf")
    assert model.tokenizer is None and model.config.vocab_size == 300
    assert cli(["run", str(tmp_path / "b.gguf")]) == 2
    assert "no tokenizer" in capsys.readouterr().err
