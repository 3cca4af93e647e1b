"""Zero copy: opening a large file maps it, and memory grows only as pages
are touched. Measured in a fresh subprocess (peak RSS is per process)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from muser_torch import GGMLType, save_gguf

FILE_BYTES = 1_100_000_000
_PROBE = textwrap.dedent("""
    import json, os, resource, sys
    import torch
    from muser_torch import load_gguf
    def peak():     # high-water mark; ru_maxrss is in KiB on Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    def current():  # resident now, file-backed pages of the map included
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    def faults():   # pages mapped in (fault-around may map up to 16 per fault)
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_minflt + r.ru_majflt
    before, peak_before = current(), peak()
    f0 = faults()
    f = load_gguf(sys.argv[1])
    views = [t.packed for t in f.tensors.values()]   # views, nothing read
    open_faults = faults() - f0
    opened, peak_opened = current(), peak()
    # Now read that many rows; max() reduces in uint8, so no temporary copy.
    top = int(views[0][: int(sys.argv[2])].max())
    print(json.dumps({"before": before, "opened": opened, "touched": current(),
                      "peak_before": peak_before, "peak_opened": peak_opened,
                      "open_faults": open_faults, "max": top, "row_bytes": views[0].shape[1]}))
""")


def _probe(path: Path, rows: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, str(path), str(rows)], check=True,
                         capture_output=True, text=True, cwd=Path(__file__).parents[2])
    return json.loads(out.stdout)


def test_opening_a_large_file_does_not_read_it(tmp_path):
    # One Q4_K matrix of ~1.1 GB (n_in 4096: 2304 bytes a row) plus small tensors,
    # written sparse so the test costs no disk writes.
    n_out = FILE_BYTES // 2304
    path = tmp_path / "big.gguf"
    save_gguf(path, {"general.architecture": "test"},
              {"big.weight": (GGMLType.Q4_K, None, (4096, n_out)),
               "norm.weight": (GGMLType.F32, None, (4096,))}, progress=False)
    size = path.stat().st_size
    assert size >= 1 << 30
    rows = (128 << 20) // 2304                     # read 128 MB of it afterwards
    r = _probe(path, rows)
    grown = max(r["peak_opened"] - r["peak_before"], r["opened"] - r["before"])
    assert grown < 0.10 * size, f"opening grew RSS by {grown:,} B for a {size:,} B file"
    # Work done, not time: opening faults in a handful of pages (its header and
    # Python's own heap), not the 270,000 pages of the file.
    assert r["open_faults"] < 1000, f"opening faulted in {r['open_faults']} pages"
    # The measurement can see reads: touching 128 MB of the map shows up.
    read = r["touched"] - r["opened"]
    assert read > 0.8 * rows * r["row_bytes"], f"reading 128 MB grew RSS by only {read:,} B"
    assert r["max"] == 0   # the hole reads as zeros
