"""The transformers floor of the test extra (pyproject.toml: transformers>=5.24).
A machine with an older one (the H200's image has 5.17) skips, with the
reason, the tests whose oracle or fixture needs a newer one, rather than
failing on an API that version lacks."""
from __future__ import annotations

import pytest

TRANSFORMERS_FLOOR = "5.24"


def require_transformers(what: str):
    """transformers, or a skip naming ``what`` needs it at the floor."""
    return pytest.importorskip("transformers", minversion=TRANSFORMERS_FLOOR,
                               reason=f"{what} needs transformers >= {TRANSFORMERS_FLOOR}")
