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
"""
from __future__ import annotations

import functools

import torch

from .floats import e4m3fn_table
from .registry import BlockFormat
from .types import NVFP4_GROUP, GGMLType

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def e2m1_table(device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)


@functools.lru_cache(maxsize=None)
def _ue4m3_half_cpu() -> torch.Tensor:
    """Half the value of every UE4M3 byte (bias 7, sign bit ignored, 0x7F -> 0)."""
    vals = []
    for x in range(256):
        exp, man = (x >> 3) & 0xF, x & 7
        v = man * 2.0 ** -9 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7)
        vals.append(0.0 if x in (0, 0x7F) else v * 0.5)
    return torch.tensor(vals, dtype=torch.float32)


# ggml's NVFP4 codes are doubled E2M1 values stored as integers (so code 8 is +0).
_GGML_DOUBLED = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
                             dtype=torch.float32)


def _codes(qs: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., k]`` to ``[..., 2k]`` codes, element 2i from the low nibble."""
    return torch.stack((qs & 0x0F, qs >> 4), dim=-1).flatten(-2)


class NVFP4(BlockFormat, qtype=GGMLType.NVFP4):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = _ue4m3_half_cpu().to(blocks.device)[blocks[:, :4].long()].unsqueeze(-1)
        qs = blocks[:, 4:].reshape(n, 4, 8)
        codes = torch.cat((qs & 0x0F, qs >> 4), dim=-1).long()          # [n, 4, 16]
        doubled = _GGML_DOUBLED.to(blocks.device)
        return (d * doubled[codes]).reshape(n, 64)


class NVFP4_E2M1(BlockFormat, qtype=GGMLType.NVFP4_E2M1):
    """Blocks are one 16-element scale group (8 payload bytes); the scales are
    companions, so the plain block path reads codes only. Use
    :func:`dequantize_nvfp4_e2m1` for values."""

    @classmethod
    def dequantize_blocks(cls, blocks):
        raise ValueError("NVFP4_E2M1 needs its scales and scale_2 companions")


def dequantize_nvfp4_e2m1(payload: torch.Tensor, scales: torch.Tensor,
                          scale_2: torch.Tensor) -> torch.Tensor:
    """payload uint8 ``[rows, n_in/2]``, scales uint8 ``[rows, n_in/16]``,
    scale_2 float32 (one element) to float32 ``[rows, n_in]``."""
    rows = payload.shape[0]
    values = e2m1_table(payload.device)[_codes(payload).long()]       # [rows, n_in]
    s = e4m3fn_table(payload.device)[scales.long()]                   # [rows, n_in/16]
    w = values.view(rows, -1, NVFP4_GROUP) * s.unsqueeze(-1)
    return (w * scale_2.to(torch.float32).reshape(())).reshape(rows, -1)
