"""One intra-op thread for the conversions in this process, as tests/models,
tests/glimmer and tests/dflash have: on a shared 2-core machine a second
thread mostly spins at each op's barrier (six times the CPU of a small op
under load). The bytes do not depend on it (the K-quant chunks' parallel
path is held to the serial one in tests/formats/test_quantize.py); child
processes keep their own default."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    torch.set_num_threads(1)
