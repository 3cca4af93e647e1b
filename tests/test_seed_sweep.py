"""The seed sweep (``python -m tests.seeds``) on a test file of its own: it
runs a seeded test once per seed, reports the worst value of its bound and
that value's seed, leaves an unseeded test out, fails on a margin under 2,
and a recorded sweep resumes with only the seeds it still lacks."""
from __future__ import annotations

import json

import pytest

from . import seeds

SWEPT = '''
import os

from tests.bounds import check_bound


def test_draws_a_seed():
    seed = int(os.environ["MUSER_TEST_SEED"])
    check_bound("seed mod 97", seed % 97 + 1, BOUND)


def test_draws_nothing():
    pass
'''


def _write(tmp_path, bound: float):
    path = tmp_path / "test_swept.py"
    path.write_text(f"BOUND = {bound}\n" + SWEPT)
    return str(path)


def _units(record):
    return [json.loads(u) for u in (record / "units.jsonl").read_text().splitlines()]


def test_the_worst_seed_of_each_bound_is_reported(tmp_path, capsys):
    path, listed = _write(tmp_path, 1000), [1234567, 98, 4242]
    assert seeds.main(["--seed-list", ",".join(map(str, listed)), "--jobs", "2", path]) == 0
    table = capsys.readouterr().out
    worst = max(listed, key=lambda s: s % 97)
    row = next(line for line in table.splitlines() if "test_draws_a_seed" in line)
    cells = [c.strip() for c in row.split("|")]
    assert cells[3:9] == ["< 1e+03", f"{worst % 97 + 1:.3g}", f"{1000 / (worst % 97 + 1):.3g}x", str(worst),
                          "3", "0"], row
    assert "test_draws_nothing" not in table        # it read no seed: not a sweep's test


def test_a_margin_under_two_fails_the_sweep(tmp_path, capsys):
    path = _write(tmp_path, 150)          # seed % 97 + 1 reaches 76 or more: a margin under 2
    assert seeds.main(["--seed-list", "75,5", "--jobs", "1", path]) == 1
    assert "1.97x" in capsys.readouterr().out


def test_a_record_resumes_with_the_seeds_it_lacks(tmp_path, capsys):
    path, record = _write(tmp_path, 1000), tmp_path / "record"
    assert seeds.main(["--seeds", "2", "--jobs", "1", "--record", str(record), path]) == 0
    first = {s for u in _units(record) for s in u["seeds"]}
    assert len(first) == 2
    assert seeds.main(["--seeds", "3", "--jobs", "1", "--record", str(record), path]) == 0
    units = _units(record)
    assert len(units) == 2 and set(units[0]["seeds"]) == first and len(units[1]["seeds"]) == 1, units
    assert units[1]["seeds"][0] not in first
    row = next(line for line in capsys.readouterr().out.splitlines()[::-1] if "test_draws_a_seed" in line)
    assert row.split("|")[7].strip() == "3", row           # runs: every recorded seed
    (tmp_path / "other").mkdir()
    other = _write(tmp_path / "other", 1000)            # another test file: another sweep
    with pytest.raises(SystemExit, match="give another folder"):
        seeds.main(["--seeds", "3", "--record", str(record), other])
