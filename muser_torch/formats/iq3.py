"""ggml's 3-bit grid formats: IQ3_XXS (98 bytes) and IQ3_S (110 bytes), 256 elements each.

Every 4 elements are one grid entry (``iq_grids.py``: four unsigned
magnitudes), chosen by one qs byte (IQ3_S: plus a ninth bit from qh), and
each element carries its own sign bit. A 32-element sub-block has one 4-bit
scale ``s``.

IQ3_XXS, 98 bytes
  0x00  2  d             f16 super-scale
  0x02 64  qs            grid index of elements 4i..4i+3 (IQ3XXS_GRID, 256 entries)
  0x42 32  scales_signs  one u32 LE per sub-block b:
                           bits 0..27  four 7-bit sign codes, code l for elements 8l..8l+7
                                       of the sub-block, expanded by KSIGNS (bit j: element j
                                       negative; bit 7 is the parity of the other seven)
                           bits 28..31 s
  y = (d * (0.5 + s) * 0.5) * grid[qs] * sign

IQ3_S, 110 bytes
  0x00  2  d       f16 super-scale
  0x02 64  qs      low 8 bits of the grid index of elements 4i..4i+3 (IQ3S_GRID, 512 entries)
  0x42  8  qh      bit k of qh[b]: bit 8 of the index in qs[8b + k]
  0x4a 32  signs   bit k of signs[i]: element 8i + k negative
  0x6a  4  scales  sub-block b's s in nibble b % 2 (low first) of scales[b / 2]
  y = (d * (1 + 2s)) * grid[qs | qh << 8] * sign

Each product rounds as ggml's ``dequantize_row_iq3_*`` (and gguf-py) rounds it:
the sub-block scale first, then the grid value, then the sign (exact).
No quantizer: files of these types are made by llama-quantize.
"""
from __future__ import annotations

import functools

import torch

from .iq_grids import IQ3S_GRID, IQ3XXS_GRID, KSIGNS
from .registry import BlockFormat
from .types import QK_K, GGMLType

_SUBS = QK_K // 32        # 32-element sub-blocks per super-block


@functools.lru_cache(maxsize=None)
def grid_values(qtype: GGMLType, device: torch.device) -> torch.Tensor:
    """float32 ``[entries, 4]``: the magnitudes of ``qtype``'s grid (read it, never write it)."""
    words = {GGMLType.IQ3_XXS: IQ3XXS_GRID, GGMLType.IQ3_S: IQ3S_GRID}[qtype]
    w = torch.tensor(words, dtype=torch.int64, device=device)
    shifts = torch.arange(0, 32, 8, dtype=torch.int64, device=device)
    return ((w.unsqueeze(-1) >> shifts) & 0xFF).to(torch.float32)


@functools.lru_cache(maxsize=None)
def _ksign_negative(device: torch.device) -> torch.Tensor:
    """bool ``[128, 8]``: which of 8 elements a 7-bit IQ3_XXS sign code makes negative."""
    return _bits(torch.tensor(KSIGNS, dtype=torch.int64, device=device))


def _bits(b: torch.Tensor) -> torch.Tensor:
    """Integer ``[...]`` to bool ``[..., 8]``: bit k of each byte, low bit first."""
    return ((b.unsqueeze(-1) >> torch.arange(8, device=b.device)) & 1).bool()


def _grid(qtype: GGMLType, index: torch.Tensor) -> torch.Tensor:
    """Grid indices ``[n, 64]`` to magnitudes float32 ``[n, 8, 32]`` (by sub-block)."""
    return grid_values(qtype, index.device)[index].view(-1, _SUBS, 32)


class IQ3_XXS(BlockFormat, qtype=GGMLType.IQ3_XXS):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        b = cls.field(blocks, "scales_signs").to(torch.int64).view(n, _SUBS, 4)
        aux = b[..., 0] | b[..., 1] << 8 | b[..., 2] << 16 | b[..., 3] << 24        # [n, 8]
        db = cls.f16(blocks, "d") * ((aux >> 28).to(torch.float32) + 0.5) * 0.5     # [n, 8]
        shifts = torch.arange(0, 28, 7, dtype=torch.int64, device=blocks.device)
        codes = (aux.unsqueeze(-1) >> shifts) & 127                                  # [n, 8, 4]
        negative = _ksign_negative(blocks.device)[codes].view(n, _SUBS, 32)
        v = _grid(cls.qtype, cls.field(blocks, "qs").long()).mul_(db.unsqueeze(-1))
        return torch.where(negative, -v, v).view(n, QK_K)


class IQ3_S(BlockFormat, qtype=GGMLType.IQ3_S):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        sc = cls.field(blocks, "scales")
        s = torch.stack((sc & 0x0F, sc >> 4), dim=-1).view(n, _SUBS).to(torch.float32)
        db = cls.f16(blocks, "d") * (1 + 2 * s)                                     # [n, 8]
        high = _bits(cls.field(blocks, "qh").long()).view(n, QK_K // 4)
        index = cls.field(blocks, "qs").long() | high.long() << 8
        negative = _bits(cls.field(blocks, "signs")).view(n, _SUBS, 32)
        v = _grid(cls.qtype, index).mul_(db.unsqueeze(-1))
        return torch.where(negative, -v, v).view(n, QK_K)
