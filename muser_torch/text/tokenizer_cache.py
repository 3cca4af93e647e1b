"""Built tokenizers, cached on disk. Building one from a file's metadata can
take seconds (Gemma 3's 262,144 tokens: transformers derives half a million
merges from the scores); reading the ``tokenizers`` JSON of the result back
takes a fraction of that.

An entry is ``cache_dir()/tokenizers/<key>.json`` beside ``<key>.meta``. The key is the sha256 of
every ``tokenizer.*`` key and value of the file, ``general.architecture``
(transformers' conversion reads it), the source of the modules that build a
tokenizer (this package's ``BUILDER_SOURCES``) and the versions of
transformers and tokenizers, so a change to any of them misses. The ``.json``
is the tokenizer's JSON, which ``tokenizers`` reads straight from the file (a
Python copy of a 262k-token vocabulary's text costs tens of MB of peak
memory); the ``.meta`` (format, key, sha256 of the JSON, token count) is
written after it, each to a temporary file renamed into place. An entry is
used only when its meta names this key and format, the JSON hashes to the
meta's digest, and it parses to a tokenizer with the file's token count;
anything else is rebuilt and rewritten. A cache that cannot be
written costs the next load a rebuild, nothing more."""
from __future__ import annotations

import ctypes
import functools
from array import array
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

from ..cache import cache_dir
from .metadata import VocabMetadata

FORMAT = 2
# The modules whose code decides what a built tokenizer is.
BUILDER_SOURCES = ("gguf_tokenizer.py", "spm_bpe.py", "metadata.py", "tokenizer_cache.py")
_KEYED = ("tokenizer.", "general.architecture")


@functools.lru_cache(maxsize=1)
def _code_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:   # without importing it: transformers takes a second
        try:
            return version(name)
        except PackageNotFoundError:
            return "-"
    here = Path(__file__).parent
    h = hashlib.sha256(f"{FORMAT}\0{installed('transformers')}\0{installed('tokenizers')}".encode())
    for name in BUILDER_SOURCES:
        h.update(b"\0" + name.encode() + b"\0" + (here / name).read_bytes())
    return h.hexdigest()


def _feed(h: Any, v: Any) -> None:
    """``v`` into the hash, typed and length-prefixed so that no two values
    (a list of strings and one string, 1 and 1.0 and True) feed the same
    bytes; a long list of one type goes in as one packed block."""
    if hasattr(v, "tolist"):      # a numpy array or scalar in a caller's own dict
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        kinds = {type(x) for x in v}
        if kinds == {str}:
            parts = [x.encode("utf-8", "surrogatepass") for x in v]
            h.update(b"S" + array("q", [len(v)] + [len(p) for p in parts]).tobytes() + b"".join(parts))
        elif kinds == {float}:
            h.update(b"F" + array("q", [len(v)]).tobytes() + array("d", v).tobytes())
        elif kinds == {int} and all(-2**63 <= x < 2**63 for x in v):
            h.update(b"I" + array("q", [len(v)]).tobytes() + array("q", v).tobytes())
        else:
            h.update(b"L" + array("q", [len(v)]).tobytes())
            for x in v:
                _feed(h, x)
        return
    text = repr(v).encode("utf-8", "surrogatepass")   # str, int, float, bool, None
    h.update(type(v).__name__.encode() + array("q", [len(text)]).tobytes() + text)


def cache_key(md: Mapping[str, Any]) -> str:
    """The entry's name: every keyed metadata value and the code's version."""
    h = hashlib.sha256(_code_version().encode())
    for k in sorted(k for k in md if k.startswith(_KEYED)):
        _feed(h, k)
        _feed(h, md[k])
    return h.hexdigest()


def entry_path(key: str) -> Path:
    return cache_dir() / "tokenizers" / f"{key}.json"


def _meta_path(key: str) -> Path:
    return entry_path(key).with_suffix(".meta")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load(key: str, n_tokens: int) -> Any | None:
    """The cached backend of ``key``, or None when there is no sound entry."""
    from tokenizers import Tokenizer
    path = entry_path(key)
    try:
        header = json.loads(_meta_path(key).read_bytes())
        if (header.get("format"), header.get("key"), header.get("tokens")) != (FORMAT, key, n_tokens) \
                or header.get("sha256") != _digest(path):
            return None
        backend = Tokenizer.from_file(str(path))
    except Exception:   # missing, unreadable, truncated, not JSON, not a tokenizer
        return None
    _release_heap()
    if backend.get_vocab_size(with_added_tokens=True) != n_tokens:
        return None
    return backend


def _release_heap() -> None:
    """Give the C heap's free pages back to the system. Parsing a large
    tokenizer JSON (Gemma 3's: 262,144 tokens, 514,906 merges) leaves about
    200 MB freed but resident in glibc's heap, which would then sit under
    every later allocation of the process (Gemma's generate peaked at 1,027 MB
    from the cache against 822 MB built). Nothing elsewhere."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):   # not glibc
            pass


def _write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem[:16]}-", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def store(key: str, backend: Any, n_tokens: int) -> None:
    """Write the entry (the JSON, then its meta); a failure to write is not an error of the load."""
    payload = backend.to_str().encode("utf-8")
    header = json.dumps({"format": FORMAT, "key": key, "tokens": n_tokens,
                         "sha256": hashlib.sha256(payload).hexdigest()}).encode()
    try:
        entry_path(key).parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(entry_path(key), payload)
        _write_atomically(_meta_path(key), header)
    except OSError:
        pass


def load_or_build(md: Mapping[str, Any], vocab: VocabMetadata,
                  build: Callable[[VocabMetadata], Any]) -> Any:
    """The backend of this metadata: from the cache, else ``build(vocab)`` and cached."""
    key = cache_key(md)
    n = len(vocab.tokens)
    backend = load(key, n)
    if backend is None:
        backend = build(vocab)
        store(key, backend, n)
    return backend
