"""Triton kernels built on one tile decoder, for every type CUDA takes.

``_tile`` decodes ``BN`` packed rows x ``TILE`` (256) columns of any supported
type to float32 in element order; field offsets come from ``formats/layout.py``
through ``layout``. Three kernels use it:

* ``_dequant_kernel``: ``dequantize`` (rows 0..n_out) and ``embedding`` (rows
  gathered by token id). Launched with ``enable_fp_fusion=False`` so every
  product and sum rounds as in gguf's numpy ``dequantize``: bit-exact.
* ``_mv_tile_kernel``: one activation row, ``sum(tile * x)`` in float32 (the
  one-token path of every type without a K-quant kernel of its own).
* ``_qmm_kernel``: 2 or more activation rows on tensor cores. The tile is
  decoded once per program and used for all ``BM`` activation rows (``tl.dot``
  of half/bfloat16 tiles, or IEEE float32 products for float32 activations, as
  torch's matmul gives by default; float32 accumulation).

Split K: ``KB_PER`` tiles per program, dividing the row's tiles exactly; every
kernel writes each output once, so results are deterministic: ``_qmm_kernel``'s
partials are summed by ``torch.sum``; the one-token kernels' by the last
program of each row block, in split order (``_store``), so no second kernel runs. Columns past ``n_in`` (rows of
32-element blocks that do not fill the last tile) and masked rows decode to 0.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .layout import (  # noqa: F401  (every name is a tl.constexpr read by the kernels)
    BF16, F16, F32, NVFP4_E2M1, NVFP4_E2M1_BYTES, NVFP4_E2M1_QS, NVFP4_GROUP, Q2_K, Q2_K_BYTES,
    Q2_K_D, Q2_K_DMIN, Q2_K_QS, Q2_K_SCALES, Q3_K, Q3_K_BYTES, Q3_K_D, Q3_K_HMASK, Q3_K_QS,
    Q3_K_SCALES, Q4_0, Q4_0_BYTES,
    Q4_0_D, Q4_0_QS, Q4_1, Q4_1_BYTES, Q4_1_D, Q4_1_M, Q4_1_QS, Q4_K, Q4_K_BYTES, Q4_K_D,
    Q4_K_DMIN, Q4_K_QS, Q4_K_SCALES, Q5_0, Q5_0_BYTES, Q5_0_D, Q5_0_QH, Q5_0_QS, Q5_1,
    Q5_1_BYTES, Q5_1_D, Q5_1_M, Q5_1_QH, Q5_1_QS, Q5_K, Q5_K_BYTES, Q5_K_D, Q5_K_DMIN, Q5_K_QH,
    Q5_K_QS, Q5_K_SCALES, Q6_K, Q6_K_BYTES, Q6_K_D, Q6_K_QH, Q6_K_QL, Q6_K_SCALES, Q8_0,
    Q8_0_BYTES, Q8_0_D, Q8_0_QS, QK_LEGACY, TILE, IQ4_NL, IQ4_NL_BYTES, IQ4_NL_D, IQ4_NL_QS,
    IQ4_XS, IQ4_XS_BYTES, IQ4_XS_D, IQ4_XS_QS, IQ4_XS_SCALES_H, IQ4_XS_SCALES_L, MXFP4,
    MXFP4_BYTES, MXFP4_E, MXFP4_QS, IQ4_W0, IQ4_W1, IQ4_W2, IQ4_W3, IQ3_XXS, IQ3_XXS_BYTES,
    IQ3_XXS_D, IQ3_XXS_QS, IQ3_XXS_SCALES_SIGNS, IQ3_S, IQ3_S_BYTES, IQ3_S_D, IQ3_S_QS, IQ3_S_QH,
    IQ3_S_SIGNS, IQ3_S_SCALES)


# ---- field decoders ---------------------------------------------------------------

@triton.jit
def _f16_at(p, off, mask):
    """The little-endian f16 at byte offsets ``off`` of uint8 pointer ``p``, as float32."""
    lo = tl.load(p + off, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(p + off + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _k4_scale_min(lo_sc, lo_m, mixed, j):
    """6-bit (sc, m) of K-quant sub-blocks ``j`` (0..7) from bytes j % 4, 4 + j % 4
    and 8 + j % 4 of the 12-byte scale strip."""
    low = j < 4
    sc = tl.where(low, lo_sc & 63, (mixed & 0xF) | ((lo_sc >> 6) << 4))
    m = tl.where(low, lo_m & 63, (mixed >> 4) | ((lo_m >> 6) << 4))
    return sc, m


@triton.jit
def _scale_min_k4(p, sbase, j, mask):
    """(sc, m) of sub-blocks ``j`` from the 12-byte strip at byte ``sbase`` of ``p``."""
    t = j % 4
    lo_sc = tl.load(p + sbase + t, mask=mask, other=0).to(tl.int32)
    lo_m = tl.load(p + sbase + 4 + t, mask=mask, other=0).to(tl.int32)
    mixed = tl.load(p + sbase + 8 + t, mask=mask, other=0).to(tl.int32)
    return _k4_scale_min(lo_sc, lo_m, mixed, j)


@triton.jit
def _e4m3fn(b):
    """E4M3FN bytes (int32) to float32, exactly (0x7F / 0xFF are NaN)."""
    sign = (b >> 7) & 1
    e = (b >> 3) & 0xF
    m = b & 7
    normal = ((sign << 31) | ((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    sub = m.to(tl.float32) * 0.001953125
    sub = tl.where(sign == 1, -sub, sub)
    v = tl.where(e == 0, sub, normal)
    return tl.where((b & 0x7F) == 0x7F, float("nan"), v)


@triton.jit
def _e2m1(c):
    """E2M1 codes (int32, 0..15) to float32: +-{0, .5, 1, 1.5, 2, 3, 4, 6}."""
    sign = (c >> 3) & 1
    e = (c >> 1) & 3
    m = c & 1
    normal = ((e + 126) << 23) | (m << 22)
    bits = tl.where(e == 0, tl.where(m == 1, 0x3F000000, 0), normal)
    return (bits | (sign << 31)).to(tl.float32, bitcast=True)


@triton.jit
def _iq4_value(c):
    """IQ4_NL / IQ4_XS codes (int32, 0..15) to their table values, as float32."""
    word = tl.where(c < 8, tl.where(c < 4, IQ4_W0, IQ4_W1), tl.where(c < 12, IQ4_W2, IQ4_W3))
    b = (word >> (8 * (c & 3))) & 0xFF
    return (b - ((b & 0x80) << 1)).to(tl.float32)


@triton.jit
def _e8m0_half(e):
    """E8M0 scale bytes (int32) to half their value, 2^(e - 128), exactly (ggml's halving)."""
    return tl.where(e < 2, 0x00200000 << e, (e - 1) << 23).to(tl.float32, bitcast=True)


# ---- per-family tiles: [BN, TILE] float32 -----------------------------------------

@triton.jit
def _q45k_tile(p, rbase, rmask, kb, BN: tl.constexpr, BB: tl.constexpr, D: tl.constexpr,
               DMIN: tl.constexpr, SCALES: tl.constexpr, QH: tl.constexpr, QS: tl.constexpr,
               FIFTH_BIT: tl.constexpr):
    """Q4_K / Q5_K (``FIFTH_BIT``): 8 sub-blocks of 32, d * sc * q - dmin * m."""
    base = rbase + kb * BB
    d = _f16_at(p, base + D, rmask)
    dmin = _f16_at(p, base + DMIN, rmask)
    j = tl.arange(0, 8)[None, :]
    sc, m = _scale_min_k4(p, base[:, None] + SCALES, j, rmask[:, None])
    scale = d[:, None] * sc.to(tl.float32)                     # [BN, 8]
    shift = dmin[:, None] * m.to(tl.float32)
    j3 = tl.arange(0, 8)[None, :, None]
    i3 = tl.arange(0, 32)[None, None, :]
    b3 = base[:, None, None]
    m3 = rmask[:, None, None]
    q = tl.load(p + b3 + QS + 32 * (j3 // 2) + i3, mask=m3, other=0).to(tl.int32)
    q = (q >> (4 * (j3 % 2))) & 0xF
    if FIFTH_BIT:
        qh = tl.load(p + b3 + QH + i3, mask=m3, other=0).to(tl.int32)
        q = q | (((qh >> j3) & 1) << 4)
    w = scale[:, :, None] * q.to(tl.float32) - shift[:, :, None]
    return tl.reshape(w, (BN, TILE))


@triton.jit
def _sub16_grid(base, rmask):
    """The [BN, 16, 16] grid of the 256-element blocks cut in 16 sub-blocks of 16
    (Q6_K, Q3_K, Q2_K): block bases and row mask, then per element its half h,
    quarter c within the half and column l (0..31) within the quarter."""
    s3 = tl.arange(0, 16)[None, :, None]                       # sub-block of 16
    l3 = tl.arange(0, 16)[None, None, :]
    return (base[:, None, None], rmask[:, None, None], s3 // 8, (s3 // 2) % 4,
            16 * (s3 % 2) + l3)


@triton.jit
def _q6k_tile(p, rbase, rmask, kb, BN: tl.constexpr):
    """Q6_K: 16 sub-blocks of 16, d * sc * (q - 32)."""
    base = rbase + kb * Q6_K_BYTES
    d = _f16_at(p, base + Q6_K_D, rmask)
    b3, m3, h, c, l = _sub16_grid(base, rmask)
    ql = tl.load(p + b3 + Q6_K_QL + 64 * h + 32 * (c % 2) + l, mask=m3, other=0).to(tl.int32)
    qh = tl.load(p + b3 + Q6_K_QH + 32 * h + l, mask=m3, other=0).to(tl.int32)
    q = ((ql >> (4 * (c // 2))) & 0xF) | (((qh >> (2 * c)) & 3) << 4)
    sc = tl.load(p + base[:, None] + Q6_K_SCALES + tl.arange(0, 16)[None, :],
                 mask=rmask[:, None], other=0).to(tl.int8, bitcast=True).to(tl.float32)
    w = (d[:, None] * sc)[:, :, None] * (q - 32).to(tl.float32)
    return tl.reshape(w, (BN, TILE))


@triton.jit
def _q23k_tile(p, rbase, rmask, kb, BN: tl.constexpr, THREE: tl.constexpr):
    """Q2_K (d * sc * q - dmin * m) or Q3_K (``THREE``: d * (s - 32) * (q - 4 + 4 hbit)):
    16 sub-blocks of 16; element l of sub-block s is bits 2c.. of qs[32 h + l'],
    h = s // 8, c = (s // 2) % 4, l' = 16 (s % 2) + l (formats/kquant.py)."""
    BB: tl.constexpr = Q3_K_BYTES if THREE else Q2_K_BYTES
    QS: tl.constexpr = Q3_K_QS if THREE else Q2_K_QS
    base = rbase + kb * BB
    b3, m3, h, c, l = _sub16_grid(base, rmask)
    q = (tl.load(p + b3 + QS + 32 * h + l, mask=m3, other=0).to(tl.int32) >> (2 * c)) & 3
    j = tl.arange(0, 16)[None, :]
    if THREE:
        hm = tl.load(p + b3 + Q3_K_HMASK + l, mask=m3, other=0).to(tl.int32)
        q = q - 4 + 4 * ((hm >> (4 * h + c)) & 1)
        lo = tl.load(p + base[:, None] + Q3_K_SCALES + j % 8, mask=rmask[:, None], other=0).to(tl.int32)
        hi = tl.load(p + base[:, None] + Q3_K_SCALES + 8 + j % 4, mask=rmask[:, None], other=0).to(tl.int32)
        sc = (((lo >> (4 * (j // 8))) & 0xF) | (((hi >> (2 * (j // 4))) & 3) << 4)) - 32
        d = _f16_at(p, base + Q3_K_D, rmask)
        w = (d[:, None] * sc.to(tl.float32))[:, :, None] * q.to(tl.float32)
    else:
        sc = tl.load(p + base[:, None] + Q2_K_SCALES + j, mask=rmask[:, None], other=0).to(tl.int32)
        dl = _f16_at(p, base + Q2_K_D, rmask)[:, None] * (sc & 0xF).to(tl.float32)
        ml = _f16_at(p, base + Q2_K_DMIN, rmask)[:, None] * (sc >> 4).to(tl.float32)
        w = dl[:, :, None] * q.to(tl.float32) - ml[:, :, None]
    return tl.reshape(w, (BN, TILE))


@triton.jit
def _legacy_tile(p, rbase, rmask, kb, n_in, BN: tl.constexpr, BB: tl.constexpr,
                 D: tl.constexpr, M: tl.constexpr, QH: tl.constexpr, QS: tl.constexpr,
                 BITS: tl.constexpr, HAS_MIN: tl.constexpr):
    """The 32-element blocks (TILE / 32 per tile): Q8_0 (``BITS`` 8: d * int8),
    Q4_0 / Q5_0 (d * (q - 8) / d * (q - 16)), Q4_1 / Q5_1 (``HAS_MIN``: d * q + m).
    A 4-bit code of element i is nibble i // 16 of qs byte i % 16; bit i of the
    little-endian u32 qh is a 5-bit code's fifth bit."""
    t3 = tl.arange(0, TILE // QK_LEGACY)[None, :, None]        # block within the tile
    i3 = tl.arange(0, QK_LEGACY)[None, None, :]                # element within the block
    blk = kb * (TILE // QK_LEGACY) + t3
    valid = rmask[:, None, None] & (blk < n_in // QK_LEGACY)
    b3 = rbase[:, None, None] + blk * BB
    d = _f16_at(p, b3 + D, valid)                              # [BN, 8, 1]
    if BITS == 8:
        q = tl.load(p + b3 + QS + i3, mask=valid, other=0).to(tl.int8, bitcast=True)
        w = d * q.to(tl.float32)
    else:
        half: tl.constexpr = QK_LEGACY // 2
        q = tl.load(p + b3 + QS + i3 % half, mask=valid, other=0).to(tl.int32)
        q = (q >> (4 * (i3 // half))) & 0xF
        if BITS == 5:
            qh = tl.load(p + b3 + QH + i3 // 8, mask=valid, other=0).to(tl.int32)
            q = q | (((qh >> (i3 % 8)) & 1) << 4)
        if HAS_MIN:
            w = d * q.to(tl.float32) + _f16_at(p, b3 + M, valid)
        else:
            w = d * (q - (1 << (BITS - 1))).to(tl.float32)
    return tl.reshape(w, (BN, TILE))


@triton.jit
def _lookup32_tile(p, rbase, rmask, kb, n_in, BN: tl.constexpr, BB: tl.constexpr,
                   QS: tl.constexpr, FP4: tl.constexpr):
    """IQ4_NL (v[q] * f16 d) and MXFP4 (``FP4``: 2 * e2m1(q) * e8m0_half(e)), 32-element
    blocks whose code of element i is nibble i // 16 of qs byte i % 16."""
    t3 = tl.arange(0, TILE // QK_LEGACY)[None, :, None]
    i3 = tl.arange(0, QK_LEGACY)[None, None, :]
    blk = kb * (TILE // QK_LEGACY) + t3
    valid = rmask[:, None, None] & (blk < n_in // QK_LEGACY)
    b3 = rbase[:, None, None] + blk * BB
    half: tl.constexpr = QK_LEGACY // 2
    q = (tl.load(p + b3 + QS + i3 % half, mask=valid, other=0).to(tl.int32) >> (4 * (i3 // half))) & 0xF
    if FP4:
        d = _e8m0_half(tl.load(p + b3 + MXFP4_E, mask=valid, other=0).to(tl.int32))
        w = (_e2m1(tl.where(q == 8, 0, q)) * 2.0) * d          # ggml's code 8 is +0
    else:
        w = _iq4_value(q) * _f16_at(p, b3 + IQ4_NL_D, valid)
    return tl.reshape(tl.where(valid, w, 0.0), (BN, TILE))


@triton.jit
def _iq4xs_tile(p, rbase, rmask, kb, BN: tl.constexpr):
    """IQ4_XS: 8 sub-blocks of 32, v[q] * (d * (ls_j - 32)); ls_j's low 4 bits are
    nibble j % 2 of scales_l[j / 2], its high 2 bits bits 2j of the u16 scales_h."""
    base = rbase + kb * IQ4_XS_BYTES
    d = _f16_at(p, base + IQ4_XS_D, rmask)
    sh = (tl.load(p + base + IQ4_XS_SCALES_H, mask=rmask, other=0).to(tl.int32)
          | (tl.load(p + base + IQ4_XS_SCALES_H + 1, mask=rmask, other=0).to(tl.int32) << 8))
    j = tl.arange(0, 8)[None, :]
    sl = tl.load(p + base[:, None] + IQ4_XS_SCALES_L + j // 2, mask=rmask[:, None], other=0).to(tl.int32)
    ls = ((sl >> (4 * (j % 2))) & 0xF) | (((sh[:, None] >> (2 * j)) & 3) << 4)
    dl = d[:, None] * (ls - 32).to(tl.float32)                               # [BN, 8]
    j3 = tl.arange(0, 8)[None, :, None]
    i3 = tl.arange(0, 32)[None, None, :]
    q = tl.load(p + base[:, None, None] + IQ4_XS_QS + 16 * j3 + i3 % 16, mask=rmask[:, None, None],
                other=0).to(tl.int32)
    q = (q >> (4 * (i3 // 16))) & 0xF
    w = _iq4_value(q) * dl[:, :, None]
    return tl.reshape(w, (BN, TILE))


@triton.jit
def _ksigns(c):
    """IQ3_XXS's 7-bit sign codes (int32) with their parity as bit 7 (ggml's ksigns_iq2xs)."""
    par = c ^ (c >> 4)
    par = par ^ (par >> 2)
    par = par ^ (par >> 1)
    return c | ((par & 1) << 7)


@triton.jit
def _iq3_tile(p, grid_ptr, rbase, rmask, kb, BN: tl.constexpr, S: tl.constexpr):
    """IQ3_XXS, or IQ3_S (``S``): 8 sub-blocks of 32; element i of sub-block j is
    byte i % 4 of grid word ``grid_ptr[idx]`` (int32: the type's grid, formats/iq_grids.py),
    idx = qs[8j + i // 4] (IQ3_S: bit i // 4 of qh[j] as bit 8), times the sub-block's
    scale (IQ3_XXS: d * (0.5 + s) * 0.5, s the top 4 bits of its u32; IQ3_S: d * (1 + 2s)),
    negated where its sign bit is set (IQ3_XXS: 7-bit code i // 8 of the u32, parity restored)."""
    BB: tl.constexpr = IQ3_S_BYTES if S else IQ3_XXS_BYTES
    QS: tl.constexpr = IQ3_S_QS if S else IQ3_XXS_QS
    base = rbase + kb * BB
    d = _f16_at(p, base + (IQ3_S_D if S else IQ3_XXS_D), rmask)
    j2 = tl.arange(0, 8)[None, :]
    j3 = tl.arange(0, 8)[None, :, None]
    i3 = tl.arange(0, 32)[None, None, :]
    b3 = base[:, None, None]
    m2 = rmask[:, None]
    m3 = rmask[:, None, None]
    idx = tl.load(p + b3 + QS + 8 * j3 + i3 // 4, mask=m3, other=0).to(tl.int32)
    if S:
        qh = tl.load(p + b3 + IQ3_S_QH + j3, mask=m3, other=0).to(tl.int32)
        idx = idx | (((qh >> (i3 // 4)) & 1) << 8)
        sign = tl.load(p + b3 + IQ3_S_SIGNS + 4 * j3 + i3 // 8, mask=m3, other=0).to(tl.int32)
        sc = tl.load(p + base[:, None] + IQ3_S_SCALES + j2 // 2, mask=m2, other=0).to(tl.int32)
        db = d[:, None] * (1 + 2 * ((sc >> (4 * (j2 % 2))) & 0xF)).to(tl.float32)
    else:
        at = base[:, None] + IQ3_XXS_SCALES_SIGNS + 4 * j2
        aux = (tl.load(p + at, mask=m2, other=0).to(tl.int32)
               | (tl.load(p + at + 1, mask=m2, other=0).to(tl.int32) << 8)
               | (tl.load(p + at + 2, mask=m2, other=0).to(tl.int32) << 16)
               | (tl.load(p + at + 3, mask=m2, other=0).to(tl.int32) << 24))   # [BN, 8]
        sign = _ksigns((aux[:, :, None] >> (7 * (i3 // 8))) & 127)
        db = (d[:, None] * (((aux >> 28) & 0xF).to(tl.float32) + 0.5)) * 0.5
    g = tl.load(grid_ptr + idx, mask=m3, other=0)
    v = db[:, :, None] * ((g >> (8 * (i3 % 4))) & 0xFF).to(tl.float32)
    w = tl.where(((sign >> (i3 % 8)) & 1) == 1, -v, v)
    return tl.reshape(w, (BN, TILE))


@triton.jit
def _float_tile(p, rows, rmask, kb, n_in, ROW_BYTES, QTYPE: tl.constexpr):
    """F32, F16, BF16: each element its own bytes (BF16: the top half of a float32)."""
    col = kb * TILE + tl.arange(0, TILE)[None, :]
    mask = rmask[:, None] & (col < n_in)
    if QTYPE == F32:
        pw = p.to(tl.pointer_type(tl.float32))
        w = tl.load(pw + (rows.to(tl.int64) * (ROW_BYTES // 4))[:, None] + col, mask=mask, other=0.0)
    elif QTYPE == F16:
        pw = p.to(tl.pointer_type(tl.float16))
        w = tl.load(pw + (rows.to(tl.int64) * (ROW_BYTES // 2))[:, None] + col,
                    mask=mask, other=0.0).to(tl.float32)
    else:
        pw = p.to(tl.pointer_type(tl.uint16))
        u = tl.load(pw + (rows.to(tl.int64) * (ROW_BYTES // 2))[:, None] + col, mask=mask, other=0)
        w = (u.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return w


@triton.jit
def _nvfp4_tile(p, s_ptr, s2_ptr, rows, rbase, rmask, kb, n_in, BN: tl.constexpr):
    """NVFP4_E2M1: TILE / 16 groups, element 2i in byte i's low nibble, e2m1 * e4m3 * scale_2."""
    g3 = tl.arange(0, TILE // NVFP4_GROUP)[None, :, None]
    t3 = tl.arange(0, NVFP4_GROUP)[None, None, :]
    grp = kb * (TILE // NVFP4_GROUP) + g3
    valid = rmask[:, None, None] & (grp < n_in // NVFP4_GROUP)
    byte = rbase[:, None, None] + grp * NVFP4_E2M1_BYTES + NVFP4_E2M1_QS + t3 // 2
    code = (tl.load(p + byte, mask=valid, other=0).to(tl.int32) >> (4 * (t3 % 2))) & 0xF
    sb = tl.load(s_ptr + (rows.to(tl.int64) * (n_in // NVFP4_GROUP))[:, None, None] + grp,
                 mask=valid, other=0).to(tl.int32)
    s2 = tl.load(s2_ptr)
    w = (_e2m1(code) * _e4m3fn(sb)) * s2
    w = tl.where(valid, w, 0.0)
    return tl.reshape(w, (BN, TILE))


# ---- one tile of any type --------------------------------------------------------

@triton.jit
def _tile(p, s_ptr, s2_ptr, rows, rmask, kb, n_in,
          ROW_BYTES, QTYPE: tl.constexpr, BN: tl.constexpr):
    """Decode columns ``TILE*kb .. TILE*kb+TILE-1`` of packed rows ``rows`` ([BN] int64).
    ``s_ptr``: NVFP4_E2M1's companion scales, or the IQ3 types' grid (int32 words)."""
    rbase = rows.to(tl.int64) * ROW_BYTES                      # [BN]
    if QTYPE == Q4_K:
        w = _q45k_tile(p, rbase, rmask, kb, BN, Q4_K_BYTES, Q4_K_D, Q4_K_DMIN, Q4_K_SCALES,
                       0, Q4_K_QS, False)
    elif QTYPE == Q5_K:
        w = _q45k_tile(p, rbase, rmask, kb, BN, Q5_K_BYTES, Q5_K_D, Q5_K_DMIN, Q5_K_SCALES,
                       Q5_K_QH, Q5_K_QS, True)
    elif QTYPE == Q6_K:
        w = _q6k_tile(p, rbase, rmask, kb, BN)
    elif QTYPE == Q2_K:
        w = _q23k_tile(p, rbase, rmask, kb, BN, False)
    elif QTYPE == Q3_K:
        w = _q23k_tile(p, rbase, rmask, kb, BN, True)
    elif QTYPE == Q8_0:
        w = _legacy_tile(p, rbase, rmask, kb, n_in, BN, Q8_0_BYTES, Q8_0_D, 0, 0, Q8_0_QS, 8, False)
    elif QTYPE == Q4_0:
        w = _legacy_tile(p, rbase, rmask, kb, n_in, BN, Q4_0_BYTES, Q4_0_D, 0, 0, Q4_0_QS, 4, False)
    elif QTYPE == Q4_1:
        w = _legacy_tile(p, rbase, rmask, kb, n_in, BN, Q4_1_BYTES, Q4_1_D, Q4_1_M, 0, Q4_1_QS,
                         4, True)
    elif QTYPE == Q5_0:
        w = _legacy_tile(p, rbase, rmask, kb, n_in, BN, Q5_0_BYTES, Q5_0_D, 0, Q5_0_QH, Q5_0_QS,
                         5, False)
    elif QTYPE == Q5_1:
        w = _legacy_tile(p, rbase, rmask, kb, n_in, BN, Q5_1_BYTES, Q5_1_D, Q5_1_M, Q5_1_QH,
                         Q5_1_QS, 5, True)
    elif QTYPE == NVFP4_E2M1:
        w = _nvfp4_tile(p, s_ptr, s2_ptr, rows, rbase, rmask, kb, n_in, BN)
    elif QTYPE == IQ4_NL:
        w = _lookup32_tile(p, rbase, rmask, kb, n_in, BN, IQ4_NL_BYTES, IQ4_NL_QS, False)
    elif QTYPE == MXFP4:
        w = _lookup32_tile(p, rbase, rmask, kb, n_in, BN, MXFP4_BYTES, MXFP4_QS, True)
    elif QTYPE == IQ4_XS:
        w = _iq4xs_tile(p, rbase, rmask, kb, BN)
    elif QTYPE == IQ3_XXS:
        w = _iq3_tile(p, s_ptr, rbase, rmask, kb, BN, False)
    elif QTYPE == IQ3_S:
        w = _iq3_tile(p, s_ptr, rbase, rmask, kb, BN, True)
    else:
        w = _float_tile(p, rows, rmask, kb, n_in, ROW_BYTES, QTYPE)
    return w


# ---- dequantize / embedding -------------------------------------------------------

@triton.jit(do_not_specialize=("n_rows",))   # the ids' count compiles nothing new
def _dequant_kernel(p, s_ptr, s2_ptr, ids_ptr, out_ptr, n_rows, n_out, n_in, ROW_BYTES,
                    QTYPE: tl.constexpr, BN: tl.constexpr,
                    HAS_IDS: tl.constexpr):
    pid_r = tl.program_id(0)
    kb = tl.program_id(1)
    r = pid_r * BN + tl.arange(0, BN)
    rmask = r < n_rows
    if HAS_IDS:
        rows = tl.load(ids_ptr + r, mask=rmask, other=0).to(tl.int64)
        ok = (rows >= 0) & (rows < n_out)
        rows = tl.where(ok, rows, 0)
    else:
        rows = r.to(tl.int64)
        ok = rmask
    w = _tile(p, s_ptr, s2_ptr, rows, rmask, kb, n_in, ROW_BYTES, QTYPE, BN)
    if HAS_IDS:   # an id outside the table reads as NaN rather than another row
        w = tl.where(ok[:, None], w, float("nan"))
    col = kb * TILE + tl.arange(0, TILE)[None, :]
    if out_ptr.dtype.element_ty != tl.float32:   # a half copy (the dense rung): rounded to nearest
        w = w.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
    tl.store(out_ptr + r.to(tl.int64)[:, None] * n_in + col, w,
             mask=rmask[:, None] & (col < n_in))


# ---- one token, any type: tile * x ---------------------------------------------

@triton.jit
def _mv_tile_kernel(x_ptr, p, s_ptr, s2_ptr, y_ptr, part_ptr, cnt_ptr, split, n_out, n_in,
                    ROW_BYTES, KB_PER: tl.constexpr, QTYPE: tl.constexpr, BN: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    r = pid_n * BN + tl.arange(0, BN)
    rmask = r < n_out
    rows = tl.where(rmask, r, 0).to(tl.int64)
    acc = tl.zeros((BN,), dtype=tl.float32)
    k0 = pid_k * KB_PER
    for i in range(0, KB_PER):
        kb = k0 + i
        col = kb * TILE + tl.arange(0, TILE)
        xv = tl.load(x_ptr + col, mask=col < n_in, other=0.0).to(tl.float32)
        w = _tile(p, s_ptr, s2_ptr, rows, rmask, kb, n_in, ROW_BYTES, QTYPE, BN)
        acc += tl.sum(w * xv[None, :], axis=1)
    _store(y_ptr, part_ptr, cnt_ptr, acc[None, :], split, 1, n_out, r, rmask, 1)


@triton.jit
def _store(y_ptr, part_ptr, cnt_ptr, acc, split, M, n_out, r, rmask, MT: tl.constexpr):
    """Write the output ``acc`` [MT, BN] (or [MT, BN, 8], summed). With a split K each program writes its partial sums
    to ``part`` [split, M, n_out]; the last of a row block's programs (an
    acq_rel counter) adds them in split order (deterministic) into ``y`` and
    resets the counter for the next call, so no second kernel runs."""
    if len(acc.shape) == 3:
        acc = tl.sum(acc, axis=2)
    t2 = tl.arange(0, MT)[:, None]
    m2 = (t2 < M) & rmask[None, :]
    ofs = t2.to(tl.int64) * n_out + r[None, :]
    if split == 1:
        tl.store(y_ptr + ofs, acc.to(y_ptr.dtype.element_ty), mask=m2)
    else:
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        tl.store(part_ptr + pid_k.to(tl.int64) * M * n_out + ofs, acc, mask=m2)
        done = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
        if done == split - 1:
            tot = tl.zeros_like(acc)
            s = 0
            while s < split:
                tot += tl.load(part_ptr + s * M * n_out + ofs, mask=m2, other=0.0,
                               cache_modifier=".cg")
                s += 1
            tl.store(y_ptr + ofs, tot.to(y_ptr.dtype.element_ty), mask=m2)
            tl.atomic_xchg(cnt_ptr + pid_n, 0)



@triton.jit(do_not_specialize=("M",))
def _mv_tile_mt_kernel(x_ptr, p, s_ptr, s2_ptr, y_ptr, part_ptr, cnt_ptr, split, M, n_out, n_in,
                       stride_xm, ROW_BYTES, KB_PER: tl.constexpr, QTYPE: tl.constexpr,
                       BN: tl.constexpr, MT: tl.constexpr):
    """Up to ``MT`` activation rows of any type: each decoded tile (float32, as
    ``_mv_tile_kernel``'s) times every row in float32 FMAs, so a weight is decoded
    once for all rows. Rows past ``M`` read as zeros and are never stored."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    r = pid_n * BN + tl.arange(0, BN)
    rmask = r < n_out
    rows = tl.where(rmask, r, 0).to(tl.int64)
    tok = tl.arange(0, MT)[:, None]
    acc = tl.zeros((MT, BN), dtype=tl.float32)
    k0 = pid_k * KB_PER
    for i in range(0, KB_PER):
        kb = k0 + i
        col = kb * TILE + tl.arange(0, TILE)
        w = _tile(p, s_ptr, s2_ptr, rows, rmask, kb, n_in, ROW_BYTES, QTYPE, BN)
        for m in tl.static_range(MT):
            xv = tl.load(x_ptr + m * stride_xm + col, mask=(col < n_in) & (m < M),
                         other=0.0).to(tl.float32)
            acc += tl.where(tok == m, tl.sum(w * xv[None, :], axis=1)[None, :], 0.0)
    _store(y_ptr, part_ptr, cnt_ptr, acc, split, M, n_out, r, rmask, MT)


# ---- several tokens: decoded tile on tensor cores ------------------------------

@triton.jit(do_not_specialize=("M",))   # a prompt length compiles nothing new
def _qmm_kernel(x_ptr, p, s_ptr, s2_ptr, y_ptr, M, n_out, n_in,
                stride_xm, ROW_BYTES, KB_PER: tl.constexpr, QTYPE: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, DOT_F32: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    mmask = rm < M
    nmask = rn < n_out
    rows = tl.where(nmask, rn, 0).to(tl.int64)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    k0 = pid_k * KB_PER
    for i in range(0, KB_PER):
        kb = k0 + i
        col = kb * TILE + tl.arange(0, TILE)
        xt = tl.load(x_ptr + rm.to(tl.int64)[:, None] * stride_xm + col[None, :],
                     mask=mmask[:, None] & (col[None, :] < n_in), other=0.0)
        w = _tile(p, s_ptr, s2_ptr, rows, nmask, kb, n_in, ROW_BYTES, QTYPE, BN)
        if DOT_F32:   # float32 activations get float32 products, as torch's default (no TF32)
            acc += tl.dot(xt.to(tl.float32), tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(xt, tl.trans(w.to(xt.dtype)))
    out = y_ptr + pid_k * M * n_out + rm.to(tl.int64)[:, None] * n_out + rn[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])
