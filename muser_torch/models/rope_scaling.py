"""RoPE as llama.cpp runs it for the llama, qwen2 and qwen3 architectures:
its two modes, partial rotation, and its scalings (linear, YaRN, and Llama 3's
per-pair frequency factors from ``rope_freqs.weight``).

Two steps, each from llama.cpp:

* ``rope_args`` reads the file's ``rope.*`` metadata the way
  ``llama_context``'s constructor turns ``hparams`` into the arguments of
  ``ggml_rope_ext`` (``freq_scale``, ``ext_factor``, ``attn_factor``, betas,
  original context);
* ``rope_frequencies`` computes, from those arguments, what ggml's
  ``rope_yarn`` does per rotated pair i: the angle at position p is
  ``p * inv_freq[i]`` and cos/sin are multiplied by ``mscale``. YaRN mixes the
  interpolated and extrapolated angle with a ramp that does not depend on p,
  so it folds into ``inv_freq`` too.

``rotate`` applies the rotation to the first ``n_rot`` features of each head
and passes the rest through: "normal" mode pairs features (2i, 2i+1) (what
the converter's q/k permutation of Llama weights is for), "neox" pairs
(i, i + n_rot/2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch

__all__ = ["RopeArgs", "rope_args", "rope_frequencies", "rotate", "ROPE_SCALING_TYPES"]

# rope.scaling.type values llama.cpp names and this module runs ("longrope" it
# names too, for Phi-3: refused here).
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


def _corr_dim(n_rot: int, n_ctx_orig: int, rotations: float, base: float) -> float:
    return n_rot * math.log(n_ctx_orig / (rotations * 2 * math.pi)) / (2 * math.log(base))


def rope_frequencies(a: RopeArgs, freq_factors: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, float]:
    """(inv_freq float32 ``[n_rot/2]``, mscale): ggml's angle for pair i at
    position p is ``p * inv_freq[i]``; cos and sin are scaled by mscale.
    ``freq_factors`` (``rope_freqs.weight``) divide each pair's frequency."""
    i = torch.arange(a.n_rot // 2, dtype=torch.float64)
    extrap = a.base ** (-2.0 * i / a.n_rot)
    if freq_factors is not None:
        extrap = extrap / freq_factors.to(torch.float64)
    interp = a.freq_scale * extrap
    mscale = a.attn_factor
    if a.ext_factor != 0.0:
        lo = max(0.0, math.floor(_corr_dim(a.n_rot, a.n_ctx_orig, a.beta_fast, a.base)))
        hi = min(a.n_rot - 1.0, math.ceil(_corr_dim(a.n_rot, a.n_ctx_orig, a.beta_slow, a.base)))
        ramp = 1 - ((i - lo) / max(0.001, hi - lo)).clamp(0, 1)
        mix = ramp * a.ext_factor
        inv = interp * (1 - mix) + extrap * mix
        mscale *= 1.0 + 0.1 * math.log(1.0 / a.freq_scale)
    else:
        inv = interp
    return inv.float(), float(mscale)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mode: str, n_rot: int) -> torch.Tensor:
    """RoPE of ``x`` ``[B, T, H, D]`` with cos/sin ``[B, T, 1, n_rot/2]`` on its
    first ``n_rot`` features; the others pass through."""
    rot, rest = (x, None) if n_rot == x.shape[-1] else (x[..., :n_rot], x[..., n_rot:])
    xf = rot.float()
    if mode == "normal":
        pairs = xf.unflatten(-1, (-1, 2))
        x1, x2 = pairs[..., 0], pairs[..., 1]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        x1, x2 = xf.chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    out = out.to(x.dtype)
    return out if rest is None else torch.cat((out, rest), dim=-1)
