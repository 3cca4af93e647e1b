/* ggml numerics, part 2: integer dot products and muser_matmul_q8.
 *
 * y[t, r] = dot(W[r], q8(x[t])): each activation row is quantized once per
 * call (q8_act.c) to the blocks ggml pairs with the weight type, and every
 * weight block meets every activation block in an exact integer sum, scaled
 * in float as ggml scales it:
 *   Q4_0, Q5_0, Q8_0:  (d_w * d_x) * sum(q_w * q_x)
 *   Q4_1, Q5_1:        (d_w * d_x) * sum(q_w * q_x) + m_w * s_x
 *   Q4_K, Q5_K:        (d_x * d_w) * sum_j sc_j sum(q_w * q_x) - (d_x * dmin_w) * sum_j m_j bsum_j
 *   Q6_K:              (d_w * d_x) * sum_j sc_j sum((q_w - 32) * q_x)
 *   Q2_K:              (d_x * d_w) * sum_j sc_j sum(q_w * q_x) - (d_x * dmin_w) * sum_j m_j bsum_j
 *   Q3_K:              (d_w * d_x) * sum_j s_j sum((q_w - 4) * q_x)
 * Every integer sum is exact; the x86 builds keep 8 float lanes per token,
 * as ggml's AVX2 code does (Q6_K too, lane by lane as ggml's current source:
 * see qdot_q6_k_rows), and the plain-C build sums one float per block, so
 * builds differ only in the order of the float additions.
 *
 * Each qdot_* takes one weight row and up to QDOT_TOKENS activation rows, so
 * a weight block is unpacked once for all of them. The x86 versions use
 * vpmaddubsw (u8 x s8 pairs; no pair here can saturate: |q_w| <= 63 or the
 * weight's sign is moved onto the activation) or, with AVX-512 VNNI,
 * vpdpbusd for the 32-element types.
 */
#include <stdlib.h>

#include "kernels.h"
#include "simd.h"

/* The 8 6-bit scales and 8 mins of a Q4_K / Q5_K block's 12-byte strip as
 * bytes (sc[j], m[j] of sub-block j; see scale_min_k4 in kernels.h), four at
 * a time: bytes 0-3 hold sc 0-3, 4-7 m 0-3, 8-11 the low bits of sc/m 4-7,
 * whose top two bits sit in bits 6-7 of bytes 0-3 (sc) and 4-7 (m). */
