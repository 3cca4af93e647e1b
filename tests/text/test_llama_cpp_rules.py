"""Where llama.cpp reads a key that transformers' GGUF conversion leaves out,
the tokenizer follows llama.cpp (src/llama-vocab.cpp): BOS defaults, and
whole-word lookup before merges for the llama3 family of BPE pre-tokenizers."""
from __future__ import annotations

import pytest

from muser_torch.text import tokenizer_from_metadata

pytest.importorskip("transformers")
P = "tokenizer.ggml."


def byte_level_metadata(pre: str) -> dict:
    """The 256 byte-level characters, then "bc" (merge "b c") and "abc", which
    no merge makes: only a whole-word lookup finds it."""
    from tokenizers.pre_tokenizers import ByteLevel
    tokens = sorted(ByteLevel.alphabet()) + ["bc", "abc", "<|end|>"]
    return {P + "model": "gpt2", P + "pre": pre, P + "tokens": tokens,
            P + "token_type": [1] * (len(tokens) - 1) + [3], P + "merges": ["b c"],
            P + "bos_token_id": len(tokens) - 1, P + "eos_token_id": len(tokens) - 1}


@pytest.mark.parametrize("pre,whole", [("llama-bpe", True), ("llama3", True), ("qwen2", False),
                                       ("gpt-2", False)])
def test_llama3_family_looks_up_whole_words_first(pre, whole):
    tok = tokenizer_from_metadata(byte_level_metadata(pre))
    tokens = tok.vocab.tokens
    want = [tokens.index("abc")] if whole else [tokens.index("a"), tokens.index("bc")]
    assert tok.encode("abc", bos=False) == want
    assert tok.decode(want) == "abc"


@pytest.mark.parametrize("pre,add_bos", [("llama-bpe", True), ("qwen2", False)])
def test_bpe_bos_default_follows_the_pre_tokenizer(pre, add_bos):
    tok = tokenizer_from_metadata(byte_level_metadata(pre))
    assert tok.add_bos is add_bos and tok.add_eos is False
    assert (tok.encode("abc")[0] == tok.bos_id) is add_bos
    explicit = tokenizer_from_metadata(byte_level_metadata(pre) | {P + "add_bos_token": not add_bos})
    assert explicit.add_bos is (not add_bos)


def test_sentencepiece_defaults_add_bos_and_the_space_prefix():
    tokens = ["<unk>", "<s>", "</s>", "\u2581", "a", "\u2581a"]
    md = {P + "model": "llama", P + "tokens": tokens, P + "scores": [0.0, 0.0, 0.0, -1.0, -2.0, -3.0],
          P + "token_type": [2, 3, 3, 1, 1, 1], P + "bos_token_id": 1, P + "eos_token_id": 2}
    tok = tokenizer_from_metadata(md)
    assert tok.add_bos and tok.encode("a") == [1, 5]
    off = tokenizer_from_metadata(md | {P + "add_space_prefix": False})
    assert off.encode("a", bos=False) == [4] and off.encode(" a", bos=False) == [5]


def test_no_token_past_the_files_vocabulary():
    """transformers' GPT-2 class adds "<|endoftext|>" when a vocabulary lacks it
    (here, as in Llama 3's); that text must stay text, inside the vocabulary."""
    md = byte_level_metadata("llama-bpe")
    tok = tokenizer_from_metadata(md)
    for parse_special in (False, True):
        ids = tok.encode("x<|endoftext|>y<|end|>", bos=False, parse_special=parse_special)
        assert max(ids) < tok.vocab_size == len(md[P + "tokens"])
    # asked for, the file's own control token stays whole
    assert ids[-1] == md[P + "tokens"].index("<|end|>")
    assert tok.decode(ids) == "x<|endoftext|>y"
