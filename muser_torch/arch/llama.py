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
from typing import Any, ClassVar

from ..formats import GGMLType
from .rope import RopeArgs, rope_args
from .spec import (LLAMA_CPP_TYPES, MAX_CONTEXT, MAX_SIZE, Architecture, Key, Role, TensorSpec,
                   number, read_keys)

KEYS = (
    Key("context_length", "context_length", hi=MAX_CONTEXT),
    Key("hidden", "embedding_length"),
    Key("ffn", "feed_forward_length"),
    Key("n_layers", "block_count"),
    Key("n_heads", "attention.head_count"),
    Key("n_kv_heads", "attention.head_count_kv"),
    Key("rms_eps", "attention.layer_norm_rms_epsilon", real=True, lo=1e-12, hi=0.1),
)
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
class LlamaFamilyConfig:
    context_length: int
    hidden: int
    ffn: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    rms_eps: float
    head_dim: int
    vocab_size: int
    rope: RopeArgs

    ARCH: ClassVar[str] = "llama"
    ROPE_MODE: ClassVar[str] = "normal"

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def rope_pairs(self) -> int:
        return self.rope.n_rot // 2

    @classmethod
    def from_metadata(cls, md: dict[str, Any]) -> "LlamaFamilyConfig":
        """Build from GGUF metadata; KeyError for a missing key, ValueError naming a bad one."""
        arch = cls.ARCH
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
        cfg = cls(**values, head_dim=head_dim, vocab_size=vocab_size(md, arch), rope=rope)
        cfg.check()
        return cfg

    def check(self) -> None:
        arch = self.ARCH
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{arch}.attention.head_count {self.n_heads} is not a multiple of "
                             f"head_count_kv {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"{arch} head size {self.head_dim} must be even (RoPE rotates pairs)")


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


def tensor_table(*, qkv_bias: bool = False, qk_norm: bool = False, rope_freqs: bool = False
                 ) -> tuple[TensorSpec, ...]:
    """The family's tensors: the shared rows plus an architecture's extras, in
    llama.cpp's names and the Decoder's module paths."""
    A = "layers.{i}.attention"
    rows = [TensorSpec("token_embd.weight", "tok_embeddings", E, ("hidden", "vocab_size"))]
    if rope_freqs:   # Llama 3 scaling; llama.cpp: TENSOR_NOT_REQUIRED
        rows.append(TensorSpec("rope_freqs.weight", "rope_freqs", N, ("rope_pairs",), group="rope_freqs"))
    rows += [
        TensorSpec("blk.{i}.attn_norm.weight", "layers.{i}.attention_norm", N, ("hidden",)),
        TensorSpec("blk.{i}.attn_q.weight", f"{A}.wq", P, ("hidden", "q_dim")),
        TensorSpec("blk.{i}.attn_k.weight", f"{A}.wk", P, ("hidden", "kv_dim")),
        TensorSpec("blk.{i}.attn_v.weight", f"{A}.wv", P, ("hidden", "kv_dim")),
    ]
    if qkv_bias:   # after their weights: a bias goes onto the QLinear already bound
        rows += [TensorSpec("blk.{i}.attn_q.bias", f"{A}.wq.bias", B, ("q_dim",)),
                 TensorSpec("blk.{i}.attn_k.bias", f"{A}.wk.bias", B, ("kv_dim",)),
                 TensorSpec("blk.{i}.attn_v.bias", f"{A}.wv.bias", B, ("kv_dim",))]
    if qk_norm:
        rows += [TensorSpec("blk.{i}.attn_q_norm.weight", f"{A}.q_norm", N, ("head_dim",)),
                 TensorSpec("blk.{i}.attn_k_norm.weight", f"{A}.k_norm", N, ("head_dim",))]
    rows += [
        TensorSpec("blk.{i}.attn_output.weight", f"{A}.wo", P, ("q_dim", "hidden")),
        TensorSpec("blk.{i}.ffn_norm.weight", "layers.{i}.ffn_norm", N, ("hidden",)),
        TensorSpec("blk.{i}.ffn_gate.weight", "layers.{i}.feed_forward.w_gate", P, ("hidden", "ffn")),
        TensorSpec("blk.{i}.ffn_up.weight", "layers.{i}.feed_forward.w_up", P, ("hidden", "ffn")),
        TensorSpec("blk.{i}.ffn_down.weight", "layers.{i}.feed_forward.w_down", P, ("ffn", "hidden")),
        TensorSpec("output_norm.weight", "norm", N, ("hidden",)),
        TensorSpec("output.weight", "output", P, ("hidden", "vocab_size"), group="output",
                   tied_to="token_embd.weight"),
    ]
    return tuple(rows)


# llama.cpp's quantizer may put any of its types on a projection or the
# embedding; 1-D tensors (norms, biases, rope_freqs) stay F32.
FENCES = {P: LLAMA_CPP_TYPES, E: LLAMA_CPP_TYPES, N: frozenset({GGMLType.F32}),
          B: frozenset({GGMLType.F32})}
GROUPS = {"output": "an untied lm_head", "rope_freqs": "Llama 3 RoPE frequency factors"}

LLAMA = Architecture("llama", "Llama", LlamaFamilyConfig, tensor_table(rope_freqs=True), FENCES,
                     groups=GROUPS)
