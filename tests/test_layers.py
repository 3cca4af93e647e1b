"""The package's layering (docs/architecture.md) holds: imports (at module
level or inside functions) only go down the layers, there is no import
circle, the Metal emulator stays apart, and the model layer names no backend
folder."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _plant(tmp_path, monkeypatch, files: dict[str, str]):
    """The checker, pointed at a planted tree of ``files`` (path -> source)
    under ``tmp_path``, whose ``muser_torch/`` stands in for the package."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import import_graph
    finally:
        sys.path.pop(0)
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.setattr(import_graph, "ROOT", tmp_path / "muser_torch")
    return import_graph


def test_imports_go_down_the_layers():
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "import_graph.py")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 violations" in res.stdout


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    # A checker that cannot fail proves nothing: plant an upward import and look.
    import_graph = _plant(tmp_path, monkeypatch, {
        "muser_torch/__init__.py": "",
        "muser_torch/formats/__init__.py": "from ..models import thing\n",
        "muser_torch/models/__init__.py": "from ..formats import other\n"})
    assert import_graph.main() == 1


# Violations closed by an import inside a function, as the circles in ops/ and
# formats/ were: (files, the line the checker must print, the one file that,
# rewritten without its lazy import, leaves the tree clean).
IN_FUNCTION = {
    "circle": ({"muser_torch/__init__.py": "",
                "muser_torch/formats/__init__.py": "from .weight import thing\n\ndef helper():\n    pass\n",
                "muser_torch/formats/weight.py": "def thing():\n    from . import helper\n    return helper()\n"},
               "circle: muser_torch.formats -> muser_torch.formats.weight -> muser_torch.formats",
               "muser_torch/formats/weight.py"),
    "upward": ({"muser_torch/__init__.py": "", "muser_torch/models/__init__.py": "",
                "muser_torch/formats/__init__.py": "def f():\n    from ..models import thing\n"},
               "upward: muser_torch.formats (layer 1) imports muser_torch.models",
               "muser_torch/formats/__init__.py"),
}


@pytest.mark.parametrize("kind", sorted(IN_FUNCTION))
def test_the_checker_sees_imports_inside_functions(kind, tmp_path, monkeypatch, capsys):
    files, line, lazy = IN_FUNCTION[kind]
    import_graph = _plant(tmp_path, monkeypatch, files)
    assert import_graph.main() == 1
    assert line in capsys.readouterr().out
    (tmp_path / lazy).write_text("def thing():\n    return 1\n")   # the lazy import was the cause
    assert import_graph.main() == 0


def test_the_checker_keeps_the_emulator_apart(tmp_path, monkeypatch, capsys):
    emu = "muser_torch_metal_emulator"
    import_graph = _plant(tmp_path, monkeypatch, {
        "muser_torch/__init__.py": "", "muser_torch/ops/__init__.py": "",
        "muser_torch/ops/metal/__init__.py": f"def f():\n    from {emu} import emulator\n",
        f"{emu}/__init__.py": "", f"{emu}/emulator.py": "import struct\n"})
    assert import_graph.EMULATOR == emu
    assert import_graph.main() == 0            # ops/metal, its one caller, may
    (tmp_path / "muser_torch" / "ops" / "dequant.py").write_text(f"import {emu}.emulator\n")
    (tmp_path / emu / "emulator.py").write_text("def f():\n    from muser_torch.ops import checks\n")
    assert import_graph.main() == 1
    out = capsys.readouterr().out
    assert f"emulator: muser_torch.ops.dequant imports {emu}" in out
    assert f"emulator: {emu}.emulator imports muser_torch" in out


def test_the_checker_keeps_backends_out_of_the_model_layer(tmp_path, monkeypatch, capsys):
    """models/ asks ``muser_torch.ops`` (``ops.warm_up``, ``ops.backend``); naming a
    backend folder, even inside a function, is a violation."""
    import_graph = _plant(tmp_path, monkeypatch, {
        "muser_torch/__init__.py": "", "muser_torch/ops/__init__.py": "def warm_up(m):\n    pass\n",
        "muser_torch/ops/cuda/__init__.py": "", "muser_torch/ops/cuda/warm.py": "def warm_up(m):\n    pass\n",
        "muser_torch/models/__init__.py": "from .. import ops\n"})
    assert import_graph.main() == 0
    (tmp_path / "muser_torch" / "models" / "assembly.py").write_text(
        "def f(m):\n    from ..ops.cuda.warm import warm_up\n    return warm_up(m)\n")
    assert import_graph.main() == 1
    assert "backend: muser_torch.models.assembly imports muser_torch.ops.cuda.warm" in capsys.readouterr().out
