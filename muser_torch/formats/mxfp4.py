"""MXFP4 (ggml type 39, OCP microscaling FP4): 32 E2M1 codes sharing one
power-of-two scale.

17 bytes per 32 elements:
  0x00  1  e   E8M0 scale: 2**(e - 127) (no sign, no mantissa; ggml never makes 0xFF NaN)
  0x01 16  qs  byte j holds element j (low nibble) and element j + 16 (high)
  y = (2**(e - 127) / 2) * (2 * e2m1(q))

ggml keeps its E2M1 codes doubled as integers (0, 1, 2, 3, 4, 6, 8, 12 and
negatives, ``nvfp4._GGML_DOUBLED_VALUES``, shared with NVFP4), so it halves
the scale instead: ``ggml_e8m0_to_fp32_half``, whose e = 0 and 1 are the
subnormals 2**-128 and 2**-127. Every product is exact.

Quantizing ports ggml's ``quantize_row_mxfp4_ref`` (ggml ignores an importance
matrix for MXFP4): ``e = floor(log2(amax)) - 2 + 127`` (0 for an all-zero
block), so the largest magnitude lands in [4, 8) times the scale and the
doubled code 12 (E2M1 6.0) can still reach 1.5 times it; then each element
takes the nearest doubled code, the first of ``kvalues`` on ties.
``log2`` is taken in float64 and rounded to float32, the correctly rounded
value of C's ``log2f``; the two could differ only for an ``amax`` whose log
lies within a fraction of an ulp of a rounding midpoint next to an integer.
"""
from __future__ import annotations

import functools

import torch

from .nvfp4 import _GGML_DOUBLED_VALUES, _decode_pairs, _nearest_magnitude
from .registry import BlockFormat, join_nibbles
from .types import GGMLType

QK_MXFP4 = 32
_HALF = QK_MXFP4 // 2
_CHUNK_BLOCKS = 1 << 15   # blocks quantized at once: bounds the [chunk, 32, 8] search


@functools.lru_cache(maxsize=None)
def e8m0_half_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """float32 ``[256]``: half the value of every E8M0 byte, ggml's
    ``ggml_e8m0_to_fp32_half`` (read it, never write it)."""
    e = torch.arange(256, dtype=torch.int64)
    bits = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    return bits.to(torch.int32).view(torch.float32).to(device)


def e8m0_of_amax(amax: torch.Tensor) -> torch.Tensor:
    """ggml's ``(uint8_t)(floorf(log2f(amax)) - 2 + 127)``, 0 where ``amax`` is 0,
    as uint8 (a negative exponent wraps as x86's conversion does)."""
    log2 = torch.log2(amax.to(torch.float64)).to(torch.float32)
    e = (torch.floor(log2) - 2.0 + 127.0)
    e = torch.where(amax > 0, e, torch.zeros_like(e)).to(torch.int32) & 0xFF
    return e.to(torch.uint8)


class MXFP4(BlockFormat, qtype=GGMLType.MXFP4):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = e8m0_half_table(blocks.device)[cls.field(blocks, "e").long()]          # [n, 1]
        pairs = _decode_pairs(cls.field(blocks, "qs"), _GGML_DOUBLED_VALUES)       # [n, 16, 2]
        return pairs.transpose(1, 2).reshape(n, QK_MXFP4).mul_(d)

    @classmethod
    def quantize_blocks(cls, blocks, weights):
        # ggml's quantize_mxfp4 ignores the importance matrix.
        return torch.cat([cls._quantize(blocks[s:s + _CHUNK_BLOCKS])
                          for s in range(0, blocks.shape[0], _CHUNK_BLOCKS)])

    @staticmethod
    def _quantize(blocks):
        n = blocks.shape[0]
        e = e8m0_of_amax(blocks.abs().amax(-1))                                    # [n]
        step = e8m0_half_table(blocks.device)[e.long()].unsqueeze(-1)
        mag = _nearest_magnitude(blocks.abs(), step.expand_as(blocks))
        codes = (mag + torch.where((blocks < 0) & (mag > 0), 8, 0)).to(torch.uint8)
        qs = join_nibbles(codes.view(n, 2, _HALF))
        return torch.cat((e.unsqueeze(-1), qs), dim=1)
