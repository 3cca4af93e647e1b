"""Muse Glimmer (``MuseGlimmerForConditionalGeneration``): the text model
converted by the rules of ``arch/muse_glimmer.py`` (the +1 on the four layer
norms, q/k un-permuted to ggml's pair layout, attn_q_norm = qk_scale_factor
and attn_k_norm = ones synthesized, logit_scale, the softcap and the pattern
as a bool per layer), the vision tower left out. llama.cpp's own
``muse-glimmer`` graph (``lcpp_logits``) on the converted file gives the
logits transformers' model gives on the checkpoint."""
from __future__ import annotations


import pytest
import torch

pytest.importorskip("transformers")

from muser_torch import load_gguf  # noqa: E402
from muser_torch.convert import convert  # noqa: E402

from .. import lcpp  # noqa: E402
from ..gguf.helpers import fresh_seed  # noqa: E402
from ..models.hf_files import permute_qk  # noqa: E402
from .checkpoints import write_glimmer_checkpoint  # noqa: E402

P = "model.language_model."


@pytest.fixture(scope="module")
def glimmer(tmp_path_factory):
    seed = fresh_seed()
    d, cfg, weights = write_glimmer_checkpoint(tmp_path_factory.mktemp("glimmer") / "ck", seed)
    return d, cfg, weights, seed


def test_converted_tensors_and_keys(glimmer, tmp_path):
    d, cfg, w, seed = glimmer
    text = cfg.text_config
    r = convert(d, tmp_path / "g.gguf", "bf16", pre_tokenizer="qwen2", progress=False)
    assert r.skipped and all("vision" in n for n in r.skipped)
    f = load_gguf(r.path)
    md, a = f.metadata, "muse-glimmer"
    assert md["general.architecture"] == a
    assert md[f"{a}.logit_scale"] == pytest.approx(text.output_multiplier, rel=1e-7)
    assert md[f"{a}.final_logit_softcapping"] == text.final_logit_softcapping
    assert md[f"{a}.attention.sliding_window"] == text.sliding_window
    assert md[f"{a}.attention.sliding_window_pattern"] == [t == "sliding_attention" for t in text.layer_types]
    assert md[f"{a}.attention.key_length"] == text.head_dim
    assert not any("vision" in n or "perception" in n for n in f.tensors)

    def rows(name):
        t = f[name]
        return t.raw.view(torch.bfloat16 if t.type_name == "BF16" else torch.float32).float() \
            .reshape(tuple(reversed(t.ne)))
    for i in range(text.num_hidden_layers):
        for hf, g in (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "post_attention_norm"),
                      ("pre_feedforward_layernorm", "ffn_norm"), ("post_feedforward_layernorm", "post_ffw_norm")):
            want = w[f"{P}layers.{i}.{hf}.weight"].float() + 1.0
            assert torch.equal(rows(f"blk.{i}.{g}.weight"), want), f"seed {seed}: {g} {i}"
        q = w[f"{P}layers.{i}.self_attn.q_proj.weight"].float()
        k = w[f"{P}layers.{i}.self_attn.k_proj.weight"].float()
        assert torch.equal(rows(f"blk.{i}.attn_q.weight"), permute_qk(q, text.num_attention_heads))
        assert torch.equal(rows(f"blk.{i}.attn_k.weight"), permute_qk(k, text.num_key_value_heads))
        assert torch.equal(rows(f"blk.{i}.attn_gate.weight"), w[f"{P}layers.{i}.self_attn.gate_proj.weight"].float())
        assert torch.equal(rows(f"blk.{i}.attn_q_norm.weight"), torch.full((text.head_dim,), 3.87))
        assert torch.equal(rows(f"blk.{i}.attn_k_norm.weight"), torch.ones(text.head_dim))
    assert torch.equal(rows("output_norm.weight"), w[f"{P}norm.weight"].float())   # plain w, no +1
    assert torch.equal(rows("output.weight"), w["lm_head.weight"].float())


def test_llama_cpp_runs_the_converted_file_as_transformers_runs_the_checkpoint(glimmer, tmp_path):
    lcpp.skip_unless_available()
    from transformers.models.muse_glimmer.modeling_muse_glimmer import MuseGlimmerForConditionalGeneration
    d, cfg, _, seed = glimmer
    path = convert(d, tmp_path / "g.gguf", "f16", pre_tokenizer="qwen2", progress=False).path
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.text_config.vocab_size, (20,), generator=gen).tolist()  # > sliding window 6
    model = MuseGlimmerForConditionalGeneration.from_pretrained(str(d), dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(input_ids=torch.tensor([ids])).logits[0, -1]
    got, _ = lcpp.llama_cpp_logits(path, ids, 1, threads=2, timeout=300)
    got = got.float()
    # llama.cpp rounds activations to f16 for its f16 matmuls: 1.9e-3 to 5.7e-3
    # relative over random seeds (docs/muse-glimmer.md). A norm without its +1, an
    # unpermuted q/k or a wrong q norm is off by O(1): 2e-2 separates the two.
    rel = float((got - want).norm() / want.norm())
    assert got.shape == want.shape and rel < 2e-2, f"seed {seed}: relative error {rel}"
