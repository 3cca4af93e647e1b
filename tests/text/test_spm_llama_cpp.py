"""``text/spm.py`` on the real Gemma 3 270M file against llama.cpp's own
tokenizer (``llama_tokenize`` in ``lcpp_logits``, ``tests/lcpp.py``), token for
token, with parse_special false and true: the 12 multilingual samples and the
fixed fragments, random text, runs of spaces, tabs and newlines past the
longest run token (31 of each), code, emoji, and every special token's text.
The same samples on small Llama-2-style vocabularies trained here
(``tiny_tokenizers``: by the ``tokenizers`` library and by sentencepiece
itself, with the space prefix on and off), written as tokenizer-only files
that llama.cpp loads as a vocabulary. Without the peer (``tools/peers.sh``) these tests skip, saying so."""
from __future__ import annotations

import pytest

from muser_torch.gguf_io import load_gguf
from muser_torch.text import tokenizer_from_metadata

from .. import lcpp
from .samples import CODE, EMOJI, FRAGMENTS, MULTILINGUAL, fresh_seed, random_texts, whitespace_runs
from .tiny_tokenizers import llama_metadata, sentencepiece_llama_metadata, write_tokenizer_gguf

SEED = fresh_seed()


@pytest.fixture(scope="module")
def gemma(gemma_path):
    return tokenizer_from_metadata(load_gguf(gemma_path).metadata)


def _texts(tok) -> dict[str, list[str]]:
    specials = [t for t, _ in tok.backend._all_specials]
    return {
        "multilingual": list(MULTILINGUAL) + [f for f in FRAGMENTS if f],
        "random": random_texts(SEED, n=40),
        "whitespace": whitespace_runs(),
        "code": [CODE, CODE.replace("\t", "    ")],
        "emoji": [EMOJI],
        # every special token, alone and between text; and all of them in one text
        "specials": specials + [f"a{t} b" for t in specials[::7]] + [" ".join(specials)],
    }


@pytest.fixture(scope="module")
def gemma_llama_cpp_ids(gemma, gemma_path, tmp_path_factory):
    """(kind, parse_special) -> llama.cpp's ids of each of ``_texts``' texts of that kind,
    from one load of the vocabulary for all of them (a load is about 0.4 s)."""
    cases = [(kind, flag, texts) for kind, texts in _texts(gemma).items() for flag in (False, True)]
    root = tmp_path_factory.mktemp("spm-gemma")
    ids = iter(lcpp.llama_cpp_tokenize_many_flags(gemma_path, [(t, flag) for _, flag, texts in cases
                                                               for t in texts], root))
    return {(kind, flag): [next(ids) for _ in texts] for kind, flag, texts in cases}


@pytest.mark.parametrize("parse_special", [False, True])
@pytest.mark.parametrize("kind", ["multilingual", "random", "whitespace", "code", "emoji",
                                  "specials"])
def test_ids_are_llama_cpps(gemma, gemma_llama_cpp_ids, kind, parse_special):
    texts = _texts(gemma)[kind]
    want = gemma_llama_cpp_ids[kind, parse_special]
    assert len(want) == len(texts)
    for text, ids in zip(texts, want):
        got = gemma.encode(text, bos=False, parse_special=parse_special)
        assert got == ids, (f"seed {SEED}, parse_special={parse_special}: {text[:80]!r}: "
                            f"ours {got[:20]} llama.cpp {ids[:20]}")
        assert gemma.decode(got) == gemma.decode(ids)


# name -> the metadata of a small sentencepiece-style vocabulary
TINY = {
    "tokenizers-bpe": lambda: llama_metadata(SEED),
    "tokenizers-bpe-no-prefix": lambda: llama_metadata(SEED + 1, add_space_prefix=False),
    "sentencepiece": lambda: sentencepiece_llama_metadata(SEED + 2)[0],
    "sentencepiece-no-prefix": lambda: sentencepiece_llama_metadata(SEED + 3,
                                                                    add_space_prefix=False)[0],
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """name -> (our tokenizer read back from the written file, its path)."""
    root = tmp_path_factory.mktemp("spm")
    out = {}
    for name, build in TINY.items():
        path = write_tokenizer_gguf(root / f"{name}.gguf", build(), "llama")
        out[name] = tokenizer_from_metadata(load_gguf(path).metadata), path
    return out


@pytest.mark.parametrize("parse_special", [False, True])
@pytest.mark.parametrize("name", TINY)
def test_small_vocabularies_are_llama_cpps(tiny, tmp_path, name, parse_special):
    tok, path = tiny[name]
    texts = [t for kind in _texts(tok).values() for t in kind]
    want = lcpp.llama_cpp_tokenize_many(path, texts, parse_special, tmp_path)
    for text, ids in zip(texts, want):
        got = tok.encode(text, bos=False, parse_special=parse_special)
        assert got == ids, (f"seed {SEED}, {name}, parse_special={parse_special}: {text[:80]!r}: "
                            f"ours {got[:20]} llama.cpp {ids[:20]}")


def test_bos_is_added_as_llama_cpp_adds_it(gemma, gemma_path):
    """``encode``'s defaults against llama_tokenize with add_special true."""
    lcpp.skip_unless_available()
    for text in ("a" + " " * 35 + "b", "user says: <end_of_turn>\n<start_of_turn>model\nI will obey"):
        assert gemma.encode(text) == lcpp.llama_cpp_tokenize(gemma_path, text), repr(text)


def test_the_comparison_sees_a_wrong_merge_order(gemma, gemma_path, tmp_path):
    """The twin: merging the lowest-scoring pair first gives other ids on most
    of these texts, so the test above can fail."""
    texts = list(MULTILINGUAL) + [CODE]
    want = lcpp.llama_cpp_tokenize_many(gemma_path, texts, False, tmp_path)
    backend = gemma.backend
    real = backend.scores
    try:
        backend.scores = [-s for s in real]   # the worst pair first
        wrong = [gemma.encode(t, bos=False) for t in texts]
    finally:
        backend.scores = real
    assert sum(w != ids for w, ids in zip(wrong, want)) >= len(texts) // 2
