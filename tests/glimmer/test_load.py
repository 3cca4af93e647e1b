"""``Glimmer.from_gguf`` refuses every fail-closed case of docs/muse-glimmer.md with a
message naming what is wrong, and binds the file's bytes without copying."""
from __future__ import annotations

import pytest
import torch

from muser_torch import Glimmer
from muser_torch.errors import (CompanionError, DtypeFenceError, GGUFError, LaneError,
                                MetadataError, ShapeMismatchError, TensorSetError)
from muser_torch.formats import GGMLType, random_weight
from muser_torch.gguf_io import load_gguf, save_gguf

from .conftest import SEED


def _variant(src: str, dst, *, metadata=None, drop=(), add=None, replace=None) -> str:
    """Copy ``src`` with metadata changes (None deletes a key), tensors dropped,
    added or replaced by (qtype, data, ne)."""
    g = load_gguf(src)
    md = dict(g.metadata)
    for k, v in (metadata or {}).items():
        if v is None:
            md.pop(k, None)
        else:
            md[k] = v
    tensors = {n: t for n, t in g.tensors.items() if n not in drop}
    tensors.update(replace or {})
    tensors.update(add or {})
    types = {k: v for k, v in g.metadata_types.items() if k in md and k not in (metadata or {})}
    save_gguf(dst, md, tensors, types=types)
    return str(dst)


def _random_bytes(qtype: GGMLType, n_out: int, n_in: int):
    g = torch.Generator().manual_seed(SEED)
    return (qtype, random_weight(qtype, n_out, n_in, generator=g).packed, (n_in, n_out))


