"""The 32-element symmetric/asymmetric formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

Field order is ggml's struct order (d, [m], [qh], qs). In a 32-element block,
qs byte j holds element j in its low nibble and element j + 16 in its high
nibble; for the 5-bit types bit j of the little-endian u32 ``qh`` is the fifth
bit of element j.
"""
from __future__ import annotations

import torch

from .registry import BlockFormat, bits, f16_field, nibbles
from .types import GGMLType


def _nibble_codes(qs: torch.Tensor) -> torch.Tensor:
    return nibbles(qs).reshape(qs.shape[0], 32)


def _high_bits(qh: torch.Tensor) -> torch.Tensor:
    """uint8 ``[n, 4]`` (a LE u32) to the 32 fifth-bits, element order."""
    return bits(qh, 8).transpose(1, 2).reshape(qh.shape[0], 32)


class Q4_0(BlockFormat, qtype=GGMLType.Q4_0):
    @classmethod
    def dequantize_blocks(cls, blocks):
        d = f16_field(blocks, 0)
        q = _nibble_codes(blocks[:, 2:]).to(torch.int8) - 8
        return d * q.to(torch.float32)


class Q4_1(BlockFormat, qtype=GGMLType.Q4_1):
    @classmethod
    def dequantize_blocks(cls, blocks):
        d, m = f16_field(blocks, 0), f16_field(blocks, 2)
        q = _nibble_codes(blocks[:, 4:]).to(torch.float32)
        return d * q + m


class Q5_0(BlockFormat, qtype=GGMLType.Q5_0):
    @classmethod
    def dequantize_blocks(cls, blocks):
        d = f16_field(blocks, 0)
        q = _nibble_codes(blocks[:, 6:]) | (_high_bits(blocks[:, 2:6]) << 4)
        return d * (q.to(torch.int8) - 16).to(torch.float32)


class Q5_1(BlockFormat, qtype=GGMLType.Q5_1):
    @classmethod
    def dequantize_blocks(cls, blocks):
        d, m = f16_field(blocks, 0), f16_field(blocks, 2)
        q = _nibble_codes(blocks[:, 8:]) | (_high_bits(blocks[:, 4:8]) << 4)
        return d * q.to(torch.float32) + m


class Q8_0(BlockFormat, qtype=GGMLType.Q8_0):
    @classmethod
    def dequantize_blocks(cls, blocks):
        d = f16_field(blocks, 0)
        return d * blocks[:, 2:].contiguous().view(torch.int8).to(torch.float32)
