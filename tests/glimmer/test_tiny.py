"""make-tiny: the lanes' recipes, exact byte accounting, determinism, and the
random packed weights' scales."""
from __future__ import annotations

import hashlib
from collections import Counter

import pytest
import torch

from muser_torch.cli import main as cli
from muser_torch import dequantize
from muser_torch.formats import GGMLType
from muser_torch.gguf_io import load_gguf
from muser_torch.formats import random_weight
from muser_torch.tiny import SEED_CONFIG, plan, planned_bytes

from ..bounds import check_bound
from .conftest import SEED


def test_seed_geometry_matches_the_seed_numbers():
    """docs/muse-glimmer.md ("The geometry"): 27,853,389,824 parameters; the recipe's tensor
    bytes are the artifact's 16,756,681,056 less its header (tokenizer
    strings etc., which this count leaves out): 16,737,949,696 bytes of
    projections and embedding plus the F32 norms of the released
    architecture: 4 per layer and output_norm, (4 * 52 + 1) * 6656 * 4 =
    5,564,416 bytes, and the q/k norms, 2 * 52 * 128 * 4 = 53,248 bytes."""
    data, params = planned_bytes(SEED_CONFIG)
    assert params == 27_853_389_824
    assert data == 16_737_949_696 + 5_564_416 + 53_248
    assert 0 < 16_756_681_056 - data < 16_000_000
    counts = Counter((name.split(".")[-2], qtype) for name, qtype, _, _ in plan(SEED_CONFIG))
    assert counts[("attn_v", GGMLType.Q6_K)] == 26 and counts[("attn_v", GGMLType.Q4_K)] == 26
    assert counts[("ffn_down", GGMLType.Q6_K)] == 26 and counts[("ffn_down", GGMLType.Q4_K)] == 26
    assert counts[("output", GGMLType.Q5_K)] == 1 and counts[("token_embd", GGMLType.Q4_K)] == 1
    assert counts[("ffn_gate", GGMLType.Q4_K)] == 52 and counts[("attn_q", GGMLType.Q4_K)] == 52


def test_make_tiny_writes_the_recipe_deterministically(tmp_path, capsys):
    args = ["make-tiny", "--layers", "2", "--ffn", "512", "--window", "4", "--seed", str(SEED)]
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    assert cli(args[:1] + [str(a)] + args[1:]) == 0
    assert cli(args[:1] + [str(b)] + args[1:]) == 0
    assert "bits/weight" in capsys.readouterr().out
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest(), \
        f"make-tiny is not deterministic (seed {SEED})"
    g = load_gguf(a)
    assert g.metadata["muser.weight_precision"] == "q4_k_xl"
    types = {n: t.qtype for n, t in g.tensors.items()}
    assert types["blk.0.ffn_down.weight"] == GGMLType.Q6_K and types["blk.1.ffn_down.weight"] == GGMLType.Q4_K
    assert types["blk.1.attn_v.weight"] == GGMLType.Q6_K and types["blk.0.attn_v.weight"] == GGMLType.Q4_K
    assert types["output.weight"] == GGMLType.Q5_K and types["token_embd.weight"] == GGMLType.Q4_K
    c = cli(["make-tiny", str(tmp_path / "c.gguf"), "--lane", "nvfp4", "--layers", "1",
             "--seed", str(SEED + 1)])
    assert c == 0
    g = load_gguf(tmp_path / "c.gguf")
    assert g.tensors["output.weight"].qtype == GGMLType.NVFP4_E2M1
    assert g.tensors["token_embd.weight"].qtype == GGMLType.Q4_K


def test_make_tiny_refuses_unpackable_shapes(tmp_path, capsys):
    assert cli(["make-tiny", str(tmp_path / "x.gguf"), "--hidden", "200"]) == 2
    assert "hidden=200" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.NVFP4_E2M1])
def test_random_rows_have_the_asked_std(qtype):
    g = torch.Generator().manual_seed(SEED)
    std = 0.05
    rw = random_weight(qtype, 48, 512, generator=g, std=std)
    w = dequantize(rw.packed, qtype, 512, **rw.companions())
    assert torch.isfinite(w).all(), f"{qtype.name}: non-finite values (seed {SEED})"
    check_bound("std: relative distance to the asked std", abs(float(w.std()) / std - 1), 0.15,
                f"{qtype.name}: std {float(w.std()):.4f} (seed {SEED})")
    check_bound("mean: distance to 0 in stds", abs(float(w.mean())) / std, 0.2,
                f"{qtype.name}: mean {float(w.mean()):.4f} (seed {SEED})")


def test_make_tiny_writes_muse_glimmer_files(tmp_path):
    """The file is llama.cpp's architecture: the pattern as a bool per layer
    counted back from the last layer (5 layers, period 4: layers 0 and 4
    global), the release's logit scale and softcap, and with a vocabulary
    other than bytes llama.cpp's "none" tokenizer (loads with no tokenizer)."""
    from muser_torch import from_gguf
    path = tmp_path / "t.gguf"
    assert cli(["make-tiny", str(path), "--layers", "5", "--vocab", "300", "--seed", str(SEED)]) == 0
    md = load_gguf(path).metadata
    assert md["general.architecture"] == "muse-glimmer"
    assert md["muse-glimmer.attention.sliding_window_pattern"] == [False, True, True, True, False]
    assert md["muse-glimmer.logit_scale"] == pytest.approx(SEED_CONFIG.logit_scale)
    assert md["tokenizer.ggml.model"] == "none" and md["muse-glimmer.vocab_size"] == 300
    model = from_gguf(path)
    assert model.tokenizer is None and model.config.vocab_size == 300
    assert [layer.attention.window for layer in model.layers] == [None, 64, 64, 64, None]


def test_make_tiny_seed_shapes_are_the_release():
    """``--shapes seed`` is the release's geometry with its pattern array and constants."""
    import argparse
    from muser_torch.tiny.cli import config_from_args
    cfg = config_from_args(argparse.Namespace(shapes="seed", lane="nvfp4"))
    assert cfg.weight_precision == "nvfp4" and cfg.n_layers == 52
    globals_ = [i for i in range(52) if cfg.is_global(i)]
    assert globals_ == list(range(3, 52, 4))
    md = cfg.to_metadata()
    assert md["muse-glimmer.final_logit_softcapping"] == 20.0
    assert md["muse-glimmer.attention.value_length"] == 128
