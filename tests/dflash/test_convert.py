"""``muser-torch convert ASSISTANT draft.gguf --target-model-dir TARGET``: a
random transformers ``MuseGlimmerAssistantModel`` checkpoint and a random
Muse Glimmer target (both ``save_pretrained``, bfloat16), converted by our
converter (bf16, so the files hold the checkpoints' values exactly) and
loaded with ``from_gguf(draft, target=...)``. The first round's draft
logits are compared with transformers' own classes loading the two
checkpoints (``from_pretrained``) and generating with its DFlash candidate
generator; llama.cpp's own converter writes the same draft file byte for
byte. Bad input: a drafter without its target, or for another model, is
refused in one line, exit 2, nothing written."""
from __future__ import annotations

import json

import pytest
import torch

import muser_torch
from muser_torch.arch.dflash import MASK_KEY
from muser_torch.cli import main as cli

from ..convert.checkpoints import write_glimmer_checkpoint
from ..convert.peers import assert_same_file, run_converter
from .conftest import SEED
from ..versions import require_transformers
from .draft_files import (assert_draft_logits_match, assistant_config, first_round, transformers_rounds,
                          write_assistant_checkpoint)

TAPS = (0, 2, 3)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(target dir, its config, assistant dir, the assistant config)."""
    root = tmp_path_factory.mktemp("dflash_convert")
    target_dir, cfg, _ = write_glimmer_checkpoint(root / "target", SEED + 11)
    vocab = cfg.text_config.vocab_size
    acfg = assistant_config(tap_ids=TAPS, mask=vocab - 7, window=5)
    acfg.architectures = ["MuseGlimmerAssistantModel"]
    return target_dir, cfg, write_assistant_checkpoint(root / "assistant", acfg, seed=SEED + 13), acfg


@pytest.fixture(scope="module")
def converted(checkpoints, tmp_path_factory):
    target_dir, _, assistant_dir, _ = checkpoints
    root = tmp_path_factory.mktemp("dflash_gguf")
    for args in ([str(target_dir), str(root / "target.gguf")],
                 [str(assistant_dir), str(root / "draft.gguf"), "--target-model-dir", str(target_dir)]):
        assert cli(["convert", *args, "--type", "bf16", "--pre-tokenizer", "qwen2", "--no-progress"]) == 0
    return root / "target.gguf", root / "draft.gguf"


def test_the_draft_file_has_the_dflash_layout(checkpoints, converted):
    target_dir, cfg, assistant_dir, acfg = checkpoints
    target_path, draft_path = converted
    f, t = muser_torch.load_gguf(draft_path), muser_torch.load_gguf(target_path)
    md, a = f.metadata, "dflash"
    assert md["general.architecture"] == a
    assert list(md[f"{a}.target_layers"]) == [i + 1 for i in TAPS]
    assert md[f"{a}.block_size"] == acfg.block_size and md[MASK_KEY] == acfg.mask_token_id
    assert md[f"{a}.attention.sliding_window"] == acfg.sliding_window
    assert list(md[f"{a}.attention.sliding_window_pattern"]) == [True] * acfg.num_hidden_layers
    assert list(md["tokenizer.ggml.tokens"]) == list(t.metadata["tokenizer.ggml.tokens"])
    assert "token_embd.weight" not in f.tensors and "output.weight" not in f.tensors
    from safetensors.torch import load_file
    w = load_file(str(assistant_dir / "model.safetensors"))
    for name, hf in (("fc.weight", "encoder.fc.weight"),
                     ("enc.output_norm.weight", "encoder.output_norm_enc.weight"),
                     ("blk.1.attn_q.weight", "layers.1.self_attn.q_proj.weight"),
                     ("blk.0.attn_k_norm.weight", "layers.0.self_attn.k_norm.weight"),
                     ("blk.1.ffn_norm.weight", "layers.1.post_attention_layernorm.weight")):
        x = f[name]
        got = x.raw.view(torch.bfloat16 if x.type_name == "BF16" else torch.float32).float()
        assert torch.equal(got.reshape(w[hf].shape), w[hf].float()), name   # not permuted, not shifted


def test_first_round_draft_logits_match_transformers(checkpoints, converted):
    require_transformers("the MuseGlimmerAssistantModel reference")
    from transformers import MuseGlimmerAssistantModel, MuseGlimmerForConditionalGeneration
    target_dir, cfg, assistant_dir, _ = checkpoints
    target_path, draft_path = converted
    target = muser_torch.from_gguf(target_path, dtype=torch.float32)
    draft = muser_torch.from_gguf(draft_path, target=target)
    ids = torch.randint(0, cfg.text_config.vocab_size - 8, (1, 12),
                        generator=torch.Generator().manual_seed(SEED * 7 + 1))
    ref_target = MuseGlimmerForConditionalGeneration.from_pretrained(
        str(target_dir), dtype=torch.float32, attn_implementation="eager").eval()
    for k in ("eos_token_id", "pad_token_id", "bos_token_id"):
        setattr(ref_target.generation_config, k, None)
    ref_draft = MuseGlimmerAssistantModel.from_pretrained(
        str(assistant_dir), dtype=torch.float32, attn_implementation="eager").eval()
    _, rounds = transformers_rounds(ref_target, ref_draft, ids, 16)
    got, _, _ = first_round(target, draft, ids)
    assert_draft_logits_match(got, rounds[0][1][0], (15, cfg.text_config.vocab_size), SEED)


def test_llama_cpps_converter_writes_the_same_draft_file(checkpoints, converted, tmp_path):
    """llama.cpp's own converter, on the same pair, writes our file byte for
    byte, so a llama.cpp-written draft loads as ours does."""
    target_dir, _, assistant_dir, _ = checkpoints
    target_path, draft_path = converted
    theirs = tmp_path / "llama.cpp-draft.gguf"
    run_converter([{"dir": assistant_dir, "out": theirs, "outtype": "bf16", "pre": "qwen2",
                    "extra": ["--target-model-dir", str(target_dir)]}], tmp_path, release=True)
    assert_same_file(draft_path, theirs, "the DFlash draft")
    draft = muser_torch.from_gguf(theirs, target=muser_torch.from_gguf(target_path, dtype=torch.float32))
    assert draft.config.block_size == muser_torch.load_gguf(theirs).metadata["dflash.block_size"]


def _refused(args: list[str], capsys, out) -> str:
    assert cli(["convert", *args, str(out), "--type", "bf16", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("muser-torch convert: error:"), err
    assert not out.exists() and not list(out.parent.glob(out.name + "*")), list(out.parent.iterdir())
    return err


def _edited(src, dst, **changes):
    """A copy of the assistant checkpoint whose config.json has ``changes``."""
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    c = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**c, **changes}))
    return dst


def test_a_drafter_without_its_target_is_refused(checkpoints, tmp_path, capsys):
    _, _, assistant_dir, _ = checkpoints
    err = _refused([str(assistant_dir)], capsys, tmp_path / "d.gguf")
    assert "--target-model-dir" in err


def test_a_drafter_for_another_model_is_refused(checkpoints, tmp_path, capsys):
    target_dir, cfg, assistant_dir, acfg = checkpoints
    vocab = cfg.text_config.vocab_size
    cases = {"hidden_size": (dict(hidden_size=128), "hidden_size is 128"),
             "mask": (dict(mask_token_id=vocab + 3), f"vocabulary of {vocab} tokens"),
             "taps": (dict(target_layer_ids=[0, 2, 9]), "target_layer_ids [0, 2, 9]")}
    for name, (changes, words) in cases.items():
        bad = _edited(assistant_dir, tmp_path / name, **changes)
        err = _refused([str(bad), "--target-model-dir", str(target_dir)], capsys, tmp_path / f"{name}.gguf")
        assert words in err, (name, err)


def test_a_target_dir_for_a_plain_model_is_refused(checkpoints, tmp_path, capsys):
    target_dir, _, _, _ = checkpoints
    err = _refused([str(target_dir), "--target-model-dir", str(target_dir)], capsys, tmp_path / "t.gguf")
    assert "not a DFlash drafter" in err
