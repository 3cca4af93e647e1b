"""The caches of a test run.

The suite never writes into the user's muser-torch cache (``cache_dir()``,
``~/.cache/muser_torch``): it once left ~80 tokenizers of its random files
there, 159 MB. ``session_cache()`` makes the run's own ``MUSER_CACHE_DIR``, a
temporary folder, with these choices:

- the user's kernel builds (``cpu_kernels-<key>``, ``cuda-ext``) are linked in,
  and one this run builds is moved to the user's cache at the end: keyed by
  the sources, compiler and CPU, it is what the user's own first run would
  build, and compiling it again each run would cost seconds to minutes;
- tokenizers are built in the run's folder, except the large ones (the real
  Gemma 3 file's and its variants: 262,144 tokens, 14 MB, about 9 s each to
  build on 2 cores): those are kept in the project's own cache beside the
  llama.cpp peers (``SHARED``, ``~/.cache/muser-torch/tokenizers``, the 4
  newest) and linked into the next run's; the small ones of the random test
  files, a few ms each, go with the run's folder;
- test-built files (the fuzz targets) live in ``SHARED`` too.

Caches outside ``MUSER_CACHE_DIR`` stay where they are, as shared builds: the
Metal emulator's compiled shim (``MUSER_METAL_CACHE``), llama.cpp's peers and
sources, Triton's kernels, the assembled Gemma file.

``kernels_only_cache()`` is a ``MUSER_CACHE_DIR`` for child processes that
holds the built kernels but no tokenizer, so a child builds each file's
tokenizer from its metadata as a first run on a fresh machine does (tests
whose verdict is about that path: the missing-extra refusal, the fuzz's
memory cap)."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from muser_torch.cache import cache_dir

SHARED = Path.home() / ".cache" / "muser-torch"
KERNELS = ("cpu_kernels-", "cuda-ext")     # cache_dir() entries that are kernel builds
LARGE = 4 << 20               # a tokenizer entry worth keeping between runs (Gemma 3's: 14 MB)
SHARED_TOKENIZERS = 4         # of them, the newest kept


def session_cache(user: Path, parent: Path | None = None) -> Path:
    """A new ``MUSER_CACHE_DIR`` for this run, the user's kernel builds linked in
    (the shared tokenizers: ``link_shared_tokenizers``)."""
    base = Path(tempfile.mkdtemp(prefix="muser-test-cache-", dir=parent))
    (base / user.name).mkdir()
    if user.is_dir():
        for entry in user.iterdir():
            if entry.name.startswith(KERNELS):
                (base / user.name / entry.name).symlink_to(entry)
    return base


def keep_kernel_builds(session: Path, user: Path) -> None:
    """Move the kernel builds this run made into the user's cache (each whole
    or not at all: copied beside, then renamed), and drop the session's folder."""
    for entry in (session / user.name).iterdir() if (session / user.name).is_dir() else ():
        target = user / entry.name
        if entry.is_symlink() or not entry.name.startswith(KERNELS) or target.exists():
            continue
        try:
            user.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=user))
            shutil.copytree(entry, tmp, symlinks=True, dirs_exist_ok=True)
            os.rename(tmp, target)
        except OSError:         # another run got there first, or no room: it builds again
            shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(session, ignore_errors=True)


def link_shared_tokenizers(session: Path) -> None:
    """Link the shared cache's tokenizer entries into this run's cache (a
    rebuild replaces a link, never writes through it: entries are written by
    ``os.replace``)."""
    folder, mine = SHARED / "tokenizers", session / cache_dir().name / "tokenizers"
    mine.mkdir(parents=True, exist_ok=True)
    for entry in folder.iterdir() if folder.is_dir() else ():
        if entry.suffix in (".json", ".meta"):
            (mine / entry.name).symlink_to(entry)


def keep_large_tokenizers(session: Path, user: Path) -> None:
    """Copy the large tokenizer entries (the real Gemma file's and its
    variants, seconds to build each) this run built into the shared cache,
    then keep only its SHARED_TOKENIZERS newest: deterministic keys are
    reused by the next run, random ones age out."""
    mine, folder = session / user.name / "tokenizers", SHARED / "tokenizers"
    built = [p for p in mine.glob("*.json") if not p.is_symlink() and p.stat().st_size >= LARGE
             and p.with_suffix(".meta").is_file() and not p.with_suffix(".meta").is_symlink()]
    for entry in built:
        folder.mkdir(parents=True, exist_ok=True)
        for part in (entry, entry.with_suffix(".meta")):     # the .meta last: then it is whole
            tmp = folder / f".{part.name}.partial"
            shutil.copyfile(part, tmp)
            os.rename(tmp, folder / part.name)
    entries = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    for old in entries[:-SHARED_TOKENIZERS]:
        old.with_suffix(".meta").unlink(missing_ok=True)
        old.unlink(missing_ok=True)


def kernels_only_cache() -> str:
    """A new folder to pass as ``MUSER_CACHE_DIR``: ``cache_dir()``'s entries
    linked into it, its tokenizers left out."""
    # inside the run's own folder (MUSER_CACHE_DIR, dropped at the end), not loose in /tmp
    base = Path(tempfile.mkdtemp(prefix="kernels-only-", dir=os.environ.get("MUSER_CACHE_DIR")))
    fresh, real = base / cache_dir().name, cache_dir()
    fresh.mkdir()
    if real.is_dir():
        for entry in real.iterdir():
            if entry.name != "tokenizers":
                (fresh / entry.name).symlink_to(entry)
    return str(base)
