"""Triton kernels for packed GGML weights (CUDA). Imported only where Triton is.

Every kernel reads the packed rows exactly as they lie in the GGUF file
(``muser_torch.formats``: uint8 ``[n_out, row_bytes]``); block geometry comes
from ``GGMLType``. Three families of kernels:

* ``_dequant_kernel``: decode a tile of ``BN`` rows x 256 columns to float32.
  One kernel serves ``dequantize`` (rows 0..n_out) and ``embedding`` (rows
  gathered by token id). Launched with ``enable_fp_fusion=False`` so each
  product and difference rounds as in ``formats.dequantize``: bit-exact.
* One activation row, Q4_K / Q5_K / Q6_K: ``_mv_q45k_v4_kernel`` and
  ``_mv_q6k_v3_kernel`` (the dispatch's defaults; the version before each
  stays for the benchmark's sweep and is tested too: see docs/performance.md). The packed
  bytes are read as 16-byte (Q4_K/Q5_K) or 2-byte (Q6_K) words and never
  reordered; the activation is permuted once per call (``_permute_x_kernel``)
  into the words' nibble order, so each thread owns a few words of several
  rows and reuses the loaded activations across them. A code becomes a float
  by ORing it into the mantissa of 128.0 (``bits(0x43000000 | q << 16) ==
  128 + q``; no integer-to-float conversion), the 128 is taken off once per
  sub-block; scales multiply each sub-block's partial dot, mins its activation
  sum. The next super-block's codes and headers are loaded before the current
  one is decoded. float32 throughout. ``_mm_q45k_mt_kernel`` is the same with
  a token axis (2 tokens: one decode of each weight for both).
* ``_qmm_kernel``: 2 or more activation rows, on tensor cores. A tile of
  ``BN`` weight rows x 256 columns is decoded once per program and used for
  all ``BM`` activation rows (``tl.dot`` of half/bfloat16 tiles, or full
  float32 products for float32 activations, as torch's matmul gives by
  default; float32 accumulation). 2-16 tokens use BM=16, so
  the weights are read once for all tokens; larger batches tile M.
  ``_mv_generic_kernel`` is the one-token path of the other types.

Split K: ``KB_PER`` divides the number of 256-column blocks exactly.

Reduction order: every kernel writes each output once (split-K partials are
summed by ``torch.sum``, never with atomics), so results are deterministic.
"""
from __future__ import annotations

import triton
import triton.language as tl

# GGML type ids (formats.types.GGMLType), as plain ints for constexpr dispatch.
F16 = tl.constexpr(1)
Q8_0 = tl.constexpr(8)
Q4_K = tl.constexpr(12)
Q5_K = tl.constexpr(13)
Q6_K = tl.constexpr(14)
NVFP4_E2M1 = tl.constexpr(1000)
MAGIC = tl.constexpr(0x4B000000)    # float bits of 2**23: OR a small integer into its mantissa
TWO23 = tl.constexpr(8388608.0)


# ---- field decoders ---------------------------------------------------------------

