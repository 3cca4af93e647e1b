"""A static pass over Metal source: clang type-checks it with Metal's address
spaces kept apart (``clang_msl.h``), which g++ and so the emulator cannot do.

``check(source)`` runs ``clang++ -x cl -cl-std=clc++ -fsyntax-only`` (Debian's
``clang`` package) and raises MetalCompileError with clang's diagnostics.
``clang_path()`` finds the compiler (``MUSER_CLANG`` overrides).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .msl_lex import MetalCompileError

__all__ = ["check", "clang_path", "diagnostics"]

_HEADER = Path(__file__).resolve().parent / "clang_msl.h"
_FLAGS = ["-x", "cl", "-cl-std=clc++", "-fsyntax-only", "-Wno-unknown-attributes", "-ferror-limit=20"]


def clang_path() -> str | None:
    """The clang++ to use, or None when none is installed."""
    explicit = os.environ.get("MUSER_CLANG")
    if explicit:
        return explicit
    for name in ("clang++", *(f"clang++-{v}" for v in range(20, 12, -1))):
        found = shutil.which(name)
        if found:
            return found
    return None


def _run(source: str, name: str, flags: list[str]) -> subprocess.CompletedProcess:
    clang = clang_path()
    if clang is None:
        raise FileNotFoundError("the Metal static pass needs clang (Debian: apt-get install clang)")
    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "include"
        empty.mkdir()
        (empty / "metal_stdlib").write_text("// declarations come from clang_msl.h\n")
        (Path(tmp) / name).write_text(source)
        return subprocess.run([clang, *flags, "-I", str(empty), "-include", str(_HEADER), name],
                              capture_output=True, text=True, cwd=tmp)


def diagnostics(source: str, name: str = "source.metal") -> list[str]:
    """Every error clang reports for ``source`` (no limit), as ``file:line:col: error: ...`` lines."""
    r = _run(source, name, [*_FLAGS, "-ferror-limit=0"])
    return [ln for ln in r.stderr.splitlines() if ": error:" in ln]


def check(source: str, name: str = "source.metal") -> None:
    """Type-check ``source``; raise MetalCompileError naming each mistake's line."""
    r = _run(source, name, _FLAGS)
    if r.returncode:
        errors = [ln for ln in r.stderr.splitlines() if ": error:" in ln]
        raise MetalCompileError("clang's address-space check failed:\n" + "\n".join(errors[:20]) +
                                "\n---\n" + r.stderr[-6000:])
