"""The packages of pyproject.toml's ``test`` extra, and the reading of a skip
reason that names one of them as missing: the suite fails on such a skip
(``tests/conftest.py``), since ``pip install -e ".[test]"`` should have
installed it; a skip for something the extra cannot give (a peer program, a
CUDA device, root) stays a skip."""
from __future__ import annotations

import re
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
# distribution -> the module a test imports, where the two names differ beyond '-' and '_'
# (libggml-python installs a shared library, which tests/formats/ggml_ref.py loads: no module)
MODULE_OF = {"protobuf": "google.protobuf", "libggml-python": None, "pillow": "PIL"}

# how a skip names what is missing: a module (importorskip's own wordings, the
# serve folder's), or a distribution to pip install
_MISSING_MODULE = (re.compile(r"could not import '([\w.]+)'"),
                   re.compile(r"module '([\w.]+)' has __version__"),
                   re.compile(r"^([\w.]+) is missing: pip install"))
_MISSING_DIST = re.compile(r"pip install (?:-e )?([A-Za-z][\w.\-]*)")


def extra_distributions() -> list[str]:
    """The distributions of the ``test`` extra, without their version bounds."""
    text = PYPROJECT.read_text()
    block = re.search(r"^test = \[(.*?)\]", text, re.S | re.M).group(1)
    return [re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0] for spec in re.findall(r'"([^"]+)"', block)]


def module_of(dist: str) -> str | None:
    return MODULE_OF.get(dist, dist.replace("-", "_"))


def missing_extra_package(reason: str) -> str | None:
    """The test-extra distribution that ``reason`` (a skip's) says is missing, or None."""
    dists = extra_distributions()
    for pattern in _MISSING_MODULE:
        m = pattern.search(reason)
        if m:
            for dist in dists:
                mod = module_of(dist)
                if mod and (m.group(1) == mod or m.group(1).startswith(mod + ".")):
                    return dist
    m = _MISSING_DIST.search(reason)
    if m and m.group(1) in dists:
        return m.group(1)
    return None
