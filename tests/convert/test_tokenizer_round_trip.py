"""A converted file tokenizes as its checkpoint does: for each kind of
tokenizer a checkpoint can ship, the file's tokenizer (``Decoder.tokenizer``,
built from the ``tokenizer.ggml.*`` keys ``convert`` wrote) gives the ids
transformers' ``AutoTokenizer`` gives on the checkpoint directory, for twelve
samples (``MULTILINGUAL``: eight scripts, emoji, code, mixed whitespace), with
and without the special tokens each adds, and decodes them back alike.

The kinds: sentencepiece ``tokenizer.model`` (Llama, Gemma 3), a byte-level
BPE ``tokenizer.json`` (Qwen's, split as Qwen2Tokenizer splits; Muse
Glimmer's, by its own ByteLevel regex), and Gemma's ``tokenizer.json``
alone (llama.cpp's sentencepiece-style BPE: its pre-tokenizer named
"granite-embed-multi-311m" after the probe hash Gemma 3's shares, or refused
until ``--pre-tokenizer`` names it, e.g. "gemma4", when the hash is not one
llama.cpp knows). Llama's ``tokenizer.json`` alone is refused: llama.cpp's
file of it would drop the merge ranks."""
from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")
pytest.importorskip("google.protobuf", reason="transformers reads tokenizer.model with protobuf")

from muser_torch.convert import TokenizerConvertError, convert  # noqa: E402
from muser_torch.gguf_io import load_gguf  # noqa: E402
from muser_torch.text import tokenizer_from_metadata  # noqa: E402

from ..gguf.helpers import fresh_seed  # noqa: E402
from ..text.samples import MULTILINGUAL  # noqa: E402
from .checkpoints import write_checkpoint, write_glimmer_checkpoint  # noqa: E402

TINY = dict(n_layers=1, hidden=64, ffn=128, n_heads=1, n_kv_heads=1, head_dim=64)


def _json_only(d, tokenizer_config: dict | None = None):
    """The checkpoint with its sentencepiece model replaced by the tokenizer.json
    transformers converts it to (``tokenizer_config`` edits pick the class)."""
    from transformers import AutoTokenizer
    if tokenizer_config:
        path = d / "tokenizer_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **tokenizer_config}))
    tok = AutoTokenizer.from_pretrained(str(d))
    out = d.with_name(d.name + "-json")
    shutil.copytree(d, out)
    (out / "tokenizer.model").unlink()
    tok.save_pretrained(str(out))
    config = json.loads((out / "tokenizer_config.json").read_text())
    config.pop("vocab_file", None)        # the sentencepiece file is gone
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    assert (out / "tokenizer.json").is_file() and not (out / "tokenizer.model").exists()
    return out


# kind -> (architecture, checkpoint edit, --pre-tokenizer)
KINDS = {
    "llama-sentencepiece": ("llama", None, None),
    "gemma3-sentencepiece": ("gemma3", None, None),
    "byte-level-bpe": ("qwen2", None, "qwen2"),   # AutoTokenizer gives Qwen2Tokenizer: its split
    "muse-glimmer-byte-level-bpe": ("muse-glimmer", None, "gpt-2"),   # the file's own ByteLevel split
    "gemma3-tokenizer-json": ("gemma3", _json_only, "gemma4"),
}


@pytest.mark.parametrize("kind", KINDS)
def test_converted_file_tokenizes_as_the_checkpoint(tmp_path, kind):
    from transformers import AutoTokenizer
    arch, edit, pre = KINDS[kind]
    seed = fresh_seed()
    if arch == "muse-glimmer":
        d, _, _ = write_glimmer_checkpoint(tmp_path / "ck", seed, n_layers=1)
    else:
        d, _, _ = write_checkpoint(tmp_path / "ck", arch, seed, **TINY)
    if edit is not None:
        d = edit(d)
    out = tmp_path / "t.gguf"
    if pre is not None:   # a tokenizer trained here has a probe hash llama.cpp does not list
        with pytest.raises(TokenizerConvertError, match="--pre-tokenizer") as refused:
            convert(d, out, "f16", progress=False)
        if pre == "gemma4":   # the refusal names the name a sentencepiece-style BPE takes
            assert "'gemma4'" in str(refused.value), refused.value
        assert not out.exists()
    convert(d, out, "f16", progress=False, pre_tokenizer=pre)
    _assert_same_tokens(out, d, f"seed {seed}, {kind}")


def _assert_same_tokens(path, checkpoint, what: str) -> None:
    from transformers import AutoTokenizer
    ours = tokenizer_from_metadata(load_gguf(path).metadata)
    theirs = AutoTokenizer.from_pretrained(str(checkpoint))
    for text in MULTILINGUAL:
        got, want = ours.encode(text, bos=False, eos=False), theirs.encode(text, add_special_tokens=False)
        assert got == want, (f"{what}: {text!r}: ours {[ours.token(i) for i in got]}, "
                             f"theirs {theirs.convert_ids_to_tokens(want)}")
        assert ours.encode(text) == theirs.encode(text), f"{what}: {text!r} with special tokens"
        assert ours.decode(got) == theirs.decode(want, skip_special_tokens=True), f"{what}: {text!r}"


def test_llama_tokenizer_json_without_its_sentencepiece_model_is_refused(tmp_path, capsys):
    from muser_torch.cli import main as cli_main
    d, _, _ = write_checkpoint(tmp_path / "ck", "llama", fresh_seed(), **TINY)
    d = _json_only(d)
    out = tmp_path / "t.gguf"
    with pytest.raises(TokenizerConvertError, match="no merge ranks.*tokenizer.model"):
        convert(d, out, "f16", progress=False)
    assert cli_main(["convert", str(d), str(out)]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and not out.exists()


@pytest.mark.slow
def test_gemma3_tokenizer_json_gets_llama_cpps_metadata_and_tokenizes_alike(tmp_path, gemma_path):
    """Gemma 3's own vocabulary as a tokenizer.json-only checkpoint (transformers'
    GemmaTokenizer of the real file, saved): the converter names the
    pre-tokenizer by its probe hash, as llama.cpp's does, and the file
    tokenizes as the checkpoint."""
    from pathlib import Path

    import torch
    from transformers import AutoTokenizer
    from .checkpoints import hf_config, save_weights
    from ..models.hf_files import random_hf_weights
    src = Path(gemma_path)
    d = tmp_path / "gemma-json"
    AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name).save_pretrained(str(d))
    cfg = hf_config("gemma3", vocab=262144, tied=True, **TINY)
    cfg.save_pretrained(str(d))
    save_weights(d, {k: v.to(torch.bfloat16) for k, v in random_hf_weights(cfg, fresh_seed()).items()})
    out = tmp_path / "g.gguf"
    convert(d, out, "f16", progress=False)
    md = load_gguf(out).metadata
    assert (md["tokenizer.ggml.model"], md["tokenizer.ggml.pre"]) == ("gpt2", "granite-embed-multi-311m")
    _assert_same_tokens(out, d, "Gemma 3's vocabulary")
