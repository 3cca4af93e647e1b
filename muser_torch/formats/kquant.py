"""The K-quant super-blocks: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256 elements each).

Q4_K, 144 bytes                       Q5_K, 176 bytes
  0x00  2  d     f16 super-scale        0x00  2  d
  0x02  2  dmin  f16 super-min          0x02  2  dmin
  0x04 12  scales (8 x 6-bit sc, m)     0x04 12  scales
  0x10 128 qs    256 nibbles            0x10 32  qh  fifth bit of each element
                                        0x30 128 qs
  y = d*sc_j * q - dmin*m_j, sub-block j = 32 elements.
  In each 64-element group g, qs[32g + l] holds element 64g + l (low nibble,
  sub-block 2g) and element 64g + 32 + l (high nibble, sub-block 2g + 1);
  Q5_K's bit j of qh[l] is the fifth bit of element 32j + l.

The 6-bit scale strip, one row per byte (docs/muse-glimmer.md works one block by hand):

  byte      b7 b6 | b5 .. b0
  0..3      sc4..7 hi2 | sc0..3
  4..7      m4..7  hi2 | m0..3
  8..11     m4..7 lo4 (b7..b4) | sc4..7 lo4 (b3..b0)

Q6_K, 210 bytes: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 sc[16]
(sub-blocks of 16), d f16 last. Per 128-element half h and l in 0..31:
  q[l]      = ql[64h + l]      & 0xF | ((qh[32h + l] >> 0) & 3) << 4
  q[l + 32] = ql[64h + l + 32] & 0xF | ((qh[32h + l] >> 2) & 3) << 4
  q[l + 64] = ql[64h + l]      >> 4  | ((qh[32h + l] >> 4) & 3) << 4
  q[l + 96] = ql[64h + l + 32] >> 4  | ((qh[32h + l] >> 6) & 3) << 4
  y = d * sc_j * (q - 32).

Q2_K, 84 bytes                        Q3_K, 110 bytes
  0x00 16  scales  sub-block j: scale     0x00 32  hmask  third bit of each element
           in b3..b0, min in b7..b4       0x20 64  qs     2-bit codes
  0x10 64  qs      2-bit codes            0x60 12  scales 16 x 6-bit, signed (-32)
  0x50  2  d                              0x6C  2  d
  0x52  2  dmin
  Both cut 256 elements into 16 sub-blocks of 16. In 128-element half h,
  element 128h + 32j + m (m < 32) is bits 2j..2j+1 of qs[32h + m]; Q3_K's
  bit 4h + j of hmask[m] set means "no -4".
  Q2_K: y = (d*sc_j) * q - (dmin*m_j), q in 0..3.
  Q3_K: y = (d*(s_j - 32)) * (q - 4*!hbit), the 6-bit s_j packed as:
    byte      b7..b4     | b3..b0
    0..7      s8..15 lo4 | s0..7 lo4
    8..11     bits 2k..2k+1 of byte 8 + i are the top 2 bits of s(4k + i)

Dequantization multiplies in gguf/ggml's order, ``(d*sc)*q - (dmin*m)``, in
float32, so results are bit-identical to both.

Quantization ports ggml's ``quantize_row_q{2,3,4,5,6}_K_ref`` (no importance
matrix) and ``quantize_row_q{2,3,4,5,6}_K_impl`` (with one), byte for byte; the
scale searches live in kquant_search.py.
"""
from __future__ import annotations

import torch

from .kquant_search import (div_rn, make_q3_quants, make_qkx_quants, make_qp_quants, make_qx_quants,
                            nearest_int, rdiv, run_chunks, seq_sum, sqrt_rn)
from .registry import (BlockFormat, f16_bytes, f16_field, field_of, fifth_bits, join_nibbles,
                       nibbles_into, split_nibbles)
from .types import QK_K, GGMLType

# Super-blocks quantized at once. The Q4_K/Q5_K search holds a few
# [32, 8 * chunk] float32 temporaries; 1024 (about 1 MB each) balances
# per-op overhead against cache misses (measured on a 2-core Zen 4).
_CHUNK = 1024
_SUB = 32           # elements per Q4_K / Q5_K sub-block (8 per super-block)
_SUB6 = 16          # elements per Q6_K sub-block (16 per super-block)


