"""Random packed weights: the one generator that models, benchmarks and tests use.

Code bytes are uniform; only the fields the layout declares as scales are
set (``formats/layout.py`` says where they sit), so every value is finite.
Two ways to set them:

* ``std=None``: varied scales, for kernel tests and benchmarks: every f16
  scale field of either sign between 2^-10 and 2^-4, E4M3 scales between 1/4
  and 4 (of either sign where the format is signed, E4M3FN), E8M0 scales
  between 2^-10 and 2^-1, so values span several binades;
* ``std=s``: the Muser recipes' synthetic models: one scale per tensor,
  mins that centre the codes on zero, chosen so the values have about ``s``
  standard deviation (measured once per type at unit scale).

Float types (F32, F16, BF16) are normal draws (``std`` or 0.05) in that dtype.
llama.cpp's NVFP4 (id 40) has no f16 scale to set: its E4M3 scales are
always varied and ``std`` is not honoured.
"""
from __future__ import annotations

import functools
import math

import torch

from .floats import TORCH_DTYPES
from .reference import dequantize_reference
from .registry import f16_bytes
from .types import NVFP4_GROUP, GGMLType
from .weight import PackedWeight

__all__ = ["random_weight"]

# E4M3 scale bytes between 2^-2 and 2^2: finite, no NaN codes.
_E4M3_LO, _E4M3_HI = 0x28, 0x48
# E8M0 scale bytes 2^(b - 127) between 2^-10 and 2^-1; 127 is 1.
_E8M0_LO, _E8M0_HI, _E8M0_ONE = 117, 127, 127
# Mean code of the formats whose min field centres them: value = d*q - dmin*m
# (K-quants, m a 6-bit sub-block min) or d*q + m (Q4_1, Q5_1).
_CODE_MEAN = {GGMLType.Q4_1: 7.5, GGMLType.Q5_1: 15.5, GGMLType.Q4_K: 7.5, GGMLType.Q5_K: 15.5}
_MIN_FIELDS = {"dmin": 1.0, "m": -1.0}     # sign of the centring min relative to d


def _e4m3_bytes(shape, gen, device, signed: bool = False) -> torch.Tensor:
    """Scale bytes between 1/4 and 4; ``signed`` (E4M3FN) also draws the sign bit."""
    b = torch.randint(_E4M3_LO, _E4M3_HI, shape, dtype=torch.uint8, generator=gen, device=device)
    if signed:
        b |= torch.randint(0, 2, shape, dtype=torch.uint8, generator=gen, device=device) << 7
    return b


def _raw(qtype: GGMLType, n_out: int, n_in: int, gen, device, scale: float | None):
    """Random blocks; ``scale`` None gives varied scales, else the recipe's."""
    packed = torch.randint(0, 256, (n_out, qtype.row_bytes(n_in)), dtype=torch.uint8,
                           generator=gen, device=device)
    blocks = packed.view(-1, qtype.block_bytes)
    n = blocks.shape[0]
    for f in qtype.layout.fields:
        span = slice(f.offset, f.offset + f.nbytes)
        if f.kind == "f16" and scale is None:
            mag = torch.exp2(torch.empty(n, device=device).uniform_(-10, -4, generator=gen))
            sign = torch.randint(0, 2, (n,), generator=gen, device=device) * 2 - 1
            blocks[:, span] = f16_bytes(mag * sign)
        elif f.kind == "f16":
            value = scale * _CODE_MEAN.get(qtype, 0.0) * _MIN_FIELDS.get(f.name, 0.0) \
                if f.name in _MIN_FIELDS else scale
            blocks[:, span] = f16_bytes(torch.full((n,), value, device=device))
        elif f.kind == "e8m0" and scale is None:
            blocks[:, span] = torch.randint(_E8M0_LO, _E8M0_HI, (n, f.nbytes), dtype=torch.uint8,
                                            generator=gen, device=device)
        elif f.kind == "e8m0":      # a power of two: the nearest to the recipe's scale
            blocks[:, span] = _E8M0_ONE + round(math.log2(scale))
        elif f.kind in ("ue4m3", "e4m3"):
            blocks[:, span] = _e4m3_bytes((n, f.nbytes), gen, device,
                                          signed=f.kind == "e4m3" and scale is None)
    scales = scale_2 = None
    if qtype.layout.companions:     # NVFP4_E2M1: E4M3 group scales and a float32 scale_2
        scales = _e4m3_bytes((n_out, n_in // NVFP4_GROUP), gen, device, signed=scale is None)
        scale_2 = (torch.empty(1, device=device).uniform_(0.005, 0.02, generator=gen)
                   if scale is None else torch.tensor([scale], dtype=torch.float32, device=device))
    return packed, scales, scale_2


@functools.lru_cache(maxsize=None)
def _unit_std(qtype: GGMLType) -> float:
    """Standard deviation of recipe blocks at unit scale (measured once, on CPU)."""
    gen = torch.Generator().manual_seed(1234)
    packed, scales, scale_2 = _raw(qtype, 64, 1024, gen, "cpu", 1.0)
    return float(dequantize_reference(packed, qtype, 1024, scales=scales, scale_2=scale_2).std())


def random_weight(qtype: "GGMLType | int | str", n_out: int, n_in: int, *,
                  generator: torch.Generator | None = None,
                  device: torch.device | str = "cpu", std: float | None = None,
                  name: str = "") -> PackedWeight:
    """A random ``[n_out, n_in]`` weight of ``qtype``, made directly on ``device``
    (``generator`` must live there too)."""
    qtype = GGMLType.parse(qtype)
    if qtype in TORCH_DTYPES and qtype.block_elems == 1 and qtype != GGMLType.F8_E4M3FN:
        w = torch.randn(n_out, n_in, generator=generator, device=device) * (std or 0.05)
        packed = w.to(TORCH_DTYPES[qtype]).view(torch.uint8).reshape(n_out, qtype.row_bytes(n_in))
        return PackedWeight(name, qtype, n_out, n_in, packed)
    if qtype == GGMLType.F8_E4M3FN:
        return PackedWeight(name, qtype, n_out, n_in, _e4m3_bytes((n_out, n_in), generator, device))
    scale = None if std is None else std / _unit_std(qtype)
    packed, scales, scale_2 = _raw(qtype, n_out, n_in, generator, device, scale)
    return PackedWeight(name, qtype, n_out, n_in, packed, scales, scale_2)
