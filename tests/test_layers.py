"""The package's layering (docs/architecture.md) holds: imports (at module
level or inside functions) only go down the layers, and there is no import
circle."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _checker():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import import_graph
    finally:
        sys.path.pop(0)
    return import_graph


def test_imports_go_down_the_layers():
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "import_graph.py")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 violations" in res.stdout


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    # A checker that cannot fail proves nothing: plant an upward import and look.
    import_graph = _checker()
    src = tmp_path / "muser_torch"
    (src / "formats").mkdir(parents=True)
    (src / "models").mkdir()
    (src / "__init__.py").write_text("")
    (src / "formats" / "__init__.py").write_text("from ..models import thing\n")
    (src / "models" / "__init__.py").write_text("from ..formats import other\n")
    monkeypatch.setattr(import_graph, "ROOT", src)
    assert import_graph.main() == 1


def test_the_checker_sees_a_circle_inside_a_function(tmp_path, monkeypatch, capsys):
    # The circle is closed by an import inside a function, as the ones in ops/
    # and formats/ were: a package importing its submodule, which reaches back.
    import_graph = _checker()
    src = tmp_path / "muser_torch"
    (src / "formats").mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "formats" / "__init__.py").write_text("from .weight import thing\n\ndef helper():\n    pass\n")
    (src / "formats" / "weight.py").write_text(
        "def thing():\n    from . import helper\n    return helper()\n")
    monkeypatch.setattr(import_graph, "ROOT", src)
    assert import_graph.main() == 1
    assert "circle: muser_torch.formats -> muser_torch.formats.weight -> muser_torch.formats" \
        in capsys.readouterr().out
    # The same module without the lazy import is clean: the circle was what failed.
    (src / "formats" / "weight.py").write_text("def thing():\n    return 1\n")
    assert import_graph.main() == 0


def test_the_checker_sees_an_upward_import_inside_a_function(tmp_path, monkeypatch, capsys):
    import_graph = _checker()
    src = tmp_path / "muser_torch"
    (src / "formats").mkdir(parents=True)
    (src / "models").mkdir()
    (src / "__init__.py").write_text("")
    (src / "models" / "__init__.py").write_text("")
    (src / "formats" / "__init__.py").write_text("def f():\n    from ..models import thing\n")
    monkeypatch.setattr(import_graph, "ROOT", src)
    assert import_graph.main() == 1
    assert "upward: muser_torch.formats (layer 1) imports muser_torch.models" in capsys.readouterr().out


def test_the_checker_keeps_the_emulator_apart(tmp_path, monkeypatch, capsys):
    import_graph = _checker()
    src = tmp_path / "muser_torch"
    emu = tmp_path / import_graph.EMULATOR
    (src / "ops" / "metal").mkdir(parents=True)
    emu.mkdir()
    (src / "__init__.py").write_text("")
    (src / "ops" / "__init__.py").write_text("")
    (src / "ops" / "metal" / "__init__.py").write_text(
        "def f():\n    from muser_torch_metal_emulator import emulator\n")
    (emu / "__init__.py").write_text("")
    (emu / "emulator.py").write_text("import struct\n")
    monkeypatch.setattr(import_graph, "ROOT", src)
    assert import_graph.main() == 0            # ops/metal, its one caller, may
    (src / "ops" / "unpack.py").write_text("import muser_torch_metal_emulator.emulator\n")
    (emu / "emulator.py").write_text("def f():\n    from muser_torch.ops import checks\n")
    assert import_graph.main() == 1
    out = capsys.readouterr().out
    assert "emulator: muser_torch.ops.unpack imports muser_torch_metal_emulator" in out
    assert "emulator: muser_torch_metal_emulator.emulator imports muser_torch" in out
