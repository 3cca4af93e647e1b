"""Bad checkpoints get a typed ConvertError naming the problem, from the
function and as a one-line CLI error (exit 2, no traceback), and nothing is
left at the output path: not a partial file, and an existing file there is
left as it was."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from muser_torch.cli import main as cli_main  # noqa: E402
from muser_torch.convert import (CheckpointError, ConfigMismatchError, RecipeError,  # noqa: E402
                                 TokenizerConvertError, UnsupportedArchitectureError, convert)

from ..gguf.helpers import fresh_seed  # noqa: E402
from .checkpoints import save_weights, write_checkpoint, write_glimmer_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A sharded random Llama and a Qwen2 with a BPE tokenizer, copied per test."""
    root = tmp_path_factory.mktemp("bad")
    seed = fresh_seed()
    llama = write_checkpoint(root / "llama", "llama", seed, shards=2)
    qwen = write_checkpoint(root / "qwen2", "qwen2", seed + 1, n_layers=1)
    return {"llama": llama, "qwen2": qwen}


def _copy(good, tmp_path, which="llama"):
    d = tmp_path / which
    shutil.copytree(good[which][0], d)
    return d


def _config_edit(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


def _missing_shard(d):
    next(d.glob("model-00002-*.safetensors")).unlink()


def _truncated(d):
    part = next(d.glob("model-00001-*.safetensors"))
    data = part.read_bytes()
    part.write_bytes(data[:len(data) - 1000])


def _bad_header(d):
    part = next(d.glob("model-00001-*.safetensors"))
    part.write_bytes((12).to_bytes(8, "little") + b"{not json}!!" + b"\0" * 64)


def _wider_config(d):
    _config_edit(d, hidden_size=512)


def _deeper_config(d):
    _config_edit(d, num_hidden_layers=3)


def _shallower_config(d):
    _config_edit(d, num_hidden_layers=1)


def _unknown_arch(d):
    _config_edit(d, architectures=["MysteryForCausalLM"])


def _no_config(d):
    (d / "config.json").unlink()


def _rewrite_weights(d, change) -> None:
    """Load every part of the checkpoint, let ``change`` edit the tensors, and
    save them back as one unsharded file."""
    from safetensors.torch import load_file
    w = {}
    for p in sorted(d.glob("model-*.safetensors")):
        w.update(load_file(str(p)))
        p.unlink()
    (d / "model.safetensors.index.json").unlink()
    change(w)
    save_weights(d, w)


def _int_weight(d):
    def change(w):
        w["model.norm.weight"] = torch.arange(w["model.norm.weight"].numel(), dtype=torch.int32)
    _rewrite_weights(d, change)


def _nan_weight(d):
    _rewrite_weights(d, lambda w: w["model.layers.1.mlp.down_proj.weight"].__setitem__((3, 5), float("nan")))


CASES = [
    (_missing_shard, CheckpointError, "missing"),
    (_truncated, CheckpointError, "truncated"),
    (_bad_header, CheckpointError, "header"),
    (_no_config, CheckpointError, "config.json"),
    (_wider_config, ConfigMismatchError, "shape"),
    (_deeper_config, ConfigMismatchError, "layer 2"),
    (_shallower_config, ConfigMismatchError, "layer 1"),
    (_unknown_arch, UnsupportedArchitectureError, "MysteryForCausalLM"),
    (_int_weight, RecipeError, "I32"),
    (_nan_weight, RecipeError, "NaN"),   # found while writing: the partial file must go
]


@pytest.mark.parametrize("damage,error,words", CASES, ids=[c[0].__name__.strip("_") for c in CASES])
def test_bad_checkpoint_is_refused_and_nothing_is_written(good, tmp_path, damage, error, words, capsys):
    d = _copy(good, tmp_path)
    damage(d)
    out = tmp_path / "out.gguf"
    with pytest.raises(error, match=words):
        convert(d, out, "q8_0", progress=False)
    assert not out.exists() and not list(tmp_path.glob("*.partial"))
    # an existing file at OUT stays as it was, even under --force
    out.write_bytes(b"keep me")
    assert cli_main(["convert", str(d), str(out), "--type", "f16", "--no-progress", "--force"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("muser-torch convert: error:") and "Traceback" not in err, err
    assert out.read_bytes() == b"keep me" and not list(tmp_path.glob("*.partial"))


def test_unidentified_pre_tokenizer_is_refused(good, tmp_path):
    """A byte-level BPE whose hash llama.cpp's converter does not list is refused,
    naming the hash; naming the pre-tokenizer converts it."""
    d = _copy(good, tmp_path, "qwen2")
    out = tmp_path / "q.gguf"
    with pytest.raises(TokenizerConvertError, match="pre-tokenizer.*hash [0-9a-f]{64}"):
        convert(d, out, "f16", progress=False)
    assert not out.exists()
    convert(d, out, "f16", pre_tokenizer="qwen2", progress=False)
    from muser_torch.gguf_io import load_gguf
    assert load_gguf(out).metadata["tokenizer.ggml.pre"] == "qwen2"


def test_recipe_refuses_rows_it_cannot_take(tmp_path):
    """q4_k_xl needs rows of whole 256-blocks; an ffn of 96 is refused by name
    (llama.cpp's q4_k_m falls back instead, and so does ours)."""
    d, _, _ = write_glimmer_checkpoint(tmp_path / "narrow", fresh_seed(), n_layers=1, ffn=96)
    with pytest.raises(RecipeError, match="ffn_down.*96.*q4_k_xl"):
        convert(d, tmp_path / "x.gguf", "q4_k_xl", progress=False, pre_tokenizer="qwen2")
    assert not (tmp_path / "x.gguf").exists()
    convert(d, tmp_path / "m.gguf", "q4_k_m", progress=False, pre_tokenizer="qwen2")
    from muser_torch.gguf_io import load_gguf
    # the one layer is a use_more_bits layer: Q6_K, which rows of 96 cannot take -> Q8_0
    assert load_gguf(tmp_path / "m.gguf")["blk.0.ffn_down.weight"].type_name == "Q8_0"


def test_unknown_type_and_device(good, tmp_path, capsys):
    d = good["llama"][0]
    with pytest.raises(RecipeError, match="q3_k"):
        convert(d, tmp_path / "x.gguf", "q3_k")
    assert cli_main(["convert", str(d), str(tmp_path / "x.gguf"), "--device", "tpu"]) == 2
    assert "--device" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("change,words", [
    ({"query_pre_attn_scalar": 256}, "query_pre_attn_scalar is 256.*1/sqrt\\(64\\)"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types .* at layer 0"),
])
def test_gemma3_config_a_file_cannot_carry_is_refused(tmp_path, change, words, capsys):
    """llama.cpp fixes Gemma 3's query scale (1/sqrt(head_dim)) and its layer
    pattern (every 6th global); a config.json saying otherwise is refused
    rather than converted into a file that computes another model."""
    d, _, _ = write_checkpoint(tmp_path / "g", "gemma3", fresh_seed(), n_layers=2, head_dim=64)
    _config_edit(d, **change)
    with pytest.raises(ConfigMismatchError, match=words):
        convert(d, tmp_path / "g.gguf", "f16", progress=False)
    assert cli_main(["convert", str(d), str(tmp_path / "g.gguf")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert not (tmp_path / "g.gguf").exists()
