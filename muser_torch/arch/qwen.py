"""Qwen2 and Qwen3 as llama.cpp runs them: the llama family (``llama.py``)
with NeoX RoPE (their converter does not permute q/k) and no
``rope_freqs``; Qwen2 adds q/k/v biases (required: llama.cpp loads them
unconditionally), Qwen3 drops them for per-head q/k RMSNorm applied before
RoPE, and its files give the head size in ``attention.key_length``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .llama import FENCES, GROUPS, LlamaFamilyConfig, tensor_table
from .spec import Architecture


@dataclass(frozen=True)
class Qwen2Config(LlamaFamilyConfig):
    ARCH: ClassVar[str] = "qwen2"
    ROPE_MODE: ClassVar[str] = "neox"


@dataclass(frozen=True)
class Qwen3Config(LlamaFamilyConfig):
    ARCH: ClassVar[str] = "qwen3"
    ROPE_MODE: ClassVar[str] = "neox"


_GROUPS = {"output": GROUPS["output"]}
QWEN2 = Architecture("qwen2", "Qwen2", Qwen2Config, tensor_table(qkv_bias=True), FENCES, groups=_GROUPS)
QWEN3 = Architecture("qwen3", "Qwen3", Qwen3Config, tensor_table(qk_norm=True), FENCES, groups=_GROUPS)
