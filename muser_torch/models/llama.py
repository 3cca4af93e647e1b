"""The llama family's model (``arch/llama.py``, ``arch/qwen.py``): pre-norm
blocks of GQA attention with llama.cpp's RoPE (``rope_scaling.py``: the
architecture's mode, YaRN's magnitude on cos/sin, Llama 3's frequency
factors) and a SwiGLU MLP. Qwen2's q/k/v biases and Qwen3's q/k norms are
options of the shared ``Attention``; an untied lm_head is optional.

``Llama``, ``Qwen2`` and ``Qwen3`` differ only in their facts (``ARCH``)."""
from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..arch.llama import LLAMA, LlamaFamilyConfig
from ..arch.qwen import QWEN2, QWEN3
from .decoder import Decoder
from .parts import Attention, GatedMLP, PreNormBlock, rope_neox, rope_normal
from .rope_scaling import rope_frequencies, rotate

__all__ = ["LlamaFamily", "Llama", "Qwen2", "Qwen3", "LlamaBlock"]


class LlamaBlock(PreNormBlock):
    def __init__(self, config: LlamaFamilyConfig, *, qkv_bias: bool, qk_norm: bool, mscale: float):
        c, r = config, config.rope
        if r.n_rot == c.head_dim and mscale == 1.0:   # the whole head, unscaled: one fused op
            rope = rope_normal if r.mode == "normal" else rope_neox
        else:
            rope = functools.partial(rotate, mode=r.mode, n_rot=r.n_rot, mscale=mscale)
        super().__init__(c.hidden, c.rms_eps,
                         Attention(c.hidden, c.n_heads, c.n_kv_heads, c.head_dim, rope=rope,
                                   qk_norm_eps=c.rms_eps if qk_norm else None, bias=qkv_bias),
                         GatedMLP(c.hidden, c.ffn, F.silu))


class _Vector(nn.Module):
    """Holds a 1-D float tensor of the file (``rope_freqs.weight``) as ``.weight``."""

    def __init__(self, n: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n), requires_grad=False)


class LlamaFamily(Decoder):
    ARCH = LLAMA

    def __init__(self, config: LlamaFamilyConfig, groups: frozenset[str] = frozenset()):
        rows = {s.name for s in self.ARCH.tensors}
        _, mscale = rope_frequencies(config.rope)
        blocks = [LlamaBlock(config, qkv_bias="blk.{i}.attn_q.bias" in rows,
                        qk_norm="blk.{i}.attn_q_norm.weight" in rows, mscale=mscale)
                  for _ in range(config.n_layers)]
        super().__init__(config, blocks)
        # Set after Decoder's first rope_tables() (it has no factors yet); the
        # file's values arrive before finish() recomputes the tables.
        self.rope_freqs = _Vector(config.rope_pairs) if "rope_freqs" in groups else None

    def rope_tables(self) -> list[torch.Tensor]:
        holder = getattr(self, "rope_freqs", None)
        factors = None
        if holder is not None and not holder.weight.is_meta:
            factors = holder.weight.detach().to("cpu", torch.float64)
        inv_freq, _ = rope_frequencies(self.config.rope, factors)
        return [inv_freq]

    @classmethod
    def build(cls, config: LlamaFamilyConfig, groups: frozenset[str]) -> "LlamaFamily":
        return cls(config, groups)


class Llama(LlamaFamily):
    ARCH = LLAMA


class Qwen2(LlamaFamily):
    ARCH = QWEN2


class Qwen3(LlamaFamily):
    ARCH = QWEN3
