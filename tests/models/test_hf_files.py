"""The random llama / qwen2 / qwen3 GGUFs of ``hf_files`` are what llama.cpp's
converter would write: transformers' own classes load them, their
dequantized weights are our packed bytes, and an all-F32 file gives back the
Hugging Face weights it was made from (names, permutation, config) exactly."""
from __future__ import annotations

import gguf
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate", reason="transformers' GGUF loader needs accelerate")

from muser_torch import dequantize, load_gguf  # noqa: E402

from ..formats.ggml_ref import lib as ggml_lib  # noqa: E402
from ..gguf.helpers import fresh_seed  # noqa: E402
from .hf_files import (ARCHS, DEFAULT_MIX, convert, default_tokenizer, gguf_arch, head_dim_of,  # noqa: E402
                       hf_config,
                       llama3_rope_factors, load_transformers, permute_qk, random_hf_weights,
                       unpermute_qk, write_random_gguf)

CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


@pytest.fixture(autouse=True)
def _needs_ggml():
    ggml_lib()


def file_rows(f, name: str) -> torch.Tensor:
    """muser_torch.dequantize of the file's packed bytes, in the tensor's own shape."""
    t = f[name]
    w = dequantize(t.packed, t.qtype, t.n_in)
    return w.reshape(tuple(reversed(t.ne)))


def hf_to_gguf_names(arch: str, n_layers: int):
    return gguf.get_tensor_name_map(gguf_arch(arch), n_layers)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("arch", ARCHS)
