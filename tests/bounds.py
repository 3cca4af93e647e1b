"""``check_bound``: a test's numeric bound, asserted and recorded.

A test that draws fresh random data (MUSER_TEST_SEED) checks its measured
errors through these two calls, so that the seed sweep (``python -m
tests.seeds``, docs/testing.md) can print the worst value of each bound over
hundreds of seeds beside the bound. Outside the sweep they are plain asserts:
the record goes nowhere."""
from __future__ import annotations

# (name, value, bound, "max" | "min") of the running test; the sweep's plugin
# sets a list here and takes it after each test, and leaves None otherwise.
sink: list[tuple[str, float, float, str]] | None = None


def check_bound(name: str, value: float, bound: float, context: str = "") -> None:
    """Assert ``value < bound`` (an error, a distance); ``name`` says what was
    measured, the same for every seed, and ``context`` (the rung, the seed) goes
    into the failure message only."""
    value = float(value)
    if sink is not None:
        sink.append((name, value, float(bound), "max"))
    assert value < bound, f"{name}: {value:.3g} against the bound {bound:.3g} {context}".rstrip()


def check_floor(name: str, value: float, floor: float, context: str = "") -> None:
    """Assert ``value > floor``: a measure that must stay large, such as a
    planted defect's error (the sweep's margin is then value / floor). NaN
    passes: a defect that makes garbage is a defect seen."""
    value = float(value)
    if sink is not None:
        sink.append((name, value, float(floor), "min"))
    assert not value <= floor, f"{name}: {value:.3g}, not above the floor {floor:.3g} {context}".rstrip()
