"""The 32-element symmetric/asymmetric formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

Field order is ggml's struct order (d, [m], [qh], qs). In a 32-element block,
qs byte j holds element j in its low nibble and element j + 16 in its high
nibble; for the 5-bit types bit j of the little-endian u32 ``qh`` is the fifth
bit of element j.

Quantizers port ggml's ``quantize_row_*_ref`` (no importance matrix) and
``quantize_row_*_impl`` (with one) and match ggml byte for byte. The
weighted paths scale the imatrix by ``sqrt(sigma2 + x*x)`` where sigma2 is
the mean square of the whole row, so ``quantize_rows`` computes it per row;
``quantize_blocks`` with weights treats each block as its own row.
"""
from __future__ import annotations

import torch

from .kquant_search import div_rn, make_qkx_quants, make_qx_quants, rdiv, seq_sum, sqrt_rn
from .registry import BlockFormat, f16_bytes, fifth_bits, join_nibbles, split_nibbles
from .types import QK_LEGACY, GGMLType

_HALF = QK_LEGACY // 2    # qs byte j holds elements j and j + _HALF

# Rows of blocks quantized at once: bounds the temporaries of the searches.
_CHUNK_BLOCKS = 1 << 14


# Dequantization writes codes straight into the float32 output in as few
# full passes as it can (byte ops on the packed data are cheap; every pass
# over the float output costs), then scales in place. The arithmetic is
# gguf's: d * (q - 8) with q - 8 exact, d * q + m.

def _nibble_codes(qs: torch.Tensor) -> torch.Tensor:
    """The codes of qs ``[n, 16]`` as uint8 ``[n, 32]``: element j from the
    low nibble of byte j, element j + 16 from the high."""
    out = torch.empty((qs.shape[0], QK_LEGACY), dtype=torch.uint8, device=qs.device)
    split_nibbles(qs, out.view(-1, 2, _HALF))
    return out


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """uint8 ``[n, 4]`` (a LE u32) to ``bit j << 4`` for the 32 elements, uint8 ``[n, 32]``."""
    return fifth_bits(qh).reshape(qh.shape[0], QK_LEGACY)


def _to_float(codes: torch.Tensor) -> torch.Tensor:
    return codes.to(torch.float32)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """Codes ``[n, 32]`` (low 4 bits used) to qs ``[n, 16]``: element j low, j + 16 high."""
    return join_nibbles(q.reshape(-1, 2, _HALF))


def _pack_high_bits(q: torch.Tensor) -> torch.Tensor:
    """Bit 4 of 32 codes to the little-endian u32 ``qh`` as uint8 ``[n, 4]``."""
    fifth = ((q.to(torch.uint8) >> 4) & 1).view(-1, 4, 8)
    shifts = torch.arange(8, dtype=torch.uint8, device=q.device)
    return (fifth << shifts).sum(-1, dtype=torch.uint8)


def _trunc(v: torch.Tensor) -> torch.Tensor:
    """C's float-to-integer conversion (toward zero)."""
    return torch.trunc(v)


def _signed_absmax(x: torch.Tensor) -> torch.Tensor:
    """``[n, 1]``: the value of largest magnitude, the first one on ties (ggml's
    strict <), and +0.0 when every value is a zero of either sign (ggml's
    starting value is never replaced then)."""
    v = x.gather(1, x.abs().argmax(1, keepdim=True))
    return torch.where(v == 0, 0.0, v)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """ggml's ``id = d ? 1.0f/d : 0.0f``."""
    return torch.where(d != 0, rdiv(1.0, d), torch.zeros_like(d))


def _row_sigma2(x: torch.Tensor) -> torch.Tensor:
    """Mean square of each row ``[rows, n_in]``, summed in element order like ggml."""
    xt = x.t()
    return div_rn(seq_sum(xt * xt), x.shape[1])


def _blockwise(fn, blocks: torch.Tensor, *extra: torch.Tensor | None) -> torch.Tensor:
    """Apply ``fn`` to chunks of blocks (and matching rows of ``extra``)."""
    if blocks.shape[0] <= _CHUNK_BLOCKS:
        return fn(blocks, *extra)
    parts = []
    for s in range(0, blocks.shape[0], _CHUNK_BLOCKS):
        e = s + _CHUNK_BLOCKS
        parts.append(fn(blocks[s:e], *(None if t is None else t[s:e] for t in extra)))
    return torch.cat(parts)


class _Legacy(BlockFormat):
    """Shared weighted path: the imatrix (per element) times sqrt(sigma2 + x*x)."""

    @classmethod
    def quantize_rows(cls, x, imatrix):
        if imatrix is None:
            return super().quantize_rows(x, None)
        rows, n_in = x.shape
        per_block = n_in // cls.qtype.block_elems
        sigma2 = _row_sigma2(x).repeat_interleave(per_block).view(-1, 1)
        blocks = x.reshape(-1, cls.qtype.block_elems)
        qw = imatrix.expand(rows, n_in).reshape(-1, cls.qtype.block_elems)
        return _blockwise(cls._weighted, blocks, qw, sigma2).reshape(rows, -1)

    @classmethod
    def quantize_blocks(cls, blocks, weights):
        if weights is None:
            return _blockwise(cls._reference, blocks)
        return _blockwise(cls._weighted, blocks, weights, _row_sigma2(blocks).view(-1, 1))

    @classmethod
    def _weighted(cls, blocks, qw, sigma2):
        return cls._from_weights(blocks, qw * sqrt_rn(sigma2 + blocks * blocks))


