/* ggml numerics for the lookup-table types (formats/iq4.py, formats/mxfp4.py):
 * a 4-bit code indexes a table of 16 small integers, so a weight block meets
 * an activation block in an exact integer sum, as for the legacy types:
 *   IQ4_NL (Q8_0 activations):  (d_x * d_w) * sum(IQ4_VALUES[q_w] * q_x)
 *   MXFP4  (Q8_0 activations):  (d_x * e8m0_half(e_w)) * sum(FP4_DOUBLED[q_w] * q_x)
 *   IQ4_XS (Q8_K activations):  (d_w * d_x) * sum_j (ls_j - 32) * sum(IQ4_VALUES[q_w] * q_x)
 * The x86 builds follow ggml-cpu's AVX2 code: a byte shuffle looks the codes
 * up, vpmaddubsw pairs |w| with the activation carrying w's sign (no pair
 * saturates: |value| <= 127 and |q_x| <= 127), 8 float lanes per token, the
 * 32-element types alternating two accumulators by block parity and summing
 * a trailing odd block in scalar float, IQ4_XS scaling the super-block's
 * integer lanes once. The plain-C build sums one float per block (IQ4_XS:
 * per 32-element sub-block, as ggml's generic code), so builds differ only in
 * the order of the float additions.
 */
#include "kernels.h"
#include "simd.h"

#define ACT32(t, b) ((const act32_t *)(act + (t) * act_stride) + (b))
#define ACTK(t, b) ((const actk_t *)(act + (t) * act_stride) + (b))

_Static_assert(MUSER_IQ4_NL_ELEMS == QK_LEGACY && MUSER_MXFP4_ELEMS == QK_LEGACY,
               "IQ4_NL and MXFP4 blocks pair with one Q8_0 activation block");
_Static_assert(MUSER_IQ4_NL_D == 0 && MUSER_IQ4_XS_D == 0 && MUSER_MXFP4_E == 0,
               "the block scale leads every lookup-table block");

/* A 32-element block's scale: IQ4_NL's f16, MXFP4's E8M0 (halved, as ggml's
 * codes are doubled); `type` is a constant in each caller. */
static inline __attribute__((always_inline)) float lut32_scale(const uint8_t *blk, const int type) {
#if defined(__AVX2__) && defined(__FMA__)
    return type == MUSER_ID_MXFP4 ? e8m0_half(blk[MUSER_MXFP4_E]) : f16_scale(blk + MUSER_IQ4_NL_D);
#else
    return type == MUSER_ID_MXFP4 ? e8m0_half(blk[MUSER_MXFP4_E]) : f16(blk + MUSER_IQ4_NL_D);
#endif
}

/* Scalar sum(table[q_w] * q_x) over 32 elements in element order. */
static inline int lut32_isum(const uint8_t *qs, const int8_t *table, const int8_t *y) {
    int s1 = 0, s2 = 0;
    for (int j = 0; j < 16; j++) {
        s1 += table[qs[j] & 0xF] * y[j];
        s2 += table[qs[j] >> 4] * y[j + 16];
    }
    return s1 + s2;
}

#if defined(__AVX2__) && defined(__FMA__)
/* One block's contribution for T tokens: acc[t] += (d_x * d_w) * sum(w * y_t) in 8 lanes. */
ROW_KERNEL void lut32_block(const uint8_t *blk, const int type, const int qs_at, const int8_t *table,
                            const uint8_t *act, int64_t act_stride, int64_t b, const int T,
                            __m256 acc[QDOT_TOKENS]) {
    const __m256i w = lut_values32(blk + qs_at, table);
    const __m256i u = _mm256_sign_epi8(w, w);
    const float d = lut32_scale(blk, type);
    for (int t = 0; t < T; t++) {
        const act32_t *a = ACT32(t, b);
        const __m256i y = _mm256_loadu_si256((const __m256i *)a->qs);
        const __m256i p = dot_u8s8(u, _mm256_sign_epi8(y, w));
        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(a->d * d), _mm256_cvtepi32_ps(p), acc[t]);
    }
}
#endif

