"""`muser-torch bench formats` end to end at a small size (its numbers are
reported, never compared: every column is filled with a finite, positive number)."""
from __future__ import annotations

import math

from muser_torch.cli import main as cli

from ..printed import numbers


def test_bench_formats_prints_every_column(capsys):
    rc = cli(["bench", "formats", "--rows", "16", "--cols", "512", "--repeat", "1",
              "--types", "Q4_K,NVFP4_E2M1,BF16", "--big", "32x256"])
    out = capsys.readouterr().out
    assert rc == 0
    rows = {}
    for line in out.splitlines():
        if line.split():
            rows.setdefault(line.split()[0], line.split())
    assert len(rows["Q4_K"]) == 11 and rows["Q4_K"][4].endswith("x")   # gguf ratios present
    assert rows["NVFP4_E2M1"][2] == "-"                                # gguf lacks the type
    assert "the output alone" in out and "Q4_K quantize 32x256" in out
    # every measured number (sizes, rates, ratios, times) is finite and positive
    for name in ("Q4_K", "NVFP4_E2M1", "BF16"):
        values = numbers(" ".join(rows[name][1:]))
        assert len(values) == (10 if name != "NVFP4_E2M1" else 6), rows[name]
        assert all(math.isfinite(v) and v > 0 for v in values), rows[name]
    for line in out.splitlines():
        if line.startswith(("the output alone", "Q4_K quantize")):
            values = numbers(line.split(":", 1)[1].split(" (target")[0])
            assert len(values) == 2 and all(math.isfinite(v) and v > 0 for v in values), line


def test_bench_formats_refuses_bad_arguments(capsys):
    for argv, message in ((["--types", "Q9_K", "--big", "none"], "Q9_K"),
                          (["--big", "10x100"], "multiple of 256"),
                          (["--repeat", "0"], "--repeat must be >= 1")):
        assert cli(["bench", "formats", *argv]) == 2
        assert message in capsys.readouterr().err


def test_peers_table_keeps_its_columns(capsys, monkeypatch, tmp_path):
    """A contender without load time or RSS growth (llama-bench) prints "-" in
    those columns at their widths, so its numbers stay under their headers."""
    from muser_torch.bench import peers

    full = dict(load_s=1.5, peak_rss_mb=700.0, growth_mb=2.0, prefill_tps=150.0, decode_tps=9.0)
    monkeypatch.setattr(peers, "_measure", lambda name, *a, **k: dict(full))
    monkeypatch.setattr(peers, "_llama_bench", lambda *a, **k: dict(
        peak_rss_mb=313.0, prefill_tps=154.0, decode_tps=39.0, build="test"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"\0" * 1_000_000)
    peers.run(model, 2, 8, 4, llama_bench=tmp_path / "llama-bench")
    lines = capsys.readouterr().out.splitlines()
    header = next(ln for ln in lines if "load s" in ln)
    rows = {ln.split()[0]: ln for ln in lines if ln.split()[:1] in (["muser"], ["llama.cpp"])}
    assert set(rows) == {"muser", "llama.cpp"}, lines
    for col in ("load s", "peak RSS MB", "prefill tok/s", "decode tok/s"):
        end = header.index(col) + len(col)         # columns are right-aligned under their header
        for name, row in rows.items():
            assert row[end - 1] != " " and (end == len(row) or row[end] == " "), (col, name, row)
    assert rows["llama.cpp"][header.index("load s") + len("load s") - 1] == "-"
