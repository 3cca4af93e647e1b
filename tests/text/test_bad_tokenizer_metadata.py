"""Bad ``tokenizer.*`` metadata is refused with a typed error naming the key;
bad API arguments get a plain ValueError; a missing extra says which."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest

from muser_torch.errors import ChatTemplateError, MetadataError
from muser_torch.gguf_io import GGUFValueType, load_gguf, save_gguf
from muser_torch.text import tokenizer_from_metadata
from muser_torch.text.byte_tokenizer import ByteTokenizer

from .samples import fresh_seed
from .tiny_tokenizers import gpt2_metadata, llama_metadata

pytest.importorskip("transformers")
SEED = fresh_seed()
P = "tokenizer.ggml."


@pytest.fixture(scope="module")
def base():
    return {"gpt2": gpt2_metadata(SEED, vocab_size=400),
            "llama": llama_metadata(SEED, vocab_size=400)}


def refused(md, match, error=MetadataError):
    with pytest.raises(error, match=match) as info:
        tokenizer_from_metadata(md)
    return info.value


def test_the_bases_build(base):
    for md in base.values():
        assert tokenizer_from_metadata(md).encode("ok")


@pytest.mark.parametrize("model", ["bert", "t5", "", 5, ["llama"]])
def test_unknown_model_is_refused_listing_the_supported(base, model):
    e = refused(base["llama"] | {P + "model": model}, "tokenizer.ggml.model")
    for name in ("glimmer-bytes", "gpt2", "llama"):
        assert name in str(e)


BAD_IDS = [math.inf, -math.inf, math.nan, 1e30, 2.0, -1, True, "1", None, [1], 2 ** 40]
ID_KEYS = ["bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id", "eot_token_id"]


@pytest.mark.parametrize("value", BAD_IDS, ids=repr)
@pytest.mark.parametrize("key", ID_KEYS)
@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_bad_special_ids_are_refused(base, model, key, value):
    md = base[model] | {P + key: value}
    if value is None:
        md[P + key] = len(md[P + "tokens"])       # one past the vocabulary
    refused(md, P + key)


@pytest.mark.parametrize("value", BAD_IDS, ids=repr)
@pytest.mark.parametrize("key", ["bos_token_id", "eos_token_id"])
def test_bad_ids_are_refused_by_the_byte_tokenizer(key, value):
    md = ByteTokenizer().to_metadata() | {P + key: ByteTokenizer.VOCAB_SIZE if value is None else value}
    with pytest.raises(MetadataError, match=P + key):
        ByteTokenizer.from_metadata(md)
    with pytest.raises(MetadataError, match=P + key):
        tokenizer_from_metadata(md)


def test_float32_infinite_bos_in_a_file_is_a_metadata_error(tmp_path):
    """A Glimmer file whose BOS id is FLOAT32 inf (a fuzz finding, ``tests/fuzz/known.py``)."""
    from muser_torch import Glimmer
    from muser_torch.config import GlimmerConfig
    from muser_torch.tiny import write_tiny
    cfg = GlimmerConfig(context_length=32, hidden=256, ffn=256, n_layers=2, n_heads=2, n_kv_heads=1,
                        head_dim=128, rms_eps=1e-6, sliding_window=8, sliding_window_pattern=2,
                        rope_base=10000.0, vocab_size=258)
    good = tmp_path / "good.gguf"
    write_tiny(good, cfg, seed=SEED)
    f = load_gguf(good)
    for value in (math.inf, -math.inf, math.nan):
        bad = tmp_path / "bad.gguf"
        save_gguf(bad, f.metadata | {P + "bos_token_id": value}, f.tensors,
                  types={P + "bos_token_id": GGUFValueType.FLOAT32})
        md = load_gguf(bad).metadata
        with pytest.raises(MetadataError, match="bos_token_id"):
            ByteTokenizer.from_metadata(md)
        with pytest.raises(MetadataError, match="bos_token_id"):
            Glimmer.from_gguf(bad)


@pytest.mark.parametrize("model,key,value,match", [
    ("llama", "tokens", None, "tokens is missing"),
    ("llama", "tokens", "abc", "tokens is 'abc'.*expected an array"),
    ("llama", "tokens", [], "tokens is empty"),
    ("gpt2", "tokens", "list-with-int", r"tokens\[3\] is 7"),
    ("llama", "scores", None, "scores is missing"),
    ("llama", "scores", "short", "scores has .* entries, expected one per token"),
    ("llama", "scores", "nan-at-5", r"scores\[5\] is nan"),
    ("llama", "scores", "inf-at-5", r"scores\[5\] is inf"),
    ("llama", "scores", "str-at-5", r"scores\[5\] is 'x'"),
    ("gpt2", "token_type", "short", "token_type has"),
    ("gpt2", "token_type", "9-at-2", r"token_type\[2\] is 9"),
    ("gpt2", "token_type", "float-at-2", r"token_type\[2\] is 1.0"),
    ("gpt2", "merges", None, "merges is missing"),
    ("gpt2", "merges", ["Ġ"], r"merges\[0\] is 'Ġ'"),
    ("gpt2", "merges", ["a b c"], r"merges\[0\] is 'a b c'"),
    ("gpt2", "merges", ["a  b"], r"merges\[0\]"),
    ("gpt2", "merges", ["a q\u2603"], "not in tokenizer.ggml.tokens"),
    ("gpt2", "merges", 5, "merges is 5"),
    ("gpt2", "pre", "default", "tokenizer.ggml.pre is 'default'.*qwen2"),
    ("gpt2", "pre", "deepseek-llm", "tokenizer.ggml.pre is 'deepseek-llm'"),
    ("gpt2", "pre", None, "tokenizer.ggml.pre is missing"),
    ("gpt2", "pre", 7, "tokenizer.ggml.pre is 7"),
    ("gpt2", "add_bos_token", 1, "add_bos_token is 1 .*expected a bool"),
    ("llama", "add_eos_token", "yes", "add_eos_token is 'yes'"),
    ("llama", "add_space_prefix", 0.0, "add_space_prefix is 0.0"),
    ("llama", "bos_token_id", None, "add_bos_token is set .*bos_token_id is missing"),
    ("llama", "tokens", "duplicate", "distinct"),
])
def test_bad_vocabulary_keys_are_refused(base, model, key, value, match):
    md = dict(base[model])
    n = len(md[P + "tokens"])
    edits = {   # built on demand: each reads the key it replaces
        "list-with-int": lambda: md[P + "tokens"][:3] + [7] + md[P + "tokens"][4:],
        "short": lambda: md[P + key][:-1],
        "nan-at-5": lambda: [0.0] * 5 + [math.nan] + [0.0] * (n - 6),
        "inf-at-5": lambda: [0.0] * 5 + [math.inf] + [0.0] * (n - 6),
        "str-at-5": lambda: [0.0] * 5 + ["x"] + [0.0] * (n - 6),
        "9-at-2": lambda: [1, 1, 9] + [1] * (n - 3),
        "float-at-2": lambda: [1, 1, 1.0] + [1] * (n - 3),
    }
    if value == "duplicate":   # the last piece again, at the end
        for k, extra in (("tokens", md[P + "tokens"][-1]), ("scores", -1e4), ("token_type", 1)):
            md[P + k] = md[P + k] + [extra]
    elif value is None:
        md.pop(P + key, None)
    else:
        md[P + key] = edits[value]() if isinstance(value, str) and value in edits else value
    refused(md, match)


@pytest.mark.parametrize("template,match", [
    (5, "tokenizer.chat_template is 5"),
    ("{% for m in messages %}{{ m }", "tokenizer.chat_template does not compile"),
    ("{{ raise_exception('roles must alternate') }}", "failed to render.*roles must alternate"),
    ("{{ messages[5]['content'] }}", "failed to render.*Undefined"),
    ("{{ 1 // 0 }}", "failed to render.*ZeroDivisionError"),
    ("{% set _ = messages.append(1) %}", "failed to render.*SecurityError"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "failed to render"),
    (None, "no tokenizer.chat_template"),
])
def test_bad_chat_templates_raise_chat_template_error(base, template, match):
    md = dict(base["gpt2"])
    md.pop("tokenizer.chat_template")
    if template is not None:
        md["tokenizer.chat_template"] = template
    if not isinstance(template, str) and template is not None:
        refused(md, match, ChatTemplateError)      # a mistyped template: refused at load
        return
    tok = tokenizer_from_metadata(md)
    with pytest.raises(ChatTemplateError, match=match):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_byte_tokenizer_has_stops_and_no_chat():
    tok = tokenizer_from_metadata(ByteTokenizer().to_metadata())
    assert isinstance(tok, ByteTokenizer) and tok.stop_ids == (tok.eos_id,) == (257,)
    assert tok.vocab_size == 258
    with pytest.raises(ChatTemplateError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert tokenizer_from_metadata({"general.architecture": "llama"}) is None
    from muser_torch.text import SUPPORTED_MODELS
    from muser_torch.text.byte_tokenizer import MODEL_NAME
    assert SUPPORTED_MODELS[0] == MODEL_NAME


@pytest.mark.parametrize("call", [
    lambda t: t.encode(b"bytes"),
    lambda t: t.encode(5),
    lambda t: t.decode([t.vocab_size]),
    lambda t: t.decode([-1]),
    lambda t: t.decode([1.5]),
    lambda t: t.decode([True]),
    lambda t: t.apply_chat_template("hi"),
    lambda t: t.apply_chat_template([]),
    lambda t: t.apply_chat_template(["hi"]),
    lambda t: replace_bos_free(t).encode("x", bos=True),
])
def test_bad_arguments_are_value_errors(base, call):
    tok = tokenizer_from_metadata(base["gpt2"])
    with pytest.raises(ValueError) as info:
        call(tok)
    assert not isinstance(info.value, MetadataError)   # the caller's mistake, not the file's


def replace_bos_free(tok):
    """The same tokenizer as if the file named no BOS id."""
    tok.bos_id = None
    return tok


def test_import_needs_no_extra_and_a_missing_extra_is_named():
    code = """
import sys
for name in ("transformers", "tokenizers", "jinja2"):
    sys.modules[name] = None     # as if not installed
import muser_torch, muser_torch.text
from muser_torch.text import tokenizer_from_metadata
from muser_torch.text.byte_tokenizer import ByteTokenizer
assert isinstance(tokenizer_from_metadata(ByteTokenizer().to_metadata()), ByteTokenizer)
md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "a", "\u2581a"],
      "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0, -2.0], "tokenizer.ggml.bos_token_id": 1,
      "tokenizer.ggml.eos_token_id": 2}
assert tokenizer_from_metadata(md).encode("a") == [1, 4]   # sentencepiece: no extra needed
md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
      "tokenizer.ggml.tokens": ["a", "b", "ab"], "tokenizer.ggml.merges": ["a b"]}
try:
    tokenizer_from_metadata(md)
except ImportError as e:
    print("refused:", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout and 'pip install -e ".[hf]"' in out.stdout, out.stdout
