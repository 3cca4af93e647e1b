import random

import pytest

from muser_torch import ops
from muser_torch_metal_emulator import emulator


@pytest.fixture(params=emulator.SCHEDULES)
def lane_schedule(request):
    """Run the test's emulated dispatches under each lane schedule; the value
    ("random:SEED") goes into assertion messages."""
    seed = random.SystemRandom().randrange(1 << 31)
    with emulator.schedule(request.param, seed=seed):
        yield f"{request.param}:{seed}" if request.param == "random" else request.param


@pytest.fixture
def emulate():
    with ops.use_backend("metal-emulator"):
        yield
