"""Glimmer's facts (GLIMMER.md): its config and metadata keys, its tensor
table, the dtype fences of its roles and the lane checks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import LaneError
from ..formats import GGMLType
from .names import optional, tensor_table
from .spec import DECODER_KEYS, Architecture, DecoderConfig, Key, Role, key_names, read_keys

ARCH = "glimmer"
LANES = ("q4_k_xl", "nvfp4")
LANE_KEY = "muser.weight_precision"   # metadata key naming the lane, one of LANES

# config field <- GGUF key under "glimmer.", in the config's field order
KEYS = DECODER_KEYS + (
    Key("sliding_window_pattern", "attention.sliding_window_pattern"),
    Key("rope_base", "rope.freq_base", real=True, lo=1.0, hi=1e12),
    Key("vocab_size", "vocab_size"),
)


@dataclass(frozen=True)
class GlimmerConfig(DecoderConfig):
    ARCH_NAME = ARCH

    sliding_window_pattern: int
    rope_base: float
    vocab_size: int
    weight_precision: str = "q4_k_xl"

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

    def to_metadata(self) -> dict[str, Any]:
        md: dict[str, Any] = {"general.architecture": ARCH, LANE_KEY: self.weight_precision}
        for k in KEYS:
            md[f"{ARCH}.{k.name}"] = getattr(self, k.field)
        return md


TENSORS = tensor_table(
    "token_embd",
    "attn_norm", "attn_q", "attn_gate", "attn_k", "attn_v", "attn_output",
    "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
    optional("attn_q_norm", "qk_norm"), optional("attn_k_norm", "qk_norm"),
    "output_norm",
    "output",   # the lm_head is untied and fenced like any projection
)

# The dtype fences (GLIMMER.md, "Weight types and fail-closed admission").
FENCES = {
    Role.PROJECTION: frozenset({GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.NVFP4_E2M1,
                                GGMLType.F16}),
    Role.EMBEDDING: frozenset({GGMLType.Q4_K, GGMLType.F16}),
    Role.NORM: frozenset({GGMLType.F32}),
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
                       check_metadata=check_lane_key, check_tensors=check_lane_tensors,
                       understood=key_names(KEYS))
