"""The built-tokenizer cache (``text/tokenizer_cache.py``) of the "gpt2"
vocabularies (a "llama" one is built from the file's arrays, uncached): a second load reads
the tokenizer back instead of building it (counted by wrapping the builder,
not timed), the tokenizer read back encodes and decodes as the one built, a
change to any ``tokenizer.*`` key (or the architecture, or the code) misses,
and an entry that is corrupt, truncated, foreign or unreadable is rebuilt
and rewritten, never used."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from muser_torch.gguf_io import load_gguf  # noqa: E402
from muser_torch.text import gguf_tokenizer, tokenizer_cache, tokenizer_from_metadata  # noqa: E402

from .samples import MULTILINGUAL, all_samples, fresh_seed  # noqa: E402
from .tiny_tokenizers import gpt2_metadata, llama_metadata  # noqa: E402

SEED = fresh_seed()


@pytest.fixture
def builds(tmp_path, monkeypatch):
    """A fresh cache directory, and a list that grows by one per tokenizer build."""
    monkeypatch.setenv("MUSER_CACHE_DIR", str(tmp_path / "cache"))
    made = []
    real = gguf_tokenizer.build_backend

    def counted(vocab):
        made.append(vocab.model)
        return real(vocab)
    monkeypatch.setattr(gguf_tokenizer, "build_backend", counted)
    return made


def _same(a, b, texts, what: str) -> None:
    for text in texts:
        ids = a.encode(text)
        assert ids == b.encode(text), f"{what}: {text!r}"
        assert a.decode(ids) == b.decode(ids), f"{what}: decode of {text!r}"
        assert a.encode(text, bos=False) == b.encode(text, bos=False), f"{what}: {text!r} without BOS"


def _metadata(kind: str, seed: int = SEED) -> dict:
    md = gpt2_metadata(seed) if kind == "bpe" else llama_metadata(seed)
    return {"general.architecture": "qwen2" if kind == "bpe" else "llama", **md}


@pytest.mark.parametrize("kind", ["bpe"])
def test_second_load_reads_the_cache_and_tokenizes_alike(builds, kind):
    md = _metadata(kind)
    built = tokenizer_from_metadata(md)
    assert len(builds) == 1 and tokenizer_cache.entry_path(tokenizer_cache.cache_key(md)).is_file()
    cached = tokenizer_from_metadata(md)
    assert len(builds) == 1, "the second load built the tokenizer again"
    assert cached.backend is not built.backend
    _same(cached, built, all_samples(SEED) + list(MULTILINGUAL), f"seed {SEED}, {kind}")


@pytest.mark.parametrize("kind", ["sentencepiece", "gemma"])
def test_a_sentencepiece_vocabulary_is_built_uncached(builds, gemma_path, kind):
    """A "llama" vocabulary (the real Gemma 3 file's too) is built from the
    file's arrays each time: no ``tokenizers`` build, no cache entry."""
    md = load_gguf(gemma_path).metadata if kind == "gemma" else _metadata("sentencepiece")
    tok = tokenizer_from_metadata(md)
    assert builds == [] and not tokenizer_cache.entry_path(tokenizer_cache.cache_key(md)).exists()
    assert type(tok.backend).__name__ == "SpmTokenizer"


def _changed(value):
    """A different value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    return list(value[:-1]) + [_changed(value[-1])]


@pytest.mark.parametrize("kind", ["bpe"])
def test_any_tokenizer_key_changes_the_key(kind, monkeypatch):
    md = _metadata(kind)
    key = tokenizer_cache.cache_key(md)
    keyed = [k for k in md if k.startswith("tokenizer.")] + ["general.architecture"]
    assert len(keyed) >= 6
    for k in keyed:
        assert tokenizer_cache.cache_key({**md, k: _changed(md[k])}) != key, k
        assert tokenizer_cache.cache_key({k2: v for k2, v in md.items() if k2 != k}) != key, k
    # a new tokenizer key, and values equal in Python but of another type
    assert tokenizer_cache.cache_key({**md, "tokenizer.ggml.add_eos_token": True}) != key
    flag = "tokenizer.ggml.add_bos_token"
    assert tokenizer_cache.cache_key({**md, flag: int(md[flag])}) != tokenizer_cache.cache_key(md)
    assert tokenizer_cache.cache_key({**md, "qwen2.block_count": 7}) == key   # not a tokenizer key
    monkeypatch.setattr(tokenizer_cache, "_code_version", lambda: "another version of the code")
    assert tokenizer_cache.cache_key(md) != key


def test_a_changed_key_misses_end_to_end(builds):
    md = _metadata("bpe")
    tokenizer_from_metadata(md)
    changed = {**md, "tokenizer.ggml.add_eos_token": True}
    tokenizer_from_metadata(changed)
    assert len(builds) == 2
    tokenizer_from_metadata(changed)
    tokenizer_from_metadata(md)
    assert len(builds) == 2      # both entries are kept


def _flip_payload_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x20
    path.write_bytes(bytes(data))


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-100])


def _garbage(path):
    path.write_bytes(b"\x00\xff not json at all")


def _empty(path):
    path.write_bytes(b"")


CORRUPTIONS = {"flipped byte": _flip_payload_byte, "truncated": _truncate, "garbage": _garbage,
               "empty": _empty}


@pytest.mark.parametrize("damage", CORRUPTIONS)
def test_a_corrupt_entry_is_rebuilt(builds, damage):
    md = _metadata("bpe")
    good = tokenizer_from_metadata(md)
    path = tokenizer_cache.entry_path(tokenizer_cache.cache_key(md))
    sound = path.read_bytes()
    CORRUPTIONS[damage](path)
    again = tokenizer_from_metadata(md)
    assert len(builds) == 2, f"{damage}: the damaged entry was used"
    assert path.read_bytes() == sound, f"{damage}: the entry was not rewritten"
    _same(again, good, MULTILINGUAL, damage)
    tokenizer_from_metadata(md)
    assert len(builds) == 2


def test_another_files_entry_under_this_key_is_rebuilt(builds):
    """A sound entry of another vocabulary copied under this key's name (its
    header names its own key) is not used."""
    md, other = _metadata("bpe"), _metadata("bpe", SEED + 1)
    tokenizer_from_metadata(md)
    tokenizer_from_metadata(other)
    here = tokenizer_cache.entry_path(tokenizer_cache.cache_key(md))
    here.write_bytes(tokenizer_cache.entry_path(tokenizer_cache.cache_key(other)).read_bytes())
    again = tokenizer_from_metadata(md)
    assert len(builds) == 3
    assert again.model == "gpt2" and again.vocab_size == len(md["tokenizer.ggml.tokens"])


def test_an_unwritable_cache_costs_a_rebuild_only(tmp_path, monkeypatch, builds):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("MUSER_CACHE_DIR", str(blocker))
    md = _metadata("bpe")
    a, b = tokenizer_from_metadata(md), tokenizer_from_metadata(md)
    assert len(builds) == 2
    _same(a, b, MULTILINGUAL, "uncached")
    assert blocker.read_text() == "not a directory"


def test_a_cached_load_leaves_no_parse_heap_behind(gemma_path):
    """Reading Gemma 3's entry back parses 14 MB of JSON; the heap it frees goes
    back to the system (``_release_heap``), so the process holds the tokenizer,
    not the parse: loading the entry grows a child's resident memory by less
    than 200 MB (about 290 MB without the release; the tokenizer itself is
    about 100 MB). The entry is the run's own cache's, so a large one an earlier
    run kept (tests/cache_dirs.py) saves its 9 s build; the child only reads it."""
    import os
    import subprocess
    import sys
    md = load_gguf(gemma_path).metadata
    key, n = tokenizer_cache.cache_key(md), len(md["tokenizer.ggml.tokens"])
    child = ("import sys; from muser_torch.text import tokenizer_cache as c; "
             "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * 4096 >> 20; "
             "before = rss(); loaded = c.load(sys.argv[1], int(sys.argv[2])) is not None; "
             "print(rss() - before if loaded else 'no entry')")

    def grown() -> str:
        return subprocess.run([sys.executable, "-c", child, key, str(n)], capture_output=True, text=True,
                              env=dict(os.environ), check=True).stdout.strip()
    out = grown()
    if out == "no entry":
        # Gemma's own load no longer reads the cache; its old "tokenizers" build is
        # still the largest entry at hand, and a large "gpt2" vocabulary's is alike
        vocab = gguf_tokenizer.read_vocab_metadata(md, "llama")
        tokenizer_cache.store(key, gguf_tokenizer.build_backend(vocab), n)
        out = grown()
    assert out != "no entry", "the entry just stored did not load"
    assert int(out) < 200, f"loading the entry grew resident memory by {out} MB"
