"""Interrupted writes: ``muser-torch convert`` stopped by Ctrl-C (SIGINT) or
SIGKILL at any point of its run, or writing to a full disk, leaves no file at
the output path, and a rerun then writes the same bytes as an uninterrupted run.

SIGINT and a full disk clean up: exit 130 or 2 with one line, nothing beside
the output path. SIGKILL cannot run cleanup: the one thing it may leave is
``<out>.partial`` (never a .gguf name; ``gguf_io.writer.save_gguf`` says why),
which the next run removes. Where the signal lands is fixed by
``paused_convert.py`` (the child pauses at a named point and says so), so no
verdict depends on timing; the wall-time limits are hang guards only."""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from muser_torch import load_gguf  # noqa: E402
from muser_torch.cli import main as cli_main  # noqa: E402

from .. import slow  # noqa: E402
from ..gguf.helpers import fresh_seed  # noqa: E402
from .checkpoints import write_checkpoint  # noqa: E402

SEED = fresh_seed()
HANG_S = 300
ROOT = Path(__file__).resolve().parents[2]     # the checkout: the child imports this muser_torch
# Where the child pauses for its signal: before the partial file exists, after its
# first tensor, mid-file and at the rename. Each case starts a converting process
# (about 5 s); the default suite sends Ctrl-C mid-file and SIGKILL at the rename,
# the slow sweep both signals at every point.
POINTS = ("start", "tensor:0", "tensor:3", "rename")
DEFAULT_CASES = {("tensor:3", signal.SIGINT), ("rename", signal.SIGKILL)}
CASES = [pytest.param(point, sig, id=f"{point}-{sig.name}",
                      marks=() if (point, sig) in DEFAULT_CASES else pytest.mark.slow)
         for point in POINTS for sig in (signal.SIGINT, signal.SIGKILL)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, bytes]:
    """A tiny random Llama checkpoint and the bytes an uninterrupted convert writes."""
    root = tmp_path_factory.mktemp("interrupted")
    d, _, _ = write_checkpoint(root / "ck", "llama", SEED, n_layers=2)
    ref = root / "ref.gguf"
    assert cli_main(["convert", str(d), str(ref), "--type", "q8_0", "--no-progress"]) == 0
    return d, ref.read_bytes()


def _argv(ck: Path, out: Path) -> list[str]:
    return ["convert", str(ck), str(out), "--type", "q8_0", "--no-progress"]


def _default_sigint() -> None:
    """The child's Ctrl-C as in a terminal, even where this suite runs with SIGINT
    ignored (a background job of a shell without job control passes SIG_IGN on,
    and Python then installs no KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for(proc: subprocess.Popen, what: Path) -> None:
    deadline = time.monotonic() + HANG_S
    while not what.exists():
        assert proc.poll() is None, f"the child exited {proc.returncode} before {what.name} (seed {SEED})"
        assert time.monotonic() < deadline, f"hang: no {what.name} after {HANG_S} s"
        time.sleep(0.05)


def _rerun_writes_the_reference(ck: Path, out: Path, ref: bytes) -> None:
    assert cli_main(_argv(ck, out)) == 0
    assert out.read_bytes() == ref, f"the rerun's file differs from an uninterrupted one (seed {SEED})"
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]
    load_gguf(out)


@pytest.mark.parametrize("point,sig", CASES)
def test_a_signal_at_any_point_leaves_no_output(checkpoint, tmp_path, point, sig):
    ck, ref = checkpoint
    work = tmp_path / "work"
    work.mkdir()
    out, marker = work / "out.gguf", tmp_path / "paused"
    proc = subprocess.Popen([sys.executable, "-m", "tests.convert.paused_convert", str(marker), point,
                             *_argv(ck, out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_default_sigint)
    try:
        _wait_for(proc, marker)
        partial = work / "out.gguf.partial"
        assert partial.exists() == (point != "start"), f"{point}: {sorted(os.listdir(work))}"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=HANG_S)
    finally:
        proc.kill()
        proc.wait()
    left = sorted(p.name for p in work.iterdir())
    if sig == signal.SIGINT:
        assert proc.returncode == 130, err
        assert err == "muser-torch convert: interrupted\n", err
        assert left == [], f"{point}: Ctrl-C left {left}"
    else:
        assert proc.returncode == -signal.SIGKILL
        assert left == ([] if point == "start" else ["out.gguf.partial"]), f"{point}: {left}"
    _rerun_writes_the_reference(ck, out, ref)


def test_plain_command_killed_mid_write(checkpoint, tmp_path):
    """The unmodified command, killed once its ``.partial`` holds bytes: the
    output path is empty whatever it had reached, and a rerun succeeds."""
    ck, ref = checkpoint
    out = tmp_path / "out.gguf"
    partial = tmp_path / "out.gguf.partial"
    proc = subprocess.Popen([sys.executable, "-m", "muser_torch.cli", *_argv(ck, out)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + HANG_S
    while proc.poll() is None and not (partial.exists() and partial.stat().st_size > 0):
        assert time.monotonic() < deadline, f"hang: no bytes in {partial.name} after {HANG_S} s"
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    left = sorted(p.name for p in tmp_path.iterdir())
    if out.exists():     # it finished before the kill: then it is the whole file and nothing else
        assert proc.returncode == 0 and out.read_bytes() == ref and left == ["out.gguf"], left
        out.unlink()
    else:
        assert set(left) <= {"out.gguf.partial"}, left
    _rerun_writes_the_reference(ck, out, ref)


def _tmpfs(path: Path, size: str) -> None:
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")


@pytest.mark.parametrize("how", ["tmpfs", slow.param("rlimit")])   # rlimit: where no tmpfs mounts
def test_a_full_disk_leaves_no_output(checkpoint, tmp_path, how):
    """The write fails part way (ENOSPC on a 64 KiB tmpfs, or EFBIG past an
    RLIMIT_FSIZE of 64 KiB): one line, exit 2, nothing left; with room, a
    rerun writes the reference bytes."""
    ck, ref = checkpoint
    limit = 64 << 10
    assert len(ref) > 4 * limit, "the checkpoint is too small to fill the disk"
    work = tmp_path / "disk"
    work.mkdir()
    out = work / "out.gguf"
    if how == "tmpfs":
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        _tmpfs(work, f"{limit // 1024}k")
        preexec = None
    else:
        def preexec():
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        r = subprocess.run([sys.executable, "-m", "muser_torch.cli", *_argv(ck, out)], cwd=ROOT,
                           capture_output=True, text=True, preexec_fn=preexec, timeout=HANG_S)
        assert r.returncode == 2, r.stderr
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("muser-torch convert: error: "), r.stderr
        assert ("No space left" if how == "tmpfs" else "too large") in r.stderr, r.stderr
        assert sorted(os.listdir(work)) == [], os.listdir(work)
        if how == "tmpfs":
            subprocess.run(["mount", "-o", "remount,size=64m", str(work)], check=True)
        _rerun_writes_the_reference(ck, out, ref)
    finally:
        if how == "tmpfs":
            subprocess.run(["umount", str(work)], check=True)


def test_the_next_run_removes_a_killed_runs_partial_even_when_it_fails(tmp_path, capsys):
    """A stray ``.partial`` goes as soon as a run accepts the output path,
    before the checkpoint is read (here it is missing)."""
    out = tmp_path / "out.gguf"
    (tmp_path / "out.gguf.partial").write_bytes(os.urandom(4096))
    assert cli_main(["convert", str(tmp_path / "no_checkpoint"), str(out)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == []
