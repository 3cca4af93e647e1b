/* x86 register decoders shared by the fused matvec (matvec.c), the GEMM tile
 * decode (gemm.c) and the NVFP4_E2M1 dequantize decoder (decoders.c), so that
 * every path rounds the same way. Included after kernels.h. */
#ifndef MUSER_SIMD_H
#define MUSER_SIMD_H

#include "kernels.h"

/* NVFP4_E2M1 block b of a row as unscaled E2M1 values: its 16 codes in
 * element order (element 2i is the low nibble of byte i), then a permute looks
 * them up (AVX-512: all 16 values; AVX2: the 8 magnitudes, the sign bit set
 * apart). */
#if defined(__AVX2__)
static inline __m128i e2m1_codes16(const uint8_t *row, int64_t b) {
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m128i raw = _mm_loadl_epi64(
        (const __m128i *)(row + MUSER_NVFP4_E2M1_BYTES * b + MUSER_NVFP4_E2M1_QS));
    return _mm_unpacklo_epi8(_mm_and_si128(raw, m4), _mm_and_si128(_mm_srli_epi16(raw, 4), m4));
}
/* The values of the low 8 code bytes; `mags` holds E2M1[0..7]. */
static inline __m256 e2m1_values8(__m256 mags, __m128i codes) {
    const __m256i c = _mm256_cvtepu8_epi32(codes);
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(8)), 28);
    const __m256 mag = _mm256_permutevar8x32_ps(mags, _mm256_and_si256(c, _mm256_set1_epi32(7)));
    return _mm256_or_ps(mag, _mm256_castsi256_ps(sign));
}
#endif
#if defined(__AVX512F__)
static inline __m512 e2m1_values16(__m512 table, __m128i codes) {
    return _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(codes), table);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
/* Fused decoders for the hot types: each 8 codes are widened to int32
 * lanes, decoded to floats in registers and FMA'd into the accumulators
 * (GCC 12 scalarizes __builtin_convertvector from bytes, hence intrinsics).
 * Other CPUs use the scalar decoders for every type. */
#define HAVE_FUSED 1

typedef int32_t v8i __attribute__((vector_size(32)));

