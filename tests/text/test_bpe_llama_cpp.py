"""The GPT-2-style ("gpt2", byte-level BPE) vocabularies against llama.cpp's own
tokenizer (``llama_tokenize`` in ``lcpp_logits``, loading the vocabulary only:
``tests/lcpp.py``), token for token, with parse_special false and true, on the
samples ``test_spm_llama_cpp.py`` holds Gemma 3 to: the 12 multilingual
samples and the fixed fragments, random text, runs of spaces, tabs and
newlines, code, emoji, and every special token's text.

The vocabularies are trained here (``tiny_tokenizers.gpt2_metadata``), each
with its family's pre-tokenizer regex and markup, and written as llama.cpp's
converter writes them: Qwen 2 (ChatML, ``<think>``), Llama 3 (``llama-bpe``,
its header tokens), DeepSeek-R1-Distill-Qwen (``deepseek-r1-qwen``, its
full-width markers outside the byte alphabet), and one holding every chat
family's markup, gpt-oss's channel markers among them (llama.cpp's loader
makes those USER_DEFINED: matched whole either way), and one whose
``<|im_end|>`` the file types USER_DEFINED (llama.cpp's loader makes it
CONTROL: parse_special decides it). Without the peer
(``tools/peers.sh``) these tests skip, saying so."""
from __future__ import annotations

import pytest

from muser_torch.gguf_io import load_gguf
from muser_torch.text import tokenizer_from_metadata

from .. import lcpp
from .samples import CODE, EMOJI, FRAGMENTS, MULTILINGUAL, fresh_seed, random_texts, whitespace_runs
from .family_templates import FAMILY_CONTROL, FAMILY_USER, R1_CONTROL, R1_USER
from .tiny_tokenizers import gpt2_metadata, write_tokenizer_gguf

pytest.importorskip("transformers")

SEED = fresh_seed()
LLAMA3_CONTROL = ("<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|end_of_text|>", "<|eom_id|>")
LLAMA3_USER = ("<|python_tag|>",)
# name -> (pre, general.architecture, CONTROL tokens, USER_DEFINED tokens)
FAMILIES = {
    "qwen2": ("qwen2", "qwen2", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
              ("<think>", "</think>")),
    "llama3": ("llama-bpe", "llama", LLAMA3_CONTROL, LLAMA3_USER),
    "deepseek-r1-qwen": ("deepseek-r1-qwen", "qwen2", R1_CONTROL, R1_USER),
    "every-family": ("qwen2", "qwen2", FAMILY_CONTROL, FAMILY_USER),
    # <|im_end|> typed USER_DEFINED: llama.cpp's loader makes it CONTROL by its text
    "retyped": ("qwen2", "qwen2", ("<|endoftext|>", "<|im_start|>"), ("<|im_end|>", "<think>")),
}


@pytest.fixture(scope="module")
def vocabularies(tmp_path_factory):
    """name -> (our tokenizer read back from the written file, its path)."""
    root = tmp_path_factory.mktemp("bpe")
    out = {}
    for k, (name, (pre, arch, control, user)) in enumerate(FAMILIES.items()):
        md = gpt2_metadata(SEED + k, pre=pre, control=control, user=user)
        path = write_tokenizer_gguf(root / f"{name}.gguf", md, arch)
        out[name] = tokenizer_from_metadata(load_gguf(path).metadata), path
    return out


def texts(tok, kind: str) -> list[str]:
    specials = [t for t, k in zip(tok.vocab.tokens, tok.vocab.token_types) if k in (3, 4)]
    return {
        "multilingual": list(MULTILINGUAL) + [f for f in FRAGMENTS if f],
        "random": random_texts(SEED, n=40),
        "whitespace": whitespace_runs(),
        "code": [CODE, CODE.replace("\t", "    ")],
        "emoji": [EMOJI],
        # every special token, alone and between text; all of them in one text
        "specials": specials + [f"a{t} b" for t in specials] + [" ".join(specials),
                                                                "".join(specials)],
    }[kind]


@pytest.mark.parametrize("parse_special", [False, True])
@pytest.mark.parametrize("kind", ["multilingual", "random", "whitespace", "code", "emoji",
                                  "specials"])
@pytest.mark.parametrize("name", FAMILIES)
def test_ids_are_llama_cpps(vocabularies, tmp_path, name, kind, parse_special):
    tok, path = vocabularies[name]
    sample = texts(tok, kind)
    want = lcpp.llama_cpp_tokenize_many(path, sample, parse_special, tmp_path)
    for text, ids in zip(sample, want):
        got = tok.encode(text, bos=False, parse_special=parse_special)
        assert got == ids, (f"seed {SEED}, {name}, parse_special={parse_special}: {text[:80]!r}: "
                            f"ours {got[:20]} llama.cpp {ids[:20]}")
        assert tok.decode(got) == tok.decode(ids)


@pytest.mark.parametrize("name", FAMILIES)
def test_the_comparison_sees_a_control_token_matched_as_text(vocabularies, tmp_path, name):
    """The twin: with the control tokens' text matched whatever parse_special
    says (the old ``encode``), the parse_special=false comparison fails on
    every text that spells one."""
    tok, path = vocabularies[name]
    spelled = [f"a{t} b" for t in tok.controls]
    want = lcpp.llama_cpp_tokenize_many(path, spelled, False, tmp_path)
    wrong = [tok.encode(t, bos=False, parse_special=True) for t in spelled]
    assert all(w != ids for w, ids in zip(wrong, want))
