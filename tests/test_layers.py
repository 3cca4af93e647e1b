"""The package's layering (docs/architecture.md) holds: module-level imports
only go down the layers, and there is no import circle."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_imports_go_down_the_layers():
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "import_graph.py")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 violations" in res.stdout


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    # A checker that cannot fail proves nothing: plant an upward import and look.
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import import_graph
    finally:
        sys.path.pop(0)
    src = tmp_path / "muser_torch"
    (src / "formats").mkdir(parents=True)
    (src / "models").mkdir()
    (src / "__init__.py").write_text("")
    (src / "formats" / "__init__.py").write_text("from ..models import thing\n")
    (src / "models" / "__init__.py").write_text("from ..formats import other\n")
    monkeypatch.setattr(import_graph, "ROOT", src)
    assert import_graph.main() == 1
