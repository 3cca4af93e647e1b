"""Gemma 3's facts, as llama.cpp converts and runs it (``src/models/gemma3.cpp``,
the ``LLM_ARCH_GEMMA3`` case of ``llama-model.cpp``).

What the files carry and what llama.cpp fixes for the architecture when they
do not (the 270M file carries neither key):

* the local/global layer pattern: every 6th layer global
  (``attention.sliding_window_pattern``, else llama.cpp's ``set_swa_pattern(6)``);
* the local RoPE base: 10000 (``rope.freq_base_swa``, else llama.cpp's
  ``rope_freq_base_train_swa``); global layers use ``rope.freq_base`` and the
  ``linear`` ``rope.scaling.factor``, local layers are never scaled;
* the query scale: ``1/sqrt(head_dim)``, except the 62-layer 27B model's
  ``1/sqrt(hidden / n_heads)`` (llama.cpp keys it on the layer count);
* ``final_logit_softcapping`` applies only when the file sets it.

The converter stores every norm weight with Gemma's +1 already added, so the
file's weight multiplies as it is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..formats import GGMLType
from .spec import (LLAMA_CPP_TYPES, MAX_CONTEXT, MAX_SIZE, Architecture, Key, Role, TensorSpec,
                   number, read_keys)

ARCH = "gemma3"

KEYS = (
    Key("context_length", "context_length", hi=MAX_CONTEXT),
    Key("hidden", "embedding_length"),
    Key("ffn", "feed_forward_length"),
    Key("n_layers", "block_count"),
    Key("n_heads", "attention.head_count"),
    Key("n_kv_heads", "attention.head_count_kv"),
    Key("head_dim", "attention.key_length"),
    Key("rms_eps", "attention.layer_norm_rms_epsilon", real=True, lo=1e-12, hi=0.1),
    Key("sliding_window", "attention.sliding_window", hi=MAX_CONTEXT),
    Key("sliding_window_pattern", "attention.sliding_window_pattern", default=6),
    Key("rope_base", "rope.freq_base", real=True, lo=1.0, hi=1e12, default=10000.0),
    Key("rope_base_local", "rope.freq_base_swa", real=True, lo=1.0, hi=1e12, default=10000.0),
    Key("rope_scale", "rope.scaling.factor", real=True, lo=1.0, hi=1e6, default=1.0),
    Key("final_softcap", "final_logit_softcapping", real=True, lo=0.0, hi=1e6, default=0.0),
)
_ROPE_SCALING_TYPES = ("none", "linear")


@dataclass(frozen=True)
class Gemma3Config:
    context_length: int
    hidden: int
    ffn: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rms_eps: float
    sliding_window: int
    vocab_size: int
    sliding_window_pattern: int = 6
    rope_base: float = 1_000_000.0
    rope_base_local: float = 10000.0
    rope_scale: float = 1.0          # linear RoPE scaling of the global layers
    final_softcap: float = 0.0       # 0: none

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def query_scale(self) -> float:
        if self.n_layers == 62:   # Gemma 3 27B (llama.cpp: LLM_TYPE_27B)
            return (self.hidden / self.n_heads) ** -0.5
        return self.head_dim ** -0.5

    def is_global(self, layer: int) -> bool:
        return (layer + 1) % self.sliding_window_pattern == 0

    @classmethod
    def from_metadata(cls, md: dict[str, Any]) -> "Gemma3Config":
        """Build from GGUF metadata; KeyError for a missing key, ValueError naming a bad one."""
        values = read_keys(md, ARCH, KEYS)
        values["vocab_size"] = _vocab_size(md)
        scaling = md.get(f"{ARCH}.rope.scaling.type", "none")
        if scaling not in _ROPE_SCALING_TYPES:
            raise ValueError(f"{ARCH}.rope.scaling.type is {scaling!r}, expected one of "
                             f"{', '.join(map(repr, _ROPE_SCALING_TYPES))}")
        if scaling == "none":
            values["rope_scale"] = 1.0
        value_length = md.get(f"{ARCH}.attention.value_length", values["head_dim"])
        if value_length != values["head_dim"]:
            raise ValueError(f"{ARCH}.attention.value_length is {value_length!r}, expected "
                             f"key_length {values['head_dim']} (one head size for k and v)")
        cfg = cls(**values)
        cfg.check()
        return cfg

    def check(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{ARCH}.attention.head_count {self.n_heads} is not a multiple of "
                             f"head_count_kv {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"{ARCH}.attention.key_length {self.head_dim} must be even (RoPE)")
        if self.sliding_window > self.context_length:
            raise ValueError(f"{ARCH}.attention.sliding_window {self.sliding_window} exceeds "
                             f"context_length {self.context_length}")


def _vocab_size(md: dict[str, Any]) -> int:
    """``gemma3.vocab_size`` when present, else the tokenizer's token count (the
    converter writes only the latter)."""
    key = f"{ARCH}.vocab_size"
    if key in md:
        v = number(key, md[key], real=False)
    else:
        tokens = md.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, (list, tuple)):
            raise KeyError(key)
        v = len(tokens)
    if not 1 <= v <= MAX_SIZE:
        raise ValueError(f"{key} is {v}, expected an integer from 1 to {MAX_SIZE}")
    return v


E, P, N = Role.EMBEDDING, Role.PROJECTION, Role.NORM
TENSORS = (
    TensorSpec("token_embd.weight", "tok_embeddings", E, ("hidden", "vocab_size")),
    TensorSpec("blk.{i}.attn_norm.weight", "layers.{i}.attention_norm", N, ("hidden",)),
    TensorSpec("blk.{i}.attn_q.weight", "layers.{i}.attention.wq", P, ("hidden", "q_dim")),
    TensorSpec("blk.{i}.attn_k.weight", "layers.{i}.attention.wk", P, ("hidden", "kv_dim")),
    TensorSpec("blk.{i}.attn_v.weight", "layers.{i}.attention.wv", P, ("hidden", "kv_dim")),
    TensorSpec("blk.{i}.attn_q_norm.weight", "layers.{i}.attention.q_norm", N, ("head_dim",)),
    TensorSpec("blk.{i}.attn_k_norm.weight", "layers.{i}.attention.k_norm", N, ("head_dim",)),
    TensorSpec("blk.{i}.attn_output.weight", "layers.{i}.attention.wo", P, ("q_dim", "hidden")),
    TensorSpec("blk.{i}.post_attention_norm.weight", "layers.{i}.post_attention_norm", N,
               ("hidden",)),
    TensorSpec("blk.{i}.ffn_norm.weight", "layers.{i}.ffn_norm", N, ("hidden",)),
    TensorSpec("blk.{i}.ffn_gate.weight", "layers.{i}.feed_forward.w_gate", P, ("hidden", "ffn")),
    TensorSpec("blk.{i}.ffn_up.weight", "layers.{i}.feed_forward.w_up", P, ("hidden", "ffn")),
    TensorSpec("blk.{i}.ffn_down.weight", "layers.{i}.feed_forward.w_down", P, ("ffn", "hidden")),
    TensorSpec("blk.{i}.post_ffw_norm.weight", "layers.{i}.post_ffw_norm", N, ("hidden",)),
    TensorSpec("output_norm.weight", "norm", N, ("hidden",)),
    TensorSpec("output.weight", "output", P, ("hidden", "vocab_size"), group="output",
               tied_to="token_embd.weight"),
)

# llama.cpp's quantizer may put any of its types on a projection or the
# embedding (the tied lm_head is the embedding, so the two fences agree).
FENCES = {P: LLAMA_CPP_TYPES, E: LLAMA_CPP_TYPES, N: frozenset({GGMLType.F32})}

GEMMA3 = Architecture(ARCH, "Gemma 3", Gemma3Config, TENSORS, FENCES,
                      groups={"output": "an untied lm_head"})
