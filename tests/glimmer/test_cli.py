"""`muser-torch run` and `muser-torch bench model` end to end on a tiny file."""
from __future__ import annotations

import math

import pytest

from muser_torch.cli import main as cli

from ..printed import numbers
from .conftest import SEED


def test_run_streams_text_and_reports_speed(tiny_files, capsys):
    rc = cli(["run", tiny_files["q4_k_xl"], "--prompt", "abc", "--max-new-tokens", "8",
              "--seed", str(SEED), "--dtype", "float32"])
    out = capsys.readouterr()
    assert rc == 0
    assert out.out.startswith("abc")
    assert "tok/s" in out.err and "MB of weights read per token" in out.err


def test_run_refuses_missing_file(tmp_path, capsys):
    assert cli(["run", str(tmp_path / "nope.gguf")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_run_refuses_unknown_device(tiny_files, capsys):
    assert cli(["run", tiny_files["q4_k_xl"], "--device", "foo"]) == 2
    assert "--device must be cpu, mps or cuda" in capsys.readouterr().err


def test_bench_model_prints_throughput(tiny_files, capsys):
    rc = cli(["bench", "model", tiny_files["nvfp4"], "--prompt-len", "8", "--decode", "3",
              "--batch", "2", "--warmup", "1", "--dtype", "float32"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "prefill" in out and "decode" in out and "GB/s" in out
    # the measured numbers after each label: tok/s, ms/step, MB, GB/s, all finite and > 0
    measured = {line.split()[0]: numbers(line.split(":", 1)[1]) for line in out.splitlines()
                if line.startswith("  ")}
    assert len(measured["prefill"]) == 1 and len(measured["decode"]) == 2, out
    assert len(measured["weights"]) == 4, out
    assert all(math.isfinite(v) and v > 0 for vs in measured.values() for v in vs), out


@pytest.mark.parametrize("argv, message", [
    (["--warmup", "-1"], "--warmup must be >= 0"),
    (["--layers", "0"], "--layers must be >= 1"),
    (["--decode", "0"], "--decode must be >= 1"),
])
def test_bench_model_refuses_bad_arguments(tiny_files, capsys, argv, message):
    assert cli(["bench", "model", tiny_files["nvfp4"], *argv]) == 2
    out = capsys.readouterr()
    assert out.out == "" and message in out.err


@pytest.mark.parametrize("argv, message", [
    (["--tokens", "0"], "--tokens must each be in 1..2048, got [0]"),
    (["--tokens", "1", "100000"], "--tokens must each be in 1..2048, got [100000]"),
    (["--baseline-mb", "0"], "--baseline-mb must be >= 1"),
])
def test_bench_ops_refuses_bad_arguments_before_measuring(capsys, argv, message):
    assert cli(["bench", "ops", *argv]) == 2
    out = capsys.readouterr()
    assert out.out == "" and message in out.err


@pytest.mark.parametrize("argv, message", [
    (["--max-new-tokens", "-5"], "--max-new-tokens must be >= 0, got -5"),
    (["--max-new-tokens", "100000"], "--max-new-tokens 100000: the prompt's 4 tokens plus 100000 "
                                     "new ones make 100004, more than the model's context length "
                                     "of 96 (at most 92 new tokens fit)"),
    (["--temperature", "-1"], "--temperature must be a finite number >= 0"),
    (["--temperature", "nan"], "--temperature must be a finite number >= 0"),
    (["--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--top-k", "0"], "--top-k must be >= 1"),
    (["--threads", "0"], "--threads must be >= 1"),
])
def test_run_refuses_bad_arguments_before_printing_anything(tiny_files, capsys, argv, message):
    assert cli(["run", tiny_files["q4_k_xl"], "--prompt", "abc", *argv]) == 2
    out = capsys.readouterr()
    assert out.out == "", f"printed {out.out!r} before refusing"
    assert message in out.err and out.err.count("\n") == 1, out.err
