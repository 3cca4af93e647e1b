"""``from_gguf`` only reads its file: on a read-only filesystem (a read-only
bind mount) it loads and generates, two more processes load the same file
while this one holds it mapped, nobody holds a lock on it (``/proc/locks``),
and nothing is written beside it (the folder's listing, sizes and times, and
the file's bytes, are the same after). All three processes generate the same
tokens. The tokenizer cache lives in ``MUSER_CACHE_DIR``, elsewhere."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import muser_torch

from ..cache_dirs import kernels_only_cache

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "demo" / "glimmer-demo-q4_k_xl.gguf"
HANG_S = 600

# The child: load, say so, wait for the parent's go (so that every process
# holds the file at once), then print its greedy tokens.
CHILD = """
import sys, torch, muser_torch
torch.set_num_threads(1)
m = muser_torch.from_gguf(sys.argv[1])
print("loaded", flush=True)
sys.stdin.readline()
ids = m.tokenizer.encode("def ")
print(" ".join(map(str, m.generate(torch.tensor(ids), 12, stop=[]).tolist())), flush=True)
"""


def _mount_read_only(src: Path, dst: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root (and chmod -w does not stop root)")
    for argv in (["mount", "--bind", str(src), str(dst)],
                 ["mount", "-o", "remount,bind,ro", str(dst)]):
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode != 0:
            if argv[1] != "--bind":
                subprocess.run(["umount", str(dst)])
            pytest.skip(f"{' '.join(argv)} failed here: {r.stderr.strip()}")


def _listing(folder: Path) -> list[tuple]:
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_ctime_ns)
                  for p in folder.iterdir())


def _locks_on(path: Path) -> list[str]:
    st = path.stat()
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return [line for line in Path("/proc/locks").read_text().splitlines() if f" {dev} " in line]


@pytest.fixture
def read_only_copy(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    dst.mkdir()
    shutil.copy(DEMO, src / DEMO.name)
    _mount_read_only(src, dst)
    try:
        with pytest.raises(OSError):    # the mount refuses writes, root's too
            (dst / "probe").write_bytes(b"x")
        yield dst / DEMO.name
    finally:
        subprocess.run(["umount", str(dst)], check=True)


def test_from_gguf_reads_a_read_only_file_in_three_processes_at_once(read_only_copy, tmp_path,
                                                                     monkeypatch):
    path = read_only_copy
    # a cache of their own, in which the children load the built CPU kernels (not build them)
    monkeypatch.setenv("MUSER_CACHE_DIR", kernels_only_cache())
    before, digest = _listing(path.parent), hashlib.sha256(path.read_bytes()).hexdigest()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    torch.set_num_threads(1)
    model = muser_torch.from_gguf(path, dtype=torch.float32)   # held mapped while the others load
    kids = [subprocess.Popen([sys.executable, "-c", CHILD, str(path)], cwd=ROOT, env=env, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for _ in range(2)]
    try:
        for kid in kids:
            line = kid.stdout.readline()
            assert line == "loaded\n", kid.communicate(timeout=HANG_S)[1][-2000:]
        assert _locks_on(path) == [], "a lock is held on the model file"
        outs = [kid.communicate("go\n", timeout=HANG_S) for kid in kids]
    finally:
        for kid in kids:
            kid.kill()
            kid.wait()
    ids = model.tokenizer.encode("def ")
    want = " ".join(map(str, model.generate(torch.tensor(ids), 12, stop=[]).tolist()))
    for kid, (out, err) in zip(kids, outs):
        assert kid.returncode == 0, err[-2000:]
        assert out.strip() == want, (out, want)
    del model
    assert _listing(path.parent) == before, "something was written beside the model file"
    assert _listing(path.parent.parent / "src") == before
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
