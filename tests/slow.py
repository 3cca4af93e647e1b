"""The one switch for slow sweeps: ``MUSER_SLOW_TESTS=1``.

A test marked ``slow`` (``pytest.mark.slow``, registered in pyproject.toml)
repeats, over a larger grid, a longer slice or another backend of the same
path, a check that the default suite makes at least once; without the
switch it is skipped with the reason ``set MUSER_SLOW_TESTS=1``
(``tests/conftest.py``). Tests whose size is a count (the fuzz slice)
read ``ON``. docs/testing.md lists what the switch adds."""
from __future__ import annotations

import os

import pytest

ON = os.environ.get("MUSER_SLOW_TESTS") == "1"
REASON = "set MUSER_SLOW_TESTS=1"


def param(*values, **kw):
    """``pytest.param(*values)`` marked slow."""
    return pytest.param(*values, marks=pytest.mark.slow, **kw)
