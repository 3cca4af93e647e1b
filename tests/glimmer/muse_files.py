"""Small random Muse Glimmer GGUFs written the way llama.cpp's converter
(``conversion/muse_glimmer.py``, ``MuseGlimmerModel``) and quantizer write
them, and transformers' own ``MuseGlimmerTextModel`` holding the same weights.

How a file is made, each step from someone else's definition:

1. transformers' ``MuseGlimmerTextConfig`` and ``MuseGlimmerTextModel`` give
   the parameters; values are drawn from a seeded generator (the four
   centered norms' w around 0, as the checkpoint stores them).
2. The converter's edits, as ``arch/muse_glimmer.py`` tabulates them and
   :func:`test_hf_table_matches_transformers` checks against transformers'
   names: +1 on the four layer norms, q/k un-permuted from rotate-half to
   interleaved pairs, attn_q_norm = qk_scale_factor and attn_k_norm = ones
   synthesized, the pattern as a bool per layer, ``logit_scale`` and the
   softcap as keys.
3. ggml's own quantizer (libggml-python) packs every matrix in a type mix.

:func:`reference_model` is the other direction: the file's tensors
dequantized by gguf-py's numpy code (not ours), the converter's edits
undone, loaded into ``MuseGlimmerTextModel`` plus an lm_head.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from muser_torch.arch.muse_glimmer import (ARCH, HF_NAMES, NORM_SHIFTED, SYNTHESIZED, UNPERMUTED)
from muser_torch.gguf_io import load_gguf, save_gguf

from ..models.hf_files import _quantized, permute_qk, random_tensor, unpermute_qk

TEXT_PREFIX = "model.language_model."
MIX = ("Q4_K", "Q5_K", "Q6_K", "Q8_0", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1")


def text_config(*, n_layers: int, hidden: int, ffn: int, n_heads: int, n_kv_heads: int,
                head_dim: int, vocab: int, context: int, window: int, rope_theta: float,
                rms_eps: float, qk_scale: float, logit_scale: float, softcap: float):
    from transformers.models.muse_glimmer.configuration_muse_glimmer import MuseGlimmerTextConfig
    cfg = MuseGlimmerTextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=n_layers,
        num_attention_heads=n_heads, num_key_value_heads=n_kv_heads, head_dim=head_dim,
        max_position_embeddings=context, rms_norm_eps=rms_eps, sliding_window=window,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        qk_scale_factor=qk_scale, output_multiplier=logit_scale,
        final_logit_softcapping=softcap, bos_token_id=None, eos_token_id=None)
    cfg._attn_implementation = "eager"
    return cfg


def _text_name(hf: str) -> str:
    return hf[len(TEXT_PREFIX):] if hf.startswith(TEXT_PREFIX) else hf


def random_checkpoint(cfg, seed: int) -> dict[str, torch.Tensor]:
    """HF-named float32 weights (text model names, plus ``lm_head.weight``)."""
    from transformers.models.muse_glimmer.modeling_muse_glimmer import MuseGlimmerTextModel
    with torch.device("meta"):
        model = MuseGlimmerTextModel(cfg)
    gen = torch.Generator().manual_seed(seed)
    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    shapes["lm_head.weight"] = (cfg.vocab_size, cfg.hidden_size)
    out = {}
    for name, shape in shapes.items():
        w = random_tensor(name, shape, gen, head_gain=8.0, centered_norms=True)
        if name in ("layers.1.self_attn.o_proj.weight", "layers.1.mlp.down_proj.weight"):
            # outputs of mean square ~1e-6 going into the post-norms, so that
            # their eps (1e-8, not the model's) shows in the logits
            w = w * 1e-3
        out[name] = w.contiguous()
    return out


def _rows(n_layers: int):
    """(GGUF name, table key, layer) of every row of the table, layer by layer."""
    for key in HF_NAMES:
        if "{i}" not in key:
            yield key, key, None
    for i in range(n_layers):
        for key in list(HF_NAMES) + list(SYNTHESIZED):
            if "{i}" in key:
                yield key.format(i=i), key, i


def convert(cfg, hf: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The converter's tensor edits and names: GGUF name -> float32 tensor."""
    out = {}
    for name, key, i in _rows(cfg.num_hidden_layers):
        if key in SYNTHESIZED:
            v = SYNTHESIZED[key]
            value = float(getattr(cfg, v)) if isinstance(v, str) else float(v)
            out[name] = torch.full((cfg.head_dim,), value)
            continue
        w = hf[_text_name(HF_NAMES[key]).format(i=i)]
        if key in NORM_SHIFTED:
            w = w + 1.0
        if key in UNPERMUTED:
            w = permute_qk(w, getattr(cfg, UNPERMUTED[key]))
        out[name] = w
    return out


