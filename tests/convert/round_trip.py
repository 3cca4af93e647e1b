"""Independent references for a converted file, and the tiny checkpoints the
round trip runs on.

``file_weights`` reads every tensor of a converted GGUF back in float64 by
code that is not the package's: gguf-py's numpy dequantizers for llama.cpp's
types, the bit definition of E2M1 x E4M3 x scale_2 for NVFP4_E2M1. The
Hugging Face name of each tensor comes from gguf-py's own tensor name map
(llama, qwen2, qwen3, gemma3), or the converter table of
``arch/muse_glimmer.py`` for Muse Glimmer (gguf-py does not know it; the
glimmer tests check that table against transformers). ``hf_weights`` undoes
the converter's edits (q/k rows back to rotate-half, Gemma's +1 off the norms),
and ``reference_model`` is transformers' own class holding them in float64."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from muser_torch.gguf_io import load_gguf

ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "muse-glimmer")
# what each tiny checkpoint is: tied Gemma 3 and Qwen2 as their small releases are
CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"n_layers": 2},
    "qwen2": {"n_layers": 2, "tied": True},
    "qwen3": {"n_layers": 2, "head_dim": 64},
    "gemma3": {"n_layers": 2, "head_dim": 64, "tied": True, "sliding_window": 6},
    "muse-glimmer": {"n_layers": 4, "window": 6},
}
BPE = ("qwen2", "qwen3", "muse-glimmer")   # byte-level BPE tokenizers, named with --pre-tokenizer


def write_tiny(directory: Path, arch: str, seed: int, **extra: Any) -> tuple[Path, Any]:
    """A tiny random checkpoint of ``arch`` (CONFIGS): (directory, config)."""
    from .checkpoints import write_checkpoint, write_glimmer_checkpoint
    if arch == "muse-glimmer":
        d, cfg, _ = write_glimmer_checkpoint(directory, seed, **{**CONFIGS[arch], **extra})
    else:
        d, cfg, _ = write_checkpoint(directory, arch, seed, **{**CONFIGS[arch], **extra})
    return d, cfg


def e2m1_float64(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 (sign, 2 exponent bits with bias 1, 1 mantissa bit) in float64."""
    c = codes.to(torch.int64)
    sign = torch.where(c & 8 != 0, -1.0, 1.0).double()
    exp, man = (c >> 1) & 3, (c & 1).double()
    mag = torch.where(exp == 0, man * 0.5, torch.exp2((exp - 1).double()) * (1 + man / 2))
    return sign * mag


def nvfp4_float64(payload: torch.Tensor, scale: torch.Tensor, scale_2: torch.Tensor) -> torch.Tensor:
    """An NVFP4 weight: element 2i in the low nibble of byte i, one E4M3 scale per 16."""
    codes = torch.stack((payload & 15, payload >> 4), dim=-1).reshape(payload.shape[0], -1)
    s = scale.to(torch.float64).repeat_interleave(16, dim=1)
    return e2m1_float64(codes) * s * scale_2.double()


def file_weights(path: "str | Path") -> dict[str, torch.Tensor]:
    """GGUF name -> float64 ``[n_out, n_in]`` (``[n]`` for 1-D), companions folded in."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    f = load_gguf(path)
    out = {}
    for name, t in f.tensors.items():
        if name.endswith(("_scale", "_scale_2")) and name.rsplit("_scale", 1)[0] in f.tensors:
            continue
        if t.type_name == "NVFP4_E2M1":
            scales, scale_2 = f.companions(name)
            w = nvfp4_float64(t.packed, scales, scale_2)
        else:
            raw = np.asarray(t.raw.numpy())
            w = torch.from_numpy(np.array(dequantize(raw, GGMLQuantizationType(t.type_id)),
                                          dtype=np.float64))
        out[name] = w.reshape(t.n_out, t.n_in) if len(t.ne) > 1 else w.reshape(-1)
    return out


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """ggml's interleaved pairs back to rotate-half halves, per head."""
    from ..models.hf_files import unpermute_qk
    return unpermute_qk(w, n_head)