def _chunked(fn, blocks: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    starts = range(0, blocks.shape[0], _CHUNK)
    parts = run_chunks(lambda s: fn(blocks[s:s + _CHUNK],
                                    None if weights is None else weights[s:s + _CHUNK]),
                       starts, blocks.device)
    return torch.cat(parts) if len(parts) != 1 else parts[0]


def unpack_scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 ``[n, 12]`` to the 6-bit (sc, m) of the 8 sub-blocks, each ``[n, 8]``."""
    lo_sc, lo_m, mixed = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat((lo_sc & 0x3F, (mixed & 0x0F) | ((lo_sc >> 2) & 0x30)), dim=1)
    m = torch.cat((lo_m & 0x3F, (mixed >> 4) | ((lo_m >> 2) & 0x30)), dim=1)
    return sc, m


def pack_scale_min_k4(sc: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`unpack_scale_min_k4`: 6-bit ``[n, 8]`` pairs to uint8 ``[n, 12]``."""
    sc, m = sc.to(torch.uint8), m.to(torch.uint8)
    lo_sc = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    lo_m = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    mixed = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    return torch.cat((lo_sc, lo_m, mixed), dim=1)


def _asymmetric(blocks: torch.Tensor, q: torch.Tensor, qtype: GGMLType) -> torch.Tensor:
    """Shared tail of Q4_K and Q5_K: uint8 codes ``[n, 8, 32]`` to float32 ``[n, 256]``,
    converted once and scaled in place: ``(d*sc) * q - (dmin*m)``."""
    n = blocks.shape[0]
    at = qtype.layout.field
    d, dmin = f16_field(blocks, at("d").offset), f16_field(blocks, at("dmin").offset)
    sc, m = unpack_scale_min_k4(field_of(blocks, qtype, "scales"))
    scale = (d * sc.to(torch.float32)).unsqueeze(-1)
    shift = (dmin * m.to(torch.float32)).unsqueeze(-1)
    return q.to(torch.float32).mul_(scale).sub_(shift).reshape(n, QK_K)


def _nibble_codes(qs: torch.Tensor) -> torch.Tensor:
    """qs ``[n, 128]`` to uint8 codes ``[n, 8, 32]``: in 64-element group g,
    sub-block 2g takes the low nibbles of qs[32g : 32g+32], 2g+1 the high."""
    codes = torch.empty((qs.shape[0], 8, _SUB), dtype=torch.uint8, device=qs.device)
    split_nibbles(qs.unflatten(1, (4, _SUB)), codes.view(-1, 4, 2, _SUB))
    return codes


# ggml's make_qkx2_quants arguments (rmin, rdelta, nstep) in the ref paths.
_REF_SEARCH = {15: (-1.0, 0.1, 20), 31: (-0.5, 0.1, 15)}


def _search_asymmetric(x: torch.Tensor, qw: torch.Tensor | None, nmax: int):
    """Search and finish Q4_K / Q5_K super-blocks ``x`` ``[n, 256]``.

    Returns (codes uint8 ``[n, 8, 32]``, head uint8 ``[n, 16]`` = d, dmin,
    the 12 scale bytes); the caller packs the codes."""
    n = x.shape[0]
    sub = x.reshape(n * 8, _SUB)
    if qw is None:
        # quantize_row_q*_K_ref: weights av_x + |x| from each sub-block's RMS.
        st = sub.t()
        av_x = sqrt_rn(seq_sum(st * st) / _SUB).view(-1, 1)
        codes, scales, mins = make_qkx_quants(sub, av_x + sub.abs(), nmax, *_REF_SEARCH[nmax])
        scales, mins = scales.view(n, 8), mins.view(n, 8)
        max_scale, max_min = _positive_max(scales), _positive_max(mins)
        ls = _six_bit(max_scale, scales)
        lm = _six_bit(max_min, mins)
        d, dmin = div_rn(max_scale, 63), div_rn(max_min, 63)
    else:
        # quantize_row_q*_K_impl: imatrix times sqrt(sigma2 + x*x), sigma2 from
        # the super-block; then the 8 scales and mins get their own weighted search.
        xt = x.t()
        sigma2 = (2 * seq_sum(xt * xt) / QK_K).view(-1, 1, 1)
        w = qw.view(n, 8, _SUB) * sqrt_rn(sigma2 + x.view(n, 8, _SUB) * x.view(n, 8, _SUB))
        sw = seq_sum(w.permute(2, 0, 1))                   # [n, 8], in element order
        codes, scales, mins = make_qkx_quants(sub, w.reshape(n * 8, _SUB), nmax, -0.9, 0.05, 36)
        ls, d = make_qp_quants(scales.view(n, 8), sw, 63)
        lm, dmin = make_qp_quants(mins.view(n, 8), sw, 63)
        if nmax == 31:
            # Q5_K clamps the codes; Q4_K stores them as they are (ggml's asymmetry).
            ls, lm = ls.clamp(max=63), lm.clamp(max=63)
        d, dmin = d.view(-1, 1), dmin.view(-1, 1)
    d16, dmin16 = d.to(torch.float16), dmin.to(torch.float16)
    scale_bytes = pack_scale_min_k4(ls, lm)
    # ggml re-reads sc, m from the packed bytes before the final rounding.
    sc, m = unpack_scale_min_k4(scale_bytes)
    dd = (d16.to(torch.float32) * sc.to(torch.float32)).unsqueeze(-1)
    dm = (dmin16.to(torch.float32) * m.to(torch.float32)).unsqueeze(-1)
    final = nearest_int((x.view(n, 8, _SUB) + dm) / dd).clamp_(0, nmax)
    # Where d*sc is zero ggml keeps the codes of the search.
    codes = torch.where(dd != 0, final, codes.view(n, 8, _SUB).to(torch.float32)).to(torch.uint8)
    head = torch.cat((f16_bytes(d16), f16_bytes(dmin16), scale_bytes), dim=1)
    return codes, head


def _positive_max(v: torch.Tensor) -> torch.Tensor:
    """ggml's running ``if (v > top) top = v`` from +0: the row max, or +0."""
    top = v.amax(1, keepdim=True)
    return torch.where(top > 0, top, torch.zeros_like(top))


def _scale_codes(top: torch.Tensor, values: torch.Tensor, levels: int) -> torch.Tensor:
    """The ref paths' sub-block scale codes: ``nearest_int(levels/top * v)``, 0
    where top is 0, as int64 (the caller stores them as ggml does)."""
    inv = torch.where(top > 0, rdiv(float(levels), top), torch.zeros_like(top))
    return nearest_int(inv * values).to(torch.int64)


def _six_bit(top: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """ggml's ``MIN(63, (uint8_t)nearest_int(63/top * v))`` for the ref path."""
    return torch.remainder(_scale_codes(top, values, 63), 256).clamp_(max=63).to(torch.uint8)


def _low_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Codes [n, 8, 32] to qs [n, 128]: sub-block 2g low nibble, 2g + 1 high."""
    return join_nibbles(codes.reshape(-1, 4, 2, _SUB)).reshape(-1, QK_K // 2)


class _KQuant(BlockFormat):
    """Quantizes super-blocks in chunks through the subclass's ``_quantize(x, qw)``."""

    @classmethod
    def quantize_blocks(cls, blocks, weights):
        return _chunked(cls._quantize, blocks, weights)


class Q4_K(_KQuant, qtype=GGMLType.Q4_K):
    @classmethod
    def dequantize_blocks(cls, blocks):
        return _asymmetric(blocks, _nibble_codes(cls.field(blocks, "qs")), cls.qtype)

    @staticmethod
    def _quantize(x, qw):
        codes, head = _search_asymmetric(x, qw, 15)
        return torch.cat((head, _low_nibbles(codes)), dim=1)


class Q5_K(_KQuant, qtype=GGMLType.Q5_K):
    @classmethod
    def dequantize_blocks(cls, blocks):
        # qh byte l, bit j is the fifth bit of element 32j + l.
        fifth = fifth_bits(cls.field(blocks, "qh")).transpose(1, 2)    # [n, j, l]
        return _asymmetric(blocks, _nibble_codes(cls.field(blocks, "qs")).bitwise_or_(fifth),
                          cls.qtype)

    @staticmethod
    def _quantize(x, qw):
        codes, head = _search_asymmetric(x, qw, 31)
        shifts = torch.arange(8, dtype=torch.uint8, device=x.device).view(1, 8, 1)
        qh = ((codes >> 4) << shifts).sum(1, dtype=torch.uint8)   # bit j: sub-block j
        return torch.cat((head, qh, _low_nibbles(codes)), dim=1)


def q6_k_codes(blocks: torch.Tensor) -> torch.Tensor:
    """The unsigned 6-bit codes of Q6_K blocks, uint8 ``[n, 256]`` in element order."""
    n = blocks.shape[0]
    ql = field_of(blocks, GGMLType.Q6_K, "ql").unflatten(1, (2, 2, 32))   # [n, half, run, l]
    qh = field_of(blocks, GGMLType.Q6_K, "qh").unflatten(1, (2, 1, 32))   # [n, half, 1, l]
    codes = torch.empty((n, 2, 4, 32), dtype=torch.uint8, device=blocks.device)
    # parts 0, 1 (l, l + 32) take the low nibbles of the two runs, parts 2, 3 the high
    nibbles_into(ql, codes[:, :, :2], codes[:, :, 2:])
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=blocks.device).view(1, 1, 4, 1)
    codes |= ((qh >> shifts) & 3) << 4
    return codes.view(n, QK_K)


class Q6_K(_KQuant, qtype=GGMLType.Q6_K):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = cls.f16(blocks, "d")
        sc = cls.field(blocks, "scales").view(torch.int8).to(torch.float32)
        q = q6_k_codes(blocks).view(torch.int8).sub_(32).to(torch.float32)
        return q.view(n, 16, 16).mul_((d * sc).unsqueeze(-1)).reshape(n, QK_K)

    @staticmethod
    def _quantize(x, qw):
        n = x.shape[0]
        sub = x.reshape(n * 16, _SUB6)
        # ggml's _impl passes the imatrix itself as the weights (no sigma2 term).
        codes, scales = make_qx_quants(sub, None if qw is None else qw.reshape(n * 16, _SUB6), 32)
        scales = scales.view(n, 16)
        top = scales.gather(1, scales.abs().argmax(1, keepdim=True))   # first largest |scale|
        zero = top.abs() < 1e-15
        iscale = rdiv(-128.0, top)
        d16 = rdiv(1.0, iscale).to(torch.float16)
        sc = nearest_int(iscale * scales).clamp_(max=127)
        dd = (d16.to(torch.float32) * sc).unsqueeze(-1)
        final = nearest_int(x.view(n, 16, _SUB6) / dd).clamp_(-32, 31) + 32
        codes = torch.where(dd != 0, final, codes.view(n, 16, _SUB6).to(torch.float32))
        codes = codes.to(torch.uint8).view(n, 2, 4, 32)          # [n, half, part, l]
        lo = codes & 0x0F
        ql = torch.cat((lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)), dim=2)
        shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=x.device).view(1, 1, 4, 1)
        qh = ((codes >> 4) << shifts).sum(2, dtype=torch.uint8)  # [n, half, 32]
        out = torch.cat((ql.reshape(n, 128), qh.reshape(n, 64),
                         sc.to(torch.int8).view(torch.uint8), f16_bytes(d16)),
                        dim=1)
        # An all-zero super-block (every scale below ggml's epsilon) is all zero bytes.
        return torch.where(zero, torch.zeros_like(out), out)


