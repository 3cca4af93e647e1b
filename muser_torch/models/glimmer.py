"""Glimmer (GLIMMER.md): pre-norm blocks of gated attention (optional per-head
q/k norms, NeoX RoPE, GQA, a sliding window on all but every
``sliding_window_pattern``-th layer) and a SwiGLU MLP; untied lm_head.

Projections are plain ``nn.Linear`` when the model is built from a config
(that is how the demo is trained); ``from_gguf`` and ``random`` put
``QLinear`` / ``QEmbedding`` over packed bytes in their place, so the forward
code is the same for float and packed weights."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..arch.glimmer import GLIMMER, GlimmerConfig
from ..arch.glimmer_recipe import recipe_weight
from .assembly import assemble
from .decoder import Decoder
from .parts import Attention, GatedMLP, PreNormBlock, rope_inv_freq

__all__ = ["Glimmer", "TransformerBlock"]


class TransformerBlock(PreNormBlock):
    def __init__(self, config: GlimmerConfig, layer: int, qk_norm: bool = False):
        c = config
        super().__init__(c.hidden, c.rms_eps,
                         Attention(c.hidden, c.n_heads, c.n_kv_heads, c.head_dim,
                                   window=None if c.is_global(layer) else c.sliding_window,
                                   qk_norm_eps=c.rms_eps if qk_norm else None, gate=True),
                         GatedMLP(c.hidden, c.ffn, F.silu))


class Glimmer(Decoder):
    ARCH = GLIMMER
    DEFAULT_DTYPE = torch.float16

    def __init__(self, config: GlimmerConfig, qk_norm: bool = False):
        super().__init__(config, [TransformerBlock(config, il, qk_norm)
                                  for il in range(config.n_layers)])

    def rope_tables(self) -> list[torch.Tensor]:
        return [rope_inv_freq(self.config.head_dim, self.config.rope_base)]

    @classmethod
    def build(cls, config: GlimmerConfig, groups: frozenset[str]) -> "Glimmer":
        return cls(config, qk_norm="qk_norm" in groups)

    @classmethod
    def random(cls, config: GlimmerConfig, device: torch.device | str | None = None,
               dtype: torch.dtype = torch.float16, seed: int = 0,
               qk_norm: bool = False) -> "Glimmer":
        """Random packed weights made directly on ``device`` in the seed's recipe
        (``config.weight_precision`` picks the lane; ``arch/glimmer_recipe.py``), at any
        shape including the full 52-layer geometry: random bytes with sane
        scale fields, no file and no float copy of any weight."""
        device = torch.device(device if device is not None else "cpu")
        gen = torch.Generator(device=device).manual_seed(seed)

        def get(name, n_out, n_in):
            return recipe_weight(config, name, n_out, n_in, gen, device)

        groups = frozenset({"qk_norm"} if qk_norm else ())
        return assemble(cls, config, groups, get, device, dtype, None)