def _names(arch: str, cfg: Any) -> dict[str, str]:
    """GGUF name -> Hugging Face name of every tensor a checkpoint of ``cfg`` has."""
    if arch == "muse-glimmer":
        from muser_torch.arch.muse_glimmer import HF_NAMES
        n = cfg.text_config.num_hidden_layers
        return {g.format(i=i): h.format(i=i) for g, h in HF_NAMES.items()
                for i in (range(n) if "{i}" in g else [0])}
    import gguf
    from transformers import AutoModelForCausalLM
    from ..models.hf_files import gguf_arch
    table = gguf.get_tensor_name_map(gguf_arch(arch), cfg.num_hidden_layers)
    with torch.device("meta"):
        hf_names = AutoModelForCausalLM.from_config(cfg).state_dict()
    out = {}
    for h in hf_names:
        g = table.get_name(h, try_suffixes=(".weight", ".bias"))
        if g is not None:
            out[g] = h
    return out


def hf_weights(path: "str | Path", arch: str, cfg: Any) -> dict[str, torch.Tensor]:
    """The converted file's weights under Hugging Face names, the converter's edits undone."""
    w = file_weights(path)
    names = _names(arch, cfg)
    text = cfg.text_config if arch == "muse-glimmer" else cfg
    out = {}
    for g, t in w.items():
        if arch == "muse-glimmer" and g.split(".")[-2] in _GLIMMER_SYNTHESIZED:
            # not in the checkpoint: the converter writes qk_scale_factor and ones
            want = text.qk_scale_factor if "attn_q_norm" in g else 1.0
            assert torch.equal(t, torch.full_like(t, float(torch.tensor(want, dtype=torch.float32)))), g
            continue
        h = names.get(g)
        if h is None:
            raise AssertionError(f"{path}: tensor {g!r} has no Hugging Face name")
        if arch in ("llama", "muse-glimmer") and g.endswith(("attn_q.weight", "attn_k.weight")):
            heads = text.num_attention_heads if "attn_q" in g else text.num_key_value_heads
            t = _unpermute(t, heads)
        if (arch == "gemma3" and g.endswith("norm.weight")) or \
                (arch == "muse-glimmer" and g.split(".")[-2] in _GLIMMER_SHIFTED):
            t = t - 1.0
        out[h] = t
    return out


_GLIMMER_SHIFTED = ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")
_GLIMMER_SYNTHESIZED = ("attn_q_norm", "attn_k_norm")


def reference_model(directory: Path, arch: str, cfg: Any, weights: dict[str, torch.Tensor]):
    """transformers' own class for the checkpoint's config, holding ``weights``
    (Hugging Face names) in float64: a callable ``ids -> logits [T, vocab]``."""
    if arch == "muse-glimmer":
        from ..glimmer.muse_files import Reference
        held = {k.removeprefix("model.language_model."): v.float() for k, v in weights.items()}
        model = Reference(cfg.text_config, held).double()

        def run(ids: torch.Tensor) -> torch.Tensor:
            return model(ids[None])[0]
        return run
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").double().eval()
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= ({"lm_head.weight"} if cfg.tie_word_embeddings else set()), missing
    if cfg.tie_word_embeddings:
        model.tie_weights()

    @torch.no_grad()
    def run(ids: torch.Tensor) -> torch.Tensor:
        return model(ids[None].long()).logits[0]
    return run


def source_model(directory: Path, arch: str, cfg: Any):
    """transformers' own class on the checkpoint itself, in float64."""
    from safetensors.torch import load_file
    weights = {}
    for p in sorted(directory.glob("model*.safetensors")):
        weights.update({k: v.double() for k, v in load_file(str(p)).items()})
    if arch == "muse-glimmer":
        weights = {k: v for k, v in weights.items() if "vision" not in k}
    return reference_model(directory, arch, cfg, weights)
