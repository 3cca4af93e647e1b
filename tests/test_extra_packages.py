"""Every package of the test extra is installed and imports, and every
``pytest.importorskip`` of the tests names one of them: a test cannot skip
for a package that ``pip install -e ".[test]"`` does not install (issue 41:
httpx and scipy were missing, and 100 tests skipped silently)."""
from __future__ import annotations

import ast
import importlib
import importlib.metadata
from pathlib import Path

import pytest

from .extra_packages import extra_distributions, missing_extra_package, module_of

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("dist", extra_distributions())
def test_every_package_of_the_test_extra_is_installed(dist):
    try:
        importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f'{dist} (the test extra) is not installed: pip install -e ".[test]"')
    if module_of(dist) is not None:
        importlib.import_module(module_of(dist))


def _importorskips() -> list[tuple[str, str]]:
    """(file, module) of every ``importorskip`` of a literal module in tests/."""
    found = []
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip" \
                    and node.args and isinstance(node.args[0], ast.Constant):
                found.append((str(path.relative_to(TESTS)), node.args[0].value))
    return found


def test_every_importorskip_names_a_package_of_the_test_extra():
    """Skips for this project's own optional modules (a backend folder) aside."""
    found = _importorskips()
    assert len(found) > 30, found       # the scan sees the tests' importorskips
    outside = [(f, m) for f, m in found if not m.startswith("muser_torch")
               and missing_extra_package(f"could not import '{m}'") is None]
    assert not outside, f"importorskip of a package the test extra does not install: {outside}"


def test_a_skip_for_a_missing_package_of_the_extra_is_recognised():
    """The readings tests/conftest.py fails the run on, and the skips it leaves alone."""
    assert missing_extra_package("could not import 'scipy.stats': No module named 'scipy'") == "scipy"
    assert missing_extra_package('httpx is missing: pip install -e ".[test]"') == "httpx"
    assert missing_extra_package("libggml-python is not installed (pip install libggml-python)") \
        == "libggml-python"
    assert missing_extra_package("module 'transformers' has __version__ '4.1', required is: '5.24'") \
        == "transformers"
    for reason in ("set MUSER_SLOW_TESTS=1", "no CUDA device", "could not import 'muser_torch.ops.metal'",
                   "llama.cpp's lcpp_logits not built at X: run tools/peers.sh"):
        assert missing_extra_package(reason) is None, reason
