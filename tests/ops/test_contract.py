"""The backend contract the model layer relies on (docs/architecture.md):

* every backend's ladder has ``ops.ladder.Rung``'s shape and one
  ``rung_for(qtype, tokens, dtype)``, which returns the first rung of its
  ``LADDER`` that serves the call;
* ``ops.warm_up(model, ...)`` asks the backend of the model's device, and
  only it, to prepare its kernels (models/ names no backend folder:
  ``tests/test_layers.py``);
* ``numerics`` is checked in one function, and a combination that cannot be
  honoured (ggml's numerics on a backend without them) is refused in one line
  by the CLI, the loader and the op alike.
"""
from __future__ import annotations

import ast
import importlib
import inspect
from types import SimpleNamespace

import pytest
import torch

from muser_torch import ops
from muser_torch.formats.types import GGMLType
from muser_torch.nn import NUMERICS, check_numerics
from muser_torch.ops import backends
from muser_torch.ops.ladder import Rung

from .conftest import Case


def _backends() -> list:
    found = []
    for name in ("cpu", "metal", "cuda"):
        try:
            found.append(importlib.import_module(f"muser_torch.ops.{name}"))
        except ImportError:   # cuda/ without Triton
            pass
    return found


BACKENDS = _backends()


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_ladder_has_one_shape(backend):
    assert list(inspect.signature(backend.rung_for).parameters) == ["qtype", "tokens", "dtype"]
    assert backend.LADDER and all(isinstance(r, Rung) for r in backend.LADDER)
    assert len({r.name for r in backend.LADDER}) == len(backend.LADDER)
    qtype = GGMLType.Q4_K
    for tokens in (1, 2, 8, 9, 17, 65, 600):
        for dtype in (torch.float32, torch.float16):
            rung = backend.rung_for(qtype, tokens, dtype)
            assert rung in backend.LADDER and rung.serves(qtype, tokens, dtype)
            before = backend.LADDER[:backend.LADDER.index(rung)]
            assert not any(r.serves(qtype, tokens, dtype) for r in before), (rung.name, tokens)


def test_a_ladder_without_a_rung_refuses_by_name(monkeypatch):
    from muser_torch.ops import cpu
    monkeypatch.setattr(cpu, "LADDER", cpu.LADDER[:1])          # the fused rung alone: 8 tokens at most
    with pytest.raises(ValueError, match="the CPU ladder: no rung .* Q4_K at 9 tokens"):
        cpu.rung_for(GGMLType.Q4_K, 9)


def test_warm_up_asks_the_backend_of_the_models_device(monkeypatch):
    model = torch.nn.Linear(4, 4)
    assert ops.warm_up(model, torch.float32) == 0.0        # the CPU compiles nothing at run time
    calls = []

    def prepare(module, dtype, max_tokens=None):
        calls.append((module, dtype, max_tokens))
        return 1.5

    monkeypatch.setitem(backends.LOADED, "cpu", SimpleNamespace(warm_up=prepare))
    monkeypatch.setitem(backends.LOADED, "cuda", SimpleNamespace(warm_up=lambda *a, **k: 1 / 0))
    assert ops.warm_up(model, torch.float16, max_tokens=64) == 1.5
    assert calls == [(model, torch.float16, 64)]


def test_numerics_is_one_value_checked_in_one_place():
    assert NUMERICS == ("exact", "ggml")
    assert check_numerics("ggml", "cpu", "native") == "ggml"
    for args, words in ((("int8",), "numerics must be one of"),
                        (("ggml", "meta"), "runs on the CPU, not meta"),
                        (("ggml", "cpu", "metal-emulator"), "not the metal-emulator backend")):
        with pytest.raises(ValueError, match=words) as e:
            check_numerics(*args)
        assert "\n" not in str(e.value)
    with ops.use_backend("metal-emulator"):
        with pytest.raises(ValueError, match="metal-emulator"):
            check_numerics("ggml", "cpu")       # the chosen backend by default
        assert check_numerics("exact", "cpu") == "exact"


def test_ggml_numerics_are_refused_inside_the_emulator_not_skipped():
    w = Case(GGMLType.Q4_K, 6, blocks=1)
    x = torch.randn(2, w.n_in)
    with ops.use_backend("metal-emulator"):
        with pytest.raises(ValueError, match="qmatmul_ggml: .*native CPU kernels"):
            ops.qmatmul_ggml(x, w.packed, GGMLType.Q4_K, w.n_out, w.n_in)


