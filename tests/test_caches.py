"""The run's caches (tests/cache_dirs.py): MUSER_CACHE_DIR is a folder of
its own, never the user's; kernel builds go back to the user's cache, test
tokenizers do not."""
from __future__ import annotations

import os
from pathlib import Path

from muser_torch.cache import cache_dir

from .cache_dirs import keep_kernel_builds, session_cache
from .conftest import _SESSION_CACHE, _USER_CACHE


def test_the_run_caches_in_a_folder_of_its_own():
    assert os.environ["MUSER_CACHE_DIR"] == str(_SESSION_CACHE)
    assert cache_dir() == _SESSION_CACHE / "muser_torch" != _USER_CACHE
    for entry in cache_dir().iterdir():      # only the kernel builds point at the user's cache
        if entry.is_symlink():
            assert entry.name.startswith(("cpu_kernels-", "cuda-ext")), entry


def test_kernel_builds_go_back_and_tokenizers_do_not(tmp_path):
    user = tmp_path / "home" / "muser_torch"
    (user / "cpu_kernels-old").mkdir(parents=True)
    (user / "cpu_kernels-old" / "lib.so").write_bytes(b"old")
    session = session_cache(user, tmp_path)
    mine = session / "muser_torch"
    assert (mine / "cpu_kernels-old").resolve() == (user / "cpu_kernels-old").resolve()
    (mine / "cpu_kernels-new").mkdir()
    (mine / "cpu_kernels-new" / "lib.so").write_bytes(b"new")
    (mine / "tokenizers").mkdir()
    (mine / "tokenizers" / "k.json").write_text("{}")
    keep_kernel_builds(session, user)
    assert (user / "cpu_kernels-new" / "lib.so").read_bytes() == b"new"
    assert sorted(p.name for p in user.iterdir()) == ["cpu_kernels-new", "cpu_kernels-old"]
    assert not Path(session).exists()


def test_large_tokenizers_are_shared_between_runs_and_small_ones_are_not(tmp_path, monkeypatch):
    from . import cache_dirs
    monkeypatch.setattr(cache_dirs, "SHARED", tmp_path / "shared")
    user = tmp_path / "home" / "muser_torch"
    first = session_cache(user, tmp_path)
    folder = first / "muser_torch" / "tokenizers"
    folder.mkdir()
    for key, size in (("big", cache_dirs.LARGE), ("small", 100)):
        (folder / f"{key}.json").write_bytes(b"x" * size)
        (folder / f"{key}.meta").write_text("{}")
    cache_dirs.keep_large_tokenizers(first, user)
    assert sorted(p.name for p in (tmp_path / "shared" / "tokenizers").iterdir()) == ["big.json", "big.meta"]
    second = session_cache(user, tmp_path)
    monkeypatch.setenv("MUSER_CACHE_DIR", str(second))
    cache_dirs.link_shared_tokenizers(second)
    linked = second / "muser_torch" / "tokenizers" / "big.json"
    assert linked.is_symlink() and linked.stat().st_size == cache_dirs.LARGE
    assert not user.exists()          # nothing of it in the user's cache
