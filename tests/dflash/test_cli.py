"""`muser-torch run --draft` and `muser-torch bench model --draft` end to end
on the tiny demo-style Glimmer (byte tokenizer) and a random draft for it."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from muser_torch.cli import main as cli
from muser_torch.tiny import write_tiny

from ..formats.ggml_ref import lib
from ..glimmer.conftest import TINY
from ..printed import numbers
from .conftest import SEED
from .draft_files import assistant_config, write_draft_gguf


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    lib()
    root = tmp_path_factory.mktemp("cli")
    target = root / "tiny.gguf"
    write_tiny(target, replace(TINY, weight_precision="q4_k_xl"), seed=SEED)
    draft = write_draft_gguf(root / "draft.gguf", assistant_config(tap_ids=(0, 1, 2), mask=257),
                             seed=SEED + 1, vocab=TINY.vocab_size, types=("Q4_K", "Q8_0"))
    return str(target), str(draft)


def test_run_with_a_draft_is_the_greedy_run_and_reports_acceptance(files, capsys):
    target, draft = files
    common = ["run", target, "--prompt", "abc", "--max-new-tokens", "12", "--temperature", "0",
              "--dtype", "float32"]
    assert cli(common) == 0
    plain = capsys.readouterr()
    assert cli([*common, "--draft", draft]) == 0
    drafted = capsys.readouterr()
    assert drafted.out == plain.out and plain.out.startswith("abc"), (plain.out, drafted.out, SEED)
    assert "mean accepted" in drafted.err and "rounds" in drafted.err


def test_run_refuses_a_draft_for_another_model(files, tmp_path, capsys):
    target, _ = files
    bad = write_draft_gguf(tmp_path / "bad.gguf", assistant_config(tap_ids=(0, 1), mask=5),
                           seed=SEED, vocab=300, types=("Q8_0",))
    assert cli(["run", target, "--draft", str(bad), "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "the draft's vocabulary has 300 tokens, its target's 258" in err and err.count("\n") == 1


def test_a_draft_given_as_the_model_is_named_a_draft(files, capsys):
    """Not the device/dtype rule of drafts (none was given): the file is a
    draft, and --draft is how to run it."""
    _, draft = files
    assert cli(["run", draft, "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert err == (f"muser-torch run: error: {draft} is a DFlash draft, not a model: run the model "
                   f"it drafts for with this file as its draft, muser-torch run MODEL.gguf "
                   f"--draft {draft}\n"), err


def test_bench_model_with_a_draft_prints_acceptance_and_both_speeds(files, capsys):
    target, draft = files
    rc = cli(["bench", "model", target, "--prompt-len", "8", "--decode", "20", "--warmup", "1",
              "--dtype", "float32", "--draft", draft])
    out = capsys.readouterr().out
    assert rc == 0
    lines = [line for line in out.splitlines() if "draft" in line]
    assert len(lines) == 2 and "mean accepted" in lines[0], out
    values = numbers(lines[1].split(":", 1)[1])
    assert len(values) == 3 and all(math.isfinite(v) and v > 0 for v in values), out