static inline void k4_scales(const uint8_t *s, uint8_t sc[8], uint8_t m[8]) {
    uint32_t u[3], w[4];
    memcpy(u, s, 12);
    w[0] = u[0] & 0x3F3F3F3Fu;
    w[1] = (u[2] & 0x0F0F0F0Fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    w[2] = u[1] & 0x3F3F3F3Fu;
    w[3] = ((u[2] >> 4) & 0x0F0F0F0Fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    memcpy(sc, w, 8);
    memcpy(m, w + 2, 8);
}

#define ACT32(t, b) ((const act32_t *)(act + (t) * act_stride) + (b))
#define ACTK(t, b) ((const actk_t *)(act + (t) * act_stride) + (b))

/* ---- the 32-element types ------------------------------------------------------------ */

#if defined(__AVX2__) && defined(__FMA__)
/* A block's 32 codes as bytes in element order: signed (offset applied) for
 * Q4_0, Q5_0, Q8_0, unsigned for Q4_1, Q5_1; `type` is a constant. */
static inline __attribute__((always_inline)) __m256i legacy_codes(const uint8_t *blk, int type) {
    switch (type) {
    case MUSER_ID_Q4_0:
        return _mm256_sub_epi8(legacy_nibbles32(blk + MUSER_Q4_0_QS), _mm256_set1_epi8(8));
    case MUSER_ID_Q4_1: return legacy_nibbles32(blk + MUSER_Q4_1_QS);
    case MUSER_ID_Q5_0:
        return _mm256_sub_epi8(_mm256_or_si256(legacy_nibbles32(blk + MUSER_Q5_0_QS),
                                               legacy_fifth32(blk + MUSER_Q5_0_QH)),
                               _mm256_set1_epi8(16));
    case MUSER_ID_Q5_1:
        return _mm256_or_si256(legacy_nibbles32(blk + MUSER_Q5_1_QS), legacy_fifth32(blk + MUSER_Q5_1_QH));
    default: return _mm256_loadu_si256((const __m256i *)(blk + MUSER_Q8_0_QS));
    }
}

ROW_KERNEL void qdot_legacy(const uint8_t *row, const int type, const int bytes, const int offset_m,
                            const uint8_t *act, int64_t act_stride, int64_t nb, const int T,
                            float *out) {
    __m256 acc[QDOT_TOKENS];
    float summ[QDOT_TOKENS];
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps(), summ[t] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bytes;
        const float d = f16_scale(blk);                      /* d leads every legacy block */
        const __m256i w = legacy_codes(blk, type);
        const __m256i u = offset_m ? w : _mm256_sign_epi8(w, w);
        for (int t = 0; t < T; t++) {
            const act32_t *a = ACT32(t, b);
            const __m256i y = _mm256_loadu_si256((const __m256i *)a->qs);
            const __m256i p = dot_u8s8(u, offset_m ? y : _mm256_sign_epi8(y, w));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * a->d), _mm256_cvtepi32_ps(p), acc[t]);
            if (offset_m) summ[t] += f16_scale(blk + MUSER_Q4_1_M) * a->s;
        }
    }
    for (int t = 0; t < T; t++) out[t] = hsum8(acc[t]) + summ[t];
}
#else
/* A block's 32 codes (offset applied for Q4_0, Q5_0). */
static inline __attribute__((always_inline)) void legacy_codes(const uint8_t *blk, int type,
                                                               int q[QK_LEGACY]) {
    if (type == MUSER_ID_Q8_0) {
        for (int j = 0; j < QK_LEGACY; j++) q[j] = ((const int8_t *)(blk + MUSER_Q8_0_QS))[j];
        return;
    }
    const int five = type == MUSER_ID_Q5_0 || type == MUSER_ID_Q5_1;
    const int off = type == MUSER_ID_Q4_0 ? 8 : type == MUSER_ID_Q5_0 ? 16 : 0;
    const uint8_t *qs = blk + (type == MUSER_ID_Q4_0 ? MUSER_Q4_0_QS : type == MUSER_ID_Q4_1 ? MUSER_Q4_1_QS
                               : type == MUSER_ID_Q5_0 ? MUSER_Q5_0_QS : MUSER_Q5_1_QS);
    uint32_t qh = 0;
    if (five) memcpy(&qh, blk + (type == MUSER_ID_Q5_0 ? MUSER_Q5_0_QH : MUSER_Q5_1_QH), 4);
    for (int j = 0; j < QK_LEGACY / 2; j++) {
        q[j] = ((qs[j] & 0xF) | (five ? ((qh >> j) & 1) << 4 : 0)) - off;
        q[j + 16] = ((qs[j] >> 4) | (five ? ((qh >> (j + 16)) & 1) << 4 : 0)) - off;
    }
}

ROW_KERNEL void qdot_legacy(const uint8_t *row, const int type, const int bytes, const int offset_m,
                            const uint8_t *act, int64_t act_stride, int64_t nb, const int T,
                            float *out) {
    float sum[QDOT_TOKENS];
    for (int t = 0; t < T; t++) sum[t] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bytes;
        const float d = f16(blk);
        int q[QK_LEGACY];
        legacy_codes(blk, type, q);
        for (int t = 0; t < T; t++) {
            const act32_t *a = ACT32(t, b);
            int isum = 0;
            for (int j = 0; j < QK_LEGACY; j++) isum += q[j] * a->qs[j];
            sum[t] += (d * a->d) * (float)isum;
            if (offset_m) sum[t] += f16(blk + MUSER_Q4_1_M) * a->s;
        }
    }
    for (int t = 0; t < T; t++) out[t] = sum[t];
}
#endif

_Static_assert(MUSER_Q4_0_D == 0 && MUSER_Q4_1_D == 0 && MUSER_Q5_0_D == 0 && MUSER_Q5_1_D == 0 &&
                   MUSER_Q8_0_D == 0 && MUSER_Q4_1_M == MUSER_Q5_1_M,
               "qdot_legacy reads d at the block's start and Q4_1/Q5_1's m at one offset");

/* Each type's qdot_fn (TOKEN_SWITCH: kernels.h). */
#define QDOT_LEGACY(name, TYPE)                                                                 \
    void name(const uint8_t *row, const uint8_t *act, int64_t act_stride, int64_t nb, int T,   \
              float *out) {                                                                     \
        TOKEN_SWITCH(CALL_LEGACY_##TYPE)                                                        \
    }
#define LEGACY_CALL(TYPE, offset_m, n) \
    qdot_legacy(row, MUSER_ID_##TYPE, MUSER_##TYPE##_BYTES, offset_m, act, act_stride, nb, n, out)
#define CALL_LEGACY_Q4_0(n) LEGACY_CALL(Q4_0, 0, n)
#define CALL_LEGACY_Q4_1(n) LEGACY_CALL(Q4_1, 1, n)
#define CALL_LEGACY_Q5_0(n) LEGACY_CALL(Q5_0, 0, n)
#define CALL_LEGACY_Q5_1(n) LEGACY_CALL(Q5_1, 1, n)
#define CALL_LEGACY_Q8_0(n) LEGACY_CALL(Q8_0, 0, n)
QDOT_LEGACY(qdot_q4_0, Q4_0)
QDOT_LEGACY(qdot_q4_1, Q4_1)
QDOT_LEGACY(qdot_q5_0, Q5_0)
QDOT_LEGACY(qdot_q5_1, Q5_1)
QDOT_LEGACY(qdot_q8_0, Q8_0)

/* ---- the K-quants ---------------------------------------------------------------------- */

#if defined(__AVX2__) && defined(__FMA__)
/* sum over 32 elements of q * y, times sc: 8 int32 lanes. */
static inline __m256i scaled_dot(__m256i q, const int8_t *y, __m256i sc16) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)y)), sc16);
}
#endif