@triton.jit
def _f16_at(p, off, mask):
    """The little-endian f16 at byte offsets ``off`` of uint8 pointer ``p``, as float32."""
    lo = tl.load(p + off, mask=mask, other=0).to(tl.uint16)
    hi = tl.load(p + off + 1, mask=mask, other=0).to(tl.uint16)
    return (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _scale_min_k4(p, sbase, j, mask):
    """6-bit (sc, m) of sub-blocks ``j`` (0..7) from the 12-byte strip at ``sbase``."""
    t = j % 4
    lo_sc = tl.load(p + sbase + t, mask=mask, other=0).to(tl.int32)
    lo_m = tl.load(p + sbase + 4 + t, mask=mask, other=0).to(tl.int32)
    mixed = tl.load(p + sbase + 8 + t, mask=mask, other=0).to(tl.int32)
    low = j < 4
    sc = tl.where(low, lo_sc & 63, (mixed & 0xF) | ((lo_sc >> 6) << 4))
    m = tl.where(low, lo_m & 63, (mixed >> 4) | ((lo_m >> 6) << 4))
    return sc, m


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


# ---- one tile: BN rows x 256 columns, float32, element order ---------------------

@triton.jit
def _tile(p, s_ptr, s2_ptr, rows, rmask, kb, n_in,
          ROW_BYTES, QTYPE: tl.constexpr, BN: tl.constexpr):
    """Decode columns ``256*kb .. 256*kb+255`` of packed rows ``rows`` ([BN] int64).

    Columns past ``n_in`` (legacy/F16/NVFP4 tails) and masked rows give 0."""
    rbase = rows.to(tl.int64) * ROW_BYTES                      # [BN]
    if QTYPE == Q4_K or QTYPE == Q5_K:
        BB: tl.constexpr = 144 if QTYPE == Q4_K else 176
        base = rbase + kb * BB
        d = _f16_at(p, base, rmask)
        dmin = _f16_at(p, base + 2, rmask)
        j = tl.arange(0, 8)[None, :]
        sc, m = _scale_min_k4(p, base[:, None] + 4, j, rmask[:, None])
        scale = d[:, None] * sc.to(tl.float32)                 # [BN, 8]
        shift = dmin[:, None] * m.to(tl.float32)
        j3 = tl.arange(0, 8)[None, :, None]
        i3 = tl.arange(0, 32)[None, None, :]
        b3 = base[:, None, None]
        m3 = rmask[:, None, None]
        QS: tl.constexpr = 16 if QTYPE == Q4_K else 48
        q = tl.load(p + b3 + QS + 32 * (j3 // 2) + i3, mask=m3, other=0).to(tl.int32)
        q = (q >> (4 * (j3 % 2))) & 0xF
        if QTYPE == Q5_K:
            qh = tl.load(p + b3 + 16 + i3, mask=m3, other=0).to(tl.int32)
            q = q | (((qh >> j3) & 1) << 4)
        w = scale[:, :, None] * q.to(tl.float32) - shift[:, :, None]
        w = tl.reshape(w, (BN, 256))
    elif QTYPE == Q6_K:
        base = rbase + kb * 210
        d = _f16_at(p, base + 208, rmask)
        s3 = tl.arange(0, 16)[None, :, None]                   # sub-block of 16
        l3 = tl.arange(0, 16)[None, None, :]
        b3 = base[:, None, None]
        m3 = rmask[:, None, None]
        h = s3 // 8
        c = (s3 // 2) % 4
        l = 16 * (s3 % 2) + l3
        ql = tl.load(p + b3 + 64 * h + 32 * (c % 2) + l, mask=m3, other=0).to(tl.int32)
        qh = tl.load(p + b3 + 128 + 32 * h + l, mask=m3, other=0).to(tl.int32)
        q = ((ql >> (4 * (c // 2))) & 0xF) | (((qh >> (2 * c)) & 3) << 4)
        sc = tl.load(p + base[:, None] + 192 + tl.arange(0, 16)[None, :],
                     mask=rmask[:, None], other=0).to(tl.int8, bitcast=True).to(tl.float32)
        w = (d[:, None] * sc)[:, :, None] * (q - 32).to(tl.float32)
        w = tl.reshape(w, (BN, 256))
    elif QTYPE == Q8_0:
        t3 = tl.arange(0, 8)[None, :, None]
        i3 = tl.arange(0, 32)[None, None, :]
        blk = kb * 8 + t3                                      # [1, 8, 1]
        valid = rmask[:, None, None] & (blk < n_in // 32)
        b3 = rbase[:, None, None] + blk * 34
        d = _f16_at(p, b3, valid)                              # [BN, 8, 1]
        q = tl.load(p + b3 + 2 + i3, mask=valid, other=0).to(tl.int8, bitcast=True)
        w = tl.reshape(d * q.to(tl.float32), (BN, 256))
    elif QTYPE == F16:
        col = kb * 256 + tl.arange(0, 256)[None, :]
        pw = p.to(tl.pointer_type(tl.float16))
        w = tl.load(pw + (rows.to(tl.int64) * (ROW_BYTES // 2))[:, None] + col,
                    mask=rmask[:, None] & (col < n_in), other=0.0).to(tl.float32)
    else:  # NVFP4_E2M1: 16 groups of 16, element 2i in byte i's low nibble
        g3 = tl.arange(0, 16)[None, :, None]
        t3 = tl.arange(0, 16)[None, None, :]
        grp = kb * 16 + g3
        valid = rmask[:, None, None] & (grp < n_in // 16)
        byte = rbase[:, None, None] + grp * 8 + t3 // 2
        code = (tl.load(p + byte, mask=valid, other=0).to(tl.int32) >> (4 * (t3 % 2))) & 0xF
        sb = tl.load(s_ptr + (rows.to(tl.int64) * (n_in // 16))[:, None, None] + grp,
                     mask=valid, other=0).to(tl.int32)
        s2 = tl.load(s2_ptr)
        w = (_e2m1(code) * _e4m3fn(sb)) * s2
        w = tl.where(valid, w, 0.0)
        w = tl.reshape(w, (BN, 256))
    return w


# ---- dequantize / embedding -------------------------------------------------------

@triton.jit
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
    col = kb * 256 + tl.arange(0, 256)[None, :]
    tl.store(out_ptr + r.to(tl.int64)[:, None] * n_in + col, w,
             mask=rmask[:, None] & (col < n_in))


# ---- one token, any type: tile * x ---------------------------------------------

@triton.jit
def _mv_generic_kernel(x_ptr, p, s_ptr, s2_ptr, y_ptr, n_out, n_in, n_kb,
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
        col = kb * 256 + tl.arange(0, 256)
        xv = tl.load(x_ptr + col, mask=col < n_in, other=0.0).to(tl.float32)
        w = _tile(p, s_ptr, s2_ptr, rows, rmask, kb, n_in, ROW_BYTES, QTYPE, BN)
        acc += tl.sum(w * xv[None, :], axis=1)
    tl.store(y_ptr + pid_k * n_out + r, acc.to(y_ptr.dtype.element_ty), mask=rmask)


# ---- several tokens: decoded tile on tensor cores ------------------------------

@triton.jit
def _qmm_kernel(x_ptr, p, s_ptr, s2_ptr, y_ptr, M, n_out, n_in, n_kb,
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
        col = kb * 256 + tl.arange(0, 256)
        xt = tl.load(x_ptr + rm.to(tl.int64)[:, None] * stride_xm + col[None, :],
                     mask=mmask[:, None] & (col[None, :] < n_in), other=0.0)
        w = _tile(p, s_ptr, s2_ptr, rows, nmask, kb, n_in, ROW_BYTES, QTYPE, BN)
        if DOT_F32:   # float32 activations get float32 products, as torch's default (no TF32)
            acc += tl.dot(xt.to(tl.float32), tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(xt, tl.trans(w.to(xt.dtype)))
    out = y_ptr + pid_k * M * n_out + rm.to(tl.int64)[:, None] * n_out + rn[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])


# ---- one token, K-quants: words in storage order, activation permuted ----------

@triton.jit
def _permute_x_kernel(x_ptr, xp_ptr, n_in, stride_x=0, QTYPE: tl.constexpr = 12,
                      BLOCK: tl.constexpr = 1024):
    """xp[t, i] = float32(x[t, elem(i)]): activations in the packed words' nibble order."""
    t_row = tl.program_id(1)
    x_ptr += t_row.to(tl.int64) * stride_x
    xp_ptr += t_row.to(tl.int64) * n_in
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    kb = i // 256
    r = i % 256
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
    v = tl.load(x_ptr + kb * 256 + e, mask=m, other=0.0).to(tl.float32)
    tl.store(xp_ptr + i, v, mask=m)


# ---- one token, K-quants: the 128 + q arithmetic --------------------------------
# (1) the nibble is moved to bits 16..19 (20 for Q5_K's fifth bit) and ORed into
# the bits of 128.0, giving 128 + q exactly; the 128 is taken off once per
# sub-block (128 * sum(x)), not once per weight, which saves an add per weight
# at a cost of ~2e-6 relative error (the partial sums carry 128 + q instead of
# q); (2) the next super-block's words are loaded before this one is decoded.
# Versions 1 and 2 of the Q4_K/Q5_K kernel (docs/performance.md) are gone; the
# sweep compares each type's last two (MV_VERSIONS in ops/cuda.py).

OFS = tl.constexpr(0x43000000)      # float bits of 128.0; mantissa bit 16 is worth 1.0


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
def _mv_q6k_v2_kernel(xp_ptr, p, y_ptr, n_out, KB_PER: tl.constexpr,
                      NB: tl.constexpr, BN: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    r = pid_n * BN + tl.arange(0, BN)
    rmask = r < n_out
    rows = tl.where(rmask, r, 0).to(tl.int64)
    ph = p.to(tl.pointer_type(tl.int16))
    u3 = tl.arange(0, 8)[None, :, None]                       # group of 8 ql halfwords
    m3 = tl.arange(0, 8)[None, None, :]
    t3 = 8 * u3 + m3                                          # ql halfword, [1, 8, 8]
    u2 = tl.arange(0, 8)[None, :]
    part = (u3 // 2) % 2
    rh = rows * (NB * 105)                                    # row start in halfwords
    lp = ph + rh[:, None, None] + t3
    hp = ph + rh[:, None, None] + 64 + 16 * (u3 // 4) + 8 * (u3 % 2) + m3
    k0 = pid_k * KB_PER
    kend = k0 + KB_PER - 1
    ql = tl.load(lp + k0 * 105, eviction_policy="evict_first").to(tl.int32)
    qh = tl.load(hp + k0 * 105, eviction_policy="evict_first").to(tl.int32)
    acc = tl.zeros((BN,), dtype=tl.float32)
    for i in range(0, KB_PER):
        kb = k0 + i
        kn = tl.minimum(kb + 1, kend)
        ql_next = tl.load(lp + kn * 105, eviction_policy="evict_first").to(tl.int32)
        qh_next = tl.load(hp + kn * 105, eviction_policy="evict_first").to(tl.int32)
        base = rh * 2 + kb * 210
        d = _f16_at(p, base + 208, rmask)
        xb = xp_ptr + kb * 256 + t3
        for hi in tl.static_range(2):
            v = ((ql >> (4 * hi)) & 0x0F0F) | (((qh >> (2 * part + 4 * hi)) & 0x0303) << 4)
            a = tl.zeros((BN, 8, 8), dtype=tl.float32)
            xs = tl.zeros((1, 8, 8), dtype=tl.float32)
            for k in tl.static_range(2):
                xv = tl.load(xb + 64 * (2 * k + hi))
                f = ((_at16(v, 8 * k) & 0x003F0000) | OFS).to(tl.float32, bitcast=True)
                a += f * xv
                xs += xv
            dot = tl.sum(a, axis=2)                           # [BN, 8]: sum (128 + q) x
            xsum = tl.sum(xs, axis=2)                         # [1, 8]
            sidx = 8 * (u2 // 4) + 2 * ((u2 // 2) % 2 + 2 * hi) + u2 % 2
            sc = tl.load(p + base[:, None] + 192 + sidx).to(tl.int8, bitcast=True).to(tl.float32)
            acc += d * tl.sum(sc * (dot - 160.0 * xsum), axis=1)
        ql = ql_next
        qh = qh_next
    tl.store(y_ptr + pid_k * n_out + r, acc.to(y_ptr.dtype.element_ty), mask=rmask)


@triton.jit
def _mv_q45k_v3_kernel(xp_ptr, p, y_ptr, n_out, KB_PER: tl.constexpr,
                       QTYPE: tl.constexpr, NB: tl.constexpr, BN: tl.constexpr):
    """The 128 + q arithmetic on [BN, 32] word tiles: Triton then gives each
    thread 4 consecutive words of several rows, so one 16-byte load of the
    activation serves all of that thread's rows."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    r = pid_n * BN + tl.arange(0, BN)
    rmask = r < n_out
    rows = tl.where(rmask, r, 0).to(tl.int64)
    BB: tl.constexpr = 144 if QTYPE == Q4_K else 176
    QS: tl.constexpr = 4 if QTYPE == Q4_K else 12
    BW: tl.constexpr = BB // 4
    pw = p.to(tl.pointer_type(tl.int32))
    n = tl.arange(0, 32)[None, :]                             # word of qs
    g2 = tl.arange(0, 4)[None, :]
    rw = rows * (NB * BW)
    wp = pw + rw[:, None] + QS + n
    hp = pw + rw[:, None] + 4 + n % 8                         # Q5_K: qh word n % 8
    k0 = pid_k * KB_PER
    kend = k0 + KB_PER - 1
    w = tl.load(wp + k0 * BW, eviction_policy="evict_first")
    if QTYPE == Q5_K:
        qh = tl.load(hp + k0 * BW, eviction_policy="evict_first")
    acc = tl.zeros((BN,), dtype=tl.float32)
    for i in range(0, KB_PER):
        kb = k0 + i
        kn = tl.minimum(kb + 1, kend)
        w_next = tl.load(wp + kn * BW, eviction_policy="evict_first")
        if QTYPE == Q5_K:
            qh_next = tl.load(hp + kn * BW, eviction_policy="evict_first")
        base = rw * 4 + kb * BB
        d = _f16_at(p, base, rmask)
        dmin = _f16_at(p, base + 2, rmask)
        xb = xp_ptr + kb * 256 + n
        for hi in tl.static_range(2):
            if QTYPE == Q5_K:
                hb = (qh >> (2 * (n // 8) + hi)) & 0x01010101
                v = ((w >> (4 * hi)) & 0x0F0F0F0F) | (hb << 4)
            else:
                v = w >> (4 * hi)
            a = tl.zeros((BN, 32), dtype=tl.float32)
            xs = tl.zeros((1, 32), dtype=tl.float32)
            for k in tl.static_range(4):
                xv = tl.load(xb + 32 * (2 * k + hi))
                if QTYPE == Q5_K:
                    f = ((_at16(v, 8 * k) & 0x001F0000) | OFS).to(tl.float32, bitcast=True)
                else:
                    f = ((_at16(v, 8 * k) & 0x000F0000) | OFS).to(tl.float32, bitcast=True)
                a += f * xv
                xs += xv
            dot = tl.sum(tl.reshape(a, (BN, 4, 8)), axis=2)   # [BN, 4]: sum (128 + q) x
            xsum = tl.sum(tl.reshape(xs, (1, 4, 8)), axis=2)  # [1, 4]
            sc, m = _scale_min_k4(p, base[:, None] + 4, 2 * g2 + hi, rmask[:, None])
            ds = d[:, None] * sc.to(tl.float32)
            acc += tl.sum(ds * dot - (128.0 * ds + dmin[:, None] * m.to(tl.float32)) * xsum, axis=1)
        w = w_next
        if QTYPE == Q5_K:
            qh = qh_next
    tl.store(y_ptr + pid_k * n_out + r, acc.to(y_ptr.dtype.element_ty), mask=rmask)


# ---- one token, version 4: the block headers are prefetched too ---------------
# Version 3 still read d, dmin and the 12 scale bytes of each super-block with
# byte loads issued after the previous block was decoded: one dependent memory
# round trip per super-block. Here the 16 header bytes are four int32 words
# loaded one super-block ahead, like the codes, and decoded in registers.

@triton.jit
def _f16_lo(w):
    return (w & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _scale_min_words(s0, s1, s2, j):
    """(sc, m) of sub-blocks ``j`` from the scale strip as words s0, s1, s2 ([BN, 1])."""
    sh = 8 * (j % 4)
    lo_sc = (s0 >> sh) & 0xFF
    lo_m = (s1 >> sh) & 0xFF
    mixed = (s2 >> sh) & 0xFF
    low = j < 4
    sc = tl.where(low, lo_sc & 63, (mixed & 0xF) | ((lo_sc >> 6) << 4))
    m = tl.where(low, lo_m & 63, (mixed >> 4) | ((lo_m >> 6) << 4))
    return sc, m


@triton.jit
def _mv_q45k_v4_kernel(xp_ptr, p, y_ptr, n_out, KB_PER: tl.constexpr,
                       QTYPE: tl.constexpr, NB: tl.constexpr, BN: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    r = pid_n * BN + tl.arange(0, BN)
    rmask = r < n_out
    rows = tl.where(rmask, r, 0).to(tl.int64)
    BB: tl.constexpr = 144 if QTYPE == Q4_K else 176
    QS: tl.constexpr = 4 if QTYPE == Q4_K else 12
    BW: tl.constexpr = BB // 4
    pw = p.to(tl.pointer_type(tl.int32))
    n = tl.arange(0, 32)[None, :]
    g2 = tl.arange(0, 4)[None, :]
    rw = rows * (NB * BW)
    wp = pw + rw[:, None] + QS + n
    hp = pw + rw[:, None] + 4 + n % 8
    h0 = pw + rw
    k0 = pid_k * KB_PER
    kend = k0 + KB_PER - 1
    w = tl.load(wp + k0 * BW, eviction_policy="evict_first")
    if QTYPE == Q5_K:
        qh = tl.load(hp + k0 * BW, eviction_policy="evict_first")
    a0 = tl.load(h0 + k0 * BW)
    a1 = tl.load(h0 + k0 * BW + 1)
    a2 = tl.load(h0 + k0 * BW + 2)
    a3 = tl.load(h0 + k0 * BW + 3)
    acc = tl.zeros((BN,), dtype=tl.float32)
    for i in range(0, KB_PER):
        kb = k0 + i
        kn = tl.minimum(kb + 1, kend)
        w_next = tl.load(wp + kn * BW, eviction_policy="evict_first")
        if QTYPE == Q5_K:
            qh_next = tl.load(hp + kn * BW, eviction_policy="evict_first")
        b0 = tl.load(h0 + kn * BW)
        b1 = tl.load(h0 + kn * BW + 1)
        b2 = tl.load(h0 + kn * BW + 2)
        b3 = tl.load(h0 + kn * BW + 3)
        d = _f16_lo(a0)[:, None]
        dmin = _f16_lo(a0 >> 16)[:, None]
        xb = xp_ptr + kb * 256 + n
        for hi in tl.static_range(2):
            if QTYPE == Q5_K:
                hb = (qh >> (2 * (n // 8) + hi)) & 0x01010101
                v = ((w >> (4 * hi)) & 0x0F0F0F0F) | (hb << 4)
            else:
                v = w >> (4 * hi)
            a = tl.zeros((BN, 32), dtype=tl.float32)
            xs = tl.zeros((1, 32), dtype=tl.float32)
            for k in tl.static_range(4):
                xv = tl.load(xb + 32 * (2 * k + hi))
                if QTYPE == Q5_K:
                    f = ((_at16(v, 8 * k) & 0x001F0000) | OFS).to(tl.float32, bitcast=True)
                else:
                    f = ((_at16(v, 8 * k) & 0x000F0000) | OFS).to(tl.float32, bitcast=True)
                a += f * xv
                xs += xv
            dot = tl.sum(tl.reshape(a, (BN, 4, 8)), axis=2)
            xsum = tl.sum(tl.reshape(xs, (1, 4, 8)), axis=2)
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
    tl.store(y_ptr + pid_k * n_out + r, acc.to(y_ptr.dtype.element_ty), mask=rmask)


@triton.jit
def _mv_q6k_v3_kernel(xp_ptr, p, y_ptr, n_out, KB_PER: tl.constexpr,
                      NB: tl.constexpr, BN: tl.constexpr):
    """Q6_K version 2 with d and the 16 scales prefetched one super-block ahead."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    r = pid_n * BN + tl.arange(0, BN)
    rmask = r < n_out
    rows = tl.where(rmask, r, 0).to(tl.int64)
    ph = p.to(tl.pointer_type(tl.int16))
    u3 = tl.arange(0, 8)[None, :, None]
    m3 = tl.arange(0, 8)[None, None, :]
    t3 = 8 * u3 + m3
    u2 = tl.arange(0, 8)[None, :]
    part = (u3 // 2) % 2
    rh = rows * (NB * 105)
    lp = ph + rh[:, None, None] + t3
    hp = ph + rh[:, None, None] + 64 + 16 * (u3 // 4) + 8 * (u3 % 2) + m3
    k0 = pid_k * KB_PER
    kend = k0 + KB_PER - 1
    # scale of group u for (hi): byte 8*(u//4) + 2*((u//2)%2 + 2*hi) + u%2
    sb0 = p + (rh * 2)[:, None] + 192 + 8 * (u2 // 4) + 2 * ((u2 // 2) % 2) + u2 % 2
    ql = tl.load(lp + k0 * 105, eviction_policy="evict_first").to(tl.int32)
    qh = tl.load(hp + k0 * 105, eviction_policy="evict_first").to(tl.int32)
    sc0 = tl.load(sb0 + k0 * 210).to(tl.int8, bitcast=True).to(tl.float32)
    sc1 = tl.load(sb0 + k0 * 210 + 4).to(tl.int8, bitcast=True).to(tl.float32)
    dw = tl.load(ph + rh + k0 * 105 + 104)
    acc = tl.zeros((BN,), dtype=tl.float32)
    for i in range(0, KB_PER):
        kb = k0 + i
        kn = tl.minimum(kb + 1, kend)
        ql_next = tl.load(lp + kn * 105, eviction_policy="evict_first").to(tl.int32)
        qh_next = tl.load(hp + kn * 105, eviction_policy="evict_first").to(tl.int32)
        sc0_next = tl.load(sb0 + kn * 210).to(tl.int8, bitcast=True).to(tl.float32)
        sc1_next = tl.load(sb0 + kn * 210 + 4).to(tl.int8, bitcast=True).to(tl.float32)
        dw_next = tl.load(ph + rh + kn * 105 + 104)
        d = dw.to(tl.float16, bitcast=True).to(tl.float32)
        xb = xp_ptr + kb * 256 + t3
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
    tl.store(y_ptr + pid_k * n_out + r, acc.to(y_ptr.dtype.element_ty), mask=rmask)


# ---- 2..8 tokens, Q4_K / Q5_K: version 4 with a token axis ----------------------
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
    BB: tl.constexpr = 144 if QTYPE == Q4_K else 176
    QS: tl.constexpr = 4 if QTYPE == Q4_K else 12
    BW: tl.constexpr = BB // 4
    pw = p.to(tl.pointer_type(tl.int32))
    n = tl.arange(0, 32)[None, :]
    g2 = tl.arange(0, 4)[None, :]
    tt = tl.arange(0, MT)[:, None, None]                      # token, [MT, 1, 1]
    tmask = tt < M
    n3 = tl.arange(0, 32)[None, None, :]
    rw = rows * (NB * BW)
    wp = pw + rw[:, None] + QS + n
    hp = pw + rw[:, None] + 4 + n % 8
    h0 = pw + rw
    k0 = pid_k * KB_PER
    kend = k0 + KB_PER - 1
    w = tl.load(wp + k0 * BW, eviction_policy="evict_first")
    if QTYPE == Q5_K:
        qh = tl.load(hp + k0 * BW, eviction_policy="evict_first")
    a0 = tl.load(h0 + k0 * BW)
    a1 = tl.load(h0 + k0 * BW + 1)
    a2 = tl.load(h0 + k0 * BW + 2)
    a3 = tl.load(h0 + k0 * BW + 3)
    acc = tl.zeros((MT, BN), dtype=tl.float32)
    for i in range(0, KB_PER):
        kb = k0 + i
        kn = tl.minimum(kb + 1, kend)
        w_next = tl.load(wp + kn * BW, eviction_policy="evict_first")
        if QTYPE == Q5_K:
            qh_next = tl.load(hp + kn * BW, eviction_policy="evict_first")
        b0 = tl.load(h0 + kn * BW)
        b1 = tl.load(h0 + kn * BW + 1)
        b2 = tl.load(h0 + kn * BW + 2)
        b3 = tl.load(h0 + kn * BW + 3)
        d = _f16_lo(a0)[:, None]
        dmin = _f16_lo(a0 >> 16)[:, None]
        xb = xp_ptr + tt.to(tl.int64) * (NB * 256) + kb * 256 + n3
        for hi in tl.static_range(2):
            if QTYPE == Q5_K:
                hb = (qh >> (2 * (n // 8) + hi)) & 0x01010101
                v = ((w >> (4 * hi)) & 0x0F0F0F0F) | (hb << 4)
            else:
                v = w >> (4 * hi)
            a = tl.zeros((MT, BN, 32), dtype=tl.float32)
            xs = tl.zeros((MT, 1, 32), dtype=tl.float32)
            for k in tl.static_range(4):
                xv = tl.load(xb + 32 * (2 * k + hi), mask=tmask, other=0.0)
                if QTYPE == Q5_K:
                    f = ((_at16(v, 8 * k) & 0x001F0000) | OFS).to(tl.float32, bitcast=True)
                else:
                    f = ((_at16(v, 8 * k) & 0x000F0000) | OFS).to(tl.float32, bitcast=True)
                a += f[None, :, :] * xv
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
