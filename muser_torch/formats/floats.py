"""Plain float storage: F32, F16, BF16 and the E4M3FN bytes of NVFP4 scales."""
from __future__ import annotations

import functools

import torch

from .registry import BlockFormat
from .types import GGMLType


class F32(BlockFormat, qtype=GGMLType.F32):
    @classmethod
    def dequantize_blocks(cls, blocks):
        return blocks.contiguous().view(torch.float32)

    @classmethod
    def quantize_blocks(cls, blocks, weights):
        return blocks.to(torch.float32).contiguous().view(torch.uint8)


class F16(BlockFormat, qtype=GGMLType.F16):
    @classmethod
    def dequantize_blocks(cls, blocks):
        return blocks.contiguous().view(torch.float16).to(torch.float32)

    @classmethod
    def quantize_blocks(cls, blocks, weights):
        return blocks.to(torch.float16).contiguous().view(torch.uint8)


class BF16(BlockFormat, qtype=GGMLType.BF16):
    @classmethod
    def dequantize_blocks(cls, blocks):
        return blocks.contiguous().view(torch.bfloat16).to(torch.float32)

    @classmethod
    def quantize_blocks(cls, blocks, weights):
        # torch rounds to nearest even, as ggml_compute_fp32_to_bf16 does.
        return blocks.to(torch.bfloat16).contiguous().view(torch.uint8)


@functools.lru_cache(maxsize=None)
def _e4m3fn_table_cpu() -> torch.Tensor:
    return torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)


def e4m3fn_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """float32 ``[256]``: the value of every E4M3FN byte (0x7F and 0xFF are NaN).

    A table gather works on every device, including MPS, which has no float8."""
    return _e4m3fn_table_cpu().to(device)


class F8_E4M3FN(BlockFormat, qtype=GGMLType.F8_E4M3FN):
    @classmethod
    def dequantize_blocks(cls, blocks):
        return e4m3fn_table(blocks.device)[blocks.long()]

    @classmethod
    def quantize_blocks(cls, blocks, weights):
        # Saturate rather than produce NaN: a scale above 448 is clamped.
        return blocks.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