static inline v8i widen_u8(const uint8_t *p) {
    return (v8i)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
static inline v8f to_f32(v8i v) { return (v8f)_mm256_cvtepi32_ps((__m256i)v); }
static inline v8f fma8(v8f a, v8f b, v8f c) {
    return (v8f)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
}
static inline v8f fms8(v8f a, v8f b, v8f c) {
    return (v8f)_mm256_fmsub_ps((__m256)a, (__m256)b, (__m256)c);
}

/* Q4_K / Q5_K group g (64 elements): (d*sc, dmin*m) of sub-blocks 2g, 2g+1. */
static inline void q45_k_group(const uint8_t *blk, float d, float dmin, int g,
                               v8f *a0, v8f *c0, v8f *a1, v8f *c1) {
    float sc0, m0, sc1, m1;
    scale_min_k4(blk + MUSER_Q4_K_SCALES, 2 * g, &sc0, &m0);
    scale_min_k4(blk + MUSER_Q4_K_SCALES, 2 * g + 1, &sc1, &m1);
    *a0 = splat(d * sc0), *c0 = splat(dmin * m0);
    *a1 = splat(d * sc1), *c1 = splat(dmin * m1);
}
/* ... and its elements 64g+8q.. (w0, low nibbles) and 64g+32+8q.. (w1):
 * w = fma(d*sc, q, -dmin*m). `qs`, `qh` point at the block's fields. */
static inline void q45_k_w8(const uint8_t *qs, const uint8_t *qh, int five, int g, int q,
                            v8f a0, v8f c0, v8f a1, v8f c1, v8f *w0, v8f *w1) {
    const v8i raw = widen_u8(qs + 32 * g + 8 * q);
    v8i lo = raw & 0xF, hi = raw >> 4;
    if (five) {
        const v8i h = widen_u8(qh + 8 * q);
        lo |= ((h >> (2 * g)) & 1) << 4;
        hi |= ((h >> (2 * g + 1)) & 1) << 4;
    }
    *w0 = fms8(a0, to_f32(lo), c0);
    *w1 = fms8(a1, to_f32(hi), c1);
}

/* Q6_K half h (128 elements), step q: elements 8q.., 32+8q.., 64+8q.., 96+8q..
 * of the half, w = (d*sc_j) * (code - 32) with sub-block j = 8h + q/2 (+2, +4, +6). */
static inline void q6_k_w8(const uint8_t *blk, float d, int h, int q, v8f w[4]) {
    const int8_t *sc = (const int8_t *)(blk + MUSER_Q6_K_SCALES);
    const uint8_t *ql = blk + MUSER_Q6_K_QL + 64 * h, *qh = blk + MUSER_Q6_K_QH + 32 * h;
    const int j = 8 * h + q / 2;
    const v8i l0 = widen_u8(ql + 8 * q), l1 = widen_u8(ql + 32 + 8 * q);
    const v8i hb = widen_u8(qh + 8 * q);
    w[0] = splat(d * (float)sc[j]) * to_f32(((l0 & 0xF) | ((hb & 3) << 4)) - 32);
    w[1] = splat(d * (float)sc[j + 2]) * to_f32(((l1 & 0xF) | (((hb >> 2) & 3) << 4)) - 32);
    w[2] = splat(d * (float)sc[j + 4]) * to_f32(((l0 >> 4) | (((hb >> 4) & 3) << 4)) - 32);
    w[3] = splat(d * (float)sc[j + 6]) * to_f32(((l1 >> 4) | (((hb >> 6) & 3) << 4)) - 32);
}

/* A block's f16 scale: one F16C instruction where there is one (exact,
 * subnormals included), else the scalar conversion. */
static inline float f16_scale(const uint8_t *p) {
#if defined(__F16C__)
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
#else
    return f16(p);
#endif
}
/* Q2_K / Q3_K: the per-sub-block factors of one block (decoders.c's order):
 * Q2_K a = d*sc_s, c = dmin*m_s; Q3_K a = d*(s6_s - 32), c unused. Eight at a
 * time: a scalar loop here costs a third of a 16-wide row's time. */
static inline void q23_k_factors(const uint8_t *blk, const int three, float a[16], float c[16]) {
    if (three) {
        uint8_t s6[16];
        q3_k_scales6(blk + MUSER_Q3_K_SCALES, s6);
        const v8f d = splat(f16_scale(blk + MUSER_Q3_K_D));
        for (int i = 0; i < 2; i++) {
            const v8f v = d * to_f32(widen_u8(s6 + 8 * i) - 32);
            memcpy(a + 8 * i, &v, 32);
        }
    } else {
        const v8f d = splat(f16_scale(blk + MUSER_Q2_K_D)), dmin = splat(f16_scale(blk + MUSER_Q2_K_DMIN));
        for (int i = 0; i < 2; i++) {
            const v8i sc = widen_u8(blk + MUSER_Q2_K_SCALES + 8 * i);
            const v8f va = d * to_f32(sc & 0xF), vc = dmin * to_f32(sc >> 4);
            memcpy(a + 8 * i, &va, 32);
            memcpy(c + 8 * i, &vc, 32);
        }
    }
}
/* ... and the 4 vectors of 8 that share the code bytes qs[32h + 8v ..]: element
 * 128h + 32j + 8v + i (j = 0..3, sub-block 8h + 2j + v/2) is bits 2j.. of byte i.
 * Q2_K w = fma(a, q, -c); Q3_K w = a * (q - 4 + 4 hbit), hbit = bit 4h + j of
 * hmask[8v + i]. */
static inline void q23_k_w8x4(const uint8_t *blk, const int three, int h, int v, const float a[16],
                              const float c[16], v8f w[4]) {
    const v8i raw = widen_u8(blk + (three ? MUSER_Q3_K_QS : MUSER_Q2_K_QS) + 32 * h + 8 * v);
    const v8i hb = three ? widen_u8(blk + MUSER_Q3_K_HMASK + 8 * v) : (v8i){0};
    for (int j = 0; j < 4; j++) {
        const int s = 8 * h + 2 * j + v / 2;
        v8i q = (raw >> (2 * j)) & 3;
        const int bit = 4 * h + j;              /* the hmask bit, moved to bit 2 */
        if (three) {
            q = (q | ((bit >= 2 ? hb >> (bit - 2) : hb << (2 - bit)) & 4)) - 4;
            w[j] = splat(a[s]) * to_f32(q);
        } else {
            w[j] = fms8(splat(a[s]), to_f32(q), splat(c[s]));
        }
    }
}

/* NVFP4_E2M1 block b (16 elements, 8 bytes, one scale): w = e2m1(code) *
 * (e4m3(scale) * scale_2), the values looked up by e2m1_values8. */
static inline void nvfp4_e2m1_w16(__m256 table, const uint8_t *row, float s, int64_t b,
                                  v8f *w0, v8f *w1) {
    const __m128i codes = e2m1_codes16(row, b);
    *w0 = splat(s) * (v8f)e2m1_values8(table, codes);
    *w1 = splat(s) * (v8f)e2m1_values8(table, _mm_srli_si128(codes, 8));
}

/* Legacy 32-element blocks: element j < 16 is the low nibble of qs[j] and
 * j + 16 the high one; Q5's fifth bit of element j is bit j of the 32-bit
 * qh. All 32 codes are built as bytes in one register (element j in byte j),
 * the fifth bits spread out by a byte shuffle and a compare. */
static inline __m256i legacy_nibbles32(const uint8_t *qs) {
    const __m128i m4 = _mm_set1_epi8(0xF), raw = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
}
static inline __m256i legacy_fifth32(const uint8_t *qh) {
    uint32_t bits;
    memcpy(&bits, qh, 4);                       /* little endian, as the file */
    /* byte j <- byte j/8 of qh (vpshufb stays in its 128-bit lane, and each
     * lane holds the broadcast qh), then 0x10 where its bit j%8 is set */
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)bits),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    const __m256i bit = _mm256_set1_epi64x((int64_t)0x8040201008040201ull);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                            _mm256_set1_epi8(0x10));
}
/* The lookup-table types (IQ4_NL, IQ4_XS's sub-blocks, MXFP4): the 32 values of
 * a block's codes as signed bytes in element order, `table` (16 int8) looked
 * up by a byte shuffle. */
