import random

import pytest

from muser_torch import ops
from muser_torch_metal_emulator import emulator

from ... import slow


def _scheduled(name: str):
    seed = random.SystemRandom().randrange(1 << 31)
    with emulator.schedule(name, seed=seed):
        yield f"{name}:{seed}" if name == "random" else name


@pytest.fixture(params=emulator.SCHEDULES)
def lane_schedule(request):
    """Run the test's emulated dispatches under each lane schedule; the value
    ("random:SEED") goes into assertion messages."""
    yield from _scheduled(request.param)


@pytest.fixture(params=[s if s == "random" else slow.param(s) for s in emulator.SCHEDULES])
def model_lane_schedule(request):
    """``lane_schedule`` for a whole model's dispatches, whose kernels the kernel
    tests run under every schedule: a random one (a fresh seed each run); the
    fixed orders with MUSER_SLOW_TESTS=1."""
    yield from _scheduled(request.param)


@pytest.fixture
def emulate():
    with ops.use_backend("metal-emulator"):
        yield