/* Block b of a Q4_K / Q5_K row: isum[t] = sum_j sc_j sum(q * y_t) exactly
 * (AVX2: in 8 int32 lanes, each under 2^23, so exact as floats too). */
#if defined(__AVX2__) && defined(__FMA__)
typedef __m256i isum_t;
#else
typedef int isum_t;
#endif
ROW_KERNEL void q45_k_isums(const uint8_t *blk, const int five, const uint8_t *act,
                            int64_t act_stride, int64_t b, const int T, const uint8_t sc[8],
                            isum_t isum[QDOT_TOKENS]) {
    const uint8_t *qs = blk + Q45_K(five, QS), *qh = blk + MUSER_Q5_K_QH;
#if defined(__AVX2__) && defined(__FMA__)
    __m256i acc[QDOT_TOKENS];
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_si256();
    const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    const __m256i h = five ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    for (int g = 0; g < 4; g++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
        __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
        if (five) {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * g), one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * g + 1), one), 4));
        }
        const __m256i s0 = _mm256_set1_epi16((short)sc[2 * g]), s1 = _mm256_set1_epi16((short)sc[2 * g + 1]);
        for (int t = 0; t < T; t++) {
            const int8_t *y = ACTK(t, b)->qs + 64 * g;
            acc[t] = _mm256_add_epi32(acc[t], _mm256_add_epi32(scaled_dot(lo, y, s0), scaled_dot(hi, y + 32, s1)));
        }
    }
    for (int t = 0; t < T; t++) isum[t] = acc[t];
#else
    for (int t = 0; t < T; t++) isum[t] = 0;
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) {
            int lo = qs[32 * g + l] & 0xF, hi = qs[32 * g + l] >> 4;
            if (five) {
                lo |= ((qh[l] >> (2 * g)) & 1) << 4;
                hi |= ((qh[l] >> (2 * g + 1)) & 1) << 4;
            }
            for (int t = 0; t < T; t++) {
                const int8_t *y = ACTK(t, b)->qs + 64 * g;
                isum[t] += sc[2 * g] * lo * y[l] + sc[2 * g + 1] * hi * y[32 + l];
            }
        }
#endif
}

ROW_KERNEL void qdot_q45_k(const uint8_t *row, const int five, const uint8_t *act, int64_t act_stride,
                           int64_t nb, const int T, float *out) {
    const int bytes = Q45_K(five, BYTES);
#if defined(__AVX2__) && defined(__FMA__)
    /* ggml's AVX2 order: 8 float lanes of d * isum and 8 of dmin * msum per token */
    __m256 acc[QDOT_TOKENS], accm[QDOT_TOKENS];
    for (int t = 0; t < T; t++) acc[t] = accm[t] = _mm256_setzero_ps();
#else
    float sum[QDOT_TOKENS];
    for (int t = 0; t < T; t++) sum[t] = 0.0f;
#endif
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bytes;
        uint8_t sc[8], m[8];
        isum_t isum[QDOT_TOKENS];
        k4_scales(blk + MUSER_Q4_K_SCALES, sc, m);
        q45_k_isums(blk, five, act, act_stride, b, T, sc, isum);
        const float dw = f16(blk + MUSER_Q4_K_D), mw = f16(blk + MUSER_Q4_K_DMIN);
#if defined(__AVX2__) && defined(__FMA__)
        /* m_j in 16-bit lanes 2j and 2j+1 */
        const __m128i m8 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)m));
        const __m256i m16 = _mm256_set_m128i(_mm_unpackhi_epi16(m8, m8), _mm_unpacklo_epi16(m8, m8));
        for (int t = 0; t < T; t++) {
            const actk_t *a = ACTK(t, b);
            /* sum_j m_j (bsum_2j + bsum_2j+1), in 8 lanes */
            const __m256i ms = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), m16);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(a->d * dw), _mm256_cvtepi32_ps(isum[t]), acc[t]);
            accm[t] = _mm256_fmadd_ps(_mm256_set1_ps(a->d * mw), _mm256_cvtepi32_ps(ms), accm[t]);
        }
