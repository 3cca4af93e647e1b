"""The optional packages behind real tokenizers and chat templates.

They belong to the ``hf`` extra (``pip install 'muser-torch[hf]'``), imported
only when a file's tokenizer needs them, so ``import muser_torch`` and the
demo's byte tokenizer work without them.
"""
from __future__ import annotations

import importlib
from types import ModuleType

EXTRA = "hf"
PACKAGES = {"transformers": "transformers", "tokenizers": "tokenizers", "jinja2": "jinja2"}


class MissingExtraError(ImportError):
    """A package of the ``hf`` extra is not installed."""


def require(module: str) -> ModuleType:
    """Import ``module`` (one of PACKAGES), or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(
            f"this file's tokenizer needs the {PACKAGES[module.split('.')[0]]!r} package, "
            f"which is not installed ({e}); install the extra: pip install 'muser-torch[{EXTRA}]'"
        ) from None