def converter_metadata(cfg, pattern: "Sequence[bool] | int | None" = None) -> dict[str, Any]:
    a = ARCH
    layer_types = [t == "sliding_attention" for t in cfg.layer_types]
    return {
        "general.architecture": a, "general.name": "random muse-glimmer",
        f"{a}.context_length": cfg.max_position_embeddings,
        f"{a}.embedding_length": cfg.hidden_size,
        f"{a}.feed_forward_length": cfg.intermediate_size,
        f"{a}.block_count": cfg.num_hidden_layers,
        f"{a}.attention.head_count": cfg.num_attention_heads,
        f"{a}.attention.head_count_kv": cfg.num_key_value_heads,
        f"{a}.attention.key_length": cfg.head_dim,
        f"{a}.attention.value_length": cfg.head_dim,
        f"{a}.rope.freq_base": float(cfg.rope_parameters["rope_theta"]),
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
        f"{a}.final_logit_softcapping": float(cfg.final_logit_softcapping),
        f"{a}.logit_scale": float(cfg.output_multiplier),
        f"{a}.attention.sliding_window": cfg.sliding_window,
        f"{a}.attention.sliding_window_pattern": layer_types if pattern is None else pattern,
    }


def write_muse_gguf(path: "str | os.PathLike[str]", *, seed: int, types: Sequence[str] = MIX,
                    n_layers: int = 5, hidden: int = 256, ffn: int = 512, n_heads: int = 4,
                    n_kv_heads: int = 2, head_dim: int = 64, vocab: int = 320, context: int = 256,
                    window: int = 6, rope_theta: float = 10000.0, rms_eps: float = 1e-6,
                    qk_scale: float = 3.87, logit_scale: float = 0.4, softcap: float = 20.0,
                    tokenizer: Mapping[str, Any] | None = None,
                    edit: Callable[[dict, dict], None] | None = None):
    """Write a random Muse Glimmer; return (path, transformers config).
    ``types`` cycle over the matrices (rotated by the seed); ``tokenizer``: a
    ``tokenizer.ggml.*`` block, by default llama.cpp's "none" with
    ``vocab_size``. ``edit(metadata, tensors)`` may change both before writing."""
    cfg = text_config(n_layers=n_layers, hidden=hidden, ffn=ffn, n_heads=n_heads,
                      n_kv_heads=n_kv_heads, head_dim=head_dim, vocab=vocab, context=context,
                      window=window, rope_theta=rope_theta, rms_eps=rms_eps, qk_scale=qk_scale,
                      logit_scale=logit_scale, softcap=softcap)
    floats = convert(cfg, random_checkpoint(cfg, seed))
    matrices = [n for n, w in floats.items() if w.dim() == 2]
    chosen = {n: types[(k + seed) % len(types)] for k, n in enumerate(matrices)}
    tensors: dict[str, Any] = {n: _quantized(w, chosen[n]) if n in chosen else ("F32", w.float())
                               for n, w in floats.items()}
    md = converter_metadata(cfg)
    md["general.quantization_version"] = 2
    if tokenizer is None:
        md |= {"tokenizer.ggml.model": "none", f"{ARCH}.vocab_size": vocab}
    else:
        md |= dict(tokenizer)
    if edit is not None:
        edit(md, tensors)
    from ..models.hf_files import TOKENIZER_TYPES
    save_gguf(path, md, tensors, types=TOKENIZER_TYPES)
    return Path(path), cfg


def dequantized(path: "str | os.PathLike[str]") -> dict[str, torch.Tensor]:
    """Every tensor of the file as float32 ``[n_out, n_in]`` (or ``[n]``),
    dequantized by gguf-py's numpy code."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    out = {}
    for t in GGUFReader(str(path)).tensors:
        shape = tuple(reversed([int(x) for x in t.shape]))
        w = dequantize(np.asarray(t.data), t.tensor_type)
        out[t.name] = torch.from_numpy(np.array(w, dtype=np.float32)).reshape(shape)
    return out


class Reference(torch.nn.Module):
    """``MuseGlimmerTextModel`` and its lm_head, with the logits as
    ``MuseGlimmerForConditionalGeneration`` computes them."""

    def __init__(self, cfg, weights: Mapping[str, torch.Tensor]):
        super().__init__()
        from transformers.models.muse_glimmer.modeling_muse_glimmer import MuseGlimmerTextModel
        self.cfg = cfg
        self.model = MuseGlimmerTextModel(cfg).eval()
        self.lm_head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        state = {k: v for k, v in weights.items() if k != "lm_head.weight"}
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        # the rotary tables are buffers the checkpoint does not hold
        assert not unexpected and all("rotary" in m or "inv_freq" in m for m in missing), (missing, unexpected)
        self.lm_head.weight.data.copy_(weights["lm_head.weight"])

    @torch.no_grad()
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.model(input_ids=ids, use_cache=False).last_hidden_state
        logits = self.lm_head(h) * self.cfg.output_multiplier
        c = self.cfg.final_logit_softcapping
        return torch.tanh(logits / c) * c


def reference_model(path: "str | os.PathLike[str]", cfg) -> Reference:
    """transformers' model holding the file's dequantized weights, the
    converter's edits undone (the q/k norms are checked, not loaded: the
    model has them as ``qk_scale_factor``)."""
    w = dequantized(path)
    hf = {}
    for name, key, i in _rows(cfg.num_hidden_layers):
        if key in SYNTHESIZED:
            continue
        t = w[name]
        if key in UNPERMUTED:
            t = unpermute_qk(t, getattr(cfg, UNPERMUTED[key]))
        if key in NORM_SHIFTED:
            t = t - 1.0
        hf[_text_name(HF_NAMES[key]).format(i=i)] = t
    return Reference(cfg, hf)


def file_metadata(path) -> dict:
    return dict(load_gguf(path).metadata)
