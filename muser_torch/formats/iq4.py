"""ggml's 4-bit non-linear formats: IQ4_NL (32 elements) and IQ4_XS (256).

Both store 4-bit indices into one table of 16 signed values (``IQ4_VALUES``
in layout.py, ggml's ``kvalues_iq4nl``), denser near zero than a uniform grid.

IQ4_NL, 18 bytes                     IQ4_XS, 136 bytes
  0x00  2  d   f16 scale               0x00  2  d         f16 super-scale
  0x02 16  qs  32 nibbles              0x02  2  scales_h  u16 LE: 2 high bits of sub-block j's
                                                          scale at bits 2j..2j+1
                                       0x04  4  scales_l  low 4 bits: sub-block j at byte j/2,
                                                          nibble j%2 (low first)
                                       0x08 128 qs        16 bytes per 32-element sub-block
  y = d * v[q]                         y = (d * (ls_j - 32)) * v[q], ls_j the 6-bit scale
In every 32 elements, qs byte j holds element j (low nibble) and j + 16 (high).

Quantization ports ggml's ``quantize_row_iq4_nl_impl`` as ``ggml_quantize_chunk``
runs it (``quantize_iq4_nl`` / ``quantize_iq4_xs``: 7 scale trials each way,
with or without an importance matrix), byte for byte, in ggml's float order
(``kquant_search`` says how).
"""
from __future__ import annotations

import functools

import torch

from .kquant_search import GROUP_MAX_EPS, div_rn, nearest_int, rdiv, run_chunks, seq_sum, sqrt_rn
from .registry import BlockFormat, f16_bytes, join_nibbles, split_nibbles
from .layout import IQ4_VALUES, QK_IQ4_NL
from .types import QK_K, GGMLType

_SUB = 32                 # elements per scale (IQ4_NL's block, IQ4_XS's sub-block)
_XS_SUBS = QK_K // _SUB   # sub-blocks per IQ4_XS super-block
_NTRY = 7                 # ggml's scale trials on each side (quantize_iq4_nl / _xs)
_CHUNK = 1024             # scale groups searched at once (bounds the [15, 32, chunk] temporaries)


@functools.lru_cache(maxsize=None)
def iq4_table(device: torch.device) -> torch.Tensor:
    """float32 ``[16]``: the values of the 16 codes (read it, never write it)."""
    return torch.tensor(IQ4_VALUES, dtype=torch.float32, device=device)


def _codes(qs: torch.Tensor) -> torch.Tensor:
    """qs ``[n, k, 16]`` to codes uint8 ``[n, k, 32]`` (low nibbles, then high)."""
    out = torch.empty((*qs.shape[:-1], 2, 16), dtype=torch.uint8, device=qs.device)
    return split_nibbles(qs, out).reshape(*qs.shape[:-1], _SUB)


def xs_scales(blocks: torch.Tensor) -> torch.Tensor:
    """The eight 6-bit sub-block scales of IQ4_XS blocks, minus 32, as float32 ``[n, 8]``."""
    qtype = GGMLType.IQ4_XS
    h = blocks[:, qtype.layout.span("scales_h")].to(torch.int32)
    high = h[:, 0] | (h[:, 1] << 8)                                             # [n]
    low = blocks[:, qtype.layout.span("scales_l")]                              # [n, 4]
    low = torch.stack((low & 0x0F, low >> 4), dim=-1).reshape(-1, _XS_SUBS).to(torch.int32)
    shifts = torch.arange(0, 2 * _XS_SUBS, 2, dtype=torch.int32, device=blocks.device)
    ls = low | (((high.unsqueeze(-1) >> shifts) & 3) << 4)
    return (ls - 32).to(torch.float32)


class IQ4_NL(BlockFormat, qtype=GGMLType.IQ4_NL):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        v = iq4_table(blocks.device)[_codes(cls.field(blocks, "qs").view(n, 1, 16)).long()]
        return v.view(n, _SUB).mul_(cls.f16(blocks, "d"))

    @classmethod
    def quantize_blocks(cls, blocks, weights):
        return _chunked(blocks, weights, super_block=QK_IQ4_NL)


class IQ4_XS(BlockFormat, qtype=GGMLType.IQ4_XS):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        dl = cls.f16(blocks, "d") * xs_scales(blocks)                            # [n, 8]
        v = iq4_table(blocks.device)[_codes(cls.field(blocks, "qs").view(n, _XS_SUBS, 16)).long()]
        return v.mul_(dl.unsqueeze(-1)).view(n, QK_K)

    @classmethod
    def quantize_blocks(cls, blocks, weights):
        return _chunked(blocks, weights, super_block=QK_K)


# ---- quantization ------------------------------------------------------------------

