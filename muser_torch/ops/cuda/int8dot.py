"""Triton kernels for 1..8 half-precision activation rows: integer dot products.

The way llama.cpp's mmvq gets its speed, kept to half precision. The
activation row is quantized once per call (``_quantize_x_kernel``) in blocks
of 32 columns, in two int8 levels: ``x ~ dxs * (254 * a1 + a2)`` with
``a1 = round(127 x / amax)`` and ``a2`` the rounded remainder in 1/254ths,
both in [-127, 127]; ``dxs = amax / (127 * 254)``. That is about 15 bits per
block (per-element error <= 1.6e-5 of the block's largest value), below the
rounding of a float16 output, where llama.cpp's single int8 level loses about
0.5% of the dot. The weights are never converted to floats: the codes of four
consecutive elements sit in one 32-bit word (a nibble mask for Q4_K / Q4_0,
plus the fifth or sixth bits ORed in for Q5_K / Q5_0 / Q6_K; Q8_0's bytes as
they are), and ``dp4a`` multiplies them with four activation bytes and adds
(two ``dp4a`` per word and level: ``dp4a(c, a2, 254 * dp4a(c, a1, 0))``, exact
in int32). Block scales, mins and the code offsets (-8, -16, -32, through the
activation's integer block sums ``s16``/``s32``) are applied per scale group
in float32. About one instruction per weight, so the kernels are bound by
memory, not issue rate (docs/performance.md).

Each program owns ``BN`` weight rows and ``MT`` (1, 2, 4 or 8) activation
rows: a weight word is decoded once for all of them. ``kb_per`` 256-column
tiles per program (split K, partial sums added by torch, deterministic).
The next tile's words are loaded before the current one is used. Rows of
32-element types whose length is not a multiple of 256 end in a masked
partial tile; the activation arrays are padded with zeros to whole tiles.

Under ``TRITON_INTERPRET=1`` ``ASM`` is False and ``dp4a`` is spelled out in
shifts and products (the interpreter runs no PTX); on a GPU it is one
``dp4a.s32.s32``. Every code byte is < 128, so signed bytes are right for all.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .layout import (  # noqa: F401  (every name is a tl.constexpr read by the kernels)
    Q4_0, Q4_0_BYTES, Q4_0_D, Q4_0_QS, Q4_K, Q4_K_BYTES, Q4_K_D, Q4_K_QS, Q4_K_SCALES, Q5_0,
    Q5_0_BYTES, Q5_0_D, Q5_0_QH, Q5_0_QS, Q5_K, Q5_K_BYTES, Q5_K_D, Q5_K_QH, Q5_K_QS, Q5_K_SCALES,
    Q6_K, Q6_K_BYTES, Q6_K_D, Q6_K_QH, Q6_K_QL, Q6_K_SCALES, Q8_0, Q8_0_BYTES, Q8_0_D, Q8_0_QS,
    QK_LEGACY, TILE, require)
from .kquant import _f16_lo, _scale_min_words
from .tile import _store

require(QK_LEGACY == 32 and TILE == 256, "32-column activation blocks, 8 to a 256-column tile")
for _name, _bb, _fields in (("Q8_0", Q8_0_BYTES, (Q8_0_D, Q8_0_QS)),
                            ("Q4_0", Q4_0_BYTES, (Q4_0_D, Q4_0_QS)),
                            ("Q5_0", Q5_0_BYTES, (Q5_0_D, Q5_0_QH, Q5_0_QS))):
    require(_bb % 2 == 0 and all(f % 2 == 0 for f in _fields), f"{_name} fields on 2-byte words")
require(Q6_K_SCALES % 2 == 0 and Q6_K_D % 2 == 0, "Q6_K's fields on 2-byte words")

LEVEL = tl.constexpr(254)          # a2's unit is 1/254 of a1's
# Arguments that vary with the token count or the split: not specialized on, so a
# new prompt length compiles nothing new (ops/cuda/warm.py compiles the rest).
_RUNTIME = ("split", "M", "nb_row", "kb_per", "n_blk")


# ---- the activation: two int8 levels per 32-column block -----------------------

@triton.jit
def _two_levels(x):
    """Blocks of 32 (``x[BLOCKS, 32]``, float32) as two int8 levels: (a1, a2, the
    block scales dxs, the integer sums 254 a1 + a2 per block)."""
    amax = tl.max(tl.abs(x), axis=1)
    inv = tl.where(amax > 0, 127.0 / tl.maximum(amax, 1e-30), 0.0)
    v = x * inv[:, None]
    q1 = tl.floor(v + 0.5)
    q2 = tl.floor((v - q1) * LEVEL + 0.5)
    q1 = tl.minimum(tl.maximum(q1, -127.0), 127.0).to(tl.int32)
    q2 = tl.minimum(tl.maximum(q2, -127.0), 127.0).to(tl.int32)
    return q1, q2, amax / (127.0 * LEVEL), q1 * LEVEL + q2


@triton.jit
def _quantize_x_kernel(x_ptr, a1_ptr, a2_ptr, dxs_ptr, s16_ptr, s32_ptr, n_in, stride_x,
                       n_pad, BLOCKS: tl.constexpr):
    """Row ``program_id(1)``, 32-column blocks ``BLOCKS * program_id(0) ..``; columns
    past ``n_in`` (up to ``n_pad``) become zeros."""
    t = tl.program_id(1).to(tl.int64)
    b = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)[:, None]
    col = b * 32 + tl.arange(0, 32)[None, :]
    inside = col < n_pad
    x = tl.load(x_ptr + t * stride_x + col, mask=col < n_in, other=0.0).to(tl.float32)
    q1, q2, dx, s = _two_levels(x)
    tl.store(a1_ptr + t * n_pad + col, q1.to(tl.int8), mask=inside)
    tl.store(a2_ptr + t * n_pad + col, q2.to(tl.int8), mask=inside)
    s16 = tl.sum(tl.reshape(s, (BLOCKS, 2, 16)), axis=2)
    bm = b < n_pad // 32
    tl.store(s16_ptr + t * (n_pad // 16) + 2 * b + tl.arange(0, 2)[None, :], s16, mask=bm)
    tl.store(s32_ptr + t * (n_pad // 32) + b, tl.sum(s16, axis=1)[:, None], mask=bm)
    tl.store(dxs_ptr + t * (n_pad // 32) + b, dx[:, None], mask=bm)


@triton.jit
def _quantize_frag_kernel(x_ptr, a12_ptr, sc_ptr, M, n_in, stride_x, n_pad,
                          BLOCKS: tl.constexpr, RUN8: tl.constexpr):
    """The same two levels, stored in the order of mv.cu's tensor-core fragments
    (``compiled.py``'s ``cuda_mm``): token ``program_id(1)`` (tokens at or past ``M``,
    up to a whole tile of 8, become zeros), 32-column blocks ``BLOCKS * program_id(0) ..``.

    ``a12[tile, block, lane, 16]``: lane 4 g + u of a tile holds token g's a1 bytes of
    its k-slots, then its a2 bytes: columns 8u .. 8u + 7 of the block (``RUN8``: the
    K-quants' order) or 4u .. 4u + 3 and 16 + 4u .. 16 + 4u + 3 (the natural order).
    ``sc[tile, block pair, u, e, 4]``: token 8 tile + 2u + e's dx of the pair's two blocks,
    then their dx * s, s a block's integer sum (what a C fragment's lane u needs)."""
    t = tl.program_id(1)
    b = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)[:, None]
    k = tl.arange(0, 32)[None, :]
    col = b * 32 + k
    x = tl.load(x_ptr + t.to(tl.int64) * stride_x + col, mask=(col < n_in) & (t < M),
                other=0.0).to(tl.float32)
    q1, q2, dx, s = _two_levels(x)
    n_blk = n_pad // 32
    tile, g = t // 8, t % 8
    if RUN8:
        u, at = k // 8, k % 8
    else:
        u, at = (k % 16) // 4, (k // 16) * 4 + k % 4
    inside = b < n_blk
    to = ((tile * n_blk + b) * 32 + 4 * g + u).to(tl.int64) * 16 + at
    tl.store(a12_ptr + to, q1.to(tl.int8), mask=inside)
    tl.store(a12_ptr + to + 8, q2.to(tl.int8), mask=inside)
    bs = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)
    at = ((((tile * (n_blk // 2) + bs // 2) * 4 + g // 2) * 2 + g % 2) * 4 + bs % 2).to(tl.int64)
    ok = bs < n_blk
    tl.store(sc_ptr + at, dx, mask=ok)
    tl.store(sc_ptr + at + 2, dx * tl.sum(s, axis=1).to(tl.float32), mask=ok)


# ---- shared pieces ---------------------------------------------------------------

@triton.jit
def _dp4a(a, b, c, ASM: tl.constexpr):
    """c + the dot of a's and b's four signed bytes (int32 tensors, broadcast)."""
    if ASM:
        r = tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                      dtype=tl.int32, is_pure=True, pack=1)
    else:
        r = c + ((a << 24) >> 24) * ((b << 24) >> 24)
        r += ((a << 16) >> 24) * ((b << 16) >> 24)
        r += ((a << 8) >> 24) * ((b << 8) >> 24)
        r += (a >> 24) * (b >> 24)
    return r


@triton.jit
def _dots(c, a1, a2, ASM: tl.constexpr):
    """Integer dots of code words ``c`` [1, BN, NW] with activation words ``a1``,
    ``a2`` [MT, 1, NW], summed over each run of 4 words (16 elements; the 4
    words one thread loads): [MT, BN, NW // 4], in units of ``dxs``."""
    hi = _dp4a(c, a1, tl.zeros_like(a1), ASM)
    dp = _dp4a(c, a2, hi * LEVEL, ASM)
    MT: tl.constexpr = dp.shape[0]
    BN: tl.constexpr = dp.shape[1]
    NW: tl.constexpr = dp.shape[2]
    return tl.sum(tl.reshape(dp, (MT, BN, NW // 4, 4)), axis=3)


@triton.jit
def _group_dots(c, a1w, a2w, aoff, amask, ASM: tl.constexpr):
    """``_dots`` with the activation words loaded at ``aoff``."""
    return _dots(c, tl.load(a1w + aoff, mask=amask, other=0),
                 tl.load(a2w + aoff, mask=amask, other=0), ASM)


@triton.jit
def _rows(BN: tl.constexpr, n_out):
    r = tl.program_id(0) * BN + tl.arange(0, BN)
    rmask = r < n_out
    return r, rmask, tl.where(rmask, r, 0).to(tl.int64)[None, :, None]


# ---- Q4_K / Q5_K -------------------------------------------------------------------

@triton.jit
def _q45k_header3(h0, kb, BW: tl.constexpr, DW: tl.constexpr, SCW: tl.constexpr):
    base = h0 + kb * BW
    return (tl.load(base + DW), tl.load(base + SCW), tl.load(base + SCW + 1),
            tl.load(base + SCW + 2))


@triton.jit
def _q45k_act(a1w, a2w, dxs_ptr, s16_ptr, aw, s_blk, s_run, kb, tmask):
    """Tile ``kb``'s activation for both nibble halves: words a1, a2, the block
    scale and the 16-column sums (float), loaded a tile ahead like the weights."""
    o = aw + kb * 64
    sb = s_blk + kb * 8
    sr = s_run + kb * 16
    return (tl.load(a1w + o, mask=tmask, other=0), tl.load(a2w + o, mask=tmask, other=0),
            tl.load(dxs_ptr + sb, mask=tmask, other=0.0),
            tl.load(s16_ptr + sr, mask=tmask, other=0).to(tl.float32),
            tl.load(a1w + o + 8, mask=tmask, other=0), tl.load(a2w + o + 8, mask=tmask, other=0),
            tl.load(dxs_ptr + sb + 1, mask=tmask, other=0.0),
            tl.load(s16_ptr + sr + 2, mask=tmask, other=0).to(tl.float32))


@triton.jit
def _q45k_fetch(wp, hp, h0, a1w, a2w, dxs_ptr, s16_ptr, aw, s_blk, s_run, kb, tmask,
                QTYPE: tl.constexpr, BW: tl.constexpr, DW: tl.constexpr, SCW: tl.constexpr):
    """Everything tile ``kb`` needs: qs words, Q5_K's qh words, the header, the activation."""
    w = tl.load(wp + kb * BW, eviction_policy="evict_first")
    qh = w                                                     # Q4_K: never read
    if QTYPE == Q5_K:
        qh = tl.load(hp + kb * BW, eviction_policy="evict_first")
    e0, e1, e2, e3 = _q45k_header3(h0, kb, BW, DW, SCW)
    x = _q45k_act(a1w, a2w, dxs_ptr, s16_ptr, aw, s_blk, s_run, kb, tmask)
    return w, qh, e0, e1, e2, e3, x


@triton.jit(do_not_specialize=_RUNTIME)
def _i8_q45k_kernel(a1_ptr, a2_ptr, dxs_ptr, s16_ptr, p, y_ptr, part_ptr, cnt_ptr, split, M,
                    n_out, nb_row, kb_per,
                    QTYPE: tl.constexpr, BN: tl.constexpr, MT: tl.constexpr, ASM: tl.constexpr):
    """qs word n holds codes of sub-block 2 (n // 8) (low nibbles) and 2 (n // 8) + 1
    (high), elements 64 (n // 8) + 4 (n % 8) + 0..3 (+ 32); Q5_K's fifth bits are
    bits 2 (n // 8) (+ 1) of the bytes of qh word n % 8. Each run of 4 words
    (h = n // 4) is 16 elements: its min term uses that run's activation sum."""
    r, rmask, rows = _rows(BN, n_out)
    pid_k = tl.program_id(1)
    BW: tl.constexpr = (Q4_K_BYTES if QTYPE == Q4_K else Q5_K_BYTES) // 4
    QSW: tl.constexpr = (Q4_K_QS if QTYPE == Q4_K else Q5_K_QS) // 4
    DW: tl.constexpr = (Q4_K_D if QTYPE == Q4_K else Q5_K_D) // 4
    SCW: tl.constexpr = (Q4_K_SCALES if QTYPE == Q4_K else Q5_K_SCALES) // 4
    pw = p.to(tl.pointer_type(tl.int32))
    n = tl.arange(0, 32)[None, None, :]
    h = tl.arange(0, 8)[None, None, :]                         # run of 4 words
    t3 = tl.arange(0, MT)[:, None, None]
    tmask = t3 < M
    t64 = (t3 * (nb_row * 64)).to(tl.int64)
    aw = t64 + 16 * (n // 8) + n % 8                          # low nibbles' activation words
    s_run = t64 // 4 + 4 * (h // 2) + h % 2                    # s16 of run h, low nibbles
    s_blk = t64 // 8 + 2 * (h // 2)                            # dxs of its sub-block
    a1w = a1_ptr.to(tl.pointer_type(tl.int32))
    a2w = a2_ptr.to(tl.pointer_type(tl.int32))
    rw = rows * (nb_row * BW)
    wp = pw + rw + QSW + n
    hp = pw + rw + Q5_K_QH // 4 + n % 8
    h0 = pw + rw + 0 * h            # [1, BN, 8]: the header in the runs' layout (no conversion)
    k0 = pid_k * kb_per
    kend = k0 + kb_per - 1
    w, qh, e0, e1, e2, e3, x0 = _q45k_fetch(wp, hp, h0, a1w, a2w, dxs_ptr, s16_ptr, aw, s_blk,
                                            s_run, k0, tmask, QTYPE, BW, DW, SCW)
    acc = tl.zeros((MT, BN, 8), dtype=tl.float32)
    kb = k0
    while kb < k0 + kb_per:      # not range(): the interpreter cannot index a runtime int
        kn = tl.minimum(kb + 1, kend)
        w_next, qh_next, f0, f1, f2, f3, x1 = _q45k_fetch(wp, hp, h0, a1w, a2w, dxs_ptr, s16_ptr,
                                                          aw, s_blk, s_run, kn, tmask, QTYPE, BW,
                                                          DW, SCW)
        d = _f16_lo(e0)
        dmin = _f16_lo(e0 >> 16)
        for hi in tl.static_range(2):
            c = (w >> (4 * hi)) & 0x0F0F0F0F
            if QTYPE == Q5_K:
                c = c | (((qh >> (2 * (n // 8) + hi)) & 0x01010101) << 4)
            dg = _dots(c, x0[4 * hi], x0[4 * hi + 1], ASM)
            sc, m = _scale_min_words(e1, e2, e3, 2 * (h // 2) + hi)
            acc += x0[4 * hi + 2] * ((d * sc.to(tl.float32)) * dg.to(tl.float32)
                                     - (dmin * m.to(tl.float32)) * x0[4 * hi + 3])
        kb += 1
        w = w_next
        qh = qh_next
        e0 = f0
        e1 = f1
        e2 = f2
        e3 = f3
        x0 = x1
    _store(y_ptr, part_ptr, cnt_ptr, acc, split, M, n_out, r, rmask, MT)


# ---- Q6_K --------------------------------------------------------------------------

@triton.jit
def _q6k_words(lp, hp, kb, BH: tl.constexpr):
    """ql and qh as int32 words (two 2-byte loads each: blocks are 210 bytes)."""
    o = kb * BH
    ql = (tl.load(lp + o, eviction_policy="evict_first").to(tl.int32) & 0xFFFF) | \
        (tl.load(lp + o + 1, eviction_policy="evict_first").to(tl.int32) << 16)
    qh = (tl.load(hp + o, eviction_policy="evict_first").to(tl.int32) & 0xFFFF) | \
        (tl.load(hp + o + 1, eviction_policy="evict_first").to(tl.int32) << 16)
    return ql, qh


@triton.jit(do_not_specialize=_RUNTIME)
def _i8_q6k_kernel(a1_ptr, a2_ptr, dxs_ptr, s16_ptr, p, y_ptr, part_ptr, cnt_ptr, split, M,
                   n_out, nb_row, kb_per,
                   BN: tl.constexpr, MT: tl.constexpr, ASM: tl.constexpr):
    """ql word u (half hf = u // 16, r = u % 16): low nibbles are elements
    128 hf + 32 (r // 8) + 4 (r % 8) + 0..3, high nibbles the same + 64; their
    two top bits are bits 2 (r // 8) (+ 4) of the bytes of qh word 8 hf + r % 8.
    Run q of 4 words (u // 4) is one 16-element scale group: 8 hf + q % 4 (+ 4)."""
    r, rmask, rows = _rows(BN, n_out)
    pid_k = tl.program_id(1)
    BH: tl.constexpr = Q6_K_BYTES // 2
    ph = p.to(tl.pointer_type(tl.int16))
    u = tl.arange(0, 32)[None, None, :]
    rr = u % 16
    sh = 2 * (rr // 8)
    rh = rows * (nb_row * BH)
    lp = ph + rh + Q6_K_QL // 2 + 2 * u
    hp = ph + rh + Q6_K_QH // 2 + 2 * (8 * (u // 16) + u % 8)
    q = tl.arange(0, 8)[None, None, :]
    scp = p + rows * (nb_row * Q6_K_BYTES) + Q6_K_SCALES + 8 * (q // 4) + q % 4
    t3 = tl.arange(0, MT)[:, None, None]
    tmask = t3 < M
    t64 = (t3 * (nb_row * 64)).to(tl.int64)
    aw = t64 + 32 * (u // 16) + 8 * (rr // 8) + rr % 8
    blk = t64 // 8 + 4 * (q // 4) + (q % 4) // 2                # 32-column block of group q
    run = t64 // 4 + 8 * (q // 4) + q % 4                       # its 16-column half
    a1w = a1_ptr.to(tl.pointer_type(tl.int32))
    a2w = a2_ptr.to(tl.pointer_type(tl.int32))
    k0 = pid_k * kb_per
    kend = k0 + kb_per - 1
    dp_ = ph + rh + Q6_K_D // 2 + 0 * q         # [1, BN, 8]: d in the groups' layout
    ql, qh = _q6k_words(lp, hp, k0, BH)
    dw = tl.load(dp_ + k0 * BH)
    acc = tl.zeros((MT, BN, 8), dtype=tl.float32)
    kb = k0
    while kb < k0 + kb_per:
        kn = tl.minimum(kb + 1, kend)
        ql_next, qh_next = _q6k_words(lp, hp, kn, BH)
        dw_next = tl.load(dp_ + kn * BH)
        d = dw.to(tl.float16, bitcast=True).to(tl.float32)
        for hi in tl.static_range(2):
            c = ((ql >> (4 * hi)) & 0x0F0F0F0F) | (((qh >> (sh + 4 * hi)) & 0x03030303) << 4)
            dg = _group_dots(c, a1w, a2w, aw + kb * 64 + 16 * hi, tmask, ASM)
            sc = tl.load(scp + kb * Q6_K_BYTES + 4 * hi).to(tl.int8, bitcast=True).to(tl.float32)
            dxs = tl.load(dxs_ptr + blk + kb * 8 + 2 * hi, mask=tmask, other=0.0)
            xs = tl.load(s16_ptr + run + kb * 16 + 4 * hi, mask=tmask, other=0)
            acc += (dxs * (d * sc)) * (dg - 32 * xs).to(tl.float32)
        kb += 1
        ql = ql_next
        qh = qh_next
        dw = dw_next
    _store(y_ptr, part_ptr, cnt_ptr, acc, split, M, n_out, r, rmask, MT)


# ---- Q8_0, Q4_0, Q5_0: eight 32-element blocks per tile -----------------------------

@triton.jit(do_not_specialize=_RUNTIME)
def _i8_legacy_kernel(a1_ptr, a2_ptr, dxs_ptr, s32_ptr, p, y_ptr, part_ptr, cnt_ptr, split, M,
                      n_out, nb_row, n_blk,
                      kb_per, QTYPE: tl.constexpr, BN: tl.constexpr, MT: tl.constexpr,
                      ASM: tl.constexpr):
    """Blocks are 2-byte aligned (34, 18, 22 bytes), so words are built from two
    2-byte loads. Q8_0: word n is elements 4n..4n+3 of the tile (8 per block).
    Q4_0 / Q5_0: word n = 4 b + i of block b holds elements 4i..4i+3 (low nibbles)
    and 16 + 4i.. (high); Q5_0's fifth bits are bits 4i.. (16 + 4i..) of its qh,
    spread one to a byte by a multiply. Codes are unsigned: the offset (8, 16)
    comes off through the activation's block sums."""
    r, rmask, rows = _rows(BN, n_out)
    pid_k = tl.program_id(1)
    BH: tl.constexpr = (Q8_0_BYTES if QTYPE == Q8_0 else Q4_0_BYTES if QTYPE == Q4_0
                        else Q5_0_BYTES) // 2
    QSH: tl.constexpr = (Q8_0_QS if QTYPE == Q8_0 else Q4_0_QS if QTYPE == Q4_0 else Q5_0_QS) // 2
    DH: tl.constexpr = (Q8_0_D if QTYPE == Q8_0 else Q4_0_D if QTYPE == Q4_0 else Q5_0_D) // 2
    NW: tl.constexpr = 64 if QTYPE == Q8_0 else 32
    NR: tl.constexpr = NW // 4                                  # runs of 4 words
    ph = p.to(tl.pointer_type(tl.int16))
    n = tl.arange(0, NW)[None, None, :]
    b_of = n // (NW // 8)
    i_of = n % (NW // 8)
    rh = rows * (n_blk * BH)
    wofs = rh + b_of * BH + QSH + 2 * i_of                        # [1, BN, NW] halfwords
    hofs = rh + b_of * BH + Q5_0_QH // 2
    run = tl.arange(0, NR)[None, None, :]
    rb = run // (NR // 8)                                         # block of run
    dofs = rh + rb * BH + DH
    t3 = tl.arange(0, MT)[:, None, None]
    tmask = t3 < M
    t8 = (t3 * (nb_row * 8)).to(tl.int64)
    if QTYPE == Q8_0:
        aw = t8 * 8 + n
    else:
        aw = t8 * 8 + 8 * (n // 4) + n % 4
    a1w = a1_ptr.to(tl.pointer_type(tl.int32))
    a2w = a2_ptr.to(tl.pointer_type(tl.int32))
    rmask3 = rmask[None, :, None]
    acc = tl.zeros((MT, BN, NR), dtype=tl.float32)
    k0 = pid_k * kb_per
    kb = k0
    while kb < k0 + kb_per:
        valid = rmask3 & (kb * 8 + b_of < n_blk)
        o = kb * 8 * BH
        w = (tl.load(ph + wofs + o, mask=valid, other=0, eviction_policy="evict_first")
             .to(tl.int32) & 0xFFFF) | (tl.load(ph + wofs + o + 1, mask=valid, other=0,
                                                eviction_policy="evict_first").to(tl.int32) << 16)
        d = tl.load(ph + dofs + o, mask=rmask3 & (kb * 8 + rb < n_blk), other=0)
        d = d.to(tl.float16, bitcast=True).to(tl.float32)
        dxs = tl.load(dxs_ptr + t8 + kb * 8 + rb, mask=tmask, other=0.0)
        if QTYPE == Q8_0:
            dg = _group_dots(w, a1w, a2w, aw + kb * 64, tmask, ASM)
            acc += (dxs * d) * dg.to(tl.float32)
        else:
            if QTYPE == Q5_0:
                qh = (tl.load(ph + hofs + o, mask=valid, other=0).to(tl.int32) & 0xFFFF) | \
                    (tl.load(ph + hofs + o + 1, mask=valid, other=0).to(tl.int32) << 16)
            dg = tl.zeros((MT, BN, NR), dtype=tl.int32)
            for hi in tl.static_range(2):
                c = (w >> (4 * hi)) & 0x0F0F0F0F
                if QTYPE == Q5_0:
                    fifth = (((qh >> (16 * hi + 4 * i_of)) & 0xF) * 0x00204081) & 0x01010101
                    c = c | (fifth << 4)
                dg += _group_dots(c, a1w, a2w, aw + kb * 64 + 4 * hi, tmask, ASM)
            xs = tl.load(s32_ptr + t8 + kb * 8 + rb, mask=tmask, other=0)
            off: tl.constexpr = 8 if QTYPE == Q4_0 else 16
            acc += (dxs * d) * (dg - off * xs).to(tl.float32)
        kb += 1
    _store(y_ptr, part_ptr, cnt_ptr, acc, split, M, n_out, r, rmask, MT)
