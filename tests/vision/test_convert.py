"""``muser-torch convert HF_DIR OUT --mmproj``: the vision projector file of
the session's random checkpoint, byte for byte the file llama.cpp's own
release converter writes with ``--mmproj`` (F16, Q8_0 and BF16 from the session's
fixture), and it loads and runs as that file does.
Refusals: a checkpoint that is not Muse Glimmer's, another type."""
from __future__ import annotations

import pytest
import torch

import muser_torch
from muser_torch.cli import main as cli

from ..convert.checkpoints import write_checkpoint
from ..convert.peers import assert_same_file
from .conftest import SEED


def _convert(args: list[str]) -> int:
    return cli(["convert", *args, "--no-progress"])


@pytest.mark.parametrize("kind", ["f16", "q8_0"])
def test_mmproj_is_llama_cpps_file(vision_files, tmp_path, kind):
    ours = tmp_path / f"mmproj-{kind}.gguf"
    assert _convert([str(vision_files["checkpoint"]), str(ours), "--mmproj", "--type", kind]) == 0
    assert_same_file(ours, vision_files[kind][1], f"the {kind} mmproj (SEED={SEED})")


def test_bf16_mmproj_is_llama_cpps_file_and_loads(vision_files, tmp_path):
    text, theirs = vision_files["bf16"]
    ours = tmp_path / "ours.gguf"
    assert _convert([str(vision_files["checkpoint"]), str(ours), "--mmproj", "--type", "bf16"]) == 0
    assert_same_file(ours, theirs, f"the bf16 mmproj (SEED={SEED})")
    model = muser_torch.from_gguf(text, dtype=torch.float32, mmproj=ours)
    assert model.vision.patch.qtype.name == "F32" and model.vision.mm0.qtype.name == "BF16"


def test_mmproj_refusals(vision_files, tmp_path, capsys):
    llama_dir, _, _ = write_checkpoint(tmp_path / "llama", "llama", SEED)
    cases = (([str(llama_dir), str(tmp_path / "a.gguf"), "--mmproj"], "LlamaForCausalLM"),
             ([str(vision_files["checkpoint"]), str(tmp_path / "b.gguf"), "--mmproj", "--type", "q4_k_m"],
              "f16, bf16, q8_0"))
    for args, words in cases:
        assert _convert(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
        assert not (tmp_path / args[1]).exists(), args[1]
