"""The Muser artifacts' weight recipes (docs/muse-glimmer.md, "The q4_k_xl
recipe" and "The nvfp4 lane"): which type each tensor gets, and its random weight.

  q4_k_xl lane   Q4_K everywhere, except
                 ffn_down  Q6_K on even layers (26 of 52: "alternating by layer")
                 attn_v    Q6_K on odd layers  (26 of 52, a quarter of the k/v tensors)
                 output    Q5_K (the lm_head)
  nvfp4 lane     every projection (lm_head included) NVFP4_E2M1 + companions,
                 the embedding Q4_K
  both           norms F32, token_embd Q4_K

Weights are random packed blocks, not quantized floats (``formats.random_weight``
with ``std``): each tensor's values have a chosen standard deviation
(1/sqrt(n_in) for projections, 1 for the embedding); norms are float32 near 1.
That makes a model of any size, the full 52 layers included, in the time it
takes to draw random bytes, on any device, and it is still a valid file every
reader must decode exactly.
"""
from __future__ import annotations

import torch

from .muse_glimmer import MUSE_GLIMMER, GlimmerConfig, reference_pattern
from .spec import expand
from ..formats import GGMLType, PackedWeight, random_weight
from ..formats.types import NVFP4_GROUP

__all__ = ["SEED_CONFIG", "QK_SCALE", "recipe_type", "tensor_std", "recipe_weight", "plan", "planned_bytes"]

# The release's geometry and constants (transformers' MuseGlimmerTextConfig
# defaults); the pattern as the converter writes it, a bool per layer.
SEED_CONFIG = GlimmerConfig(
    context_length=131072, hidden=6656, ffn=19968, n_layers=52, n_heads=32, n_kv_heads=2,
    head_dim=128, rms_eps=1e-5, sliding_window=2048, sliding_window_pattern=reference_pattern(52),
    rope_base=1_000_000.0, vocab_size=202048, logit_scale=0.19611613513818404,
    final_softcap=20.0, weight_precision="q4_k_xl")
QK_SCALE = 3.87   # the release's qk_scale_factor: the converter's attn_q_norm value


def recipe_type(config: GlimmerConfig, name: str) -> GGMLType:
    """The GGML type of tensor ``name`` under the recipe of the config's lane."""
    if name.endswith("norm.weight"):
        return GGMLType.F32
    if config.weight_precision is None:
        raise ValueError("the recipe is a Muser lane's: weight_precision must be "
                         "'q4_k_xl' or 'nvfp4', got None")
    if name == "token_embd.weight":
        return GGMLType.Q4_K
    if config.weight_precision == "nvfp4":
        return GGMLType.NVFP4_E2M1
    if config.weight_precision != "q4_k_xl":
        raise ValueError(f"unknown weight_precision {config.weight_precision!r}; expected q4_k_xl or nvfp4")
    if name == "output.weight":
        return GGMLType.Q5_K
    il = int(name.split(".")[1])
    if name.endswith("ffn_down.weight") and il % 2 == 0:
        return GGMLType.Q6_K
    if name.endswith("attn_v.weight") and il % 2 == 1:
        return GGMLType.Q6_K
    return GGMLType.Q4_K


def tensor_std(name: str, n_in: int) -> float:
    return 1.0 if name == "token_embd.weight" else n_in ** -0.5


def recipe_weight(config: GlimmerConfig, name: str, n_out: int, n_in: int,
                  gen: torch.Generator, device: torch.device | str) -> PackedWeight:
    """``n_out`` random rows of tensor ``name`` in the recipe (a norm: float32
    ``1 + 0.1 N(0, 1)``, except the q/k norms, which hold what the converter
    writes: ``QK_SCALE`` and ones), drawn on ``device`` from ``gen``."""
    qtype = recipe_type(config, name)
    if name.endswith(("attn_q_norm.weight", "attn_k_norm.weight")):
        value = QK_SCALE if "attn_q_norm" in name else 1.0
        w = torch.full((n_out, n_in), value, device=device)
        return PackedWeight(name, qtype, n_out, n_in, w.contiguous().view(torch.uint8))
    if qtype == GGMLType.F32:
        w = 1.0 + 0.1 * torch.randn(n_out, n_in, generator=gen, device=device)
        return PackedWeight(name, qtype, n_out, n_in, w.contiguous().view(torch.uint8))
    return random_weight(qtype, n_out, n_in, generator=gen, device=device,
                         std=tensor_std(name, n_in), name=name)


def plan(config: GlimmerConfig) -> list[tuple[str, GGMLType, int, int]]:
    """Every tensor of the file in write order (Muse Glimmer's table): (name, qtype, n_out, n_in)."""
    out = []
    for name, (spec, _) in expand(MUSE_GLIMMER, config).items():
        ne = spec.shape(config)
        out.append((name, recipe_type(config, name), ne[1] if len(ne) > 1 else 1, ne[0]))
    return out


def planned_bytes(config: GlimmerConfig) -> tuple[int, int]:
    """(tensor data bytes, weight parameters) of the file ``plan`` describes;
    parameters exclude norms, as docs/muse-glimmer.md counts them."""
    total = params = 0
    for name, qtype, n_out, n_in in plan(config):
        total += n_out * qtype.row_bytes(n_in)
        if qtype == GGMLType.NVFP4_E2M1:
            total += n_out * (n_in // NVFP4_GROUP) + 4    # E4M3 scales, f32 scale_2
        if qtype != GGMLType.F32:
            params += n_out * n_in
    return total, params
