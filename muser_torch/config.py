"""Glimmer's configuration, read from and written to GGUF metadata (GLIMMER.md)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

ARCH = "glimmer"
LANES = ("q4_k_xl", "nvfp4")
LANE_KEY = "muser.weight_precision"   # metadata key naming the lane, one of LANES

# dataclass field -> GGUF key under the "glimmer." prefix
_KEYS = {
    "context_length": "context_length",
    "hidden": "embedding_length",
    "ffn": "feed_forward_length",
    "n_layers": "block_count",
    "n_heads": "attention.head_count",
    "n_kv_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "rms_eps": "attention.layer_norm_rms_epsilon",
    "sliding_window": "attention.sliding_window",
    "sliding_window_pattern": "attention.sliding_window_pattern",
    "rope_base": "rope.freq_base",
    "vocab_size": "vocab_size",
}


def _number(key: str, v: Any, real: bool) -> "int | float":
    """A metadata number, refused (ValueError naming the key) if it is not one:
    no bools, strings or lists, and no fractional, infinite or NaN integers."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{key} is {v!r}, expected {'a number' if real else 'an integer'}")
    if real:
        return float(v)
    if isinstance(v, float) and not v.is_integer():
        raise ValueError(f"{key} is {v!r}, expected an integer")
    return int(v)


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
        """Build from GGUF metadata; raises KeyError/ValueError naming the bad key
        (the loader turns these into GGUFError subclasses)."""
        arch = md.get("general.architecture")
        if arch != ARCH:
            raise ValueError(f"general.architecture is {arch!r}, expected {ARCH!r}")
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name == "weight_precision":
                continue
            key = f"{ARCH}.{_KEYS[f.name]}"
            if key not in md:
                raise KeyError(key)
            values[f.name] = _number(key, md[key], f.type == "float")
        if LANE_KEY not in md:
            raise KeyError(LANE_KEY)
        values["weight_precision"] = str(md[LANE_KEY])
        return cls(**values)

    def to_metadata(self) -> dict[str, Any]:
        md: dict[str, Any] = {"general.architecture": ARCH, LANE_KEY: self.weight_precision}
        for name, key in _KEYS.items():
            md[f"{ARCH}.{key}"] = getattr(self, name)
        return md
