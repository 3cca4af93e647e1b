# The emulator's own tests run under the same lane schedules as the Metal kernels' tests.
from ..ops.metal.conftest import lane_schedule  # noqa: F401
