"""RoPE facts of the llama-family files: how llama.cpp turns a file's
``{arch}.rope.*`` metadata into the arguments of ``ggml_rope_ext``
(``llama_model::load_hparams``, then the ``llama_context`` constructor).
The rotation itself is ``models/rope_scaling.py``."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["RopeArgs", "rope_args", "ROPE_SCALING_TYPES"]

# rope.scaling.type values llama.cpp names and muser-torch runs ("longrope",
# Phi-3's, it names too: refused).
ROPE_SCALING_TYPES = ("none", "linear", "yarn")


@dataclass(frozen=True)
class RopeArgs:
    """The arguments llama.cpp passes to ``ggml_rope_ext``."""
    mode: str                  # "normal" or "neox"
    n_rot: int                 # rotated features per head (rope.dimension_count)
    base: float                # rope.freq_base
    freq_scale: float = 1.0    # 1 / rope.scaling.factor
    ext_factor: float = 0.0    # YaRN's ramp mix; 0 without YaRN
    attn_factor: float = 1.0   # as ggml takes it (ggml multiplies in YaRN's own magnitude)
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    n_ctx_orig: int = 0        # YaRN's original context


def _mscale(scale: float, m: float) -> float:
    return 1.0 if scale <= 1.0 else 0.1 * m * math.log(scale) + 1.0


def rope_args(md: Mapping[str, Any], arch: str, *, mode: str, n_rot: int, context_length: int
              ) -> RopeArgs:
    """``ggml_rope_ext``'s arguments from a file's metadata, as llama.cpp derives
    them (``llama_model::load_hparams`` then the ``llama_context`` constructor).
    Keys are read already range-checked by the caller except the scaling type;
    ValueError names a key this module cannot run."""
    def get(name: str, default: Any) -> Any:
        return md.get(f"{arch}.rope.{name}", default)

    kind = get("scaling.type", "linear")   # llama.cpp's default: the factor alone means linear
    if kind not in ROPE_SCALING_TYPES:
        raise ValueError(f"{arch}.rope.scaling.type is {kind!r}; muser-torch runs "
                         f"{', '.join(map(repr, ROPE_SCALING_TYPES))}")
    factor = float(get("scaling.factor", 0.0))
    freq_scale = 1.0 if factor == 0.0 or kind == "none" else 1.0 / factor
    rope_attn = float(get("scaling.attn_factor", 1.0))
    if kind != "yarn":
        return RopeArgs(mode, n_rot, float(get("freq_base", 10000.0)), freq_scale,
                        attn_factor=rope_attn)
    ext = float(get("scaling.yarn_ext_factor", -1.0))
    ext = 1.0 if ext < 0 else ext            # negative: "not set", 1 for YaRN
    attn = 1.0
    if ext != 0.0:
        # llama_context: the magnitude YaRN wants, divided by the one ggml multiplies in.
        f = 1.0 / freq_scale
        log_mul = float(get("scaling.yarn_log_multiplier", 0.0))
        want = _mscale(f, 1.0) / _mscale(f, log_mul) if log_mul != 0.0 else _mscale(f, 1.0)
        attn = want / (1.0 + 0.1 * math.log(f))
    n_ctx_orig = int(get("scaling.original_context_length", 0)) or context_length
    return RopeArgs(mode, n_rot, float(get("freq_base", 10000.0)), freq_scale, ext, attn * rope_attn,
                    float(get("scaling.yarn_beta_fast", 32.0)), float(get("scaling.yarn_beta_slow", 1.0)),
                    n_ctx_orig)
