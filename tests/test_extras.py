"""A command that needs a package of an optional extra which is not installed
ends in one line naming the install command, with exit status 2: `run` on
a BPE ("gpt2") file without transformers or tokenizers (Gemma 3's
sentencepiece vocabulary needs neither), `convert` of a
sentencepiece checkpoint without sentencepiece, `serve` without FastAPI,
uvicorn or sse-starlette. Each runs in a child where the package's import
fails as if it were not installed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from . import slow
from .cache_dirs import kernels_only_cache
from .models.family_files import hf_file  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parent.parent
INSTALL = 'pip install -e ".[hf]"'
DEMO = ROOT / "demo" / "glimmer-demo-q4_k_xl.gguf"

CHILD = """
import sys
sys.modules[sys.argv[1]] = None      # as if not installed: its import raises ImportError
from muser_torch.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _without(module: str, argv: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        MUSER_CACHE_DIR=kernels_only_cache())   # a cached tokenizer needs no transformers
    return subprocess.run([sys.executable, "-c", CHILD, module, *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True)


def _assert_one_line(proc: subprocess.CompletedProcess, command: str, module: str,
                     extra: str = "hf") -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(f"muser-torch {command}: error: "), lines[0]
    assert f"the {module!r} package is not installed" in lines[0], lines[0]
    assert lines[0].endswith(f"needs the {extra} extra (the {module!r} package is not installed): "
                             f'pip install -e ".[{extra}]"'), lines[0]


@pytest.mark.parametrize("module", ["transformers", slow.param("tokenizers")])
def test_run_on_a_bpe_file_without_the_hf_extra_names_the_install(hf_file, module):  # noqa: F811
    proc = _without(module, ["run", hf_file("qwen2"), "--prompt", "Hi", "--max-new-tokens", "2"])
    _assert_one_line(proc, "run", module)
    assert proc.stdout == ""


@pytest.mark.parametrize("module", ["transformers", "tokenizers"])
def test_run_on_gemma_needs_no_hf_extra(gemma_path, module):
    """A sentencepiece vocabulary is tokenized by text/spm.py, no extra needed."""
    proc = _without(module, ["run", gemma_path, "--prompt", "Hi", "--max-new-tokens", "2"])
    assert proc.returncode == 0 and proc.stdout.startswith("Hi"), proc.stderr[-3000:]


def test_convert_without_sentencepiece_names_the_install(tmp_path):
    pytest.importorskip("sentencepiece")      # to write the checkpoint's tokenizer.model
    pytest.importorskip("transformers")
    from .convert.checkpoints import write_checkpoint
    src, _, _ = write_checkpoint(tmp_path / "llama", "llama", seed=1)
    out = tmp_path / "out.gguf"
    proc = _without("sentencepiece", ["convert", str(src), str(out), "--type", "f16"])
    _assert_one_line(proc, "convert", "sentencepiece")
    assert not out.exists() and not list(tmp_path.glob("out.gguf*"))


@pytest.mark.parametrize("module", ["fastapi", "uvicorn", "sse_starlette"])
def test_serve_without_the_serve_extra_names_the_install(module):
    proc = _without(module, ["serve", str(DEMO), "--port", "0"])
    _assert_one_line(proc, "serve", module, extra="serve")


def test_a_missing_module_outside_the_extras_is_not_hidden():
    """Only the optional packages become the one line; any other missing
    module is a bug and keeps its traceback."""
    from muser_torch.text.requirements import missing_from
    assert missing_from(ModuleNotFoundError("no", name="muser_torch.nothing")) is None
    refusal = missing_from(ModuleNotFoundError("no", name="jinja2.sandbox"))
    assert str(refusal).endswith(f"(the 'jinja2' package is not installed): {INSTALL}")


def test_a_transformers_older_than_the_floor_is_refused_by_name(monkeypatch):
    """The H200's image had transformers 5.17, which lacks the pre-tokenizer
    table the tokenizers read: one line naming both versions, not an ImportError."""
    transformers = pytest.importorskip("transformers")
    from muser_torch.errors import MissingExtraError
    from muser_torch.text.requirements import _release, require
    assert require("transformers") is transformers
    monkeypatch.setattr(transformers, "__version__", "5.17.0")
    with pytest.raises(MissingExtraError, match=r"needs transformers >= 5\.24 \(the hf extra; "
                                                r"5\.17\.0 is installed\): pip install"):
        require("transformers")
    assert _release("5.24.0.dev0") == (5, 24, 0) and _release("5.9rc1") == (5, 9)
