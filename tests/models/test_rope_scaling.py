"""llama.cpp's RoPE for llama / qwen2 / qwen3 (``arch/rope.py``, ``models/rope_scaling.py``):
the rotation is ggml's own ``ggml_rope_ext`` for both modes, partial
rotation, frequency factors and YaRN; the metadata reading gives the
frequencies and magnitude transformers computes for the same scaling."""
from __future__ import annotations

import math

import pytest
import torch

from muser_torch.arch.rope import RopeArgs, rope_args
from muser_torch.models.rope_scaling import rope_frequencies, rotate

from ..gguf.helpers import fresh_seed
from .ggml_rope import ggml_rope, lib as ggml_lib
from .hf_files import hf_config, llama3_rope_factors


def ours(x: torch.Tensor, positions: torch.Tensor, a: RopeArgs, ff: torch.Tensor | None) -> torch.Tensor:
    inv, mscale = rope_frequencies(a, ff)
    ang = positions.float()[None, :, None] * inv           # [1, T, D/2]
    return rotate(x.unsqueeze(0), ang.cos().unsqueeze(2), ang.sin().unsqueeze(2), a.mode, a.n_rot, mscale)[0]


CASES = [
    dict(n_rot=64),
    dict(n_rot=32),                                              # partial rotation
    dict(n_rot=64, freq_scale=0.5),                              # linear
    dict(n_rot=64, freq_scale=0.25, ext_factor=1.0, attn_factor=0.9, n_ctx_orig=256),   # YaRN
    dict(n_rot=48, freq_scale=1 / 3, ext_factor=0.7, beta_fast=16.0, beta_slow=2.0, n_ctx_orig=512),
    dict(n_rot=64, freq_factors=True),                           # Llama 3's rope_freqs
]


@pytest.mark.parametrize("mode", ["normal", "neox"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v:.3g}" if isinstance(v, float)
                                                                else f"{k}={v}" for k, v in c.items()))
def test_rotation_is_ggml_rope(mode, case):
    ggml_lib()
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    T, H, D = 9, 3, 64
    x = torch.randn(T, H, D, generator=g)
    positions = torch.randint(0, 3000, (T,), generator=g)
    case = dict(case)
    ff = None
    if case.pop("freq_factors", False):
        ff = 1 + 7 * torch.rand(case["n_rot"] // 2, generator=g)
    base = 10000.0 if mode == "normal" else 1e6
    a = RopeArgs(mode, base=base, **case)
    want = ggml_rope(x, positions, mode=mode, n_rot=a.n_rot, base=base, freq_scale=a.freq_scale,
                     ext_factor=a.ext_factor, attn_factor=a.attn_factor, beta_fast=a.beta_fast,
                     beta_slow=a.beta_slow, n_ctx_orig=a.n_ctx_orig, freq_factors=ff)
    got = ours(x, positions, a, ff)
    assert torch.equal(got[..., a.n_rot:], x[..., a.n_rot:])
    # ggml builds angles by repeated float32 multiplication; 3000 * 2^-23 per step
    torch.testing.assert_close(got, want, rtol=0, atol=1e-3, msg=lambda m: f"seed {seed}: {m}")
    # and the mode matters: the other one is far off
    other = ours(x, positions, RopeArgs("neox" if mode == "normal" else "normal", base=base, **case), ff)
    assert (other - want).abs().max() > 0.1


def _md(arch: str, **rope) -> dict:
    return {f"{arch}.rope.{k}": v for k, v in {"freq_base": 10000.0, **rope}.items()}


@pytest.mark.parametrize("rope", [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096,
     "beta_fast": 16.0, "beta_slow": 2.0},
], ids=lambda r: f"{r['rope_type']}{r['factor']:g}")
def test_metadata_gives_transformers_frequencies(rope):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from .hf_files import rope_metadata
    cfg = hf_config("qwen2", n_layers=1, hidden=256, ffn=256, n_heads=4, n_kv_heads=2, head_dim=None,
                    vocab=64, context=1024, rope_theta=10000.0, rms_eps=1e-6, rope=rope, tied=True)
    md = {**_md("qwen2"), **rope_metadata("qwen2", rope)}
    a = rope_args(md, "qwen2", mode="neox", n_rot=64, context_length=1024)
    inv, mscale = rope_frequencies(a)
    want_inv, want_scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](cfg, "cpu")
    torch.testing.assert_close(inv, want_inv.float(), rtol=1e-6, atol=0)
    assert mscale == pytest.approx(want_scale, rel=1e-6)
    if rope["rope_type"] == "yarn":
        assert mscale == pytest.approx(1 + 0.1 * math.log(rope["factor"]), rel=1e-6) and mscale > 1


def test_llama3_factors_give_transformers_frequencies():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}
    cfg = hf_config("llama", n_layers=1, hidden=256, ffn=256, n_heads=4, n_kv_heads=2, head_dim=None,
                    vocab=64, context=1024, rope_theta=500000.0, rms_eps=1e-5, rope=rope, tied=True)
    a = rope_args(_md("llama", freq_base=500000.0), "llama", mode="normal", n_rot=64, context_length=1024)
    inv, mscale = rope_frequencies(a, llama3_rope_factors(64, rope, 500000.0))
    want_inv, want_scale = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    torch.testing.assert_close(inv, want_inv.float(), rtol=1e-6, atol=0)
    assert mscale == want_scale == 1.0


def test_metadata_rules():
    md = _md("llama", **{"scaling.factor": 2.0})          # a factor without a type is linear
    assert rope_args(md, "llama", mode="normal", n_rot=64, context_length=64).freq_scale == 0.5
    md = _md("llama", **{"scaling.type": "none", "scaling.factor": 2.0})   # none never scales
    assert rope_args(md, "llama", mode="normal", n_rot=64, context_length=64).freq_scale == 1.0
    md = _md("qwen2", **{"scaling.type": "yarn", "scaling.factor": 4.0})
    a = rope_args(md, "qwen2", mode="neox", n_rot=64, context_length=777)
    assert a.n_ctx_orig == 777 and a.ext_factor == 1.0            # original context defaults to the trained one
    with pytest.raises(ValueError, match="longrope"):
        rope_args(_md("qwen2", **{"scaling.type": "longrope"}), "qwen2", mode="neox", n_rot=64,
                  context_length=64)
