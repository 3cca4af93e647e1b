"""Fixtures of the server tests: the bundled demo (float32 on the CPU) and,
where the test extra installed it, the real Gemma 3 270M file. The server's
packages and the official ``openai`` client come with the test extra."""
from __future__ import annotations

import pytest
import torch

for _module in ("fastapi", "uvicorn", "sse_starlette", "openai", "httpx"):
    pytest.importorskip(_module, reason=f'{_module} is missing: pip install -e ".[test]"')

from muser_torch.models import from_gguf  # noqa: E402
from muser_torch.run import DEMO  # noqa: E402


@pytest.fixture(scope="session")
def demo_model():
    return from_gguf(DEMO["q4_k_xl"], dtype=torch.float32)


@pytest.fixture(scope="session")
def gemma_model(gemma_path):
    return from_gguf(gemma_path, dtype=torch.float32)