static inline __m256i lut_values32(const uint8_t *qs, const int8_t *table) {
    const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)table));
    return _mm256_shuffle_epi8(t, legacy_nibbles32(qs));
}
/* kernels.h's iq3_grid in one register. IQ3_XXS: eight scalar loads; IQ3_S:
 * one gather of the 9-bit indices (each as ggml-cpu's AVX2 code). */
static inline __attribute__((always_inline)) __m256i iq3_grid8(const uint8_t *blk, int s, const int xxs) {
    if (xxs) {
        const uint8_t *q = blk + MUSER_IQ3_XXS_QS + 8 * s;
        return _mm256_setr_epi32((int)IQ3XXS_GRID[q[0]], (int)IQ3XXS_GRID[q[1]], (int)IQ3XXS_GRID[q[2]],
                                 (int)IQ3XXS_GRID[q[3]], (int)IQ3XXS_GRID[q[4]], (int)IQ3XXS_GRID[q[5]],
                                 (int)IQ3XXS_GRID[q[6]], (int)IQ3XXS_GRID[q[7]]);
    }
    const __m256i to_bit8 = _mm256_setr_epi32(8, 7, 6, 5, 4, 3, 2, 1);
    const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + MUSER_IQ3_S_QS + 8 * s)));
    const __m256i hi = _mm256_and_si256(_mm256_sllv_epi32(_mm256_set1_epi32(blk[MUSER_IQ3_S_QH + s]), to_bit8),
                                        _mm256_set1_epi32(256));
    return _mm256_i32gather_epi32((const int *)IQ3S_GRID, _mm256_or_si256(lo, hi), 4);
}
/* The 32 weights of an IQ3 sub-block from its grid words `u`: each grid byte
 * times db, the sign bit XORed in (the same bits as the reference's negation). */
