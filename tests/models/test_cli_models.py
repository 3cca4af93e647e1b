"""`muser-torch run / inspect / bench model` on llama.cpp-style files: plain
continuation, one chat turn through the file's chat template, and the
errors a user meets."""
from __future__ import annotations

import re

import pytest
import torch

import muser_torch
from muser_torch.cli import main as cli
from muser_torch.gguf_io import load_gguf, save_gguf

from ..printed import numbers
from .family_files import hf_file  # noqa: F401  (fixture)


def _greedy_text(path: str, ids: list[int], n: int) -> str:
    model = muser_torch.from_gguf(path, dtype=torch.float32)
    tok = model.tokenizer
    out = model.generate(ids, n, stop=list(tok.stop_ids))[len(ids):].tolist()
    new = []
    for t in out:
        if t in tok.stop_ids:
            break
        new.append(t)
    return tok.decode(new)


def test_run_continues_a_prompt(hf_file, capsys):  # noqa: F811
    path = hf_file("qwen2")
    rc = cli(["run", path, "--prompt", "def add(a, b):", "--max-new-tokens", "6",
              "--temperature", "0", "--dtype", "float32"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    tok = muser_torch.from_gguf(path, dtype=torch.float32).tokenizer
    want = _greedy_text(path, tok.encode("def add(a, b):"), 6)
    assert out.out == "def add(a, b):" + want + "\n"


def test_run_chat_answers_one_turn(hf_file, capsys):  # noqa: F811
    path = hf_file("qwen2-tied-yarn")
    rc = cli(["run", path, "--chat", "--prompt", "Hello there", "--max-new-tokens", "5",
              "--temperature", "0", "--dtype", "float32"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    tok = muser_torch.from_gguf(path, dtype=torch.float32).tokenizer
    ids = tok.encode_chat([{"role": "user", "content": "Hello there"}])
    assert out.out == _greedy_text(path, ids, 5) + "\n"
    assert "tok/s" in out.err


def test_run_chat_without_a_template_is_one_line(capsys):
    assert cli(["run", "--chat", "--prompt", "hi"]) == 2      # the byte-level demo has none
    err = capsys.readouterr().err
    assert "chat_template" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_run_refuses_emulator_off_cpu(capsys):
    assert cli(["run", "--backend", "metal-emulator", "--device", "meta"]) == 2
    assert "--device must be" in capsys.readouterr().err


def test_inspect_and_bench_model_take_these_files(hf_file, capsys):  # noqa: F811
    path = hf_file("qwen3")
    assert cli(["inspect", path]) == 0
    assert "Q" in capsys.readouterr().out
    rc = cli(["bench", "model", path, "--prompt-len", "8", "--decode", "3", "--warmup", "1",
              "--dtype", "float32"])
    out = capsys.readouterr().out
    assert rc == 0
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("decode"))
    assert all(v > 0 for v in numbers(line.split(":", 1)[1]))


def test_run_numerics_ggml_is_the_ggml_model(hf_file, capsys):  # noqa: F811
    """`run --numerics ggml` continues the prompt as from_gguf(numerics="ggml")
    does, every projection set to the mode; a bad mode is a one-line error."""
    path = hf_file("qwen2")
    rc = cli(["run", path, "--prompt", "def add(a, b):", "--max-new-tokens", "6",
              "--temperature", "0", "--dtype", "float32", "--numerics", "ggml"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    model = muser_torch.from_gguf(path, dtype=torch.float32, numerics="ggml")
    linears = [m for m in model.modules() if isinstance(m, muser_torch.QLinear)]
    assert linears and all(m.numerics == "ggml" for m in linears)
    tok = model.tokenizer
    ids = tok.encode("def add(a, b):")
    new = [t for t in model.generate(ids, 6, stop=list(tok.stop_ids))[len(ids):].tolist()]
    new = new[:next((i for i, t in enumerate(new) if t in tok.stop_ids), len(new))]
    assert out.out == "def add(a, b):" + tok.decode(new) + "\n"
    with pytest.raises(SystemExit) as exit_:          # argparse refuses the choice
        cli(["run", path, "--numerics", "int8"])
    assert exit_.value.code == 2 and "--numerics" in capsys.readouterr().err
    with pytest.raises(ValueError, match="numerics must be one of"):
        muser_torch.from_gguf(path, numerics="int8")


def _with_template(path: str, template: str, dest) -> str:
    f = load_gguf(path)
    save_gguf(dest, f.metadata | {"tokenizer.chat_template": template}, f.tensors)
    return str(dest)


@pytest.mark.parametrize("template,flags,bound", [
    ("{{ 'x' * 3000000000 }}", [], "size bound.*over the bound of 1,000,000"),
    ("{% for a in range(99999) %}{% for b in range(99999) %}{% for c in range(99999) %}"
     "{% endfor %}{% endfor %}{% endfor %}", ["--chat-template-seconds", "0.3"],
     r"time bound: more than 0.3 s of CPU"),
    # 16 x the size of the message (and special tokens) is the larger bound here
    ("{% for m in messages %}{{ m['content'] * 100000 }}{% endfor %}",
     ["--chat-template-max-chars", "1"], r"size bound: .* 200,000 characters .*over the bound of [\d,]+ "),
])
def test_run_chat_with_a_hostile_template_is_one_line(hf_file, tmp_path, capsys,  # noqa: F811
                                                      template, flags, bound):
    path = _with_template(hf_file("qwen2"), template, tmp_path / "hostile.gguf")
    rc = cli(["run", path, "--chat", "--prompt", "hi", "--max-new-tokens", "1", *flags])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert re.search(f"tokenizer.chat_template stopped at its {bound}", err), err


def test_run_chat_refuses_bad_bounds(capsys):
    assert cli(["run", "--chat", "--prompt", "hi", "--chat-template-seconds", "0"]) == 2
    assert "--chat-template-*: chat template seconds must be" in capsys.readouterr().err
