"""Where every test's fresh seed comes from: a new one each run, or
MUSER_TEST_SEED=N to replay one (tests name their seed in failure messages;
the seed sweep, ``python -m tests.seeds``, sets the variable per run)."""
from __future__ import annotations

import os
import random

SEED_ENV = "MUSER_TEST_SEED"


def fresh_seed(limit: int = 1 << 31) -> int:
    """A seed in ``[0, limit)``, or MUSER_TEST_SEED's value when it is set."""
    fixed = os.environ.get(SEED_ENV)
    return int(fixed) if fixed else random.SystemRandom().randrange(limit)