#else
        for (int t = 0; t < T; t++) {
            const actk_t *a = ACTK(t, b);
            int msum = 0;
            for (int j = 0; j < 8; j++) msum += m[j] * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
            sum[t] += (a->d * dw) * (float)isum[t];
            sum[t] -= (a->d * mw) * (float)msum;
        }
#endif
    }
#if defined(__AVX2__) && defined(__FMA__)
    for (int t = 0; t < T; t++) out[t] = hsum8(acc[t]) - hsum8(accm[t]);
#else
    for (int t = 0; t < T; t++) out[t] = sum[t];
#endif
}

/* Q4_K as llama.cpp runs it on x86: its weights repacked to q4_K_8x8 (every
 * Q4_K matrix of a multiple of 8 rows on an AVX2 CPU), whose kernels sum in
 * float otherwise than vec_dot_q4_K_q8_K: one float per row, no lanes.
 *   gemv (a call's last T % 4 tokens): per block, acc = fma((float)I, d_w * d_x, acc)
 *     with I = sum_j sc_j sum(q * y) over the 8 sub-blocks, and accm the same with
 *     sum_j m_j bsum32_j and dmin_w * d_x;
 *   gemm (the tokens before, 4 at a time): the same per pair of sub-blocks 2g,
 *     2g + 1 (g = 0..3), four fmas a block each;
 * y = acc - accm. Which of the two a token gets depends on the call's token
 * count as in ggml's repack mul_mat (gemm for rows below T - T % 4), and
 * q8_task hands qdot groups of QDOT_TOKENS = 4 tokens from the first: a full
 * group is gemm, the last short one gemv. qdot_packed_k.c computes the same. */
ROW_KERNEL void qdot_q4_k_rows(const uint8_t *row, const uint8_t *act, int64_t act_stride,
                               int64_t nb, const int T, float *out) {
    const int gemm = T == QDOT_TOKENS;
    float acc[QDOT_TOKENS], accm[QDOT_TOKENS];
    for (int t = 0; t < T; t++) acc[t] = accm[t] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * MUSER_Q4_K_BYTES, *qs = blk + MUSER_Q4_K_QS;
        uint8_t sc[8], m[8];
        k4_scales(blk + MUSER_Q4_K_SCALES, sc, m);
        const float dw = f16(blk + MUSER_Q4_K_D), mw = f16(blk + MUSER_Q4_K_DMIN);
        int I[QDOT_TOKENS][4];     /* per token, per pair of sub-blocks g: sc-scaled sums */
#if defined(__AVX2__) && defined(__FMA__)
        const __m256i m4 = _mm256_set1_epi8(0xF);
        for (int g = 0; g < 4; g++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
            const __m256i lo = _mm256_and_si256(raw, m4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            const __m256i s0 = _mm256_set1_epi16((short)sc[2 * g]), s1 = _mm256_set1_epi16((short)sc[2 * g + 1]);
            for (int t = 0; t < T; t++) {
                const int8_t *y = ACTK(t, b)->qs + 64 * g;
                const __m256i v = _mm256_add_epi32(scaled_dot(lo, y, s0), scaled_dot(hi, y + 32, s1));
                __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
                h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
                h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
                I[t][g] = _mm_cvtsi128_si32(h);
            }
        }
#else
        for (int t = 0; t < T; t++)
            for (int g = 0; g < 4; g++) {
                const int8_t *y = ACTK(t, b)->qs + 64 * g;
                int lo = 0, hi = 0;
                for (int l = 0; l < 32; l++) lo += (qs[32 * g + l] & 0xF) * y[l], hi += (qs[32 * g + l] >> 4) * y[32 + l];
                I[t][g] = sc[2 * g] * lo + sc[2 * g + 1] * hi;
            }
#endif
        for (int t = 0; t < T; t++) {
            const actk_t *a = ACTK(t, b);
            const float d = dw * a->d, dm = mw * a->d;
            int mins[4];
            for (int g = 0; g < 4; g++)
                mins[g] = m[2 * g] * (a->bsums[4 * g] + a->bsums[4 * g + 1]) +
                          m[2 * g + 1] * (a->bsums[4 * g + 2] + a->bsums[4 * g + 3]);
            if (gemm) {
                for (int g = 0; g < 4; g++) {
                    acc[t] = __builtin_fmaf((float)I[t][g], d, acc[t]);
                    accm[t] = __builtin_fmaf((float)mins[g], dm, accm[t]);
                }
            } else {
                acc[t] = __builtin_fmaf((float)(I[t][0] + I[t][1] + I[t][2] + I[t][3]), d, acc[t]);
                accm[t] = __builtin_fmaf((float)(mins[0] + mins[1] + mins[2] + mins[3]), dm, accm[t]);
            }
        }
    }
    for (int t = 0; t < T; t++) out[t] = acc[t] - accm[t];
}
_Static_assert(QDOT_TOKENS == 4, "ggml's repack gemm takes 4 tokens at a time, as a full qdot group");

