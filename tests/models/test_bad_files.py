"""Bad llama / qwen2 / qwen3 files are refused before any weight is used, with
a typed GGUFError naming the tensor or key."""
from __future__ import annotations

import pytest

import muser_torch
from muser_torch.errors import (DtypeFenceError, GGUFError, MetadataError, ShapeMismatchError,
                                TensorSetError)

from .conftest import SEED

pytest.importorskip("transformers")   # hf_files builds its names and shapes with transformers' classes


def refused(tmp_path, arch: str, edit, error: type, *match: str, **opts) -> None:
    from .hf_files import write_random_gguf
    path = write_random_gguf(tmp_path / f"bad-{arch}.gguf", arch, seed=SEED, edit=edit, **opts)
    with pytest.raises(error) as info:
        muser_torch.from_gguf(path)
    assert isinstance(info.value, GGUFError)
    for m in match:
        assert m in str(info.value), f"{m!r} not in {info.value} (seed {SEED})"


def set_key(key: str, value):
    def edit(md, tensors):
        md[key] = value
    return edit


def drop(name: str):
    def edit(md, tensors):
        del tensors[name]
    return edit


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_missing_tensor(tmp_path, arch):
    refused(tmp_path, arch, drop("blk.1.ffn_up.weight"), TensorSetError, "'blk.1.ffn_up.weight'")


def test_missing_qwen2_bias(tmp_path):
    refused(tmp_path, "qwen2", drop("blk.0.attn_v.bias"), TensorSetError, "'blk.0.attn_v.bias'")


def test_missing_qwen3_norm(tmp_path):
    refused(tmp_path, "qwen3", drop("blk.1.attn_k_norm.weight"), TensorSetError,
            "'blk.1.attn_k_norm.weight'")


def test_tensor_of_another_architecture(tmp_path):
    import torch

    def add_freqs(md, tensors):   # rope_freqs is a llama tensor
        tensors["rope_freqs.weight"] = ("F32", torch.ones(64))
    refused(tmp_path, "qwen2", add_freqs, TensorSetError, "'rope_freqs.weight'", "Qwen2")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_misshaped_tensor(tmp_path, arch):
    import torch

    from ..formats.ggml_ref import quantize_chunk

    def shrink(md, tensors):   # 96 kv rows where 2 kv heads x head size are expected
        tensors["blk.0.attn_k.weight"] = (8, quantize_chunk(torch.randn(96, 256), 8), (256, 96))
    refused(tmp_path, arch, shrink, ShapeMismatchError, "'blk.0.attn_k.weight'", "96")


def test_norm_of_wrong_length(tmp_path):
    import torch
    refused(tmp_path, "qwen3", lambda md, t: t.update({"blk.0.attn_q_norm.weight": ("F32", torch.ones(64))}),
            ShapeMismatchError, "'blk.0.attn_q_norm.weight'")


# types no CPU kernel of this package computes (ggml quantizes them without an imatrix)
@pytest.mark.parametrize("arch,name,qtype", [("llama", "blk.0.attn_q.weight", "TQ1_0"),
                                             ("qwen2", "output.weight", "TQ2_0"),
                                             ("qwen3", "token_embd.weight", "TQ1_0")])
def test_unsupported_tensor_type(tmp_path, arch, name, qtype):
    refused(tmp_path, arch, None, DtypeFenceError, repr(name), qtype, type_of={name: qtype})


def test_float16_norm_is_refused(tmp_path):
    import torch
    refused(tmp_path, "llama",
            lambda md, t: t.update({"output_norm.weight": ("F16", torch.ones(256, dtype=torch.float16))}),
            DtypeFenceError, "'output_norm.weight'", "F16")


@pytest.mark.parametrize("arch,key,value,words", [
    ("llama", "llama.attention.head_count_kv", 3, ("head_count_kv",)),
    ("llama", "llama.attention.layer_norm_rms_epsilon", "tiny", ("layer_norm_rms_epsilon",)),
    ("llama", "llama.context_length", 0, ("llama.context_length",)),
    ("llama", "llama.rope.dimension_count", 32, ("rope.dimension_count", "32")),
    ("llama", "llama.rope.freq_base", float("nan"), ("rope.freq_base",)),
    ("qwen2", "qwen2.rope.scaling.type", "longrope", ("rope.scaling.type", "longrope")),
    ("qwen2", "qwen2.rope.scaling.factor", -2.0, ("rope.scaling.factor",)),
    ("qwen2", "qwen2.rope.scaling.yarn_attn_factor", 0.8, ("yarn_attn_factor",)),
    ("qwen3", "qwen3.attention.value_length", 64, ("value_length",)),
    ("qwen3", "qwen3.block_count", 1000, ("block_count", "1000")),
])
def test_bad_metadata_value(tmp_path, arch, key, value, words):
    refused(tmp_path, arch, set_key(key, value), MetadataError, *words)


def test_head_size_the_tensors_do_not_have(tmp_path):
    def edit(md, tensors):
        md["qwen3.attention.key_length"] = md["qwen3.attention.value_length"] = 64
    refused(tmp_path, "qwen3", edit, ShapeMismatchError, "'blk.0.attn_q.weight'", "head_dim 64")


@pytest.mark.parametrize("arch,key", [("llama", "llama.block_count"),
                                      ("qwen2", "qwen2.attention.head_count"),
                                      ("qwen3", "qwen3.embedding_length")])
def test_missing_key(tmp_path, arch, key):
    def edit(md, tensors):
        del md[key]
    refused(tmp_path, arch, edit, MetadataError, repr(key))


def test_vocabulary_needs_a_size(tmp_path):
    def edit(md, tensors):   # qwen files give it only through the tokenizer's tokens
        for k in [k for k in md if k.startswith("tokenizer.")]:
            del md[k]
    refused(tmp_path, "qwen2", edit, MetadataError, "'qwen2.vocab_size'")


def test_unsupported_architecture_lists_the_supported(tmp_path):
    refused(tmp_path, "llama", set_key("general.architecture", "mistral3"), MetadataError,
            "'mistral3'", "'llama'", "'qwen2'", "'qwen3'")


def _more_tokens(md, tensors):
    """Two tokens past the embedding's rows (llama.vocab_size still says the rows)."""
    for key, extra in (("tokens", ["<extra_a>", "<extra_b>"]), ("scores", [0.0, 0.0]),
                       ("token_type", [1, 1])):
        if f"tokenizer.ggml.{key}" in md:
            md[f"tokenizer.ggml.{key}"] = list(md[f"tokenizer.ggml.{key}"]) + extra


def test_tokenizer_larger_than_the_embedding(tmp_path):
    """Ids past the embedding's rows would index outside it: refused at load."""
    refused(tmp_path, "llama", _more_tokens, MetadataError, "the tokenizer has",
            "llama.vocab_size")
