/* ggml numerics for the 3-bit grid types (formats/iq3.py) over Q8_K
 * activations: a 32-element sub-block's grid magnitudes g (unsigned bytes), its
 * sign bits and its odd scale ls meet the activation codes in an exact integer
 * sum, as ggml's vec_dot_iq3_*_q8_K:
 *   IQ3_XXS:  0.25 * sum_blocks (d_w * d_x) * sum_s ls_s * sum(g * sign * q_x),  ls = 2s' + 1
 *   IQ3_S:           sum_blocks (d_w * d_x) * sum_s ls_s * sum(g * sign * q_x),  ls = 2s' + 1
 * The x86 builds follow ggml-cpu's AVX2 code: the 8 grid words of a sub-block
 * in one register, the sign bits spread to bytes and put on the activation
 * (vpsignb), vpmaddubsw pairs (no pair saturates: g <= 62, |q_x| <= 127),
 * vpmaddwd by ls, 8 int32 lanes per super-block scaled once into 8 float lanes
 * per token. The plain-C build sums one float per block, as ggml's generic
 * code, so builds differ only in the order of the float additions. */
#include "kernels.h"
#include "simd.h"

#define ACTK(t, b) ((const actk_t *)(act + (t) * act_stride) + (b))

#if defined(__AVX2__) && defined(__FMA__)
/* 32 sign bits to bytes: -1 where bit i is set, +1 elsewhere (a vpsignb operand). */
static inline __m256i sign_bytes(uint32_t bits) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    return _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(1));
}
#endif

ROW_KERNEL void qdot_grid_rows(const uint8_t *row, const int xxs, const uint8_t *act, int64_t act_stride,
                               int64_t nb, const int T, float *out) {
    const int bytes = xxs ? MUSER_IQ3_XXS_BYTES : MUSER_IQ3_S_BYTES;
    const float outer = xxs ? 0.25f : 1.0f;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc[QDOT_TOKENS];
    for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bytes;
        __m256i isum[QDOT_TOKENS];
        for (int t = 0; t < T; t++) isum[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int s = 0; s < QK_K / 32; s++) {
            uint32_t sg;
            const int ls = 2 * iq3_signs(blk, s, xxs, &sg) + 1;
            const __m256i u = iq3_grid8(blk, s, xxs);
            const __m256i signs = sign_bytes(sg), vls = _mm256_set1_epi16((short)ls);
            for (int t = 0; t < T; t++) {
                const __m256i y = _mm256_loadu_si256((const __m256i *)(ACTK(t, b)->qs + 32 * s));
                const __m256i p16 = _mm256_maddubs_epi16(u, _mm256_sign_epi8(y, signs));
                isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p16, vls));
            }
        }
        const float dw = f16_scale(blk);
        for (int t = 0; t < T; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * ACTK(t, b)->d), _mm256_cvtepi32_ps(isum[t]), acc[t]);
    }
    for (int t = 0; t < T; t++) out[t] = outer * hsum8(acc[t]);
#else
    float sum[QDOT_TOKENS];
    for (int t = 0; t < T; t++) sum[t] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bytes;
        int32_t bsum[QDOT_TOKENS] = {0};
        for (int s = 0; s < QK_K / 32; s++) {
            uint32_t g[8], sg;
            const int ls = 2 * iq3_signs(blk, s, xxs, &sg) + 1;
            iq3_grid(blk, s, xxs, g);
            for (int t = 0; t < T; t++) {
                const int8_t *y = ACTK(t, b)->qs + 32 * s;
                int32_t sumi = 0;
                for (int i = 0; i < 32; i++) {
                    const int v = (int)((g[i / 4] >> (8 * (i % 4))) & 0xFF) * y[i];
                    sumi += (sg >> i) & 1 ? -v : v;
                }
                bsum[t] += sumi * ls;
            }
        }
        const float dw = f16(blk);
        for (int t = 0; t < T; t++) sum[t] += (dw * ACTK(t, b)->d) * (float)bsum[t];
    }
    for (int t = 0; t < T; t++) out[t] = outer * sum[t];
#endif
}

/* Each type's qdot_fn (TOKEN_SWITCH: kernels.h). */
#define GRID_FN(name, call)                                                                    \
    void name(const uint8_t *row, const uint8_t *act, int64_t act_stride, int64_t nb, int T,   \
              float *out) {                                                                     \
        TOKEN_SWITCH(call)                                                                      \
    }
#define CALL_IQ3_XXS(n) qdot_grid_rows(row, 1, act, act_stride, nb, n, out)
#define CALL_IQ3_S(n) qdot_grid_rows(row, 0, act, act_stride, nb, n, out)
GRID_FN(qdot_iq3_xxs, CALL_IQ3_XXS)
GRID_FN(qdot_iq3_s, CALL_IQ3_S)
