"""Small tokenizers trained here (tiny_tokenizers.py), written into tokenizer-only
GGUFs, read back by our reader, and compared with transformers'
``AutoTokenizer.from_pretrained(dir, gguf_file=...)`` of the same files, and
the sentencepiece vocabularies with sentencepiece itself.

A known difference, on purpose: for sentencepiece vocabularies with the space
prefix on, llama.cpp (and sentencepiece) put "▁" in front of every run of
text, also one that starts with a space or follows a special token; ours
does too, transformers' Llama conversion does not (" hi" gives "▁hi" there,
and decodes to "hi"). Those inputs are compared with sentencepiece instead."""
from __future__ import annotations

import pytest

from muser_torch.gguf_io import load_gguf
from muser_torch.text import tokenizer_from_metadata

from .samples import all_samples, fresh_seed
from .tiny_tokenizers import (gpt2_metadata, llama_metadata, sentencepiece_llama_metadata,
                              write_tokenizer_gguf)

pytest.importorskip("transformers")

SEED = fresh_seed()

# name -> (metadata builder, general.architecture)
CASES = {
    "qwen2-bpe": (lambda s: gpt2_metadata(s, pre="qwen2"), "qwen2"),
    "llama3-bpe": (lambda s: gpt2_metadata(s, pre="llama-bpe", add_bos=True, add_eos=True), "llama"),
    "llama-spm": (lambda s: llama_metadata(s), "llama"),
    "llama-spm-no-bos": (lambda s: llama_metadata(s, add_bos=False), "llama"),
}
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Héllo <b>wörld</b> & 日本?"},
    {"role": "assistant", "content": "  Привет!  "},
    {"role": "user", "content": "def f():\n\treturn 1"},
]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """name -> (ours, transformers', path), all read from the written files."""
    from transformers import AutoTokenizer
    root = tmp_path_factory.mktemp("tok")
    out = {}
    for i, (name, (build, arch)) in enumerate(CASES.items()):
        path = write_tokenizer_gguf(root / f"{name}.gguf", build(SEED + i), arch)
        ours = tokenizer_from_metadata(load_gguf(path).metadata)
        ref = AutoTokenizer.from_pretrained(str(root), gguf_file=path.name)
        out[name] = ours, ref, path
    return out


def comparable(name: str, text: str) -> str:
    """The text with the inputs of the known difference (module docstring) left out."""
    return text.lstrip(" ") if "spm" in name else text


@pytest.mark.parametrize("name", CASES)
def test_ids_match_transformers(pairs, name):
    ours, ref, _ = pairs[name]
    specials = "x<|im_end|>y <think>z</think><|endoftext|>" if "bpe" in name else "x</s>"
    for text in all_samples(SEED):
        text = comparable(name, text)
        assert ours.encode(text) == ref.encode(text), f"seed {SEED} {name}: {text!r}"
    # transformers matches control tokens' text; ours does when asked (parse_special)
    assert ours.encode(specials, parse_special=True) == ref.encode(specials), f"seed {SEED} {name}"


@pytest.mark.parametrize("name", CASES)
def test_decode_round_trips_exactly(pairs, name):
    ours, ref, _ = pairs[name]
    for text in all_samples(SEED):
        ids = ours.encode(text)
        assert ours.decode(ids) == text, f"seed {SEED} {name}: {text!r}"
        if "spm" not in name:
            assert ref.decode(ids, skip_special_tokens=True) == text, f"seed {SEED} {name}: {text!r}"


@pytest.mark.parametrize("name", CASES)
def test_special_ids_flags_and_stops(pairs, name):
    ours, ref, path = pairs[name]
    md = load_gguf(path).metadata
    assert (ours.bos_id, ours.eos_id) == (ref.bos_token_id, ref.eos_token_id)
    assert ours.vocab_size == len(md["tokenizer.ggml.tokens"]) == len(ref)
    assert (ours.add_bos, ours.add_eos) == (md["tokenizer.ggml.add_bos_token"],
                                            md["tokenizer.ggml.add_eos_token"])
    ids = ours.encode("the model")
    assert (ids[0] == ours.bos_id) == ours.add_bos and (ids[-1] == ours.eos_id) == ours.add_eos
    tokens = md["tokenizer.ggml.tokens"]
    if "bpe" in name:   # EOS is <|im_end|>; <|endoftext|> is an end-of-turn text too
        assert ours.stop_ids == (tokens.index("<|im_end|>"), tokens.index("<|endoftext|>"))
        think = ours.encode("a<think>b", bos=False, eos=False)
        assert tokens.index("<think>") in think          # a user-defined token stays whole
        assert ours.decode(think) == "a<think>b"          # and is text, not special
    else:
        assert ours.stop_ids == (2,)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("name", CASES)
def test_chat_matches_transformers(pairs, name, add_generation_prompt):
    ours, ref, _ = pairs[name]
    for turns in (2, 3, 4):
        messages = CHAT[:turns]
        want = ref.apply_chat_template(messages, tokenize=False,
                                       add_generation_prompt=add_generation_prompt)
        assert ref.chat_template == ours.chat_template     # both read the file's template
        assert ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == want
        if "bpe" in name:   # sentencepiece prompts hold specials mid-text: the known difference
            want_ids = ref.apply_chat_template(messages, tokenize=True, return_dict=False,
                                               add_generation_prompt=add_generation_prompt)
            assert ours.encode_chat(messages, add_generation_prompt) == list(want_ids)


@pytest.mark.parametrize("add_space_prefix", [True, False])
def test_sentencepiece_vocabulary_matches_sentencepiece(tmp_path, add_space_prefix):
    """Leading spaces, runs of spaces, byte fallback and both prefix settings,
    against the sentencepiece model the vocabulary came from."""
    pytest.importorskip("sentencepiece")
    md, sp = sentencepiece_llama_metadata(SEED, add_space_prefix=add_space_prefix)
    path = write_tokenizer_gguf(tmp_path / "sp.gguf", md, "llama")
    ours = tokenizer_from_metadata(load_gguf(path).metadata)
    for text in all_samples(SEED) + ["  two leading", " ", "   "]:
        want = sp.encode(text)
        assert ours.encode(text, bos=False) == want, f"seed {SEED} prefix={add_space_prefix}: {text!r}"
        assert ours.encode(text) == [sp.bos_id()] + want
        assert ours.decode(want) == sp.decode(want) == text, f"seed {SEED}: {text!r}"
    # llama.cpp also prefixes the text after a special token, as after <s> here
    assert ours.encode("<s>abc", bos=False, parse_special=True) == [sp.bos_id()] + sp.encode("abc")
