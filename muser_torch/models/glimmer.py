"""Muse Glimmer (``arch/muse_glimmer.py`` holds the facts), as llama.cpp's
``muse-glimmer.cpp`` computes it and transformers' ``MuseGlimmerTextModel``
defines it:

* the embedding passes a weightless RMSNorm (the model's eps);
* sandwich blocks: ``x + post_norm(attn(pre_norm(x)))`` and the same around
  the SwiGLU MLP; the post-norms use eps 1e-8;
* attention: per-head RMSNorm of q and k with the file's weights (q's holds
  ``qk_scale_factor``), RoPE in ggml's "normal" pair layout on sliding-window
  layers only (NoPE on global ones), scale 1/sqrt(head_dim), GQA, the output
  times ``sigmoid(attn_gate(x))`` before ``attn_output``;
* logits: the untied lm_head times ``logit_scale``, then ``c * tanh(l / c)``.

Projections are plain ``torch.nn.Linear`` when the model is built from a config
(that is how the demo is trained); ``from_gguf`` and ``random`` put
``QLinear`` / ``QEmbedding`` over packed bytes in their place, so the forward
code is the same for float and packed weights."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..arch.glimmer_recipe import recipe_weight
from ..arch.muse_glimmer import MUSE_GLIMMER, POST_NORM_EPS, GlimmerConfig
from .assembly import assemble
from .decoder import Decoder
from .parts import Attention, GatedMLP, SandwichBlock, no_rope, rope_inv_freq, rope_normal

__all__ = ["Glimmer", "GlimmerBlock", "no_rope"]


class GlimmerBlock(SandwichBlock):
    def __init__(self, config: GlimmerConfig, layer: int):
        c = config
        sliding = not c.is_global(layer)
        attention = Attention(c.hidden, c.n_heads, c.n_kv_heads, c.head_dim,
                              window=c.sliding_window if sliding else None,
                              rope=rope_normal if sliding else no_rope,
                              qk_norm_eps=c.rms_eps, gate=True)
        super().__init__(c.hidden, c.rms_eps, POST_NORM_EPS, attention,
                         GatedMLP(c.hidden, c.ffn, F.silu))


class Glimmer(Decoder):
    ARCH = MUSE_GLIMMER

    def __init__(self, config: GlimmerConfig):
        super().__init__(config, [GlimmerBlock(config, il) for il in range(config.n_layers)],
                         final_softcap=config.final_softcap)

    def rope_tables(self) -> list[torch.Tensor]:
        # Only the sliding layers rotate, with their own base, never scaled.
        return [rope_inv_freq(self.config.head_dim, self.config.swa_base)]

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        # weightless RMSNorm in float32 (llama.cpp's build_norm with no weight)
        x = self.tok_embeddings(tokens).float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.config.rms_eps)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        # scale and cap in float32, returned in the activation dtype as every model's logits
        logits = self.output(x)
        cap = self.config.final_softcap
        return (torch.tanh(logits.float() * (self.config.logit_scale / cap)) * cap).to(logits.dtype)

    @classmethod
    def build(cls, config: GlimmerConfig, groups: frozenset[str]) -> "Glimmer":
        return cls(config)

    @classmethod
    def random(cls, config: GlimmerConfig, device: torch.device | str | None = None,
               dtype: torch.dtype | None = None, seed: int = 0) -> "Glimmer":
        """Random packed weights made directly on ``device`` in the lane's recipe
        (``config.weight_precision`` picks the lane; ``arch/glimmer_recipe.py``), at any
        shape including the full 52-layer geometry: random bytes with sane
        scale fields, no file and no float copy of any weight. ``dtype`` defaults
        as ``from_gguf``'s does."""
        device = torch.device(device if device is not None else "cpu")
        gen = torch.Generator(device=device).manual_seed(seed)

        def get(name, n_out, n_in):
            return recipe_weight(config, name, n_out, n_in, gen, device)

        return assemble(cls, config, frozenset(), get, device, dtype or cls.default_dtype(device), None)
