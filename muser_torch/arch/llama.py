"""The llama-family architectures' facts, as llama.cpp loads and runs them
(``llama-model.cpp``'s ``LLM_ARCH_LLAMA``, ``_QWEN2`` and ``_QWEN3`` cases,
``src/models/llama.cpp``, ``qwen2.cpp``, ``qwen3.cpp``): one config reader and
one tensor table shared by ``llama`` (here) and ``qwen2`` / ``qwen3``
(``qwen.py``), which differ in their RoPE mode and a few tensors.

What llama.cpp takes from the file and what it fixes:

* head size ``attention.key_length``, else ``embedding_length / head_count``;
  ``value_length`` must equal it;
* ``rope.dimension_count`` defaults to the head size, and the three graphs
  assert it equals it (no partial rotation): a file saying otherwise is refused;
* RoPE mode: "normal" (adjacent pairs) for ``llama``, whose converter permutes
  the q/k rows for it; NeoX for the Qwens, whose weights are not permuted;
* ``rope.scaling.*`` (none, linear, YaRN) as ``rope_scaling.rope_args``
  reads them; Llama 3's scaling is the optional ``rope_freqs.weight`` tensor
  of per-pair frequency divisors, not keys;
* attention scale ``1/sqrt(head size)``; SwiGLU MLP; RMSNorm everywhere;
* ``output.weight`` optional: without it the embedding is the lm_head;
* the vocabulary: ``{arch}.vocab_size`` if present, else the tokenizer's
  token count (the converter writes the key only for llama).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..formats import GGMLType
from .names import optional, tensor_table
from .rope import RopeArgs, rope_args
from .spec import (DECODER_KEYS, LLAMA_CPP_TYPES, MAX_CONTEXT, MAX_SIZE, Architecture, DecoderConfig,
                   Key, Role, key_names, number, read_keys)

# The shared decoder keys, less two: the head size is optional here (read by
# _head_dim) and these graphs have no sliding window (llama.cpp's n_swa = 0).
KEYS = tuple(k for k in DECODER_KEYS if k.field not in ("head_dim", "sliding_window"))
# Range checks only (rope_args reads them): every number it may use, with llama.cpp's defaults.
ROPE_KEYS = (
    Key("base", "rope.freq_base", real=True, lo=1.000001, hi=1e12, default=10000.0),
    Key("factor", "rope.scaling.factor", real=True, lo=0.0, hi=1e6, default=0.0),
    Key("attn_factor", "rope.scaling.attn_factor", real=True, lo=1e-6, hi=1e6, default=1.0),
    Key("n_ctx_orig", "rope.scaling.original_context_length", lo=0, hi=MAX_CONTEXT, default=0),
    Key("ext_factor", "rope.scaling.yarn_ext_factor", real=True, lo=-1.0, hi=1e3, default=-1.0),
    Key("beta_fast", "rope.scaling.yarn_beta_fast", real=True, lo=1e-6, hi=1e6, default=32.0),
    Key("beta_slow", "rope.scaling.yarn_beta_slow", real=True, lo=1e-6, hi=1e6, default=1.0),
    Key("log_mul", "rope.scaling.yarn_log_multiplier", real=True, lo=0.0, hi=1e3, default=0.0),
)
# Written by the converter from HF's attention_factor, but replaced by llama.cpp's
# own YaRN magnitude for these graphs: a file carrying it is refused, not half-followed.
_REFUSED_KEYS = ("rope.scaling.yarn_attn_factor",)


@dataclass(frozen=True)
class LlamaFamilyConfig(DecoderConfig):
    ARCH_NAME = "llama"
    ROPE_MODE = "normal"   # llama.cpp's LLAMA_ROPE_TYPE_NORM

    vocab_size: int
    rope: RopeArgs

    @property
    def rope_pairs(self) -> int:
        return self.rope.n_rot // 2

    @classmethod
    def from_metadata(cls, md: dict[str, Any]) -> "LlamaFamilyConfig":
        """Build from GGUF metadata; KeyError for a missing key, ValueError naming a bad one."""
        arch = cls.ARCH_NAME
        values = read_keys(md, arch, KEYS)
        for name in _REFUSED_KEYS:
            if f"{arch}.{name}" in md:
                raise ValueError(f"{arch}.{name} is set ({md[f'{arch}.{name}']!r}); llama.cpp's "
                                 f"{arch} graph does not follow it and neither does muser-torch")
        head_dim = _head_dim(md, arch, values["hidden"], values["n_heads"])
        n_rot = _one(md, f"{arch}.rope.dimension_count", head_dim)
        if n_rot != head_dim:
            raise ValueError(f"{arch}.rope.dimension_count is {n_rot}, but llama.cpp's {arch} graph "
                             f"rotates whole heads (head size {head_dim})")
        read_keys(md, arch, ROPE_KEYS)
        rope = rope_args(md, arch, mode=cls.ROPE_MODE, n_rot=n_rot,
                         context_length=values["context_length"])
        cfg = cls(**values, head_dim=head_dim, sliding_window=0, vocab_size=vocab_size(md, arch),
                  rope=rope)
        cfg.check()
        return cfg


def _one(md: dict[str, Any], key: str, default: int) -> int:
    if key not in md:
        return default
    v = number(key, md[key], real=False)
    if not 1 <= v <= MAX_SIZE:
        raise ValueError(f"{key} is {md[key]!r}, expected an integer from 1 to {MAX_SIZE}")
    return v


def _head_dim(md: dict[str, Any], arch: str, hidden: int, n_heads: int) -> int:
    key = f"{arch}.attention.key_length"
    if key not in md and hidden % n_heads:
        raise ValueError(f"{arch}.embedding_length {hidden} is not a multiple of head_count "
                         f"{n_heads} and the file has no {key}")
    head_dim = _one(md, key, hidden // n_heads)
    value_length = _one(md, f"{arch}.attention.value_length", head_dim)
    if value_length != head_dim:
        raise ValueError(f"{arch}.attention.value_length is {value_length}, expected the key "
                         f"length {head_dim} (one head size for k and v)")
    return head_dim


def vocab_size(md: dict[str, Any], arch: str) -> int:
    """``{arch}.vocab_size`` when present, else the tokenizer's token count."""
    key = f"{arch}.vocab_size"
    if key in md:
        return _one(md, key, 0)
    tokens = md.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, (list, tuple)):
        raise KeyError(key)
    if not 1 <= len(tokens) <= MAX_SIZE:
        raise ValueError(f"tokenizer.ggml.tokens has {len(tokens)} tokens, expected 1 to {MAX_SIZE}")
    return len(tokens)