/* Q6_K as ggml's vec_dot_q6_K_q8_K (x86, llama.cpp's source as tools/peers.sh
 * builds it): per block, 8 int32 lanes, lane m the sum over the block's eight
 * 32-element groups G of sc[2G + m/4] * sum(q * y) over elements 32G + 4m ..
 * 32G + 4m + 3 (q unsigned 0..63), less the codes' offset of sub-blocks 2m and
 * 2m + 1: 32 * (sc[2m] bsum[2m] + sc[2m+1] bsum[2m+1]) (ggml's q8sclsub); then
 * fma(d_x * d_w, lane, acc) into 8 float lanes per token, summed by hsum8.
 * qdot_packed_k.c computes the same on the repacked layout, bit for bit. The
 * plain-C build sums one exact int32 per block, scaled in float. */
#if defined(__AVX2__) && defined(__FMA__)
ROW_KERNEL void q6_k_lanes(const uint8_t *blk, const uint8_t *act, int64_t act_stride, int64_t b,
                           const int T, __m256i lanes[QDOT_TOKENS]) {
    const int8_t *sc = (const int8_t *)(blk + MUSER_Q6_K_SCALES);
    for (int t = 0; t < T; t++) lanes[t] = _mm256_setzero_si256();
    const __m256i m4 = _mm256_set1_epi8(0xF), m3 = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = blk + MUSER_Q6_K_QL + 64 * h, *qh = blk + MUSER_Q6_K_QH + 32 * h;
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
        const __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
        __m256i q[4];
        q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m3), 4));
        q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m3), 4));
        q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m3), 4));
        q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m3), 4));
        for (int k = 0; k < 4; k++) {       /* group G = 4h + k: sub-blocks 8h+2k, 8h+2k+1 */
            const int j = 8 * h + 2 * k;
            const __m256i s16 = _mm256_set_m128i(_mm_set1_epi16(sc[j + 1]), _mm_set1_epi16(sc[j]));
            for (int t = 0; t < T; t++) {
                const __m256i y = _mm256_loadu_si256((const __m256i *)(ACTK(t, b)->qs + 128 * h + 32 * k));
                /* pair sums of q * y: each |.| <= 2 * 63 * 128, no saturation */
                lanes[t] = _mm256_add_epi32(lanes[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], y), s16));
            }
        }
    }
    /* the offset: lane m less 32 * (sc[2m] bsum[2m] + sc[2m+1] bsum[2m+1]) */
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
    for (int t = 0; t < T; t++) {
        const __m256i bs = _mm256_loadu_si256((const __m256i *)ACTK(t, b)->bsums);
        lanes[t] = _mm256_sub_epi32(lanes[t], _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5));
    }
}

ROW_KERNEL void qdot_q6_k_rows(const uint8_t *row, const uint8_t *act, int64_t act_stride,
                               int64_t nb, const int T, float *out) {
    __m256 acc[QDOT_TOKENS];
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * MUSER_Q6_K_BYTES;
        __m256i lanes[QDOT_TOKENS];
        q6_k_lanes(blk, act, act_stride, b, T, lanes);
        const float dw = f16(blk + MUSER_Q6_K_D);
        for (int t = 0; t < T; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(ACTK(t, b)->d * dw), _mm256_cvtepi32_ps(lanes[t]), acc[t]);
    }
    for (int t = 0; t < T; t++) out[t] = hsum8(acc[t]);
}
#else
/* Block b of a Q6_K row: isum[t] = sum_j sc_j sum(q * y_t) (q unsigned, 0 .. 63). */
ROW_KERNEL void q6_k_isums(const uint8_t *blk, const uint8_t *act, int64_t act_stride, int64_t b,
                           const int T, int isum[QDOT_TOKENS]) {
    const int8_t *sc = (const int8_t *)(blk + MUSER_Q6_K_SCALES);
    for (int t = 0; t < T; t++) isum[t] = 0;
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = blk + MUSER_Q6_K_QL + 64 * h, *qh = blk + MUSER_Q6_K_QH + 32 * h;
        for (int l = 0; l < 32; l++) {
            const int q[4] = {(ql[l] & 0xF) | ((qh[l] & 3) << 4),
                              (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4),
                              (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                              (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)};
            for (int k = 0; k < 4; k++) {
                const int e = 128 * h + 32 * k + l;
                for (int t = 0; t < T; t++) isum[t] += sc[e / 16] * q[k] * ACTK(t, b)->qs[e];
            }
        }
    }
}

