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
from .names import optional, tensor_table
from .spec import (DECODER_KEYS, LLAMA_CPP_TYPES, MAX_SIZE, Architecture, DecoderConfig, Key, Role,
                   key_names, number, read_keys)

ARCH = "gemma3"

DEFAULT_PATTERN = 6   # llama.cpp's set_swa_pattern(6): every 6th layer global

KEYS = DECODER_KEYS + (
    Key("sliding_window_pattern", "attention.sliding_window_pattern", default=DEFAULT_PATTERN),
    Key("rope_base", "rope.freq_base", real=True, lo=1.0, hi=1e12, default=10000.0),
    Key("rope_base_local", "rope.freq_base_swa", real=True, lo=1.0, hi=1e12, default=10000.0),
    Key("rope_scale", "rope.scaling.factor", real=True, lo=1.0, hi=1e6, default=1.0),
    Key("final_softcap", "final_logit_softcapping", real=True, lo=0.0, hi=1e6, default=0.0),
)
_ROPE_SCALING_TYPES = ("none", "linear")


@dataclass(frozen=True)
class Gemma3Config(DecoderConfig):
    ARCH_NAME = ARCH

    vocab_size: int
    sliding_window_pattern: int = DEFAULT_PATTERN
    rope_base: float = 10000.0
    rope_base_local: float = 10000.0
    rope_scale: float = 1.0          # linear RoPE scaling of the global layers
    final_softcap: float = 0.0       # 0: none

    @property
    def query_scale(self) -> float:
        return query_pre_attn_scalar(self.n_layers, self.hidden, self.n_heads, self.head_dim) ** -0.5

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


def query_pre_attn_scalar(n_layers: int, hidden: int, n_heads: int, head_dim: int) -> float:
    """What llama.cpp scales queries by the inverse square root of (its files
    carry no key for it): the head size, except the 62-layer 27B model's
    ``hidden / n_heads`` (llama.cpp: LLM_TYPE_27B)."""
    return hidden / n_heads if n_layers == 62 else float(head_dim)


def global_layers(n_layers: int, pattern: int = DEFAULT_PATTERN) -> tuple[bool, ...]:
    """Which layers attend globally (``DecoderConfig.is_global``): every
    ``pattern``-th, counted from the first."""
    return tuple((i + 1) % pattern == 0 for i in range(n_layers))


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


TENSORS = tensor_table(
    "token_embd",
    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output",
    "post_attention_norm",
    "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm",
    "output_norm",
    optional("output", "output", tied_to="token_embd"),
)

# llama.cpp's quantizer may put any of its types on a projection or the
# embedding (the tied lm_head is the embedding, so the two fences agree).
FENCES = {Role.PROJECTION: LLAMA_CPP_TYPES, Role.EMBEDDING: LLAMA_CPP_TYPES,
          Role.NORM: frozenset({GGMLType.F32})}

GEMMA3 = Architecture(ARCH, "Gemma 3", Gemma3Config, TENSORS, FENCES,
                      groups={"output": "an untied lm_head"},
                      understood=key_names(KEYS, extra=("rope.scaling.type",
                                                        "attention.value_length", "vocab_size")))
