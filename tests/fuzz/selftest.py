"""The runner's own check: a target that misbehaves on purpose, one way per
file, so every outcome the fuzz run counts is shown to be detected.

``python -m tests.fuzz.selftest`` prints ``{behaviour: [outcome, stage, error]}``
as JSON; test_fuzz compares it with what each behaviour must give.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from .runner import Pool, Result

CAP_MB = 64
# CPU seconds, and the wall time of the blocked one in those: the honest behaviours
# take milliseconds of both, "rss" a few hundredths of a second before the watch kills it.
TIMEOUT_S, WALL_FACTOR = 1.0, 3.0


def target(path: str, say) -> None:
    """Behave as the file says (its whole content is the behaviour's name)."""
    from muser_torch.errors import ContextLengthError, GGUFFormatError
    what = Path(path).read_text()
    say({"stage": "load"})
    if what == "ok":
        return
    say({"stage": "model"})
    if what == "typed":
        raise GGUFFormatError("a typed refusal")
    if what == "untyped":
        raise KeyError("an untyped exception")
    if what == "context":                    # a prompt past the file's context: typed too
        raise ContextLengthError("a sequence of 61 tokens exceeds the context of 20", 61, 20)
    if what == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if what == "spin":                       # past the CPU timeout
        while True:
            pass
    if what == "hang":                       # blocked: past the wall-time backstop
        time.sleep(600)
    if what == "alloc":                      # one allocation past the address-space limit
        bytearray(8 << 30)
    if what == "rss":                        # growth the RSS watch must catch
        chunks = []
        for _ in range(4 * CAP_MB):
            chunks.append(bytearray(1 << 20))
            time.sleep(0.002)
    if what == "exit":
        os._exit(3)


BEHAVIOURS = ("ok", "typed", "context", "untyped", "crash", "spin", "hang", "alloc", "rss", "exit")


def main() -> int:
    import muser_torch  # noqa: F401  (the children inherit it, as in a real run)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        pool = Pool(2, TIMEOUT_S, CAP_MB, Path(tmp), target=target, wall_factor=WALL_FACTOR)
        for i, what in enumerate(BEHAVIOURS):
            pool.submit(lambda slot, what=what: slot.write_text(what), 16,
                        Result(i, what, (), "pending"))
        for r in pool.drain():
            out[r.detail] = [r.outcome, r.stage, r.error]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