def test_transformers_loads_our_bytes(tmp_path, arch, tied):
    seed = fresh_seed()
    path = write_random_gguf(tmp_path / f"{arch}.gguf", arch, seed=seed, tied=tied)
    f = load_gguf(path)
    model = load_transformers(path)
    cfg = model.config
    assert type(model).__name__ == CLASSES[arch]
    assert cfg.tie_word_embeddings == tied and ("output.weight" in f.tensors) == (not tied)
    names = hf_to_gguf_names(arch, cfg.num_hidden_layers)
    used = set()
    for hf_name, got in model.state_dict().items():
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if hf_name == "lm_head.weight" and tied:
            gguf_name = "token_embd.weight"
        assert gguf_name in f.tensors, f"seed {seed}: {arch} has no {gguf_name} for {hf_name}"
        want = file_rows(f, gguf_name)
        if arch == "llama" and ".q_proj." in hf_name:
            want = unpermute_qk(want, cfg.num_attention_heads)
        elif arch == "llama" and ".k_proj." in hf_name:
            want = unpermute_qk(want, cfg.num_key_value_heads)
        assert torch.equal(got, want), (
            f"seed {seed}: {arch} {hf_name} ({f[gguf_name].type_name}) differs from our bytes")
        used.add(gguf_name)
    assert used == set(f.tensors), f"seed {seed}: unused tensors {set(f.tensors) - used}"
    # every type of the mix is in the file, and only norms and biases are F32
    types = {t.type_name for t in f.tensors.values()}
    assert types == set(DEFAULT_MIX) | {"F32"}, f"seed {seed}: {types}"
    assert all(t.type_name != "F32" or len(t.ne) == 1 for t in f.tensors.values())
    # GQA with fewer kv heads; the config transformers read is the file's
    assert cfg.num_key_value_heads < cfg.num_attention_heads
    md = f.metadata
    assert cfg.hidden_size == md[f"{arch}.embedding_length"]
    assert cfg.num_hidden_layers == md[f"{arch}.block_count"]
    assert cfg.vocab_size == len(md["tokenizer.ggml.tokens"]) == f["token_embd.weight"].n_out
    prompt = torch.randint(0, cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        logits = model(prompt).logits
    assert logits.shape == (2, 11, cfg.vocab_size)
    assert torch.isfinite(logits).all() and logits.std() > 0.5, f"seed {seed}: logits {logits.std()}"


ROPES = [None,
         {"rope_type": "linear", "factor": 2.0},
         {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
          "beta_fast": 32.0, "beta_slow": 1.0},
         {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}]


@pytest.mark.parametrize("rope", ROPES, ids=lambda r: (r or {}).get("rope_type", "default"))
@pytest.mark.parametrize("arch", ARCHS)
def test_f32_file_is_the_converted_hf_model(tmp_path, arch, rope):
    """All-F32 file: transformers from the GGUF holds the very HF weights the
    file was made from (so names, the q/k permutation and its inverse agree
    with llama.cpp's converter and transformers' loader), and gives the same
    logits as the HF model built directly from them and their config."""
    if rope and rope["rope_type"] == "llama3" and arch != "llama":
        pytest.skip("llama3 scaling is a llama converter rule")
    seed = fresh_seed()
    tokenizer = default_tokenizer(arch, 384)
    vocab = len(tokenizer["tokenizer.ggml.tokens"])
    kw = dict(n_layers=2, hidden=256, ffn=512, n_heads=4, n_kv_heads=2, head_dim=128 if arch == "qwen3" else None,
              vocab=vocab, context=512, rope_theta=10000.0, rms_eps=1e-6, rope=rope, tied=False)
    path = write_random_gguf(tmp_path / f"{arch}.gguf", arch, seed=seed, types=("F32",), tokenizer=tokenizer,
                             **{k: v for k, v in kw.items() if k != "vocab"})
    from transformers import AutoModelForCausalLM
    config = hf_config(arch, **kw)
    hf = random_hf_weights(config, seed)
    direct = AutoModelForCausalLM.from_config(config).eval()
    direct.load_state_dict(hf, strict=True)
    loaded = load_transformers(path, rope=rope)
    for name, w in direct.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], w), f"seed {seed}: {arch} {name}"
    prompt = torch.randint(0, vocab, (1, 23), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        a, b = loaded(prompt).logits, direct(prompt).logits
    assert torch.equal(a, b), f"seed {seed}: {arch} {rope}: max diff {float((a - b).abs().max())}"
    md = gguf.GGUFReader(str(path)).fields   # gguf-py's own reader, as transformers uses
    key = f"{arch}.rope.scaling.type"
    if rope and rope["rope_type"] in ("linear", "yarn"):
        assert md[key].contents() == rope["rope_type"]
        assert md[f"{arch}.rope.scaling.factor"].contents() == rope["factor"]
    else:
        assert key not in md
    if rope and rope["rope_type"] == "yarn":
        assert md[f"{arch}.rope.scaling.original_context_length"].contents() == 128


def test_llama3_rope_factors_are_transformers_inv_freq():
    """rope_freqs.weight divides each pair's frequency into the one
    transformers' llama3 RoPE computes from the same parameters."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    rope = ROPES[3]
    config = hf_config("llama", n_layers=1, hidden=256, ffn=256, n_heads=4, n_kv_heads=2, head_dim=None,
                       vocab=64, context=512, rope_theta=500000.0, rms_eps=1e-5, rope=rope, tied=True)
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    d = head_dim_of(config)
    base = 1.0 / (500000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    factors = llama3_rope_factors(d, rope, 500000.0)
    assert (factors > 1).any() and (factors == 1).any()   # both ends of the ramp are covered
    torch.testing.assert_close(base / factors, inv_freq.float(), rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="8192"):
        llama3_rope_factors(d, {**rope, "original_max_position_embeddings": 4096}, 500000.0)


def test_permutation_pairs_rotate_half_halves():
    """permute_qk puts HF's rotate-half partners (i, i + d/2) side by side,
    per head, and unpermute_qk undoes it."""
    n_head, d, n_in = 3, 8, 5
    w = torch.arange(n_head * d).repeat_interleave(n_in).reshape(n_head * d, n_in).float()
    p = permute_qk(w, n_head)
    rows = p[:, 0].long().tolist()
    for h in range(n_head):
        for i in range(d // 2):
            assert rows[h * d + 2 * i] == h * d + i and rows[h * d + 2 * i + 1] == h * d + d // 2 + i
    assert torch.equal(unpermute_qk(p, n_head), w)


def test_convert_names_every_hf_tensor():
    config = hf_config("qwen2", n_layers=3, hidden=256, ffn=512, n_heads=4, n_kv_heads=2, head_dim=None,
                       vocab=64, context=128, rope_theta=1e6, rms_eps=1e-6, rope=None, tied=True)
    out = convert("qwen2", config, random_hf_weights(config, 0))
    assert "output.weight" not in out and "blk.2.attn_k.bias" in out
    assert len(out) == 2 + 3 * 12   # token_embd, output_norm; per block 7 matrices, 3 biases, 2 norms


def test_pinned_types_and_edit(tmp_path):
    def drop_norm(md, tensors):
        del tensors["output_norm.weight"]
        md["llama.context_length"] = 77
    path = write_random_gguf(tmp_path / "x.gguf", "llama", seed=5, type_of={"blk.0.attn_q.weight": "Q2_K"},
                             edit=drop_norm)
    f = load_gguf(path)
    assert f["blk.0.attn_q.weight"].type_name == "Q2_K" and "output_norm.weight" not in f.tensors
    assert f.metadata["llama.context_length"] == 77
    with pytest.raises(ValueError, match="arch"):
        write_random_gguf(tmp_path / "y.gguf", "gemma", seed=1)
