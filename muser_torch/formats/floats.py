"""Plain float storage: F32, F16, BF16 and the E4M3FN bytes of NVFP4 scales."""
from __future__ import annotations

import functools

import torch

from .registry import BlockFormat
from .types import GGMLType


# The torch dtype whose bytes are exactly one element of each plain float type.
TORCH_DTYPES: dict[GGMLType, torch.dtype] = {
    GGMLType.F32: torch.float32, GGMLType.F16: torch.float16,
    GGMLType.BF16: torch.bfloat16, GGMLType.F8_E4M3FN: torch.float8_e4m3fn,
}


def as_float_type(t: torch.Tensor, q: GGMLType) -> torch.Tensor | None:
    """A tensor as the plain float type ``q`` stores it (F32, F16, BF16; BF16
    rounded from float32, as llama.cpp's converter rounds), or None for any
    other type."""
    if q == GGMLType.F32:
        return t.to(torch.float32).contiguous()
    if q == GGMLType.F16:
        return t.to(torch.float16).contiguous()
    if q == GGMLType.BF16:
        return t.to(torch.float32).to(torch.bfloat16).contiguous()
    return None


class _Plain(BlockFormat):
    """Blocks of one element stored as that element's own bytes."""

    @classmethod
    def dequantize_blocks(cls, blocks):
        return blocks.contiguous().view(TORCH_DTYPES[cls.qtype]).to(torch.float32)

    @classmethod
    def quantize_blocks(cls, blocks, weights):
        # torch rounds to nearest even, as ggml's fp32 -> f16 / bf16 conversions do.
        return blocks.to(TORCH_DTYPES[cls.qtype]).contiguous().view(torch.uint8)


class F32(_Plain, qtype=GGMLType.F32):
    pass


class F16(_Plain, qtype=GGMLType.F16):
    pass


class BF16(_Plain, qtype=GGMLType.BF16):
    pass


@functools.lru_cache(maxsize=None)
def e4m3fn_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """float32 ``[256]``: the value of every E4M3FN byte (0x7F and 0xFF are NaN).
    Built once per device (read it, never write it).

    A table gather works on every device, including MPS, which has no float8."""
    return torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32).to(device)


class F8_E4M3FN(BlockFormat, qtype=GGMLType.F8_E4M3FN):
    @classmethod
    def dequantize_blocks(cls, blocks):
        return e4m3fn_table(blocks.device)[blocks.long()]

    @classmethod
    def quantize_blocks(cls, blocks, weights):
        # Saturate rather than produce NaN: a scale above 448 is clamped.
        return blocks.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