static inline void iq3_w32(__m256i u, uint32_t signs, float db, v8f w[4]) {
    const __m256i to_top = _mm256_setr_epi32(31, 30, 29, 28, 27, 26, 25, 24);
    const __m256i top = _mm256_set1_epi32((int)0x80000000u);
    for (int v = 0; v < 4; v++) {
        const __m128i half = v < 2 ? _mm256_castsi256_si128(u) : _mm256_extracti128_si256(u, 1);
        const v8f mag = to_f32((v8i)_mm256_cvtepu8_epi32(v & 1 ? _mm_unpackhi_epi64(half, half) : half));
        const __m256i sign = _mm256_and_si256(
            _mm256_sllv_epi32(_mm256_set1_epi32((int)(signs >> (8 * v))), to_top), top);
        w[v] = (v8f)_mm256_xor_si256((__m256i)(mag * splat(db)), sign);
    }
}
/* 8 int32 lanes, each the sum of 4 adjacent u8 x s8 products (qdot.c, qdot_lut.c). */
static inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
/* Signed code bytes 8v .. 8v+7 of `codes` as floats. */
static inline v8f legacy_codes8(__m256i codes, int v) {
    const __m128i half = v < 2 ? _mm256_castsi256_si128(codes) : _mm256_extracti128_si256(codes, 1);
    return to_f32((v8i)_mm256_cvtepi8_epi32(v & 1 ? _mm_unpackhi_epi64(half, half) : half));
}

/* All 32 weights of one legacy block as 4 vectors of 8, rounding as the
 * reference: d*q (Q8_0), d*(q-8) (Q4_0), d*(q-16) (Q5_0), d*v[q] (IQ4_NL,
 * MXFP4's halved scale and doubled values), and for Q4_1 and Q5_1
 * fma(d, q, m) (one rounding, not the reference's two). `type` is a
 * compile-time constant in every caller, so each type gets its own loop. */
static inline __attribute__((always_inline)) void legacy_w32(const uint8_t *blk, const int type,
                                                             v8f w[4]) {
    __m256i codes;
    float d, m = 0.0f;
    switch (type) {
    case MUSER_ID_Q8_0: {                       /* the codes are the bytes: widen from memory */
        const v8f dv = splat(f16_scale(blk + MUSER_Q8_0_D));
        for (int v = 0; v < 4; v++)
            w[v] = dv * to_f32((v8i)_mm256_cvtepi8_epi32(
                            _mm_loadl_epi64((const __m128i *)(blk + MUSER_Q8_0_QS + 8 * v))));
        return;
    }
    case MUSER_ID_Q4_0:
        d = f16_scale(blk + MUSER_Q4_0_D);
        codes = _mm256_sub_epi8(legacy_nibbles32(blk + MUSER_Q4_0_QS), _mm256_set1_epi8(8));
        break;
    case MUSER_ID_Q4_1:
        d = f16_scale(blk + MUSER_Q4_1_D), m = f16_scale(blk + MUSER_Q4_1_M);
        codes = legacy_nibbles32(blk + MUSER_Q4_1_QS);
        break;
    case MUSER_ID_Q5_0:
        d = f16_scale(blk + MUSER_Q5_0_D);
        codes = _mm256_sub_epi8(_mm256_or_si256(legacy_nibbles32(blk + MUSER_Q5_0_QS),
                                                legacy_fifth32(blk + MUSER_Q5_0_QH)),
                                _mm256_set1_epi8(16));
        break;
    case MUSER_ID_IQ4_NL:
        d = f16_scale(blk + MUSER_IQ4_NL_D);
        codes = lut_values32(blk + MUSER_IQ4_NL_QS, IQ4_VALUES);
        break;
    case MUSER_ID_MXFP4:
        d = e8m0_half(blk[MUSER_MXFP4_E]);
        codes = lut_values32(blk + MUSER_MXFP4_QS, FP4_DOUBLED);
        break;
    default:                                    /* Q5_1 */
        d = f16_scale(blk + MUSER_Q5_1_D), m = f16_scale(blk + MUSER_Q5_1_M);
        codes = _mm256_or_si256(legacy_nibbles32(blk + MUSER_Q5_1_QS),
                                legacy_fifth32(blk + MUSER_Q5_1_QH));
    }
    const v8f dv = splat(d), mv = splat(m);
    const int offset = type == MUSER_ID_Q4_1 || type == MUSER_ID_Q5_1;
    for (int v = 0; v < 4; v++)
        w[v] = offset ? fma8(dv, legacy_codes8(codes, v), mv) : dv * legacy_codes8(codes, v);
}
#endif /* __AVX2__ && __FMA__ */

#endif /* MUSER_SIMD_H */
