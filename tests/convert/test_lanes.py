"""The Muser lanes (Muse Glimmer's): a ModelOpt NVFP4 checkpoint becomes the
nvfp4 lane bit for bit (payload and scale bytes are the checkpoint's; the
file's weights dequantize to E2M1 x E4M3 x scale_2 of the checkpoint,
computed here in float64 from the bit definitions and correctly rounded to
float32, with the q/k row permutation applied to both payload and scales),
its 16-bit tensors follow the q4_k_xl recipe; q4_k_xl and nvfp4 from a 16-bit
checkpoint follow the lane's recipe (``arch/glimmer_recipe``) and write
``muser.weight_precision``."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import muser_torch  # noqa: E402
from muser_torch import dequantize, load_gguf  # noqa: E402
from muser_torch.arch.muse_glimmer import HF_NAMES  # noqa: E402
from muser_torch.convert import convert  # noqa: E402

from ..gguf.helpers import fresh_seed  # noqa: E402
from ..models.hf_files import permute_qk  # noqa: E402
from .checkpoints import NVFP4_LINEARS, write_glimmer_checkpoint, write_nvfp4_checkpoint  # noqa: E402
from .round_trip import nvfp4_float64  # noqa: E402

_GGUF_NAME = {hf: g for g, hf in HF_NAMES.items()}   # HF pattern -> GGUF pattern


def test_nvfp4_checkpoint_passes_through_bit_for_bit(tmp_path):
    seed = fresh_seed()
    d, cfg, ck = write_nvfp4_checkpoint(tmp_path / "ck", "muse-glimmer", seed, n_layers=2)
    text = cfg.text_config
    out = tmp_path / "g.gguf"
    convert(d, out, "nvfp4", progress=False, pre_tokenizer="qwen2")
    f = load_gguf(out)
    assert f.metadata["muser.weight_precision"] == "nvfp4"
    n_checked = 0
    for name, payload in ck.items():
        parts = name.split(".")
        if not (name.endswith(".weight") and parts[-2] in NVFP4_LINEARS and "vision" not in name):
            continue
        base = name[:-len(".weight")]
        scale, scale_2 = ck[base + ".weight_scale"], ck[base + ".weight_scale_2"]
        want = nvfp4_float64(payload, scale, scale_2)
        want_payload, want_scale = payload, scale.view(torch.uint8)
        if parts[-2] in ("q_proj", "k_proj"):
            heads = text.num_attention_heads if parts[-2] == "q_proj" else text.num_key_value_heads
            want = permute_qk(want, heads)
            want_payload, want_scale = permute_qk(payload, heads), permute_qk(want_scale, heads)
        layer = parts[3]
        gname = _GGUF_NAME[name.replace(f".{layer}.", ".{i}.", 1)].format(i=layer)
        t = f[gname]
        assert t.type_name == "NVFP4_E2M1" and t.ne == (payload.shape[1] * 2, payload.shape[0])
        assert torch.equal(t.packed, want_payload), f"seed {seed}: {gname} payload"
        scales, s2 = f.companions(gname)
        assert torch.equal(scales.view(torch.uint8), want_scale), f"seed {seed}: {gname} scales"
        got = dequantize(t.packed, t.qtype, t.n_in, scales=scales, scale_2=s2)
        # e2m1 x e4m3 is exact in float32; the one product with scale_2 is
        # rounded once, so float32 holds the float64 value correctly rounded
        assert torch.equal(got, want.float()), f"seed {seed}: {gname} values"
        n_checked += 1
    assert n_checked == 8 * text.num_hidden_layers     # q, k, v, gate, o; gate, up, down
    # what the checkpoint keeps in 16 bits follows the q4_k_xl recipe
    assert f["token_embd.weight"].type_name == "Q4_K" and f["output.weight"].type_name == "Q5_K"
    assert f["output_norm.weight"].type_name == "F32"
    assert not any(n.endswith("input_scale") for n in f.tensors)
    muser_torch.from_gguf(out)      # admitted as the nvfp4 lane


def test_q4_k_xl_and_nvfp4_lanes_from_bf16(tmp_path):
    seed = fresh_seed()
    d, cfg, ck = write_glimmer_checkpoint(tmp_path / "ck", seed, n_layers=4)
    xl = load_gguf(convert(d, tmp_path / "xl.gguf", "q4_k_xl", progress=False, pre_tokenizer="qwen2").path)
    assert xl.metadata["muser.weight_precision"] == "q4_k_xl"
    for il in range(4):
        assert xl[f"blk.{il}.ffn_down.weight"].type_name == ("Q6_K" if il % 2 == 0 else "Q4_K")
        assert xl[f"blk.{il}.attn_v.weight"].type_name == ("Q6_K" if il % 2 == 1 else "Q4_K")
        assert xl[f"blk.{il}.attn_q.weight"].type_name == "Q4_K"
    assert xl["output.weight"].type_name == "Q5_K" and xl["token_embd.weight"].type_name == "Q4_K"
    nv = load_gguf(convert(d, tmp_path / "nv.gguf", "nvfp4", progress=False, pre_tokenizer="qwen2").path)
    assert nv.metadata["muser.weight_precision"] == "nvfp4"
    # quantized from the bf16 values, within quantize_nvfp4_e2m1's documented bound
    w = ck["model.language_model.layers.2.mlp.up_proj.weight"].float()
    t = nv["blk.2.ffn_up.weight"]
    scales, s2 = nv.companions("blk.2.ffn_up.weight")
    got = dequantize(t.packed, t.qtype, t.n_in, scales=scales, scale_2=s2)
    group_max = w.abs().reshape(w.shape[0], -1, 16).amax(-1).repeat_interleave(16, dim=1)
    assert bool(((got - w).abs() <= 0.1875 * group_max + 6 * 2**-10 * float(s2)).all()), f"seed {seed}"
    assert nv["output.weight"].type_name == "NVFP4_E2M1" and nv["token_embd.weight"].type_name == "Q4_K"
