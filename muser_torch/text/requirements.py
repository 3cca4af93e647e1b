"""The optional packages: which extra of pyproject.toml installs each, and
the one-line refusal when one is missing.

The ``hf`` extra (``pip install -e ".[hf]"``) carries what real files'
tokenizers, chat templates and ``convert`` need; they are imported only
when a file's tokenizer needs them, so ``import muser_torch`` and the demo's
byte tokenizer work without them.
"""
from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import MissingExtraError

# top-level module -> the extra that installs it (pyproject.toml's optional-dependencies)
EXTRAS = {"transformers": "hf", "tokenizers": "hf", "jinja2": "hf", "sentencepiece": "hf",
          "accelerate": "peers", "triton": "cuda",
          "fastapi": "serve", "uvicorn": "serve", "sse_starlette": "serve", "llguidance": "serve",
          "PIL": "vision"}

# the floors of pyproject.toml's pins that the code needs (transformers 5.24 added the
# BPE pre-tokenizer table the tokenizers read); an older install is refused by name
FLOORS = {"transformers": (5, 24)}


def install_command(extra: str) -> str:
    """The README's install of ``extra`` (from a checkout of the repository)."""
    return f'pip install -e ".[{extra}]"'


def missing(module: str, what: str) -> MissingExtraError:
    """The refusal for ``module`` (a key of EXTRAS) not being installed; ``what``
    says what needs it."""
    extra = EXTRAS[module]
    return MissingExtraError(f"{what} needs the {extra} extra (the {module!r} package is not "
                             f"installed): {install_command(extra)}")


def missing_from(e: ModuleNotFoundError) -> MissingExtraError | None:
    """The refusal for an import of an optional package that failed, else None
    (any other missing module is a bug, not a missing extra)."""
    top = (e.name or "").split(".")[0]
    return missing(top, "this command") if top in EXTRAS else None


def require(module: str) -> ModuleType:
    """Import ``module`` (a key of EXTRAS), or say which extra installs it (or
    that the installed one is older than the code needs)."""
    try:
        imported = importlib.import_module(module)
    except ImportError:
        raise missing(module.split(".")[0], "this file's tokenizer") from None
    floor = FLOORS.get(module)
    version = getattr(imported, "__version__", "")
    if floor is not None and _release(version) < floor:
        extra = EXTRAS[module]
        raise MissingExtraError(f"this file's tokenizer needs {module} >= "
                                f"{'.'.join(map(str, floor))} (the {extra} extra; {version} is "
                                f"installed): {install_command(extra)}")
    return imported


def _release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version string: '5.17.0.dev0' -> (5, 17, 0)."""
    out = []
    for part in version.split("."):
        digits = part[:len(part) - len(part.lstrip("0123456789"))]
        if not digits:
            break
        out.append(int(digits))
        if digits != part:      # '9rc1': the release ends here
            break
    return tuple(out)
