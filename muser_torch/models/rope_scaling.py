"""RoPE as llama.cpp computes it for the llama, qwen2 and qwen3 architectures,
from the arguments ``arch/rope.py`` reads off the file (``RopeArgs``).

``rope_frequencies`` does what ggml's ``rope_yarn`` does per rotated pair i:
the angle at position p is ``p * inv_freq[i]`` and cos/sin are multiplied by
``mscale``. YaRN mixes the interpolated and extrapolated angle with a ramp
that does not depend on p, so it folds into ``inv_freq``; Llama 3's
``rope_freqs.weight`` factors divide it.

``rotate`` applies the rotation to the first ``n_rot`` features of each head
and passes the rest through: "normal" mode pairs features (2i, 2i+1) (what
the converter's q/k permutation of Llama weights is for), "neox" pairs
(i, i + n_rot/2).
"""
from __future__ import annotations

import math

import torch

from ..arch.rope import RopeArgs

__all__ = ["RopeArgs", "rope_frequencies", "rotate"]


def _corr_dim(n_rot: int, n_ctx_orig: int, rotations: float, base: float) -> float:
    return n_rot * math.log(n_ctx_orig / (rotations * 2 * math.pi)) / (2 * math.log(base))


def rope_frequencies(a: RopeArgs, freq_factors: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, float]:
    """(inv_freq float32 ``[n_rot/2]``, mscale): ggml's angle for pair i at
    position p is ``p * inv_freq[i]``; cos and sin are scaled by mscale.
    ``freq_factors`` (``rope_freqs.weight``) divide each pair's frequency."""
    i = torch.arange(a.n_rot // 2, dtype=torch.float64, device="cpu")   # CPU even in a meta build
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


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mode: str, n_rot: int,
           mscale: float = 1.0) -> torch.Tensor:
    """RoPE of ``x`` ``[B, T, H, D]`` with cos/sin ``[B, T, 1, n_rot/2]`` on its
    first ``n_rot`` features (cos and sin times ``mscale``); the others pass through."""
    if mscale != 1.0:
        cos, sin = cos * mscale, sin * mscale
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