ROW_KERNEL void qdot_q6_k_rows(const uint8_t *row, const uint8_t *act, int64_t act_stride,
                               int64_t nb, const int T, float *out) {
    float sum[QDOT_TOKENS];
    for (int t = 0; t < T; t++) sum[t] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * MUSER_Q6_K_BYTES;
        const int8_t *sc = (const int8_t *)(blk + MUSER_Q6_K_SCALES);
        int isum[QDOT_TOKENS];
        q6_k_isums(blk, act, act_stride, b, T, isum);
        const float dw = f16(blk + MUSER_Q6_K_D);
        for (int t = 0; t < T; t++) {
            const actk_t *a = ACTK(t, b);
            int off = 0;      /* the codes' offset of 32: sum_j sc_j * 32 * bsum_j */
            for (int j = 0; j < QK_K / 16; j++) off += sc[j] * a->bsums[j];
            sum[t] += (dw * a->d) * (float)(isum[t] - 32 * off);
        }
    }
    for (int t = 0; t < T; t++) out[t] = sum[t];
}
#endif

/* The 16 sub-block scales of a Q2_K / Q3_K block as bytes, in sub-block order:
 * Q2_K the low nibbles of its scale bytes (0..15) and, in m, the high ones (the
 * mins); Q3_K the signed 6-bit scales (s6 - 32). */
static inline void q23_k_scales(const uint8_t *blk, const int three, int8_t s[16], int8_t m[16]) {
    if (three) {
        q3_k_scales6(blk + MUSER_Q3_K_SCALES, (uint8_t *)s);
        for (int j = 0; j < 16; j++) s[j] = (int8_t)(s[j] - 32);
    } else {
        for (int j = 0; j < 16; j++) {
            s[j] = (int8_t)(blk[MUSER_Q2_K_SCALES + j] & 0xF);
            m[j] = (int8_t)(blk[MUSER_Q2_K_SCALES + j] >> 4);
        }
    }
}

/* Q2_K: (d_x * d_w) * isum - (d_x * dmin_w) * sum_j m_j bsum_j, as ggml's vec_dot_q2_K_q8_K;
 * Q3_K: (d_w * d_x) * (isum - 4 sum_j s_j bsum_j), with isum = sum_j s_j sum(u * y) over
 * the 16 sub-blocks of 16 and u the unsigned code (Q2_K 0..3; Q3_K 0..7, the 2-bit code
 * plus 4 where the hmask bit is set, so q = u - 4). Every integer sum is exact; the x86
 * builds keep 8 float lanes per token (as ggml's AVX2 code), plain C one float per block. */
ROW_KERNEL void qdot_q23_k(const uint8_t *row, const int three, const uint8_t *act,
                           int64_t act_stride, int64_t nb, const int T, float *out) {
    const int bytes = three ? MUSER_Q3_K_BYTES : MUSER_Q2_K_BYTES;
    const int qs_at = three ? MUSER_Q3_K_QS : MUSER_Q2_K_QS;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc[QDOT_TOKENS], accm[QDOT_TOKENS];
    for (int t = 0; t < T; t++) acc[t] = accm[t] = _mm256_setzero_ps();
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
#else
    float sum[QDOT_TOKENS];
    for (int t = 0; t < T; t++) sum[t] = 0.0f;
#endif
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bytes, *qs = blk + qs_at, *hm = blk + MUSER_Q3_K_HMASK;
        int8_t s[16], m[16];
        q23_k_scales(blk, three, s, m);
        const float dw = f16(blk + (three ? MUSER_Q3_K_D : MUSER_Q2_K_D));
        const float mw = three ? 0.0f : f16(blk + MUSER_Q2_K_DMIN);
#if defined(__AVX2__) && defined(__FMA__)
        __m256i isum[QDOT_TOKENS];
        for (int t = 0; t < T; t++) isum[t] = _mm256_setzero_si256();
        const __m256i hb = three ? _mm256_loadu_si256((const __m256i *)hm) : _mm256_setzero_si256();
        const __m256i s16all = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)s));
        for (int h = 0; h < 2; h++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
            /* the 8 scales of this half in both 128-bit lanes: word 2j + (lane) is picked below */
            const __m256i sh = _mm256_permute4x64_epi64(s16all, h ? 0xEE : 0x44);
            for (int j = 0; j < 4; j++) {    /* elements 128h + 32j ..: sub-blocks 8h+2j, 8h+2j+1 */
                __m256i u = _mm256_and_si256(_mm256_srli_epi16(raw, 2 * j), m3);
                if (three)
                    u = _mm256_or_si256(u, _mm256_slli_epi16(
                                               _mm256_and_si256(_mm256_srli_epi16(hb, 4 * h + j), one), 2));
                /* words 2j (low lane) and 2j + 1 (high lane) broadcast across their lanes */
                const __m256i s16 = _mm256_shuffle_epi8(
                    sh, _mm256_set_m128i(_mm_set1_epi16((short)(0x0100 * (4 * j + 3) + 4 * j + 2)),
                                         _mm_set1_epi16((short)(0x0100 * (4 * j + 1) + 4 * j))));
                for (int t = 0; t < T; t++)
                    isum[t] = _mm256_add_epi32(isum[t], scaled_dot(u, ACTK(t, b)->qs + 128 * h + 32 * j, s16));
            }
        }
        /* the mins (Q2_K) or the codes' offset of 4 (Q3_K), against the 16 bsums */
        const __m256i f16s = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(three ? s : m)));
        for (int t = 0; t < T; t++) {
            const actk_t *a = ACTK(t, b);
            const __m256i bs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), f16s);
            if (three) {
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a->d),
                                         _mm256_cvtepi32_ps(_mm256_sub_epi32(isum[t], _mm256_slli_epi32(bs, 2))),
                                         acc[t]);
            } else {
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(a->d * dw), _mm256_cvtepi32_ps(isum[t]), acc[t]);
                accm[t] = _mm256_fmadd_ps(_mm256_set1_ps(a->d * mw), _mm256_cvtepi32_ps(bs), accm[t]);
            }
        }
