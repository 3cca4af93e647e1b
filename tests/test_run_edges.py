"""`muser-torch run`'s first-hour edges (issue 41): the defaults in --help, a
first run's kernel compile kept out of the text and the prompt's time, no
`nan` when nothing is generated, one wording for a missing or wrong path
across run, inspect and serve. (A draft given as the model: tests/dflash/test_cli.py.)"""
from __future__ import annotations

import argparse
import sys
import time

import pytest

from muser_torch.cli import build_parser
from muser_torch.cli import main as cli
from muser_torch.run import DEMO

from .printed import numbers

DEMO_FILE = str(DEMO["q4_k_xl"])


def subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def test_run_help_shows_every_default():
    """Every option of `run` with a value has a help line that names its default."""
    parser = subparser("run")
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0:   # --help, flags
            continue
        assert action.help, f"{action.option_strings[0]} has no help"
        shown = action.help % {**vars(action), "prog": parser.prog}
        assert "default" in shown, f"{action.option_strings[0]}: {shown!r}"
        d = action.default
        if d is not None:
            assert (f"{d:g}" if isinstance(d, float) else str(d)) in shown.replace(",", ""), shown


def test_the_compile_notice_stands_apart(monkeypatch, capsys):
    """A first run's kernel compile (a stand-in: its notice, and 1000 s on a
    clock of the test's own) is printed before the prompt is echoed, on its
    own line of stderr, and none of its seconds count as the prompt's."""
    from muser_torch.ops import cpu
    real, offset = time.perf_counter, [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: real() + offset[0])

    def build_now():
        print("muser-torch: compiling CPU kernels (once, cached in X)", file=sys.stderr, flush=True)
        offset[0] += 1000.0

    monkeypatch.setattr(cpu, "build_now", build_now)
    assert cli(["run", DEMO_FILE, "--prompt", "def ", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("def ") and "muser-torch" not in out.out, out.out
    notice, stats = out.err.splitlines()
    assert notice.startswith("muser-torch: compiling CPU kernels"), out.err
    prompt_s = numbers(stats.split("prompt", 1)[1])[1]       # "prompt 5 tokens in S s"
    assert prompt_s < 1000, stats


def test_no_new_tokens_prints_no_nan(capsys):
    assert cli(["run", DEMO_FILE, "--max-new-tokens", "0"]) == 0
    err = capsys.readouterr().err
    assert "nan" not in err and "0 new tokens" in err, err


@pytest.mark.parametrize("command", [["run"], ["inspect"], ["serve", "--port", "0"]])
def test_a_missing_or_wrong_path_is_one_line_the_same_everywhere(command, tmp_path, capsys):
    name = command[0]
    for path, says in ((tmp_path / "none.gguf", f"{tmp_path / 'none.gguf'} does not exist"),
                       (tmp_path, f"{tmp_path} is a directory, not a GGUF file")):
        assert cli([name, str(path), *command[1:]]) == 2
        err = capsys.readouterr().err
        assert err == f"muser-torch {name}: error: {says}\n", err


def test_a_wrong_draft_path_is_named_as_the_draft(tmp_path, capsys):
    assert cli(["run", DEMO_FILE, "--draft", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"muser-torch run: error: --draft {tmp_path} is a directory, not a GGUF file\n", err