ROW_KERNEL void qdot_lut32(const uint8_t *row, const int type, const uint8_t *act,
                           int64_t act_stride, int64_t nb, const int T, float *out) {
    const int bytes = type == MUSER_ID_MXFP4 ? MUSER_MXFP4_BYTES : MUSER_IQ4_NL_BYTES;
    const int qs_at = type == MUSER_ID_MXFP4 ? MUSER_MXFP4_QS : MUSER_IQ4_NL_QS;
    const int8_t *table = type == MUSER_ID_MXFP4 ? FP4_DOUBLED : IQ4_VALUES;
    float sum[QDOT_TOKENS];
    int64_t b = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 even[QDOT_TOKENS], odd[QDOT_TOKENS];
    for (int t = 0; t < T; t++) even[t] = odd[t] = _mm256_setzero_ps();
    for (; b + 1 < nb; b += 2) {
        lut32_block(row + b * bytes, type, qs_at, table, act, act_stride, b, T, even);
        lut32_block(row + (b + 1) * bytes, type, qs_at, table, act, act_stride, b + 1, T, odd);
    }
    for (int t = 0; t < T; t++) sum[t] = hsum8(_mm256_add_ps(even[t], odd[t]));
#else
    for (int t = 0; t < T; t++) sum[t] = 0.0f;
#endif
    for (; b < nb; b++) {
        const uint8_t *blk = row + b * bytes;
        const float d = lut32_scale(blk, type);
        for (int t = 0; t < T; t++) {
            const act32_t *a = ACT32(t, b);
            sum[t] += (a->d * d) * (float)lut32_isum(blk + qs_at, table, a->qs);
        }
    }
    for (int t = 0; t < T; t++) out[t] = sum[t];
}

/* IQ4_XS sub-block j's 6-bit scale minus 32. */
static inline int iq4_xs_scale(const uint8_t *blk, int j) {
    const unsigned h = blk[MUSER_IQ4_XS_SCALES_H] | (blk[MUSER_IQ4_XS_SCALES_H + 1] << 8);
    const int ls = ((blk[MUSER_IQ4_XS_SCALES_L + j / 2] >> (4 * (j % 2))) & 0xF) | (((h >> (2 * j)) & 3) << 4);
    return ls - 32;
}

ROW_KERNEL void qdot_iq4_xs_rows(const uint8_t *row, const uint8_t *act, int64_t act_stride,
                                 int64_t nb, const int T, float *out) {
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc[QDOT_TOKENS];
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * MUSER_IQ4_XS_BYTES;
        __m256i isum[QDOT_TOKENS];
        for (int t = 0; t < T; t++) isum[t] = _mm256_setzero_si256();
        for (int j = 0; j < QK_K / 32; j++) {
            const __m256i w = lut_values32(blk + MUSER_IQ4_XS_QS + 16 * j, IQ4_VALUES);
            const __m256i u = _mm256_sign_epi8(w, w);
            const __m256i ls = _mm256_set1_epi16((short)iq4_xs_scale(blk, j));
            for (int t = 0; t < T; t++) {
                const __m256i y = _mm256_loadu_si256((const __m256i *)(ACTK(t, b)->qs + 32 * j));
                const __m256i p16 = _mm256_maddubs_epi16(u, _mm256_sign_epi8(y, w));
                isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p16, ls));
            }
        }
        const float dw = f16_scale(blk + MUSER_IQ4_XS_D);
        for (int t = 0; t < T; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * ACTK(t, b)->d), _mm256_cvtepi32_ps(isum[t]), acc[t]);
    }
    for (int t = 0; t < T; t++) out[t] = hsum8(acc[t]);
#else
    float sum[QDOT_TOKENS];
    for (int t = 0; t < T; t++) sum[t] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * MUSER_IQ4_XS_BYTES;
        const float dw = f16(blk + MUSER_IQ4_XS_D);
        for (int t = 0; t < T; t++) {
            const actk_t *a = ACTK(t, b);
            const float dd = dw * a->d;
            for (int j = 0; j < QK_K / 32; j++)
                sum[t] += (dd * (float)iq4_xs_scale(blk, j)) *
                          (float)lut32_isum(blk + MUSER_IQ4_XS_QS + 16 * j, IQ4_VALUES, a->qs + 32 * j);
        }
    }
    for (int t = 0; t < T; t++) out[t] = sum[t];
#endif
}

/* Each type's qdot_fn (TOKEN_SWITCH: kernels.h). */
#define LUT_FN(name, call)                                                                     \
    void name(const uint8_t *row, const uint8_t *act, int64_t act_stride, int64_t nb, int T,   \
              float *out) {                                                                     \
        TOKEN_SWITCH(call)                                                                      \
    }
#define CALL_IQ4_NL(n) qdot_lut32(row, MUSER_ID_IQ4_NL, act, act_stride, nb, n, out)
#define CALL_MXFP4(n) qdot_lut32(row, MUSER_ID_MXFP4, act, act_stride, nb, n, out)
#define CALL_IQ4_XS(n) qdot_iq4_xs_rows(row, act, act_stride, nb, n, out)
LUT_FN(qdot_iq4_nl, CALL_IQ4_NL)
LUT_FN(qdot_mxfp4, CALL_MXFP4)
LUT_FN(qdot_iq4_xs, CALL_IQ4_XS)