E, P, N, B = Role.EMBEDDING, Role.PROJECTION, Role.NORM, Role.BIAS


def family_table(*extra: str, rope_freqs: bool = False):
    """The family's tensors in llama.cpp's file order, with an architecture's
    ``extra`` attention tensors (biases, q/k norms) after q/k/v."""
    head = ["token_embd"] + ([optional("rope_freqs", "rope_freqs")] if rope_freqs else [])
    return tensor_table(*head, "attn_norm", "attn_q", "attn_k", "attn_v", *extra, "attn_output",
                        "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "output_norm",
                        optional("output", "output", tied_to="token_embd"))


# llama.cpp's quantizer may put any of its types on a projection or the
# embedding; 1-D tensors (norms, biases, rope_freqs) stay F32.
FENCES = {P: LLAMA_CPP_TYPES, E: LLAMA_CPP_TYPES, N: frozenset({GGMLType.F32}),
          B: frozenset({GGMLType.F32})}
GROUPS = {"output": "an untied lm_head", "rope_freqs": "Llama 3 RoPE frequency factors"}

# Every key from_metadata reads (the refused ones too: they get their own message).
UNDERSTOOD = key_names(KEYS, ROPE_KEYS, extra=(
    "attention.key_length", "attention.value_length", "rope.dimension_count", "vocab_size",
    "rope.scaling.type", *_REFUSED_KEYS))

# rope_freqs: llama.cpp's TENSOR_NOT_REQUIRED for llama (Llama 3 scaling)
LLAMA = Architecture("llama", "Llama", LlamaFamilyConfig, family_table(rope_freqs=True), FENCES,
                     groups=GROUPS, understood=UNDERSTOOD)
