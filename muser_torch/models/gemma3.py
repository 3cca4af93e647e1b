"""Gemma 3 as llama.cpp runs it (``arch/gemma3.py`` holds the facts): the
embedding scaled by sqrt(hidden), blocks with RMSNorm before and after both
attention and the GELU-tanh gated MLP, per-head q/k RMSNorm, sliding-window
layers with the local RoPE base and global layers with the global one, the
lm_head tied to the embedding unless the file has its own, and a final
logit soft-cap when the file sets one."""
from __future__ import annotations

import torch

from ..arch.gemma3 import GEMMA3, Gemma3Config
from .decoder import Decoder
from .parts import Attention, GatedMLP, SandwichBlock, gelu_tanh, rope_inv_freq

__all__ = ["Gemma3", "Gemma3Block"]

GLOBAL_ROPE, LOCAL_ROPE = 0, 1   # rope_slot of global and sliding-window layers


class Gemma3Block(SandwichBlock):
    def __init__(self, config: Gemma3Config, layer: int):
        c = config
        is_global = c.is_global(layer)
        attention = Attention(c.hidden, c.n_heads, c.n_kv_heads, c.head_dim,
                              window=None if is_global else c.sliding_window,
                              rope_slot=GLOBAL_ROPE if is_global else LOCAL_ROPE,
                              qk_norm_eps=c.rms_eps, scale=c.query_scale, scale_q=True)
        super().__init__(c.hidden, c.rms_eps, c.rms_eps, attention,
                         GatedMLP(c.hidden, c.ffn, gelu_tanh))


class Gemma3(Decoder):
    ARCH = GEMMA3
    # The embedding rows are scaled in float32 before they take the activation
    # dtype, as llama.cpp scales its float32 rows (transformers scales in the
    # weights' dtype: the same in a float32 model).
    EMBED_DTYPE = torch.float32
    # Gemma's activations outgrow float16's range; bfloat16 keeps float32's.
    ACCEL_DTYPE = torch.bfloat16

    def __init__(self, config: Gemma3Config):
        super().__init__(config, [Gemma3Block(config, il) for il in range(config.n_layers)],
                         embed_scale=config.hidden ** 0.5,
                         final_softcap=config.final_softcap or None)

    def rope_tables(self) -> list[torch.Tensor]:
        c = self.config
        return [rope_inv_freq(c.head_dim, c.rope_base, c.rope_scale),   # GLOBAL_ROPE
                rope_inv_freq(c.head_dim, c.rope_base_local)]            # LOCAL_ROPE

    @classmethod
    def build(cls, config: Gemma3Config, groups: frozenset[str]) -> "Gemma3":
        return cls(config)   # the tied lm_head is bound by assembly when "output" is absent
