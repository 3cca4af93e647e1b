"""Qwen2 and Qwen3 as llama.cpp runs them: the llama family (``llama.py``)
with NeoX RoPE (their converter does not permute q/k) and no
``rope_freqs``; Qwen2 adds q/k/v biases (required: llama.cpp loads them
unconditionally), Qwen3 drops them for per-head q/k RMSNorm applied before
RoPE, and its files give the head size in ``attention.key_length``."""
from __future__ import annotations

from dataclasses import dataclass

from .llama import FENCES, GROUPS, UNDERSTOOD, LlamaFamilyConfig, family_table
from .spec import Architecture


@dataclass(frozen=True)
class Qwen2Config(LlamaFamilyConfig):
    ARCH_NAME = "qwen2"
    ROPE_MODE = "neox"


@dataclass(frozen=True)
class Qwen3Config(LlamaFamilyConfig):
    ARCH_NAME = "qwen3"
    ROPE_MODE = "neox"


_GROUPS = {"output": GROUPS["output"]}
QWEN2 = Architecture("qwen2", "Qwen2", Qwen2Config,
                     family_table("attn_q_bias", "attn_k_bias", "attn_v_bias"), FENCES, groups=_GROUPS,
                     understood=UNDERSTOOD)
QWEN3 = Architecture("qwen3", "Qwen3", Qwen3Config, family_table("attn_q_norm", "attn_k_norm"),
                     FENCES, groups=_GROUPS, understood=UNDERSTOOD)
