"""The two NVFP4 formats: E2M1 codes scaled per 16 inputs by an E4M3 scale.

E2M1 (1 sign, 2 exponent, 1 mantissa bits), code -> value:
  0..7  ->  0, 0.5, 1, 1.5, 2, 3, 4, 6        8..15 -> the same, negated

llama.cpp's NVFP4 (type 40), 36 bytes per 64 elements:
  0x00  4  d   four UE4M3 scales (sign bit ignored), one per 16 elements
  0x04 32  qs  sub-block s uses qs[8s : 8s+8]: low nibbles are elements
               16s+0..7, high nibbles 16s+8..15
  y = (ue4m3(d_s) / 2) * (2 * e2m1(q))  (ggml's doubled-code convention)

Muser-native NVFP4_E2M1 (type 1000): a payload ``[n_out, n_in/2]`` whose byte
i holds element 2i (low nibble) and 2i+1 (high nibble), plus companions
``scales`` (F8_E4M3FN ``[n_out, n_in/16]``) and ``scale_2`` (one f32):
  w = (e2m1(code) * e4m3fn(scale)) * scale_2

Quantizing type 40 ports ggml's ``quantize_row_nvfp4_ref`` byte for byte
(ggml ignores an importance matrix for it). Quantizing NVFP4_E2M1 is ours;
see :func:`quantize_nvfp4_e2m1` for the choices.
"""
from __future__ import annotations

import functools

import torch

from .floats import e4m3fn_table
from .kquant_search import div_rn
from .registry import BlockFormat, join_nibbles
from .types import NVFP4_GROUP, QK_NVFP4, GGMLType

_CHUNK_ELEMS = 1 << 20  # elements quantized at once: bounds the temporaries
_SUBS = QK_NVFP4 // NVFP4_GROUP   # scale groups (and leading UE4M3 bytes) per type-40 block
E2M1_MAX = 6.0      # largest E2M1 magnitude
E4M3_MAX = 448.0    # largest finite E4M3FN (and UE4M3) value

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def e2m1_table(device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)


@functools.lru_cache(maxsize=None)
def ue4m3_half_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """float32 ``[256]``: half the value of every UE4M3 byte (bias 7, sign bit
    ignored, 0x7F -> 0), as ggml's ``ggml_ue4m3_to_fp32(x) / 2``. Built once
    per device (read it, never write it)."""
    vals = []
    for x in range(256):
        exp, man = (x >> 3) & 0xF, x & 7
        v = man * 2.0 ** -9 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7)
        vals.append(0.0 if x in (0, 0x7F) else v * 0.5)
    return torch.tensor(vals, dtype=torch.float32, device=device)


# ggml's NVFP4 codes are doubled E2M1 values stored as integers (so code 8 is +0).
_GGML_DOUBLED_VALUES = (0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0,
                        0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0)


@functools.lru_cache(maxsize=None)
def _doubled_magnitudes(device: torch.device) -> torch.Tensor:
    return torch.tensor(_GGML_DOUBLED_VALUES[:8], dtype=torch.float32, device=device)


