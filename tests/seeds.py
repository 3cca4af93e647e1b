"""The seed sweep: every test that draws fresh random data, over N seeds, with
the worst value of each bound it checks beside the bound.

    python -m tests.seeds [--seeds N] [--jobs J] [-k EXPR] [--seed-list S,S,...] [--record DIR] [paths]

Tests draw their data in one of two ways, and the sweep runs each its own way:

- **per test** (``fresh_seed()`` in ``tests/ops/metal/helpers.py``,
  ``tests/gguf/helpers.py``, the CUDA tests' ``_seed()``: MUSER_TEST_SEED is
  read when the test runs). One pytest process per job runs every such test
  once per seed: this plugin parametrizes it over its share of the seeds and
  sets MUSER_TEST_SEED before each. A test that reads no MUSER_TEST_SEED on its
  first run draws nothing and skips its other seeds.
- **per session** (a module-level ``SEED``: ``tests/models``, ``tests/glimmer``,
  ``tests/dflash``, ``tests/text``, ``tests/vision``; it also seeds files that session fixtures
  write): one pytest process per seed, with MUSER_TEST_SEED set, so fixtures
  and tests see the same seed and a failing seed replays as printed. A test
  marked ``seed_at_run_time`` reads its module's SEED only while it runs (no
  session fixture's data comes from it): it runs per test, the plugin setting
  the module's SEED as well.

Tests report their measured values through ``tests.bounds.check_bound``; the
plugin writes one JSON line per test and seed. The table gives, per test and
bound, the seed with the least margin (bound / value; value / floor for
``check_floor``), and the runs and failures. A failing seed replays with
``MUSER_TEST_SEED=<seed> python -m pytest <test>``. Exit status 1 when a run
failed or a margin is under 2.

A sweep of hundreds of seeds over the per-session tests takes hours on a small
machine; ``--record DIR`` keeps every finished pytest run (a seed of the
per-session tests, 25 seeds of the per-test ones) and a later call with the
same folder and tests runs only the seeds still missing, so a sweep can be
spread over sessions and machines. Its table names the commits it covers.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from .random_seed import SEED_ENV

ROOT = Path(__file__).resolve().parent.parent
SEED_ID = re.compile(r"^seed\d+$")
# A test file draws a seed if it names the variable, the fresh_seed helper
# (tests/random_seed.py), or a conftest's SEED.
DRAWS = re.compile(r"MUSER_TEST_SEED|fresh_seed|from \.+\w*\.?conftest import .*\bSEED\b")
MARGIN = 2.0
# The plugin's state in a pytest process: the running test's outcome (by node
# id) and the config (the hooks that report a run get no item).
_RUNS: dict = {}
_CONFIG: list = []


# ---------------------------------------------------------------- the plugin (-p tests.seeds)

def pytest_addoption(parser):
    group = parser.getgroup("seed sweep (python -m tests.seeds)")
    group.addoption("--seed-sweep-out", help="append one JSON line per test and seed here")
    group.addoption("--seed-sweep-seeds", help="comma-separated seeds: run each per-test-seeded test once per seed")
    group.addoption("--seed-sweep-plan", help="write the selected tests, per-test or per-session seeded, here")


def _module_seed(module) -> bool:
    seed = getattr(module, "SEED", None)
    return isinstance(seed, int) and not isinstance(seed, bool)


def _session_seeded(item) -> bool:
    """Seeded per session: a module-level SEED, unless the test is marked
    ``seed_at_run_time`` (it reads SEED only while it runs: no session fixture
    holds data drawn from it), when the plugin sets the module's SEED per test."""
    return _module_seed(getattr(item, "module", None)) and item.get_closest_marker("seed_at_run_time") is None


def _seeds(config) -> list[int]:
    raw = config.getoption("--seed-sweep-seeds", None)
    return [int(s) for s in raw.split(",")] if raw else []


class _SeedReads(type(os.environ)):
    """os.environ that notes a read of MUSER_TEST_SEED: how the sweep tells that
    a test drew a seed, whichever helper it used."""
    read = False

    def __getitem__(self, key):
        if key == SEED_ENV:
            _SeedReads.read = True
        return super().__getitem__(key)


def pytest_configure(config):
    if config.getoption("--seed-sweep-out", None) or config.getoption("--seed-sweep-plan", None):
        os.environ.__class__ = _SeedReads
        config._seed_sweep = {"unseeded": set(), "seen": set()}


def pytest_generate_tests(metafunc):
    seeds = _seeds(metafunc.config)
    if not seeds or _module_seed(metafunc.module) and \
            metafunc.definition.get_closest_marker("seed_at_run_time") is None:
        return
    metafunc.fixturenames.append("_sweep_seed")
    metafunc.parametrize("_sweep_seed", seeds, ids=[f"seed{s}" for s in seeds])


def _path_id(item) -> str:
    """The node id with its file as an absolute path: the sweep's runs take it
    as an argument from the repository root, wherever pytest put the rootdir."""
    return str(item.path) + item.nodeid[len(item.nodeid.split("::")[0]):]


