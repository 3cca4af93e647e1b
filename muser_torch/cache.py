"""Where muser-torch keeps what it builds once per machine: the native CPU
kernels (``ops/cpu/build.py``) and the tokenizers built from files' metadata
(``text/tokenizer_cache.py``): ``$MUSER_CACHE_DIR``, else
``$XDG_CACHE_HOME``, else ``~/.cache``, then ``muser_torch``."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    base = os.environ.get("MUSER_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME") \
        or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "muser_torch"