def _chunked(blocks: torch.Tensor, weights: torch.Tensor | None, super_block: int) -> torch.Tensor:
    step = max(1, _CHUNK * _SUB // super_block)
    parts = run_chunks(lambda s: _quantize(blocks[s:s + step],
                                           None if weights is None else weights[s:s + step]),
                       range(0, blocks.shape[0], step), blocks.device)
    return torch.cat(parts) if len(parts) != 1 else parts[0]


def best_index(x: torch.Tensor) -> torch.Tensor:
    """ggml's ``best_index_int8`` over ``IQ4_VALUES``: the nearest value's code
    (int64), the lower one on ties, 0 and 15 beyond the ends."""
    vals = iq4_table(x.device)
    mu = (x.unsqueeze(-1) >= vals).sum(-1).clamp_(1, 15)       # first value above x
    below, above = vals[mu - 1], vals[mu]
    idx = torch.where(x - below < above - x, mu - 1, mu)
    idx = torch.where(x <= vals[0], 0, idx)
    return torch.where(x >= vals[15], 15, idx)


def _fit(x: torch.Tensor, w: torch.Tensor, inv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sumqx, sumq2) of the codes chosen at inverse scale ``inv``: position-major
    ``x``, ``w`` ``[32, g]``, ``inv`` ``[..., g]``; sums in element order."""
    q = iq4_table(x.device)[best_index(inv.unsqueeze(-2) * x)]                 # [..., 32, g]
    wq = w * q
    return seq_sum((wq * x).movedim(-2, 0)), seq_sum((wq * q).movedim(-2, 0))


def _group_scales(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The scale ggml settles on for each 32-element group: position-major
    ``x``, ``w`` ``[32, g]`` to float32 ``[g]`` (0 for a group under GROUP_MAX_EPS)."""
    amax, first = x.abs().max(0)            # the first largest magnitude (ggml's strict >)
    mx = x.gather(0, first.unsqueeze(0)).squeeze(0)
    live = amax >= GROUP_MAX_EPS
    mx = torch.where(live, mx, torch.ones_like(mx))
    d = div_rn(mx, 127.0)                   # ggml: -max / values[0]
    sumqx, sumq2 = _fit(x, w, rdiv(1.0, d))
    d = torch.where(sumq2 > 0, sumqx / sumq2, torch.zeros_like(sumqx))
    best = d * sumqx
    trials = torch.arange(-_NTRY, _NTRY + 1, dtype=torch.float32, device=x.device) + IQ4_VALUES[0]
    sx, s2 = _fit(x, w, trials.unsqueeze(-1) / mx)                             # [15, g]
    for t in range(2 * _NTRY + 1):           # a running best, as ggml's loop
        better = (s2[t] > 0) & (sx[t] * sx[t] > best * s2[t])
        d = torch.where(better, sx[t] / s2[t], d)
        best = torch.where(better, d * sx[t], best)
    return torch.where(live, d, torch.zeros_like(d))


def _quantize(blocks: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    n, size = blocks.shape
    subs = size // _SUB
    xt = blocks.t()                                                              # [size, n]
    sigma2 = seq_sum(xt * xt) * (2.0 / size)
    x = blocks.view(n * subs, _SUB).t()                                          # [32, g]
    if weights is None:
        w = x * x
    else:
        s2 = sigma2.repeat_interleave(subs).unsqueeze(0)
        w = weights.reshape(n * subs, _SUB).t() * sqrt_rn(s2 + x * x)
    scales = _group_scales(x, w).view(n, subs)
    if subs == 1:                                                                # IQ4_NL
        d = scales
        inv = torch.where(d != 0, rdiv(1.0, d), torch.zeros_like(d))
        head = f16_bytes(d)
        step = inv                                                               # [n, 1]
    else:                                                                        # IQ4_XS
        first = scales.abs().argmax(-1, keepdim=True)    # the first largest, ggml's strict >
        top = scales.gather(1, first)
        d = -torch.where(top != 0, top, torch.zeros_like(top)) / 32.0           # [n, 1]
        inv = torch.where(d != 0, rdiv(1.0, d), torch.zeros_like(d))
        ls = nearest_int(inv * scales).clamp_(-32, 31)                           # [n, 8]
        dl = d * ls
        step = torch.where(dl != 0, rdiv(1.0, dl), torch.zeros_like(dl))
        head = torch.cat((f16_bytes(d), _pack_xs_scales((ls + 32).to(torch.int32))), dim=1)
    codes = best_index(step.unsqueeze(-1) * blocks.view(n, subs, _SUB))          # [n, subs, 32]
    qs = join_nibbles(codes.view(n, subs, 2, 16)).reshape(n, size // 2)
    return torch.cat((head, qs), dim=1)


def _pack_xs_scales(ls: torch.Tensor) -> torch.Tensor:
    """6-bit scales int32 ``[n, 8]`` to scales_h (u16 LE) and scales_l: uint8 ``[n, 6]``."""
    shifts = torch.arange(0, 2 * _XS_SUBS, 2, dtype=torch.int32, device=ls.device)
    high = ((ls >> 4) << shifts).sum(-1)
    low = ls & 0x0F
    scales_l = low[:, 0::2] | (low[:, 1::2] << 4)
    head = torch.stack((high & 0xFF, high >> 8), dim=-1)
    return torch.cat((head, scales_l), dim=1).to(torch.uint8)