@pytest.hookimpl(trylast=True)          # after -k and the markers have deselected
def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "_seed_sweep"):
        return
    plan = config.getoption("--seed-sweep-plan", None)
    if plan:
        Path(plan).write_text(json.dumps({
            "per_test": [_path_id(i) for i in items if not _session_seeded(i)],
            "per_session": [_path_id(i) for i in items if _session_seeded(i)]}))
        config.hook.pytest_deselected(items=list(items))
        items[:] = []
        return
    # With seeds given this process runs the per-test-seeded tests; without, the per-session ones.
    keep = [i for i in items if _session_seeded(i) != bool(_seeds(config))]
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep


def _key(nodeid: str) -> str:
    """The node id less the sweep's ``seedN`` parameter."""
    if not nodeid.endswith("]"):
        return nodeid
    head, _, params = nodeid[:-1].partition("[")
    kept = [p for p in params.split("-") if not SEED_ID.match(p)]
    return f"{head}[{'-'.join(kept)}]" if kept else head


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    state = getattr(item.config, "_seed_sweep", None)
    if state is None:
        return
    from . import bounds
    bounds.sink = []
    _SeedReads.read = False
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "_sweep_seed" in callspec.params:
        if _key(item.nodeid) in state["unseeded"]:
            pytest.skip("draws no seed")
        os.environ[SEED_ENV] = str(callspec.params["_sweep_seed"])
        if _module_seed(item.module):            # a seed_at_run_time test: its module's SEED too
            state["module_seed"] = item.module, item.module.SEED
            item.module.SEED = callspec.params["_sweep_seed"]


def pytest_runtest_logreport(report):
    # A failure in any phase fails the run; a skip in setup or call skips it.
    run = _RUNS.get(report.nodeid)
    if run is not None and report.outcome != "passed" and run["outcome"] != "failed":
        run["outcome"] = report.outcome


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    state = getattr(item.config, "_seed_sweep", None)
    if state is not None:
        _RUNS.clear()
        _RUNS[item.nodeid] = {"outcome": "passed"}


def pytest_runtest_logfinish(nodeid, location):
    from . import bounds
    run = _RUNS.pop(nodeid, None)
    if run is None or bounds.sink is None:
        return
    config = _CONFIG[0]
    state = config._seed_sweep
    key = _key(nodeid)
    per_test = key != nodeid
    module_seed = state.pop("module_seed", None)
    if module_seed is not None:
        module_seed[0].SEED = module_seed[1]
    drew = _SeedReads.read or not per_test or module_seed is not None      # before the reads below
    seed = int(os.environ.pop(SEED_ENV, -1)) if per_test else int(os.environ.get(SEED_ENV, -1))
    if per_test and key not in state["seen"]:
        state["seen"].add(key)
        if not drew and run["outcome"] != "failed":
            state["unseeded"].add(key)
    records, bounds.sink = bounds.sink, None
    if run["outcome"] == "skipped" and not records:
        return
    if key in state["unseeded"]:
        return
    with open(config.getoption("--seed-sweep-out"), "a") as f:
        f.write(json.dumps({"test": key, "seed": seed, "outcome": run["outcome"],
                            "bounds": records}) + "\n")


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    _CONFIG[:] = [session.config]


# ---------------------------------------------------------------- the command

def _test_files(paths: list[str]) -> list[str]:
    files = []
    for p in paths or ["tests"]:
        p = Path(p)
        for f in sorted([p] if p.is_file() else p.rglob("test_*.py")):
            if DRAWS.search(f.read_text(errors="replace")):
                files.append(str(f))
    return files


def _pytest(args: list[str], env_seed: int | None = None) -> int:
    env = dict(os.environ)
    env.pop(SEED_ENV, None)
    if env_seed is not None:
        env[SEED_ENV] = str(env_seed)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "tests.seeds", "-p", "no:cacheprovider",
           "--no-header", "-rN", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode


def _table(lines: list[dict], n_seeds: int) -> tuple[str, bool]:
    runs, fails = defaultdict(int), defaultdict(list)
    worst: dict[tuple[str, str], tuple[float, float, float, str, int]] = {}
    for r in lines:
        runs[r["test"]] += 1
        if r["outcome"] == "failed":
            fails[r["test"]].append(r["seed"])
        for name, value, bound, kind in r["bounds"]:
            if kind == "max":
                margin = bound / value if value > 0 else float("inf")
            else:           # NaN: a defect that made garbage (check_floor passes it)
                margin = value / bound if bound > 0 and value == value else float("inf")
            k = (r["test"], name)
            if k not in worst or margin < worst[k][0]:
                worst[k] = (margin, value, bound, kind, r["seed"])
    ok = True
    out = [f"{n_seeds} seeds; per test and bound: the bound, the worst value, its margin and seed", "",
           "| test | bound | limit | worst | margin | seed | runs | failed |",
           "|---|---|---:|---:|---:|---:|---:|---|"]
    for test in sorted(runs):
        failed = fails.get(test, [])
        ok &= not failed
        fail_text = f"{len(failed)} (seeds {', '.join(map(str, failed[:3]))})" if failed else "0"
        names = sorted(name for t, name in worst if t == test)
        if not names:
            out.append(f"| `{test}` | (no check_bound) | | | | | {runs[test]} | {fail_text} |")
        for name in names:
            margin, value, bound, kind, seed = worst[(test, name)]
            ok &= margin >= MARGIN
            limit = f"< {bound:.3g}" if kind == "max" else f"> {bound:.3g}"
            out.append(f"| `{test}` | {name.replace('|', chr(92) + '|')} | {limit} | {value:.3g} | {margin:.3g}x | {seed} | "
                       f"{runs[test]} | {fail_text} |")
            fail_text = ""
    return "\n".join(out), ok