#else
        int isum[QDOT_TOKENS];
        for (int t = 0; t < T; t++) isum[t] = 0;
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, j = (e % 128) / 32, l = e % 32;
            int u = (qs[32 * h + l] >> (2 * j)) & 3;
            if (three) u |= ((hm[l] >> (4 * h + j)) & 1) << 2;
            for (int t = 0; t < T; t++) isum[t] += s[e / 16] * u * ACTK(t, b)->qs[e];
        }
        for (int t = 0; t < T; t++) {
            const actk_t *a = ACTK(t, b);
            int bs = 0;
            for (int j = 0; j < 16; j++) bs += (three ? s[j] : m[j]) * a->bsums[j];
            if (three)
                sum[t] += (dw * a->d) * (float)(isum[t] - 4 * bs);
            else
                sum[t] += (a->d * dw) * (float)isum[t] - (a->d * mw) * (float)bs;
        }
#endif
    }
#if defined(__AVX2__) && defined(__FMA__)
    for (int t = 0; t < T; t++) out[t] = three ? hsum8(acc[t]) : hsum8(acc[t]) - hsum8(accm[t]);
#else
    for (int t = 0; t < T; t++) out[t] = sum[t];
#endif
}

/* Q6_K as ggml's tiled matmul (kernels.h, GGML_TILED_MIN_TOKENS): the block's
 * integer sum I = sum_j sc_j (sum(q * y) - 32 bsum_j), then y += ((float)I * d_w) * d_x. */
void qdot_q6_k_tiled(const uint8_t *row, const uint8_t *act, int64_t act_stride, int64_t nb, int T,
                     float *out) {
    for (int t = 0; t < T; t++) out[t] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * MUSER_Q6_K_BYTES;
        const int8_t *sc = (const int8_t *)(blk + MUSER_Q6_K_SCALES);
        int isum[QDOT_TOKENS];
#if defined(__AVX2__) && defined(__FMA__)
        __m256i lanes[QDOT_TOKENS];
        switch (T) {   /* the lanes already hold the offset; their sum is the block's integer */
        case 1: q6_k_lanes(blk, act, act_stride, b, 1, lanes); break;
        case 2: q6_k_lanes(blk, act, act_stride, b, 2, lanes); break;
        case 3: q6_k_lanes(blk, act, act_stride, b, 3, lanes); break;
        default: q6_k_lanes(blk, act, act_stride, b, 4, lanes); break;
        }
        for (int t = 0; t < T; t++) {
            __m128i h = _mm_add_epi32(_mm256_castsi256_si128(lanes[t]), _mm256_extracti128_si256(lanes[t], 1));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
            isum[t] = _mm_cvtsi128_si32(h);
        }
#else
        q6_k_isums(blk, act, act_stride, b, T, isum);
        for (int t = 0; t < T; t++) {
            int off = 0;
            for (int j = 0; j < QK_K / 16; j++) off += sc[j] * ACTK(t, b)->bsums[j];
            isum[t] -= 32 * off;
        }
#endif
        (void)sc;
        const float dw = f16(blk + MUSER_Q6_K_D);
        for (int t = 0; t < T; t++) out[t] = tiled_fold(out[t], (float)isum[t] * dw, ACTK(t, b)->d);
    }
}

