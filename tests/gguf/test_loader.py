"""Fail-closed admission (docs/muse-glimmer.md) and weight binding, on tiny Muse Glimmer files."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from muser_torch import GGMLType, load_gguf, save_gguf
from muser_torch.arch.muse_glimmer import MUSE_GLIMMER
from muser_torch.arch.spec import expand
from muser_torch.config import GlimmerConfig
from muser_torch.errors import (CompanionError, DtypeFenceError, LaneError, MetadataError,
                                ShapeMismatchError, TensorSetError)
from muser_torch.loader import admit, bind_weights, packed_weight

from .helpers import finite_kquant, fresh_seed, nvfp4_reference, random_nvfp4

CFG = GlimmerConfig(context_length=128, hidden=256, ffn=512, n_layers=2, n_heads=2,
                    n_kv_heads=1, head_dim=128, rms_eps=float(np.float32(1e-6)), sliding_window=16,
                    sliding_window_pattern=2, rope_base=10000.0, vocab_size=64)
NVFP4_PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_gate", "ffn_up", "ffn_down")


def glimmer_tensors(cfg: GlimmerConfig, rng: np.random.Generator | None, *, lane="q4_k_xl") -> dict:
    """Every tensor of ``cfg`` in a q4_k_xl-like recipe: Q4_K, Q6_K on odd-layer attn_v
    and ffn_down, Q5_K lm_head, F32 norms; the nvfp4 lane swaps most projections
    to NVFP4_E2M1 with companions. ``rng`` None gives zero bytes (sparse)."""
    out = {}
    for name, (spec, _) in expand(MUSE_GLIMMER, cfg).items():
        role, ne = spec.role, spec.shape(cfg)
        part = name.split(".")[-2]
        layer = int(name.split(".")[1]) if name.startswith("blk.") else 0
        n_in, n_out = ne[0], (ne[1] if len(ne) > 1 else 1)
        if role.value == "norm":
            data = None if rng is None else torch.from_numpy(rng.standard_normal(n_in).astype(np.float32))
            out[name] = (GGMLType.F32, data, ne)
        elif lane == "nvfp4" and part in NVFP4_PROJECTIONS:
            payload, scales, scale_2 = random_nvfp4(rng or np.random.default_rng(0), n_out, n_in)
            out[name] = (GGMLType.NVFP4_E2M1, payload)
            out[name + "_scale"] = (GGMLType.F8_E4M3FN, scales)
            out[name + "_scale_2"] = (GGMLType.F32, scale_2)
        else:
            qtype = GGMLType.Q4_K
            if part in ("attn_v", "ffn_down") and layer % 2:
                qtype = GGMLType.Q6_K
            elif name == "output.weight":
                qtype = GGMLType.Q5_K
            data = None if rng is None else finite_kquant(rng, int(qtype), n_out, n_in)
            out[name] = (qtype, data, ne)
    return out


def write(tmp_path, tensors, md=None, cfg=CFG, lane=None):
    md = dict(cfg.to_metadata() if md is None else md)
    if lane is not None:
        md["muser.weight_precision"] = lane
    path = tmp_path / "muse-glimmer.gguf"
    save_gguf(path, md, tensors)
    return load_gguf(path)


def test_q4_k_xl_file_is_admitted_and_binds(tmp_path):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    tensors = glimmer_tensors(CFG, rng)
    f = write(tmp_path, tensors)
    assert admit(f) == CFG
    weights = bind_weights(f)
    assert list(weights) == list(tensors)
    for name in ("blk.1.ffn_down.weight", "output.weight", "token_embd.weight"):
        w = weights[name]
        qtype, packed, ne = tensors[name]
        assert (w.qtype, w.n_in, w.n_out, w.scales) == (qtype, ne[0], ne[1], None)
        expect = gguf_dequantize(packed.numpy(), GGMLQuantizationType(int(qtype)))
        assert np.array_equal(w.dequantize().numpy(), expect.reshape(ne[1], ne[0])), f"seed {seed} {name}"


def test_nvfp4_file_is_admitted_and_binds_companions(tmp_path):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    tensors = glimmer_tensors(CFG, rng, lane="nvfp4")
    f = write(tmp_path, tensors, lane="nvfp4")
    assert admit(f) == replace(CFG, weight_precision="nvfp4")
    weights = bind_weights(f)
    assert not any(n.endswith(("_scale", "_scale_2")) for n in weights)
    w = packed_weight(f, "blk.1.ffn_down.weight")
    _, payload = tensors["blk.1.ffn_down.weight"]
    _, scales = tensors["blk.1.ffn_down.weight_scale"]
    _, scale_2 = tensors["blk.1.ffn_down.weight_scale_2"]
    assert w.qtype == GGMLType.NVFP4_E2M1 and w.scales.dtype == torch.float8_e4m3fn
    assert w.scales.shape == (CFG.hidden, CFG.ffn // 16) and float(w.scale_2) == float(scale_2)
    ref = nvfp4_reference(payload.numpy(), scales.numpy(), scale_2)
    assert np.array_equal(w.dequantize().numpy(), ref), f"seed {seed}"


# Each case edits (metadata, tensors) of a valid zero-filled q4_k_xl file.
def _set(name, spec):
    def edit(md, t):
        t[name] = spec
    return edit


def _drop(name):
    def edit(md, t):
        t.pop(name, None)
        md.pop(name, None)
    return edit


def _md(key, value):
    def edit(md, t):
        md[key] = value
    return edit


def _to_nvfp4(name, scale=True, scale_2=True, scale_spec=None):
    def edit(md, t):
        ne = t[name][2]
        t[name] = (GGMLType.NVFP4_E2M1, None, ne)
        if scale:
            t[name + "_scale"] = scale_spec or (GGMLType.F8_E4M3FN, None, (ne[0] // 16, ne[1]))
        if scale_2:
            t[name + "_scale_2"] = (GGMLType.F32, None, (1,))
    return edit


def _both(*edits):
    def edit(md, t):
        for e in edits:
            e(md, t)
    return edit


Q = "blk.1.attn_q.weight"
CASES = {
    "no lane, NVFP4 tensors": (_both(_drop("muser.weight_precision"), _to_nvfp4(Q)), LaneError,
                               "NVFP4_E2M1 .* but muser.weight_precision is missing"),
    "unknown lane": (_md("muser.weight_precision", "fp8"), LaneError, "'fp8', expected one of"),
    "other architecture": (_md("general.architecture", "llama"), MetadataError, "'llama'"),
    "missing key": (_drop("muse-glimmer.block_count"), MetadataError, "'muse-glimmer.block_count' is missing"),
    "bad heads": (_md("muse-glimmer.attention.head_count_kv", 3), MetadataError,
                  "head_count 2 is not a multiple of head_count_kv 3"),
    "infinite layers": (_md("muse-glimmer.block_count", float("inf")), MetadataError,
                        "muse-glimmer.block_count is inf, expected an integer"),
    "text for a number": (_md("muse-glimmer.embedding_length", "big"), MetadataError,
                          "muse-glimmer.embedding_length is 'big', expected an integer"),
    "list for a number": (_md("muse-glimmer.rope.freq_base", [1.0]), MetadataError,
                          r"muse-glimmer.rope.freq_base is \[1.0\], expected a number"),
    "zero vocab": (_md("muse-glimmer.vocab_size", 0), MetadataError, "vocab_size is 0"),
    "missing tensor": (_drop("blk.1.ffn_up.weight"), TensorSetError, "missing tensor 'blk.1.ffn_up.weight'"),
    "extra tensor": (_set("rope_freqs.weight", (GGMLType.F32, None, (64,))), TensorSetError,
                     "unexpected tensor 'rope_freqs.weight'"),
    "Q8_0 projection": (_set(Q, (GGMLType.Q8_0, None, (256, 256))), DtypeFenceError,
                        r"'blk.1.attn_q.weight': type Q8_0 \(id 8\) is not admitted for a projection; "
                        r"expected one of F16, NVFP4_E2M1, Q4_K, Q5_K, Q6_K"),
    "Q6_K embedding": (_set("token_embd.weight", (GGMLType.Q6_K, None, (256, 64))), DtypeFenceError,
                       "'token_embd.weight': type Q6_K .* embedding; expected one of F16, Q4_K"),
    "llama.cpp NVFP4": (_set(Q, (GGMLType.NVFP4, None, (256, 256))), DtypeFenceError,
                        "different format"),
    "uncomputable type": (_set(Q, (16, None, (256, 256))), DtypeFenceError, "IQ2_XXS"),
    "F16 norm": (_set("blk.0.attn_norm.weight", (GGMLType.F16, None, (256,))), DtypeFenceError,
                 "'blk.0.attn_norm.weight': type F16 .* norm; expected one of F32"),
    "shape": (_set("blk.0.attn_k.weight", (GGMLType.Q4_K, None, (256, 256))), ShapeMismatchError,
              r"'blk.0.attn_k.weight': ne \[256, 256\] but the config expects \[256, 128\] "
              r"\(hidden 256, 1 kv heads x head_dim 128\)"),
    "embedding rows": (_set("token_embd.weight", (GGMLType.Q4_K, None, (256, 65))), ShapeMismatchError,
                       "vocab_size 64"),
    "nvfp4 in kquant lane": (_to_nvfp4(Q), LaneError, "'q4_k_xl' but tensor 'blk.1.attn_q.weight' is NVFP4_E2M1"),
    "nvfp4 lane, no nvfp4": (_md("muser.weight_precision", "nvfp4"), LaneError, "no tensor is NVFP4_E2M1"),
    "missing scale_2": (_both(_md("muser.weight_precision", "nvfp4"), _to_nvfp4(Q, scale_2=False)),
                        CompanionError, "blk.1.attn_q.weight_scale_2 are missing"),
    "missing scale": (_both(_md("muser.weight_precision", "nvfp4"), _to_nvfp4(Q, scale=False)),
                      CompanionError, "blk.1.attn_q.weight_scale are missing"),
    "scale shape": (_both(_md("muser.weight_precision", "nvfp4"),
                          _to_nvfp4(Q, scale_spec=(GGMLType.F8_E4M3FN, None, (16, 128))),),
                    CompanionError, r"found F8_E4M3FN with \(n_out, n_in\) \(128, 16\), expected F8_E4M3FN \(256, 16\)"),
    "scale type": (_both(_md("muser.weight_precision", "nvfp4"),
                         _to_nvfp4(Q, scale_spec=(GGMLType.F16, None, (16, 256))),),
                   CompanionError, "found F16"),
    "orphan companion": (_set(Q + "_scale", (GGMLType.F8_E4M3FN, None, (16, 256))), CompanionError,
                         "'blk.1.attn_q.weight' is Q4_K, expected NVFP4_E2M1"),
    "missing k norm": (_drop("blk.0.attn_k_norm.weight"), TensorSetError,
                       "missing tensor 'blk.0.attn_k_norm.weight'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_refusals_name_the_tensor_found_and_expected(tmp_path, case):
    edit, error, match = CASES[case]
    md, tensors = CFG.to_metadata(), glimmer_tensors(CFG, None)
    edit(md, tensors)
    f = write(tmp_path, tensors, md)
    with pytest.raises(error, match=match):
        admit(f)