def test_the_cli_refuses_ggml_numerics_on_the_emulator_in_one_line(capsys):
    from muser_torch.cli import main
    assert main(["run", "--numerics", "ggml", "--backend", "metal-emulator",
                 "--max-new-tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--numerics ggml --backend metal-emulator" in err, err


def test_every_entry_point_defaults_to_one_dtype():
    """``Glimmer.from_gguf``, ``muser_torch.from_gguf`` and the commands'
    ``--dtype auto`` leave the activation dtype to one function,
    ``Decoder.default_dtype``: float32 on CPU, the architecture's on an
    accelerator (Gemma 3's bfloat16 included)."""
    import argparse
    from pathlib import Path

    import muser_torch
    from muser_torch.models import MODELS, Gemma3
    from muser_torch.run import load_model, resolve_dtype

    demo = Path(__file__).resolve().parents[2] / "demo" / "glimmer-demo-q4_k_xl.gguf"
    assert resolve_dtype("auto") is None and resolve_dtype("bfloat16") is torch.bfloat16
    args = argparse.Namespace(dtype="auto", threads=None, numerics="exact")
    got = {"Glimmer.from_gguf": muser_torch.Glimmer.from_gguf(demo).activation_dtype,
           "muser_torch.from_gguf": muser_torch.from_gguf(demo).activation_dtype,
           "run --dtype auto": load_model(demo, torch.device("cpu"), args).activation_dtype}
    assert set(got.values()) == {torch.float32}, got
    assert {cls.default_dtype(torch.device("cpu")) for cls in MODELS.values()} == {torch.float32}
    assert Gemma3.default_dtype(torch.device("cuda")) is torch.bfloat16   # what auto gives it there


def test_an_environment_variable_chooses_no_backend():
    """``MUSER_METAL`` set is named in a warning at import, and the CPU
    backend stays the native one."""
    import os
    import subprocess
    import sys
    code = "import muser_torch.ops as o; print(o.chosen_backend())"
    run = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True,
                         env={**os.environ, "MUSER_METAL": "1"}, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "native", run.stderr[-2000:]
    assert "MUSER_METAL is not read" in run.stderr


# The Triton sources decode each format themselves (a kernel's own decoder may
# name its format); every other module of a backend folder is glue.
KERNEL_SOURCES = {"cuda/tile.py", "cuda/kquant.py", "cuda/int8dot.py", "cuda/layout.py"}
TYPE_SETS = {"NATIVE_TYPES", "SUPPORTED"}          # a backend's one set of types


def companion_format_names(source: str) -> list[str]:
    """Where glue ``source`` names a format with companions (NVFP4's) outside
    its type set, or re-derives companions the boundary already hands over."""
    from muser_torch.formats.types import NEEDS_COMPANIONS
    names = {t.name for t in NEEDS_COMPANIONS} | {"NVFP4"}
    found = []
    for top in ast.parse(source).body:
        targets = top.targets if isinstance(top, ast.Assign) else \
            [top.target] if isinstance(top, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id in TYPE_SETS for t in targets):
            continue
        for n in ast.walk(top):
            word = n.attr if isinstance(n, ast.Attribute) else n.id if isinstance(n, ast.Name) else None
            if word in names or word in ("companion_args", "check_companions"):
                found.append(f"line {n.lineno}: {word}")
    return found


def test_no_backend_glue_names_a_companion_format():
    """``checks.checked`` hands every kernel the canonical weight, so a
    backend's Python names NVFP4 only in its one type set."""
    from pathlib import Path
    ops_dir = Path(ops.__file__).parent
    bad = {}
    for folder in ("cpu", "cuda", "metal"):
        for path in sorted((ops_dir / folder).glob("*.py")):
            rel = path.relative_to(ops_dir).as_posix()
            if rel not in KERNEL_SOURCES and (found := companion_format_names(path.read_text())):
                bad[rel] = found
    assert not bad, bad
    planted = ("SUPPORTED = frozenset({T.Q4_K, T.NVFP4_E2M1})\n"
               "def _weights(qt, scales, scale_2):\n"
               "    if qt is GGMLType.NVFP4_E2M1:\n"
               "        return companion_args(scales, scale_2, None)\n")
    assert companion_format_names(planted) == ["line 3: NVFP4_E2M1", "line 4: companion_args"]


def test_the_cpu_and_metal_sets_are_read_off_their_kernel_tables(tmp_path, monkeypatch):
    """``cpu.NATIVE_TYPES`` follows ``decoders.c``'s ``TYPE_ROW`` lines and
    ``metal.SUPPORTED`` the ``MUSER_DEFINE_KERNELS`` lines: a planted table of
    two types gives exactly those two."""
    from muser_torch.ops import metal
    from muser_torch.ops.cpu import build
    (tmp_path / "decoders.c").write_text(
        "static const type_entry_t TYPE_TABLE[] = {\n"
        "    TYPE_ROW(Q4_K, dec_q4_k, matvec_q4_k, tile_q4_k, ACT_Q8_K, qdot_q4_k),\n"
        "    TYPE_ROW(IQ3_S, dec_iq3_s, matvec_iq3_s, tile_generic, ACT_Q8_K, qdot_iq3_s),\n};\n")
    monkeypatch.setattr(build, "_KERNEL_DIR", tmp_path)
    assert build._table_types() == {GGMLType.Q4_K, GGMLType.IQ3_S}
    (tmp_path / "a.metal").write_text("MUSER_DEFINE_KERNELS(q8_0, FormatQ80)\n")
    (tmp_path / "b.metal").write_text("#define MUSER_DEFINE_KERNELS(tname, F) \\\n"
                                      "MUSER_DEFINE_KERNELS(nvfp4_e2m1, FormatNVFP4)\n")
    monkeypatch.setattr(metal, "_SRC_DIR", tmp_path)
    monkeypatch.setattr(metal, "_FILES", ("a.metal", "b.metal"))
    assert metal._kernel_types() == {GGMLType.Q8_0, GGMLType.NVFP4_E2M1}
