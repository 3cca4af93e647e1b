"""A ``MUSER_CACHE_DIR`` for child processes that holds the built kernels but
no tokenizer, so a child builds each file's tokenizer from its metadata as a
first run on a fresh machine does (tests whose verdict is about that path:
the missing-extra refusal, the fuzz's memory cap)."""
from __future__ import annotations

import tempfile
from pathlib import Path

from muser_torch.cache import cache_dir


def kernels_only_cache() -> str:
    """A new folder to pass as ``MUSER_CACHE_DIR``: ``cache_dir()``'s entries
    linked into it, its tokenizers left out."""
    base = Path(tempfile.mkdtemp(prefix="muser-cache-"))
    fresh, real = base / cache_dir().name, cache_dir()
    fresh.mkdir()
    if real.is_dir():
        for entry in real.iterdir():
            if entry.name != "tokenizers":
                (fresh / entry.name).symlink_to(entry)
    return str(base)