#define KQ_FN(name, call)                                                                      \
    void name(const uint8_t *row, const uint8_t *act, int64_t act_stride, int64_t nb, int T,   \
              float *out) {                                                                     \
        TOKEN_SWITCH(call)                                                                      \
    }
#define CALL_Q4_K(n) qdot_q4_k_rows(row, act, act_stride, nb, n, out)
#define CALL_Q5_K(n) qdot_q45_k(row, 1, act, act_stride, nb, n, out)
#define CALL_Q6_K(n) qdot_q6_k_rows(row, act, act_stride, nb, n, out)
KQ_FN(qdot_q4_k, CALL_Q4_K)
KQ_FN(qdot_q5_k, CALL_Q5_K)
KQ_FN(qdot_q6_k, CALL_Q6_K)
#define CALL_Q2_K(n) qdot_q23_k(row, 0, act, act_stride, nb, n, out)
#define CALL_Q3_K(n) qdot_q23_k(row, 1, act, act_stride, nb, n, out)
KQ_FN(qdot_q2_k, CALL_Q2_K)
KQ_FN(qdot_q3_k, CALL_Q3_K)

/* ---- the matmul ------------------------------------------------------------------------- */

#define Q8_ROW_BLOCK 16   /* weight rows dotted with one group of activation rows at a time */

typedef struct {
    const type_entry_t *k;
    const uint8_t *packed, *act;
    int64_t n_out, nb, row_bytes, T, act_stride;
    float *y;
} q8_job;

static void q8_task(const void *ctx, int64_t r0, int64_t r1) {
    const q8_job *j = ctx;
    for (int64_t rb = r0; rb < r1; rb += Q8_ROW_BLOCK) {
        const int64_t re = rb + Q8_ROW_BLOCK < r1 ? rb + Q8_ROW_BLOCK : r1;
        for (int64_t t0 = 0; t0 < j->T; t0 += QDOT_TOKENS) {
            const int T = j->T - t0 < QDOT_TOKENS ? (int)(j->T - t0) : QDOT_TOKENS;
            for (int64_t r = rb; r < re; r++) {
                float out[QDOT_TOKENS];
                j->k->qdot(j->packed + r * j->row_bytes, j->act + t0 * j->act_stride, j->act_stride,
                           j->nb, T, out);
                for (int t = 0; t < T; t++) j->y[(t0 + t) * j->n_out + r] = out[t];
            }
        }
    }
}

typedef struct { const type_entry_t *k; const float *x; int64_t n_in, act_stride; uint8_t *act; } quant_job;

static void quant_task(const void *ctx, int64_t t0, int64_t t1) {
    const quant_job *j = ctx;
    for (int64_t t = t0; t < t1; t++) {
        uint8_t *a = j->act + t * j->act_stride;
        if (j->k->act == ACT_Q8_K) quantize_act_q8_k(j->x + t * j->n_in, j->n_in, (actk_t *)a);
        else quantize_act_q8_0(j->x + t * j->n_in, j->n_in, (act32_t *)a, j->k->act == ACT_Q8_1);
    }
}

/* y[T, n_out] = x[T, n_in] @ W.T in ggml's numerics: -1 for a type without
 * them or a bad width, -2 when the activation blocks cannot be allocated. */
int muser_matmul_q8(int type, const uint8_t *packed, int64_t n_out, int64_t n_in, const float *x,
                    int64_t T, float *y, int nthreads) {
    const type_entry_t *k = type_entry_for(type);
    if (!k || !k->qdot || n_in % k->elems || T < 1) return -1;
    const int64_t act_stride = k->act == ACT_Q8_K ? n_in / QK_K * (int64_t)sizeof(actk_t)
                                                  : n_in / QK_LEGACY * (int64_t)sizeof(act32_t);
    uint8_t *act = malloc((size_t)(T * act_stride));
    if (!act) return -2;
    const quant_job qj = {k, x, n_in, act_stride, act};
    parallel_for(quant_task, &qj, T, T >= 16 ? nthreads : 1);
    type_entry_t tiled;     /* ggml's tiled K-quant matmul takes calls of many tokens */
    if (type == MUSER_ID_Q6_K && T >= GGML_TILED_MIN_TOKENS) {
        tiled = *k;
        tiled.qdot = qdot_q6_k_tiled;
        k = &tiled;
    }
    const q8_job j = {k, packed, act, n_out, n_in / k->elems, n_in / k->elems * k->bytes, T,
                      act_stride, y};
    parallel_for(q8_task, &j, n_out, nthreads);
    free(act);
    return 0;
}
