"""The Muser lanes: a ModelOpt NVFP4 checkpoint becomes the nvfp4 lane bit for
bit (payload and scale bytes are the checkpoint's; the file's weights
dequantize to E2M1 x E4M3 x scale_2 of the checkpoint, computed here in
float64 from the bit definitions and correctly rounded to float32, with Llama's
q/k row permutation applied to both payload and scales), its 16-bit tensors
follow the q4_k_xl recipe; q4_k_xl and nvfp4 from a 16-bit checkpoint follow
the seed's recipe (``arch/glimmer_recipe``) and write ``muser.weight_precision``."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from muser_torch import dequantize, load_gguf  # noqa: E402
from muser_torch.convert import convert  # noqa: E402

from ..gguf.helpers import fresh_seed  # noqa: E402
from ..models.hf_files import permute_qk  # noqa: E402
from .checkpoints import NVFP4_LINEARS, write_checkpoint, write_nvfp4_checkpoint  # noqa: E402

_HF_TO_GGUF = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
               "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def e2m1_float64(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 (sign, 2 exponent bits with bias 1, 1 mantissa bit) in float64."""
    c = codes.to(torch.int64)
    sign = torch.where(c & 8 != 0, -1.0, 1.0).double()
    exp, man = (c >> 1) & 3, (c & 1).double()
    mag = torch.where(exp == 0, man * 0.5, torch.exp2((exp - 1).double()) * (1 + man / 2))
    return sign * mag


def reference(payload: torch.Tensor, scale: torch.Tensor, scale_2: torch.Tensor) -> torch.Tensor:
    """The checkpoint's weight: element 2i in the low nibble of byte i."""
    codes = torch.stack((payload & 15, payload >> 4), dim=-1).reshape(payload.shape[0], -1)
    s = scale.to(torch.float64).repeat_interleave(16, dim=1)
    return e2m1_float64(codes) * s * scale_2.double()


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_nvfp4_checkpoint_passes_through_bit_for_bit(tmp_path, arch):
    seed = fresh_seed()
    d, cfg, ck = write_nvfp4_checkpoint(tmp_path / arch, arch, seed, n_layers=2,
                                        head_dim=64 if arch == "qwen3" else None)
    out = tmp_path / f"{arch}.gguf"
    convert(d, out, "nvfp4", progress=False, pre_tokenizer="qwen2" if arch == "qwen3" else None)
    f = load_gguf(out)
    assert f.metadata["muser.weight_precision"] == "nvfp4"
    n_checked = 0
    for name, payload in ck.items():
        parts = name.split(".")
        if name.endswith(".weight") and parts[-2] in NVFP4_LINEARS:
            base = name[:-len(".weight")]
            scale, scale_2 = ck[base + ".weight_scale"], ck[base + ".weight_scale_2"]
            want = reference(payload, scale, scale_2)
            want_payload, want_scale = payload, scale.view(torch.uint8)
            if arch == "llama" and parts[-2] in ("q_proj", "k_proj"):
                heads = cfg.num_attention_heads if parts[-2] == "q_proj" else cfg.num_key_value_heads
                want = permute_qk(want, heads)
                want_payload, want_scale = permute_qk(payload, heads), permute_qk(want_scale, heads)
            gname = f"blk.{parts[2]}.{_HF_TO_GGUF[parts[-2]]}.weight"
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
    assert n_checked == 7 * cfg.num_hidden_layers
    # what the checkpoint keeps in 16 bits follows the q4_k_xl recipe
    assert f["token_embd.weight"].type_name == "Q4_K" and f["output.weight"].type_name == "Q5_K"
    assert f["output_norm.weight"].type_name == "F32"
    assert not any(n.endswith("input_scale") for n in f.tensors)


def test_q4_k_xl_and_nvfp4_lanes_from_bf16(tmp_path):
    seed = fresh_seed()
    d, cfg, ck = write_checkpoint(tmp_path / "ck", "llama", seed, n_layers=4)
    xl = load_gguf(convert(d, tmp_path / "xl.gguf", "q4_k_xl", progress=False).path)
    assert xl.metadata["muser.weight_precision"] == "q4_k_xl"
    for il in range(4):
        assert xl[f"blk.{il}.ffn_down.weight"].type_name == ("Q6_K" if il % 2 == 0 else "Q4_K")
        assert xl[f"blk.{il}.attn_v.weight"].type_name == ("Q6_K" if il % 2 == 1 else "Q4_K")
        assert xl[f"blk.{il}.attn_q.weight"].type_name == "Q4_K"
    assert xl["output.weight"].type_name == "Q5_K" and xl["token_embd.weight"].type_name == "Q4_K"
    nv = load_gguf(convert(d, tmp_path / "nv.gguf", "nvfp4", progress=False).path)
    assert nv.metadata["muser.weight_precision"] == "nvfp4"
    # quantized from the bf16 values, within quantize_nvfp4_e2m1's documented bound
    w = ck["model.layers.2.mlp.up_proj.weight"].float()
    t = nv["blk.2.ffn_up.weight"]
    scales, s2 = nv.companions("blk.2.ffn_up.weight")
    got = dequantize(t.packed, t.qtype, t.n_in, scales=scales, scale_2=s2)
    group_max = w.abs().reshape(w.shape[0], -1, 16).amax(-1).repeat_interleave(16, dim=1)
    assert bool(((got - w).abs() <= 0.1875 * group_max + 6 * 2**-10 * float(s2)).all()), f"seed {seed}"
    assert nv["output.weight"].type_name == "NVFP4_E2M1" and nv["token_embd.weight"].type_name == "Q4_K"
