"""Triton kernels for one or two activation rows of K-quant weights (CUDA).

The dispatch's one-token kernels for Q4_K / Q5_K (``_mv_q45k_kernel``) and
Q6_K (``_mv_q6k_kernel``), and ``_mm_q45k_mt_kernel``, the Q4_K / Q5_K kernel
with a token axis (2 tokens: one decode of each weight for both). Every other
type and rung decodes through ``tile._tile``.

The packed bytes are read as 4-byte (Q4_K/Q5_K) or 2-byte (Q6_K) words and
never reordered; the activation is permuted once per call
(``_permute_x_kernel``) into the words' nibble order, so each thread owns a
few words of several rows and reuses the loaded activations across them.
Word offsets are the byte offsets of ``formats/layout.py`` (through
``layout``) divided by the word size; the checks below refuse a layout
whose fields do not sit on word boundaries. The history of these kernels
(versions 1-4, measured on an H200) is in docs/performance.md.

The arithmetic: (1) a code becomes a float by ORing it into the mantissa of
128.0 (``bits(0x43000000 | q << 16) == 128 + q``; no integer-to-float
conversion); the 128 is taken off once per sub-block (128 * sum(x)), not once
per weight, which saves an add per weight at a cost of ~2e-6 relative error
(the partial sums carry 128 + q instead of q); scales multiply each
sub-block's partial dot, mins its activation sum. (2) The next super-block's
codes and its header (d, dmin and the scale strip as four words, decoded in
registers) are loaded before the current one is decoded. float32 throughout.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .layout import (  # noqa: F401  (every name is a tl.constexpr read by the kernels)
    K_SCALE_SIZE, Q4_K, Q4_K_BYTES, Q4_K_D, Q4_K_DMIN, Q4_K_QS, Q4_K_SCALES, Q5_K, Q5_K_BYTES,
    Q5_K_D, Q5_K_DMIN, Q5_K_QH, Q5_K_QS, Q5_K_SCALES, Q6_K, Q6_K_BYTES, Q6_K_D, Q6_K_QH, Q6_K_QL,
    Q6_K_SCALES, TILE, require)
from .tile import _k4_scale_min, _store  # noqa: F401  (_k4_scale_min: called by _scale_min_words)

for _name, _bb, _d, _dmin, _sc, _qs, _qh in (
        ("Q4_K", Q4_K_BYTES, Q4_K_D, Q4_K_DMIN, Q4_K_SCALES, Q4_K_QS, 0),
        ("Q5_K", Q5_K_BYTES, Q5_K_D, Q5_K_DMIN, Q5_K_SCALES, Q5_K_QS, Q5_K_QH)):
    require(all(v % 4 == 0 for v in (_bb, _d, _sc, _qs, _qh)),
            f"{_name} blocks and their d, scales, qs and qh fields on 4-byte words")
    require(_dmin == _d + 2, f"{_name}'s dmin in the upper half of d's word")
require(K_SCALE_SIZE == 12, "the K-quant scale strip is 3 words")
require(all(v % 2 == 0 for v in (Q6_K_BYTES, Q6_K_QL, Q6_K_QH, Q6_K_D)),
        "Q6_K blocks and their ql, qh and d fields on 2-byte words")

OFS = tl.constexpr(0x43000000)      # float bits of 128.0; mantissa bit 16 is worth 1.0


# ---- the activation in the words' nibble order ---------------------------------

@triton.jit
def _permute_x_kernel(x_ptr, xp_ptr, n_in, stride_x, QTYPE: tl.constexpr,
                      BLOCK: tl.constexpr):
    """xp[t, i] = float32(x[t, elem(i)]): activations in the packed words' nibble order."""
    t_row = tl.program_id(1)
    x_ptr += t_row.to(tl.int64) * stride_x
    xp_ptr += t_row.to(tl.int64) * n_in
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    kb = i // TILE
    r = i % TILE
    if QTYPE == Q6_K:            # r = 64 * s + t: halfword t of ql, nibble s = 2k + hi
        s = r // 64
        t = r % 64
        k = s // 2
        hi = s % 2
        c = (t // 16) % 2 + 2 * hi
        e = 128 * (t // 32) + 32 * c + 2 * (t % 16) + k
    else:                        # r = 32 * s + n: word n of qs, nibble s = 2k + hi
        s = r // 32
        n = r % 32
        e = 64 * (n // 8) + 32 * (s % 2) + 4 * (n % 8) + s // 2
    m = i < n_in
    v = tl.load(x_ptr + kb * TILE + e, mask=m, other=0.0).to(tl.float32)
    tl.store(xp_ptr + i, v, mask=m)


# ---- shared pieces of the Q4_K / Q5_K kernels ------------------------------------

@triton.jit
def _at16(w, P: tl.constexpr):
    """Move bit P of ``w`` to bit 16."""
    if P < 16:
        r = w << (16 - P)
    elif P > 16:
        r = w >> (P - 16)
    else:
        r = w
    return r


@triton.jit
def _f16_lo(w):
    return (w & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _scale_min_words(s0, s1, s2, j):
    """(sc, m) of sub-blocks ``j`` from the scale strip as words s0, s1, s2 ([BN, 1])."""
    sh = 8 * (j % 4)
    return _k4_scale_min((s0 >> sh) & 0xFF, (s1 >> sh) & 0xFF, (s2 >> sh) & 0xFF, j)


@triton.jit
def _q45k_header(h0, kb, BW: tl.constexpr, DW: tl.constexpr, SCW: tl.constexpr):
    """Super-block ``kb``'s header words: d | dmin << 16, then the scale strip's three."""
    base = h0 + kb * BW
    return tl.load(base + DW), tl.load(base + SCW), tl.load(base + SCW + 1), tl.load(base + SCW + 2)


@triton.jit
def _q45k_codes(w, qh, n, hi, QTYPE: tl.constexpr):
    """The codes of nibble half ``hi`` of qs words ``w`` (bytes 0..3 hold sub-blocks
    2k + hi), with Q5_K's fifth bits from its qh words."""
    if QTYPE == Q5_K:
        hb = (qh >> (2 * (n // 8) + hi)) & 0x01010101
        v = ((w >> (4 * hi)) & 0x0F0F0F0F) | (hb << 4)
    else:
        v = w >> (4 * hi)
    return v


@triton.jit
def _q128(v, k: tl.constexpr, QTYPE: tl.constexpr):
    """128 + the code in byte ``k`` of ``v``, as float32 (exact)."""
    if QTYPE == Q5_K:
        f = ((_at16(v, 8 * k) & 0x001F0000) | OFS).to(tl.float32, bitcast=True)
    else:
        f = ((_at16(v, 8 * k) & 0x000F0000) | OFS).to(tl.float32, bitcast=True)
    return f


# ---- one token, Q4_K / Q5_K ------------------------------------------------------

@triton.jit
def _mv_q45k_kernel(xp_ptr, p, y_ptr, part_ptr, cnt_ptr, split, n_out, KB_PER: tl.constexpr,
                    QTYPE: tl.constexpr, NB: tl.constexpr, BN: tl.constexpr):
    """[BN, 32] word tiles: Triton gives each thread 4 consecutive words of several
    rows, so one 16-byte load of the activation serves all of that thread's rows."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    r = pid_n * BN + tl.arange(0, BN)
    rmask = r < n_out
    rows = tl.where(rmask, r, 0).to(tl.int64)
    BW: tl.constexpr = (Q4_K_BYTES if QTYPE == Q4_K else Q5_K_BYTES) // 4   # words per block
    QSW: tl.constexpr = (Q4_K_QS if QTYPE == Q4_K else Q5_K_QS) // 4
    DW: tl.constexpr = (Q4_K_D if QTYPE == Q4_K else Q5_K_D) // 4          # d | dmin << 16
    SCW: tl.constexpr = (Q4_K_SCALES if QTYPE == Q4_K else Q5_K_SCALES) // 4
    pw = p.to(tl.pointer_type(tl.int32))
    n = tl.arange(0, 32)[None, :]
    g2 = tl.arange(0, 4)[None, :]
    rw = rows * (NB * BW)
    wp = pw + rw[:, None] + QSW + n
    hp = pw + rw[:, None] + Q5_K_QH // 4 + n % 8              # Q5_K: qh word n % 8
    h0 = pw + rw
    k0 = pid_k * KB_PER
    kend = k0 + KB_PER - 1
    w = tl.load(wp + k0 * BW, eviction_policy="evict_first")
    qh = w                                                    # Q4_K: never read
    if QTYPE == Q5_K:
        qh = tl.load(hp + k0 * BW, eviction_policy="evict_first")
    a0, a1, a2, a3 = _q45k_header(h0, k0, BW, DW, SCW)
    acc = tl.zeros((BN,), dtype=tl.float32)
    for i in range(0, KB_PER):
        kb = k0 + i
        kn = tl.minimum(kb + 1, kend)
        w_next = tl.load(wp + kn * BW, eviction_policy="evict_first")
        if QTYPE == Q5_K:
            qh_next = tl.load(hp + kn * BW, eviction_policy="evict_first")
        b0, b1, b2, b3 = _q45k_header(h0, kn, BW, DW, SCW)
        d = _f16_lo(a0)[:, None]
        dmin = _f16_lo(a0 >> 16)[:, None]
        xb = xp_ptr + kb * TILE + n
        for hi in tl.static_range(2):
            v = _q45k_codes(w, qh, n, hi, QTYPE)
            a = tl.zeros((BN, 32), dtype=tl.float32)
            xs = tl.zeros((1, 32), dtype=tl.float32)
            for k in tl.static_range(4):
                xv = tl.load(xb + 32 * (2 * k + hi))
                a += _q128(v, k, QTYPE) * xv
                xs += xv
            dot = tl.sum(tl.reshape(a, (BN, 4, 8)), axis=2)   # [BN, 4]: sum (128 + q) x
            xsum = tl.sum(tl.reshape(xs, (1, 4, 8)), axis=2)  # [1, 4]
            sc, m = _scale_min_words(a1[:, None], a2[:, None], a3[:, None], 2 * g2 + hi)
            ds = d * sc.to(tl.float32)
            acc += tl.sum(ds * dot - (128.0 * ds + dmin * m.to(tl.float32)) * xsum, axis=1)
        w = w_next
        if QTYPE == Q5_K:
            qh = qh_next
        a0 = b0
        a1 = b1
        a2 = b2
        a3 = b3
    _store(y_ptr, part_ptr, cnt_ptr, acc[None, :], split, 1, n_out, r, rmask, 1)


# ---- one token, Q6_K -------------------------------------------------------------

@triton.jit
def _mv_q6k_kernel(xp_ptr, p, y_ptr, part_ptr, cnt_ptr, split, n_out, KB_PER: tl.constexpr,
                   NB: tl.constexpr, BN: tl.constexpr):
    """Halfwords of ql / qh in storage order; d and the 16 scales are prefetched
    one super-block ahead like the codes. Codes are 128 + q, less 128 + 32 once."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    r = pid_n * BN + tl.arange(0, BN)
    rmask = r < n_out
    rows = tl.where(rmask, r, 0).to(tl.int64)
    BH: tl.constexpr = Q6_K_BYTES // 2                        # halfwords per block
    ph = p.to(tl.pointer_type(tl.int16))
    u3 = tl.arange(0, 8)[None, :, None]
    m3 = tl.arange(0, 8)[None, None, :]
    t3 = 8 * u3 + m3
    u2 = tl.arange(0, 8)[None, :]
    part = (u3 // 2) % 2
    rh = rows * (NB * BH)
    lp = ph + rh[:, None, None] + Q6_K_QL // 2 + t3
    hp = ph + rh[:, None, None] + Q6_K_QH // 2 + 16 * (u3 // 4) + 8 * (u3 % 2) + m3
    k0 = pid_k * KB_PER
    kend = k0 + KB_PER - 1
    # scale of group u for (hi): byte 8*(u//4) + 2*((u//2)%2 + 2*hi) + u%2
    sb0 = p + (rh * 2)[:, None] + Q6_K_SCALES + 8 * (u2 // 4) + 2 * ((u2 // 2) % 2) + u2 % 2
    ql = tl.load(lp + k0 * BH, eviction_policy="evict_first").to(tl.int32)
    qh = tl.load(hp + k0 * BH, eviction_policy="evict_first").to(tl.int32)
    sc0 = tl.load(sb0 + k0 * Q6_K_BYTES).to(tl.int8, bitcast=True).to(tl.float32)
    sc1 = tl.load(sb0 + k0 * Q6_K_BYTES + 4).to(tl.int8, bitcast=True).to(tl.float32)
    dw = tl.load(ph + rh + k0 * BH + Q6_K_D // 2)
    acc = tl.zeros((BN,), dtype=tl.float32)
    for i in range(0, KB_PER):
        kb = k0 + i
        kn = tl.minimum(kb + 1, kend)
        ql_next = tl.load(lp + kn * BH, eviction_policy="evict_first").to(tl.int32)
        qh_next = tl.load(hp + kn * BH, eviction_policy="evict_first").to(tl.int32)
        sc0_next = tl.load(sb0 + kn * Q6_K_BYTES).to(tl.int8, bitcast=True).to(tl.float32)
        sc1_next = tl.load(sb0 + kn * Q6_K_BYTES + 4).to(tl.int8, bitcast=True).to(tl.float32)
        dw_next = tl.load(ph + rh + kn * BH + Q6_K_D // 2)
        d = dw.to(tl.float16, bitcast=True).to(tl.float32)
        xb = xp_ptr + kb * TILE + t3
        for hi in tl.static_range(2):
            v = ((ql >> (4 * hi)) & 0x0F0F) | (((qh >> (2 * part + 4 * hi)) & 0x0303) << 4)
            a = tl.zeros((BN, 8, 8), dtype=tl.float32)
            xs = tl.zeros((1, 8, 8), dtype=tl.float32)
            for k in tl.static_range(2):
                xv = tl.load(xb + 64 * (2 * k + hi))
                f = ((_at16(v, 8 * k) & 0x003F0000) | OFS).to(tl.float32, bitcast=True)
                a += f * xv
                xs += xv
            dot = tl.sum(a, axis=2)
            xsum = tl.sum(xs, axis=2)
            sc = sc0 if hi == 0 else sc1
            acc += d * tl.sum(sc * (dot - 160.0 * xsum), axis=1)
        ql = ql_next
        qh = qh_next
        sc0 = sc0_next
        sc1 = sc1_next
        dw = dw_next
    _store(y_ptr, part_ptr, cnt_ptr, acc[None, :], split, 1, n_out, r, rmask, 1)


# ---- 2 tokens, Q4_K / Q5_K: the one-token kernel with a token axis --------------
# The decode of each weight (shift, mask, OR) is done once and used for all MT
# activation rows (FFMA on CUDA cores, float32), so the weights are read once
# for all tokens. Rows t >= M of the token axis are zero activations.

@triton.jit
def _mm_q45k_mt_kernel(xp_ptr, p, y_ptr, M, n_out, KB_PER: tl.constexpr,
                       QTYPE: tl.constexpr, NB: tl.constexpr, BN: tl.constexpr,
                       MT: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    r = pid_n * BN + tl.arange(0, BN)
    rmask = r < n_out
    rows = tl.where(rmask, r, 0).to(tl.int64)
    BW: tl.constexpr = (Q4_K_BYTES if QTYPE == Q4_K else Q5_K_BYTES) // 4
    QSW: tl.constexpr = (Q4_K_QS if QTYPE == Q4_K else Q5_K_QS) // 4
    DW: tl.constexpr = (Q4_K_D if QTYPE == Q4_K else Q5_K_D) // 4
    SCW: tl.constexpr = (Q4_K_SCALES if QTYPE == Q4_K else Q5_K_SCALES) // 4
    pw = p.to(tl.pointer_type(tl.int32))
    n = tl.arange(0, 32)[None, :]
    g2 = tl.arange(0, 4)[None, :]
    tt = tl.arange(0, MT)[:, None, None]                      # token, [MT, 1, 1]
    tmask = tt < M
    n3 = tl.arange(0, 32)[None, None, :]
    rw = rows * (NB * BW)
    wp = pw + rw[:, None] + QSW + n
    hp = pw + rw[:, None] + Q5_K_QH // 4 + n % 8
    h0 = pw + rw
    k0 = pid_k * KB_PER
    kend = k0 + KB_PER - 1
    w = tl.load(wp + k0 * BW, eviction_policy="evict_first")
    qh = w                                                    # Q4_K: never read
    if QTYPE == Q5_K:
        qh = tl.load(hp + k0 * BW, eviction_policy="evict_first")
    a0, a1, a2, a3 = _q45k_header(h0, k0, BW, DW, SCW)
    acc = tl.zeros((MT, BN), dtype=tl.float32)
    for i in range(0, KB_PER):
        kb = k0 + i
        kn = tl.minimum(kb + 1, kend)
        w_next = tl.load(wp + kn * BW, eviction_policy="evict_first")
        if QTYPE == Q5_K:
            qh_next = tl.load(hp + kn * BW, eviction_policy="evict_first")
        b0, b1, b2, b3 = _q45k_header(h0, kn, BW, DW, SCW)
        d = _f16_lo(a0)[:, None]
        dmin = _f16_lo(a0 >> 16)[:, None]
        xb = xp_ptr + tt.to(tl.int64) * (NB * TILE) + kb * TILE + n3
        for hi in tl.static_range(2):
            v = _q45k_codes(w, qh, n, hi, QTYPE)
            a = tl.zeros((MT, BN, 32), dtype=tl.float32)
            xs = tl.zeros((MT, 1, 32), dtype=tl.float32)
            for k in tl.static_range(4):
                xv = tl.load(xb + 32 * (2 * k + hi), mask=tmask, other=0.0)
                a += _q128(v, k, QTYPE)[None, :, :] * xv
                xs += xv
            dot = tl.sum(tl.reshape(a, (MT, BN, 4, 8)), axis=3)      # [MT, BN, 4]
            xsum = tl.sum(tl.reshape(xs, (MT, 1, 4, 8)), axis=3)     # [MT, 1, 4]
            sc, m = _scale_min_words(a1[:, None], a2[:, None], a3[:, None], 2 * g2 + hi)
            ds = (d * sc.to(tl.float32))[None, :, :]
            mm = (128.0 * d * sc.to(tl.float32) + dmin * m.to(tl.float32))[None, :, :]
            acc += tl.sum(ds * dot - mm * xsum, axis=2)
        w = w_next
        if QTYPE == Q5_K:
            qh = qh_next
        a0 = b0
        a1 = b1
        a2 = b2
        a3 = b3
    t2 = tl.arange(0, MT)[:, None]
    out = y_ptr + pid_k * M * n_out + t2.to(tl.int64) * n_out + r[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=(t2 < M) & rmask[None, :])