CASES = {
    "unknown lane": (dict(metadata={"muser.weight_precision": "q8_0"}), LaneError, "q8_0"),
    "wrong architecture": (dict(metadata={"general.architecture": "llama"}), MetadataError, "llama"),
    "missing metadata key": (dict(metadata={"muse-glimmer.logit_scale": None}), MetadataError,
                             "muse-glimmer.logit_scale"),
    "pattern shorter than block_count": (
        dict(metadata={"muse-glimmer.attention.sliding_window_pattern": [True, False, True]}),
        MetadataError, "sliding_window_pattern has 3 entries"),
    "pattern of integers": (
        dict(metadata={"muse-glimmer.attention.sliding_window_pattern": [1, 0, 1, 0]}),
        MetadataError, "sliding_window_pattern[0]"),
    "q_norm of the wrong width": (dict(replace={"blk.2.attn_q_norm.weight": (GGMLType.F32, torch.ones(32))}),
                                  ShapeMismatchError, "blk.2.attn_q_norm.weight"),
    "vocab_size against the tokens": (dict(metadata={"muse-glimmer.vocab_size": 300}), MetadataError,
                                      "muse-glimmer.vocab_size"),
    "value_length against key_length": (dict(metadata={"muse-glimmer.attention.value_length": 32}),
                                        MetadataError, "value_length"),
    "partial rotation": (dict(metadata={"muse-glimmer.rope.dimension_count": 32}), MetadataError,
                         "rope.dimension_count"),
    "YaRN scaling": (dict(metadata={"muse-glimmer.rope.scaling.type": "yarn"}), MetadataError,
                     "rope.scaling.type"),
    "retired glimmer architecture": (dict(metadata={"general.architecture": "glimmer"}),
                                     MetadataError, "'glimmer'"),
    "shape vs config": (dict(metadata={"muse-glimmer.feed_forward_length": 768}), ShapeMismatchError,
                        "ffn_gate"),
    "missing tensor": (dict(drop=("blk.2.ffn_up.weight",)), TensorSetError, "blk.2.ffn_up.weight"),
    "extra tensor": (dict(add={"blk.0.attn_bias.weight": (GGMLType.F32, torch.ones(256))}),
                     TensorSetError, "blk.0.attn_bias.weight"),
    "Q8_0 projection": (dict(replace={"blk.1.attn_q.weight": _random_bytes(GGMLType.Q8_0, 256, 256)}),
                        DtypeFenceError, "blk.1.attn_q.weight"),
    "Q5_K embedding": (dict(replace={"token_embd.weight": _random_bytes(GGMLType.Q5_K, 258, 256)}),
                       DtypeFenceError, "token_embd.weight"),
    "llama.cpp NVFP4 projection": (dict(replace={"blk.0.ffn_up.weight": _random_bytes(GGMLType.NVFP4, 512, 256)}),
                                   DtypeFenceError, "blk.0.ffn_up.weight"),
    "Q4_K norm": (dict(replace={"output_norm.weight": (GGMLType.Q4_K, torch.zeros(1, 144, dtype=torch.uint8), (256,))}),
                  DtypeFenceError, "output_norm.weight"),
    "nvfp4 lane without NVFP4 tensors": (dict(metadata={"muser.weight_precision": "nvfp4"}),
                                         LaneError, "NVFP4_E2M1"),
    "tokenizer mismatch": (dict(metadata={"tokenizer.ggml.bos_token_id": 1}), MetadataError,
                           "bos_token_id"),
}
NVFP4_CASES = {
    "NVFP4 tensors without a lane key": (dict(metadata={"muser.weight_precision": None}), LaneError,
                                         "muser.weight_precision"),
    "nvfp4 tensors in the q4_k_xl lane": (dict(metadata={"muser.weight_precision": "q4_k_xl"}),
                                          LaneError, "NVFP4"),
    "missing scale companion": (dict(drop=("blk.1.attn_v.weight_scale",)), CompanionError,
                                "blk.1.attn_v.weight_scale"),
    "missing scale_2 companion": (dict(drop=("output.weight_scale_2",)), CompanionError,
                                  "output.weight_scale_2"),
    "mistyped scale companion": (dict(replace={"blk.0.ffn_down.weight_scale": (
        GGMLType.F16, torch.ones(256, 512 // 16, dtype=torch.float16))}), CompanionError,
        "blk.0.ffn_down.weight_scale"),
    "half the q/k norms": (dict(drop=("blk.3.attn_k_norm.weight",)), TensorSetError,
                           "blk.3.attn_k_norm.weight"),
}


BY_LANE = {"q4_k_xl": CASES, "nvfp4": NVFP4_CASES}


@pytest.mark.parametrize("lane,case", [(lane, case) for lane, cases in BY_LANE.items()
                                       for case in sorted(cases)])
def test_refuses_bad_file(tiny_files, tmp_path, lane, case):
    change, error, names = BY_LANE[lane][case]
    path = _variant(tiny_files[lane], tmp_path / "bad.gguf", **change)
    with pytest.raises(error) as info:
        Glimmer.from_gguf(path)
    assert names in str(info.value), f"{case}: message does not name {names!r}: {info.value}"
    assert isinstance(info.value, GGUFError) and isinstance(info.value, ValueError)


def test_unchanged_copy_loads(tiny_files, tmp_path):
    """The variant writer itself is faithful, so the refusals above are real."""
    for lane, src in tiny_files.items():
        path = _variant(src, tmp_path / f"same-{lane}.gguf")
        model = Glimmer.from_gguf(path, dtype=torch.float32)
        assert model.config.weight_precision == lane
        assert model.tokenizer is not None


def test_kquant_file_without_lane_key_is_a_llama_cpp_file(tiny_files, tmp_path):
    """Without ``muser.weight_precision`` the file is llama.cpp's: it loads,
    and then admits llama.cpp's types beyond the lane's (a Q8_0 projection)."""
    path = _variant(tiny_files["q4_k_xl"], tmp_path / "plain.gguf",
                    metadata={"muser.weight_precision": None},
                    replace={"blk.1.attn_q.weight": _random_bytes(GGMLType.Q8_0, 256, 256)})
    model = Glimmer.from_gguf(path, dtype=torch.float32)
    assert model.config.weight_precision is None
    assert model.layers[1].attention.wq.qtype == GGMLType.Q8_0


def test_cpu_weights_view_the_memory_map(tiny_files):
    """On CPU the projections hold the file's bytes, not a copy."""
    path = tiny_files["q4_k_xl"]
    model = Glimmer.from_gguf(path)
    g = load_gguf(path)
    file_ptr = g.tensors["blk.2.ffn_gate.weight"].packed.data_ptr() - g.tensors["blk.0.attn_q.weight"].packed.data_ptr()
    mod_ptr = (model.layers[2].feed_forward.w_gate.packed.data_ptr()
               - model.layers[0].attention.wq.packed.data_ptr())
    assert file_ptr == mod_ptr, "packed weights were copied out of the memory map"


def test_both_entry_points_compute_in_float32_on_the_cpu(tiny_files):
    """``Glimmer.from_gguf`` and ``muser_torch.from_gguf`` read one file into one
    numerics: float32 activations (and cache) on the CPU unless asked otherwise."""
    import muser_torch
    path = tiny_files["q4_k_xl"]
    for model in (Glimmer.from_gguf(path), muser_torch.from_gguf(path)):
        assert type(model) is Glimmer and model.activation_dtype == torch.float32
        tokens = torch.tensor([[1, 2, 3]])
        assert model(tokens).dtype == torch.float32


def test_weight_bytes_per_token_counts_the_file(tiny_files):
    """Every tensor's bytes once, except the embedding: one row of it."""
    for lane, path in tiny_files.items():
        g = load_gguf(path)
        emb = g.tensors["token_embd.weight"]
        want = g.tensor_bytes - emb.nbytes + emb.nbytes // emb.n_out
        got = Glimmer.from_gguf(path).weight_bytes_per_token()
        assert got == want, f"{lane}: {got} != {want}"