PER_TEST_CHUNK = 25     # seeds per per-test pytest process: what an interrupted run loses


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _recorded(record: Path, selection: dict) -> tuple[set[int], set[int]]:
    """The seeds a record already holds, per kind (per test, per session).
    A record belongs to one selection of tests: another is refused."""
    record.mkdir(parents=True, exist_ok=True)
    kept = record / "selection.json"
    if kept.exists() and json.loads(kept.read_text()) != selection:
        raise SystemExit(f"--record {record} holds a sweep of {kept.read_text().strip()}, not of "
                         f"{json.dumps(selection)}: give another folder")
    kept.write_text(json.dumps(selection))
    done: dict[str, set[int]] = {"per_test": set(), "per_session": set()}
    index = record / "units.jsonl"
    for line in index.read_text().splitlines() if index.exists() else []:
        unit = json.loads(line)
        done[unit["kind"]].update(unit["seeds"])
    return done["per_test"], done["per_session"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.seeds", description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="test files or folders (default: every test file that draws a seed)")
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--seed-list", help="comma-separated seeds instead of --seeds fresh ones")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("-k", dest="expr", help="pytest's -k expression")
    ap.add_argument("--record", type=Path,
                    help="keep each finished run here and resume: a second call with the same folder "
                         "and tests runs only the seeds that --seeds still lacks, and the table covers "
                         "every run recorded (their commits are listed)")
    args = ap.parse_args(argv)
    files = _test_files(args.paths)
    select = ["-k", args.expr] if args.expr else []
    with tempfile.TemporaryDirectory(prefix="muser-seeds-") as tmp:
        record = args.record or Path(tmp, "record")
        have_test, have_session = _recorded(record, {"files": files, "k": args.expr})
        plan_path = Path(tmp, "plan.json")
        _pytest([*files, *select, "--seed-sweep-plan", str(plan_path)])
        plan = json.loads(plan_path.read_text())
        if args.seed_list:
            wanted = [int(s) for s in args.seed_list.split(",")]
        else:
            wanted = sorted(have_test | have_session)[:args.seeds]      # a record's seeds first
            rng, taken = random.SystemRandom(), set(wanted)
            while len(wanted) < args.seeds:
                s = rng.randrange(1 << 31)
                if s not in taken:
                    wanted.append(s)
                    taken.add(s)
        todo_test = [s for s in wanted if s not in have_test] if plan["per_test"] else []
        todo_session = [s for s in wanted if s not in have_session] if plan["per_session"] else []
        print(f"{len(plan['per_test'])} per-test-seeded and {len(plan['per_session'])} per-session-seeded "
              f"tests; {len(wanted)} seeds ({len(todo_test)} and {len(todo_session)} to run), {args.jobs} jobs",
              file=sys.stderr, flush=True)
        commit = _commit()
        jobs = []
        per_test_files = sorted({n.split("::")[0] for n in plan["per_test"]})
        for i in range(0, len(todo_test), PER_TEST_CHUNK):
            chunk = todo_test[i:i + PER_TEST_CHUNK]
            jobs.append(("per_test", chunk, [*per_test_files, *select, "--seed-sweep-seeds", ",".join(map(str, chunk))],
                         None))
        for s in todo_session:
            jobs.append(("per_session", [s], list(plan["per_session"]), s))

        def run(job) -> None:
            kind, chunk, pytest_args, env_seed = job
            name = f"{'t' if kind == 'per_test' else 's'}{chunk[0]}-{len(chunk)}.jsonl"
            out = Path(tmp, name)
            # pytest's exit status: 0 passed, 1 some failed, 5 nothing to run: a whole run,
            # recorded; any other (interrupted, an internal error) leaves its seeds to run again.
            if _pytest([*pytest_args, "--seed-sweep-out", str(out)], env_seed) not in (0, 1, 5):
                return
            if out.exists():
                os.replace(out, record / name)
            else:
                (record / name).write_text("")
            with open(record / "units.jsonl", "a") as f:
                f.write(json.dumps({"kind": kind, "seeds": chunk, "file": name, "commit": commit}) + "\n")

        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(run, jobs))
        units = [json.loads(u) for u in (record / "units.jsonl").read_text().splitlines()] \
            if (record / "units.jsonl").exists() else []
        lines = [json.loads(line) for u in units for line in (record / u["file"]).read_text().splitlines()]
    commits = sorted({u["commit"] for u in units})
    n_seeds = len({s for u in units for s in u["seeds"]})
    table, ok = _table(lines, n_seeds)
    print(f"commits: {', '.join(commits)}" if args.record else "", table, sep="\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