@functools.lru_cache(maxsize=None)
def _pair_table(values: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """int64 ``[256]``: byte b -> the float32 pair (values[b & 15], values[b >> 4])
    packed as one little-endian int64, so one gather decodes two codes."""
    v = torch.tensor(values, dtype=torch.float32)
    b = torch.arange(256)
    return torch.stack((v[b & 15], v[b >> 4]), dim=1).view(torch.int64).reshape(256).to(device)


def _decode_pairs(qs: torch.Tensor, values: tuple[float, ...]) -> torch.Tensor:
    """uint8 ``[..., k]`` to float32 ``[..., k, 2]``: (low code, high code) values."""
    return _pair_table(values, qs.device)[qs.long()].view(torch.float32).view(*qs.shape, 2)


def ue4m3_bytes(x: torch.Tensor) -> torch.Tensor:
    """float32 to unsigned E4M3 bytes, as ggml's ``ggml_fp32_to_ue4m3``.

    Not IEEE rounding: the mantissa is rounded by adding fp32 bit 19 (ties
    away), values of 2**-6 and below go through ``(int)(x*512 + 0.5)``
    capped at 7, non-positive input gives 0 and overflow gives 0x7E (448)."""
    x = torch.where(x > 0, x, torch.zeros_like(x)).clamp_(max=E4M3_MAX)
    b = x.view(torch.int32)
    exp = ((b >> 23) & 0xFF) - 127 + 7
    man = ((b >> 20) & 0x7) + ((b >> 19) & 1)
    carry = man > 7
    exp = exp + carry.to(torch.int32)
    man = torch.where(carry, torch.zeros_like(man), man)
    normal = torch.where(exp >= 15, torch.full_like(exp, 0x7E), (exp << 3) | man)
    sub = torch.trunc(x * 512.0 + 0.5).to(torch.int32).clamp_(max=7)
    out = torch.where(((b >> 23) & 0xFF) - 127 + 7 <= 0, sub, normal)
    return torch.where(x > 0, out, torch.zeros_like(out)).to(torch.uint8)


def _nearest_magnitude(a: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """Index 0..7 of the doubled E2M1 magnitude k with the least ``|k*step - a|``,
    the first (smallest) on ties: ggml's best_index_mxfp4 on ``|x|``."""
    mags = _doubled_magnitudes(a.device)
    err = (mags * step.unsqueeze(-1) - a.unsqueeze(-1)).abs()
    return err.argmin(-1)


class NVFP4(BlockFormat, qtype=GGMLType.NVFP4):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = ue4m3_half_table(blocks.device)[cls.field(blocks, "d").long()].unsqueeze(-1)
        pairs = _decode_pairs(cls.field(blocks, "qs").reshape(n, _SUBS, NVFP4_GROUP // 2),
                              _GGML_DOUBLED_VALUES)
        # low nibbles are elements 0..7 of the sub-block, high nibbles 8..15
        return pairs.transpose(2, 3).reshape(n, _SUBS, NVFP4_GROUP).mul_(d).reshape(n, QK_NVFP4)

    @classmethod
    def quantize_blocks(cls, blocks, weights):
        # ggml's quantize_nvfp4 ignores the importance matrix.
        step = _CHUNK_ELEMS // QK_NVFP4
        return torch.cat([cls._quantize(blocks[s:s + step]) for s in range(0, blocks.shape[0], step)])

    @staticmethod
    def _quantize(blocks):
        n = blocks.shape[0]
        x = blocks.reshape(n, _SUBS, NVFP4_GROUP)
        scale = ue4m3_bytes(div_rn(x.abs().amax(-1), E2M1_MAX))                 # [n, 4]
        step = ue4m3_half_table(x.device)[scale.long()].unsqueeze(-1)
        # ggml scans the 16 signed codes in order: +0 wins ties with -0, and
        # a smaller magnitude wins ties with a larger one, so the code is the
        # nearest magnitude with the sign bit set only for negative nonzero.
        mag = _nearest_magnitude(x.abs(), step.expand_as(x))
        codes = (mag + torch.where((x < 0) & (mag > 0), 8, 0)).to(torch.uint8)
        qs = join_nibbles(codes.view(n, _SUBS, 2, NVFP4_GROUP // 2))     # [n, 4, 8]
        return torch.cat((scale, qs.reshape(n, QK_NVFP4 // 2)), dim=1)


class NVFP4_E2M1(BlockFormat, qtype=GGMLType.NVFP4_E2M1):
    """Blocks are one 16-element scale group (8 payload bytes); the scales are
    companions, so the plain block path reads codes only. Use
    :func:`dequantize_nvfp4_e2m1` for values."""

    @classmethod
    def dequantize_blocks(cls, blocks):
        raise ValueError("NVFP4_E2M1 needs its scales and scale_2 companions")


def quantize_nvfp4_e2m1(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float32 ``[rows, n_in]`` to (payload uint8 ``[rows, n_in/2]``,
    scales uint8 ``[rows, n_in/16]`` E4M3FN bytes, scale_2 float32 0-dim).

    Choices (Muser-native, no reference quantizer to follow):
    * one ``scale_2`` per tensor, ``amax(|x|) / (6 * 448)``, so the largest
      group scale lands on E4M3FN's largest finite value 448 and the group
      scales use the format's whole range (0 for an all-zero tensor);
    * group scale ``amax(group) / 6 * (1 / scale_2)``, clamped to 448 (never
      NaN) and rounded to nearest-even by the float8 conversion;
    * each element goes to the nearest E2M1 value of ``x / (scale * scale_2)``
      with the decoded scale, ties to the even code as hardware ``cvt.rn``
      does, saturating at 6; an element of a zero-scale group is 0.
    Error bound (tested): |w - x| <= 0.1875 * amax(group) + 6 * 2**-10 *
    scale_2 for every element. The decoded scale S is within
    max(2**-4 relative, 2**-10 * scale_2 absolute) of amax(group) / 6; inside
    the range the error is at most half the widest E2M1 step (1 * S), and a
    saturated element loses at most amax(group) - 6 * S.
    """
    rows, n_in = x.shape
    if rows == 0:
        return (x.new_empty((0, n_in // 2), dtype=torch.uint8),
                x.new_empty((0, n_in // NVFP4_GROUP), dtype=torch.uint8),
                x.new_zeros((), dtype=torch.float32))
    scale_2 = div_rn(x.abs().amax(), E2M1_MAX * E4M3_MAX)
    inv_2 = torch.where(scale_2 > 0, 1.0 / scale_2, torch.zeros_like(scale_2))
    step = max(1, _CHUNK_ELEMS // n_in)
    parts = [_e2m1_rows(x[s:s + step], scale_2, inv_2) for s in range(0, rows, step)]
    payload = torch.cat([p for p, _ in parts])
    scales = torch.cat([s for _, s in parts])
    return payload, scales, scale_2.to(torch.float32)


def _e2m1_rows(x: torch.Tensor, scale_2: torch.Tensor,
               inv_2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows, n_in = x.shape
    groups = x.reshape(rows, n_in // NVFP4_GROUP, NVFP4_GROUP)
    amax = groups.abs().amax(-1)                                       # [rows, g]
    scales = (div_rn(amax, E2M1_MAX) * inv_2).clamp_(max=E4M3_MAX).to(torch.float8_e4m3fn)
    step = scales.to(torch.float32) * scale_2                          # decoded group scale
    a = groups.abs() / step.unsqueeze(-1)
    a = torch.where(step.unsqueeze(-1) > 0, a, torch.zeros_like(a))
    mag = _e2m1_round(a)
    codes = (mag + torch.where((groups < 0) & (mag > 0), 8, 0)).to(torch.uint8).reshape(rows, n_in)
    payload = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return payload.contiguous(), scales.view(torch.uint8).contiguous()


# Midpoints between consecutive E2M1 magnitudes, and whether a tie there
# goes up (the upper neighbour has the even code: 1.0, 2.0, 4.0).
_E2M1_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True),
                   (2.5, False), (3.5, True), (5.0, False))


def _e2m1_round(a: torch.Tensor) -> torch.Tensor:
    """Magnitude code 0..7 of non-negative ``a``: nearest, ties to even, saturating."""
    code = torch.zeros(a.shape, dtype=torch.int64, device=a.device)
    for mid, tie_up in _E2M1_MIDPOINTS:
        code += (a >= mid) if tie_up else (a > mid)
    return code


def dequantize_nvfp4_e2m1(payload: torch.Tensor, scales: torch.Tensor,
                          scale_2: torch.Tensor) -> torch.Tensor:
    """payload uint8 ``[rows, n_in/2]``, scales uint8 ``[rows, n_in/16]``,
    scale_2 float32 (one element) to float32 ``[rows, n_in]``."""
    rows, n_in = payload.shape[0], payload.shape[1] * 2
    values = _decode_pairs(payload, E2M1_VALUES)                      # element 2i low nibble
    s = e4m3fn_table(payload.device)[scales.long()]                   # [rows, n_in/16]
    w = values.view(rows, n_in // NVFP4_GROUP, NVFP4_GROUP).mul_(s.unsqueeze(-1))
    return w.mul_(scale_2.to(torch.float32).reshape(())).reshape(rows, n_in)
