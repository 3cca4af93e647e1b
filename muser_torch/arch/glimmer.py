"""Glimmer's facts (GLIMMER.md): its config and metadata keys, its tensor
table, the dtype fences of its roles and the lane checks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import LaneError
from ..formats import GGMLType
from .spec import MAX_CONTEXT, Architecture, Key, Role, TensorSpec, read_keys

ARCH = "glimmer"
LANES = ("q4_k_xl", "nvfp4")
LANE_KEY = "muser.weight_precision"   # metadata key naming the lane, one of LANES

# config field <- GGUF key under "glimmer.", in the config's field order
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
    Key("sliding_window_pattern", "attention.sliding_window_pattern"),
    Key("rope_base", "rope.freq_base", real=True, lo=1.0, hi=1e12),
    Key("vocab_size", "vocab_size"),
)


@dataclass(frozen=True)
class GlimmerConfig:
    context_length: int
    hidden: int
    ffn: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rms_eps: float
    sliding_window: int
    sliding_window_pattern: int
    rope_base: float
    vocab_size: int
    weight_precision: str = "q4_k_xl"

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def is_global(self, layer: int) -> bool:
        """Global (full-context) attention on every ``sliding_window_pattern``-th layer."""
        return (layer + 1) % self.sliding_window_pattern == 0

    @classmethod
    def from_metadata(cls, md: dict[str, Any]) -> "GlimmerConfig":
        """Build from GGUF metadata; raises KeyError (a missing key) or
        ValueError naming the bad key (the loader turns these into GGUFError
        subclasses)."""
        arch = md.get("general.architecture")
        if arch != ARCH:
            raise ValueError(f"general.architecture is {arch!r}, expected {ARCH!r}")
        values = read_keys(md, ARCH, KEYS)
        if LANE_KEY not in md:
            raise KeyError(LANE_KEY)
        cfg = cls(**values, weight_precision=str(md[LANE_KEY]))
        cfg.check()
        return cfg

    def check(self) -> None:
        """Refuse values each in range but unusable together (ValueError naming the keys)."""
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{ARCH}.attention.head_count {self.n_heads} is not a multiple of "
                             f"head_count_kv {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"{ARCH}.attention.key_length {self.head_dim} must be even (RoPE)")
        if self.sliding_window > self.context_length:
            raise ValueError(f"{ARCH}.attention.sliding_window {self.sliding_window} exceeds "
                             f"context_length {self.context_length}")

    def to_metadata(self) -> dict[str, Any]:
        md: dict[str, Any] = {"general.architecture": ARCH, LANE_KEY: self.weight_precision}
        for k in KEYS:
            md[f"{ARCH}.{k.name}"] = getattr(self, k.field)
        return md


E, P, N = Role.EMBEDDING, Role.PROJECTION, Role.NORM
TENSORS = (
    TensorSpec("token_embd.weight", "tok_embeddings", E, ("hidden", "vocab_size")),
    TensorSpec("blk.{i}.attn_norm.weight", "layers.{i}.attention_norm", N, ("hidden",)),
    TensorSpec("blk.{i}.attn_q.weight", "layers.{i}.attention.wq", P, ("hidden", "q_dim")),
    TensorSpec("blk.{i}.attn_gate.weight", "layers.{i}.attention.wgate", P, ("hidden", "q_dim")),
    TensorSpec("blk.{i}.attn_k.weight", "layers.{i}.attention.wk", P, ("hidden", "kv_dim")),
    TensorSpec("blk.{i}.attn_v.weight", "layers.{i}.attention.wv", P, ("hidden", "kv_dim")),
    TensorSpec("blk.{i}.attn_output.weight", "layers.{i}.attention.wo", P, ("q_dim", "hidden")),
    TensorSpec("blk.{i}.ffn_norm.weight", "layers.{i}.ffn_norm", N, ("hidden",)),
    TensorSpec("blk.{i}.ffn_gate.weight", "layers.{i}.feed_forward.w_gate", P, ("hidden", "ffn")),
    TensorSpec("blk.{i}.ffn_up.weight", "layers.{i}.feed_forward.w_up", P, ("hidden", "ffn")),
    TensorSpec("blk.{i}.ffn_down.weight", "layers.{i}.feed_forward.w_down", P, ("ffn", "hidden")),
    TensorSpec("blk.{i}.attn_q_norm.weight", "layers.{i}.attention.q_norm", N, ("head_dim",),
               group="qk_norm"),
    TensorSpec("blk.{i}.attn_k_norm.weight", "layers.{i}.attention.k_norm", N, ("head_dim",),
               group="qk_norm"),
    TensorSpec("output_norm.weight", "norm", N, ("hidden",)),
    # The lm_head is untied and fenced like any projection.
    TensorSpec("output.weight", "output", P, ("hidden", "vocab_size")),
)

# The dtype fences (GLIMMER.md, "Weight types and fail-closed admission").
FENCES = {
    P: frozenset({GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.NVFP4_E2M1, GGMLType.F16}),
    E: frozenset({GGMLType.Q4_K, GGMLType.F16}),
    N: frozenset({GGMLType.F32}),
}


def check_lane_key(md: dict, where: str) -> None:
    """``muser.weight_precision`` is present and one of ``LANES``."""
    if LANE_KEY not in md:
        raise LaneError(f"{where}: metadata key {LANE_KEY!r} is missing; it is required and "
                        f"must be one of {', '.join(map(repr, LANES))}")
    if md[LANE_KEY] not in LANES:
        raise LaneError(f"{where}: {LANE_KEY} is {md[LANE_KEY]!r}, expected one of "
                        f"{', '.join(map(repr, LANES))}")


def check_lane_tensors(gguf: Any, cfg: GlimmerConfig) -> None:
    """``q4_k_xl`` holds no NVFP4 tensor; ``nvfp4`` at least one, each with its
    companions bound."""
    where = gguf.path.name
    nvfp4 = [n for n, t in gguf.tensors.items() if t.type_id == GGMLType.NVFP4_E2M1]
    if cfg.weight_precision == "q4_k_xl" and nvfp4:
        raise LaneError(f"{where}: {LANE_KEY} is 'q4_k_xl' but tensor {nvfp4[0]!r} is "
                        f"NVFP4_E2M1 ({len(nvfp4)} NVFP4 tensors); the kquant lane admits none")
    if cfg.weight_precision == "nvfp4":
        if not nvfp4:
            raise LaneError(f"{where}: {LANE_KEY} is 'nvfp4' but no tensor is NVFP4_E2M1")
        for name in nvfp4:
            gguf.companions(name)   # raises CompanionError naming what is wrong


GLIMMER = Architecture(ARCH, "Glimmer", GlimmerConfig, TENSORS, FENCES,
                       groups={"qk_norm": "per-head q/k norms"},
                       check_metadata=check_lane_key, check_tensors=check_lane_tensors)