class Q4_0(_Legacy, qtype=GGMLType.Q4_0):
    @classmethod
    def dequantize_blocks(cls, blocks):
        codes = _nibble_codes(cls.field(blocks, "qs"))
        return _to_float(codes.view(torch.int8).sub_(8)).mul_(cls.f16(blocks, "d"))

    @classmethod
    def _reference(cls, x):
        d = _signed_absmax(x) / -8
        q = _trunc(x * _inverse(d) + 8.5).clamp_(max=15)
        return torch.cat((f16_bytes(d), _pack_nibbles(q)), dim=1)

    @classmethod
    def _from_weights(cls, x, w):
        codes, d = make_qx_quants(x, w, 8)
        return torch.cat((f16_bytes(d.view(-1, 1)), _pack_nibbles(codes)), dim=1)


class Q4_1(_Legacy, qtype=GGMLType.Q4_1):
    @classmethod
    def dequantize_blocks(cls, blocks):
        codes = _nibble_codes(cls.field(blocks, "qs"))
        return _to_float(codes).mul_(cls.f16(blocks, "d")).add_(cls.f16(blocks, "m"))

    @classmethod
    def _reference(cls, x):
        lo, hi = x.amin(1, keepdim=True), x.amax(1, keepdim=True)
        d = div_rn(hi - lo, 15)
        q = _trunc((x - lo) * _inverse(d) + 0.5).clamp_(max=15)
        return torch.cat((f16_bytes(d), f16_bytes(lo), _pack_nibbles(q)), dim=1)

    @classmethod
    def _from_weights(cls, x, w):
        codes, d, the_min = make_qkx_quants(x, w, 15, -0.9, 0.05, 36)
        return torch.cat((f16_bytes(d.view(-1, 1)), f16_bytes(-the_min.view(-1, 1)),
                          _pack_nibbles(codes)), dim=1)


class Q5_0(_Legacy, qtype=GGMLType.Q5_0):
    @classmethod
    def dequantize_blocks(cls, blocks):
        codes = _nibble_codes(cls.field(blocks, "qs")).bitwise_or_(_fifth_bits(cls.field(blocks, "qh")))
        return _to_float(codes.view(torch.int8).sub_(16)).mul_(cls.f16(blocks, "d"))

    @classmethod
    def _reference(cls, x):
        d = _signed_absmax(x) / -16
        q = _trunc(x * _inverse(d) + 16.5).clamp_(max=31)
        return cls._pack(d, q)

    @classmethod
    def _from_weights(cls, x, w):
        codes, d = make_qx_quants(x, w, 16)
        return cls._pack(d.view(-1, 1), codes)

    @staticmethod
    def _pack(d, q):
        return torch.cat((f16_bytes(d), _pack_high_bits(q), _pack_nibbles(q)), dim=1)


def q5_0_as_q8_0(packed: torch.Tensor) -> torch.Tensor:
    """Q5_0 rows ``uint8 [n_out, blocks * 22]`` as Q8_0 rows ``[n_out, blocks *
    34]`` of the same values, exactly: a Q5_0 element is ``d * (q - 16)`` with q
    in 0..31, which Q8_0 holds as the int8 ``q - 16`` under the same f16 ``d``.
    A load-time trade: 55% more bytes for a kernel that reads whole bytes
    (docs/performance.md, "Q5_0 as Q8_0")."""
    n_out = packed.shape[0]
    blocks = packed.reshape(-1, GGMLType.Q5_0.block_bytes)
    codes = _nibble_codes(Q5_0.field(blocks, "qs")).bitwise_or_(_fifth_bits(Q5_0.field(blocks, "qh")))
    q8 = codes.view(torch.int8).sub_(16).view(torch.uint8)
    return torch.cat((Q5_0.field(blocks, "d"), q8), dim=1).reshape(n_out, -1)


class Q5_1(_Legacy, qtype=GGMLType.Q5_1):
    @classmethod
    def dequantize_blocks(cls, blocks):
        codes = _nibble_codes(cls.field(blocks, "qs")).bitwise_or_(_fifth_bits(cls.field(blocks, "qh")))
        return _to_float(codes).mul_(cls.f16(blocks, "d")).add_(cls.f16(blocks, "m"))

    @classmethod
    def _reference(cls, x):
        lo, hi = x.amin(1, keepdim=True), x.amax(1, keepdim=True)
        d = div_rn(hi - lo, 31)
        # ggml casts to uint8 without clamping; only bits 0..4 are stored.
        q = _trunc((x - lo) * _inverse(d) + 0.5)
        return cls._pack(d, lo, q)

    @classmethod
    def _from_weights(cls, x, w):
        codes, d, the_min = make_qkx_quants(x, w, 31, -0.9, 0.05, 36)
        return cls._pack(d.view(-1, 1), -the_min.view(-1, 1), codes)

    @staticmethod
    def _pack(d, m, q):
        return torch.cat((f16_bytes(d), f16_bytes(m), _pack_high_bits(q), _pack_nibbles(q)), dim=1)


def _round_half_away(v: torch.Tensor) -> torch.Tensor:
    """C's roundf: halves go away from zero (torch.round goes to even)."""
    t = torch.trunc(v)
    return t + torch.where((v - t).abs() >= 0.5, torch.sign(v), torch.zeros_like(v))


class Q8_0(BlockFormat, qtype=GGMLType.Q8_0):
    @classmethod
    def dequantize_blocks(cls, blocks):
        return _to_float(cls.field(blocks, "qs").view(torch.int8)).mul_(cls.f16(blocks, "d"))

    @classmethod
    def quantize_blocks(cls, blocks, weights):
        # ggml's quantize_q8_0 ignores the importance matrix.
        return _blockwise(cls._reference, blocks)

    @staticmethod
    def _reference(x):
        d = div_rn(x.abs().amax(1, keepdim=True), 127)
        q = _round_half_away(x * _inverse(d)).to(torch.int8).view(torch.uint8)
        return torch.cat((f16_bytes(d), q), dim=1)