# ---- the 2- and 3-bit K-quants: 16 sub-blocks of 16 ------------------------------------

_SHIFTS2 = (0, 2, 4, 6)


def crumb_codes(qs: torch.Tensor) -> torch.Tensor:
    """qs ``[n, 64]`` to the 2-bit codes of Q2_K / Q3_K, uint8 ``[n, 256]`` in
    element order: element 128h + 32j + m is bits 2j.. of qs[32h + m]."""
    shifts = torch.tensor(_SHIFTS2, dtype=torch.uint8, device=qs.device).view(1, 1, 4, 1)
    return ((qs.view(-1, 2, 1, 32) >> shifts) & 3).reshape(-1, QK_K)


def _pack_crumbs(codes: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`crumb_codes`: codes 0..3 ``[n, 256]`` to qs ``[n, 64]``."""
    shifts = torch.tensor(_SHIFTS2, dtype=torch.uint8, device=codes.device).view(1, 1, 4, 1)
    return (codes.to(torch.uint8).view(-1, 2, 4, 32) << shifts).sum(2, dtype=torch.uint8).view(-1, 64)


def q3_k_scales(scales: torch.Tensor) -> torch.Tensor:
    """The 12 scale bytes of Q3_K blocks to the 16 unsigned 6-bit scales
    ``[n, 16]`` (int16; the signed scale is this minus 32)."""
    lo = torch.cat((scales[:, :8] & 0x0F, scales[:, :8] >> 4), dim=1)
    shifts = torch.tensor(_SHIFTS2, dtype=torch.uint8, device=scales.device).view(1, 4, 1)
    hi = ((scales[:, None, 8:12] >> shifts) & 3).reshape(-1, 16)
    return (lo | (hi << 4)).to(torch.int16)


def _pack_q3_k_scales(s6: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`q3_k_scales`: 6-bit ``[n, 16]`` to the 12 bytes."""
    s6 = s6.to(torch.uint8)
    lo = s6 & 0x0F
    shifts = torch.tensor(_SHIFTS2, dtype=torch.uint8, device=s6.device).view(1, 4, 1)
    hi = ((s6 >> 4).view(-1, 4, 4) << shifts).sum(1, dtype=torch.uint8)
    return torch.cat((lo[:, :8] | (lo[:, 8:] << 4), hi), dim=1)


def q3_k_codes(blocks: torch.Tensor) -> torch.Tensor:
    """The signed codes (-4..3) of Q3_K blocks, int8 ``[n, 256]`` in element order."""
    low = crumb_codes(field_of(blocks, GGMLType.Q3_K, "qs")).view(torch.int8)
    hm = field_of(blocks, GGMLType.Q3_K, "hmask")
    bits = torch.arange(8, dtype=torch.uint8, device=blocks.device).view(1, 8, 1)
    high = ((hm.unsqueeze(1) >> bits) & 1).reshape(-1, QK_K).view(torch.int8)   # bit e // 32 of hm[e % 32]
    return low - 4 + 4 * high


def _sub16_sums(t: torch.Tensor) -> torch.Tensor:
    """``[n, 256]`` to the in-order sums of its 16 sub-blocks, ``[n, 16]``."""
    return seq_sum(t.view(-1, 16, 16).permute(2, 0, 1))


class Q2_K(_KQuant, qtype=GGMLType.Q2_K):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        sc = cls.field(blocks, "scales")
        dl = (cls.f16(blocks, "d") * (sc & 0x0F).to(torch.float32)).unsqueeze(-1)
        ml = (cls.f16(blocks, "dmin") * (sc >> 4).to(torch.float32)).unsqueeze(-1)
        q = crumb_codes(cls.field(blocks, "qs")).to(torch.float32).view(n, 16, 16)
        return q.mul_(dl).sub_(ml).reshape(n, QK_K)

    @staticmethod
    def _quantize(x, qw):
        n = x.shape[0]
        sub = x.reshape(n * 16, 16)
        if qw is None:
            # quantize_row_q2_K_ref: weights |x|, the absolute error, then the
            # 16 scales and mins to 4 bits against the largest of each.
            codes, scales, mins = make_qkx_quants(sub, sub.abs(), 3, -0.5, 0.1, 15, use_mad=True)
            scales, mins = scales.view(n, 16), mins.view(n, 16)
            max_scale, max_min = _positive_max(scales), _positive_max(mins)
            ls = _scale_codes(max_scale, scales, 15)
            lm = _scale_codes(max_min, mins, 15)
            d, dmin = div_rn(max_scale, 15), div_rn(max_min, 15)
        else:
            # quantize_row_q2_K_impl: imatrix times sqrt(sigma2 + x*x), then a
            # weighted search of the scales and mins (4 bits each).
            sigma2 = (seq_sum(x.t() * x.t()) / QK_K).view(-1, 1)
            w = qw * sqrt_rn(sigma2 + x * x)
            sw = _sub16_sums(w)
            codes, scales, mins = make_qkx_quants(sub, w.reshape(n * 16, 16), 3, -0.9, 0.05, 36)
            ls, d = make_qp_quants(scales.view(n, 16), sw, 15)
            lm, dmin = make_qp_quants(mins.view(n, 16), sw, 15)
            ls, lm = ls.to(torch.int64), lm.to(torch.int64)
            d, dmin = d.view(-1, 1), dmin.view(-1, 1)
        # ggml stores the codes in uint8: (l | m << 4) wraps.
        sc_bytes = ((ls | (lm << 4)) & 0xFF).to(torch.uint8)
        d16, dmin16 = d.to(torch.float16), dmin.to(torch.float16)
        dd = (d16.to(torch.float32) * (sc_bytes & 0x0F).to(torch.float32)).unsqueeze(-1)
        dm = (dmin16.to(torch.float32) * (sc_bytes >> 4).to(torch.float32)).unsqueeze(-1)
        final = nearest_int((x.view(n, 16, 16) + dm) / dd).clamp_(0, 3)
        # Where d*sc is zero ggml keeps the codes of the search.
        codes = torch.where(dd != 0, final, codes.view(n, 16, 16).to(torch.float32))
        return torch.cat((sc_bytes, _pack_crumbs(codes.view(n, QK_K)), f16_bytes(d16),
                          f16_bytes(dmin16)), dim=1)


class Q3_K(_KQuant, qtype=GGMLType.Q3_K):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        s = (q3_k_scales(cls.field(blocks, "scales")) - 32).to(torch.float32)
        dl = (cls.f16(blocks, "d") * s).unsqueeze(-1)
        q = q3_k_codes(blocks).to(torch.float32).view(n, 16, 16)
        return q.mul_(dl).reshape(n, QK_K)

    @staticmethod
    def _quantize(x, qw):
        n = x.shape[0]
        sub = x.reshape(n * 16, 16)
        if qw is None:
            # quantize_row_q3_K_ref: each sub-block by make_q3_quants, the
            # scales to 6 bits against the one of largest magnitude.
            codes, scales = make_q3_quants(sub, 4)
            scales = scales.view(n, 16)
            top = scales.gather(1, scales.abs().argmax(1, keepdim=True))   # first largest |scale|
            iscale = torch.where(top != 0, rdiv(-32.0, top), torch.zeros_like(top))
            s6 = (nearest_int(iscale * scales).clamp_(-32, 31) + 32)
            s6 = torch.where(top != 0, s6, torch.zeros_like(s6))
            d = torch.where(top != 0, rdiv(1.0, iscale), torch.zeros_like(top))
        else:
            # quantize_row_q3_K_impl: imatrix times sqrt(sigma2 + x*x) weights
            # every search, the scales' own included (weighted by their sums).
            sigma2 = (2 * seq_sum(x.t() * x.t()) / QK_K).view(-1, 1)
            w = qw * sqrt_rn(sigma2 + x * x)
            codes, scales = make_qx_quants(sub, w.reshape(n * 16, 16), 4)
            s6, d = make_qx_quants(scales.view(n, 16), _sub16_sums(w), 32)
            d = d.view(-1, 1)
        scale_bytes = _pack_q3_k_scales(s6)
        d16 = d.to(torch.float16)
        dd = (d16.to(torch.float32) * (q3_k_scales(scale_bytes) - 32).to(torch.float32)).unsqueeze(-1)
        final = nearest_int(x.view(n, 16, 16) / dd).clamp_(-4, 3) + 4
        # Where d*sc is zero ggml keeps the codes of the search.
        codes = torch.where(dd != 0, final, codes.view(n, 16, 16).to(torch.float32))
        codes = codes.to(torch.uint8).view(n, QK_K)
        high = codes > 3                                  # the "no -4" bit
        bits = torch.arange(8, dtype=torch.uint8, device=x.device).view(1, 8, 1)
        hmask = (high.to(torch.uint8).view(n, 8, 32) << bits).sum(1, dtype=torch.uint8)
        low = torch.where(high, codes - 4, codes)
        return torch.cat((hmask, _pack_crumbs(low), scale_bytes, f16_bytes(d16)), dim=1)
