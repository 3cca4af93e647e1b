/* muser_matmul: the fused decode-and-dot kernel for a few activation rows.
 *
 * y[t, r] = sum_i x[t, i] * W[r, i] for t < T <= MAX_TOKENS. Threads take chunks
 * of contiguous rows and stream each row once, dotting every decoded weight
 * with all T activation rows, so the packed bytes are read once whatever T is.
 *
 * The fused row kernels use FMA (w = a*q - c in one rounding, more exact
 * than the reference's two); all sums run in 8 float32 lanes per token,
 * folded at the end of the row. Only muser_dequant_rows promises values
 * bit-exact with the reference.
 */
#include "kernels.h"
#include "simd.h"

#ifdef HAVE_FUSED
/* One FMA has a latency of several cycles, so with few tokens a single sum
 * per token would serialize: keep CHAINS independent sums per token (chain c
 * takes the FMA sites numbered c mod CHAINS) and add them up at the end. */
#define CHAINS(T) ((T) == 1 ? 4 : (T) == 2 ? 2 : 1)
#define ACC_DECLARE(T)                                                        \
    v8f acc[4][TOKEN_GROUP];                                                 \
    for (int c = 0; c < CHAINS(T); c++)                                      \
        for (int t = 0; t < (T); t++) acc[c][t] = splat(0.0f)
#define ACC_FINISH(T)                                                         \
    for (int t = 0; t < (T); t++) {                                          \
        v8f a = acc[0][t];                                                   \
        for (int c = 1; c < CHAINS(T); c++) a += acc[c][t];                  \
        out[t] = hsum(a);                                                    \
    }
/* acc[site % chains][t] += w * x[t][off .. off+8) */
#define FMA_TOKENS(w, off, site)                                              \
    for (int t = 0; t < T; t++)                                              \
        acc[(site) % CHAINS(T)][t] =                                         \
            fma8((w), load8(x + t * n_in + (off)), acc[(site) % CHAINS(T)][t])

/* Q4_K / Q5_K: w = (d*sc_j)*q - dmin*m_j, q from the nibbles (and qh bit). */
ROW_KERNEL void row_q45_k(const uint8_t *row, const int five, int64_t nb, const float *x,
                          int64_t n_in, const int T, float *out) {
    ACC_DECLARE(T);
    const int bytes = Q45_K(five, BYTES);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bytes;
        const uint8_t *qh = blk + MUSER_Q5_K_QH, *qs = blk + Q45_K(five, QS);
        const float d = f16(blk + MUSER_Q4_K_D), dmin = f16(blk + MUSER_Q4_K_DMIN);
        const int64_t base = b * QK_K;
        for (int g = 0; g < 4; g++) {
            v8f a0, c0, a1, c1, w0, w1;
            q45_k_group(blk, d, dmin, g, &a0, &c0, &a1, &c1);
            for (int k = 0; k < 4; k++) {
                q45_k_w8(qs, qh, five, g, k, a0, c0, a1, c1, &w0, &w1);
                FMA_TOKENS(w0, base + 64 * g + 8 * k, 2 * k);
                FMA_TOKENS(w1, base + 64 * g + 32 + 8 * k, 2 * k + 1);
            }
        }
    }
    ACC_FINISH(T)
}

/* Q6_K: w = (d*sc_j) * (q - 32), sub-blocks of 16. */
ROW_KERNEL void row_q6_k(const uint8_t *row, int64_t nb, const float *x, int64_t n_in,
                         const int T, float *out) {
    ACC_DECLARE(T);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * MUSER_Q6_K_BYTES;
        const float d = f16(blk + MUSER_Q6_K_D);
        for (int h = 0; h < 2; h++) {
            const int64_t base = b * QK_K + 128 * h;
            for (int k = 0; k < 4; k++) {
                v8f w[4];
                q6_k_w8(blk, d, h, k, w);
                FMA_TOKENS(w[0], base + 8 * k, 0);
                FMA_TOKENS(w[1], base + 32 + 8 * k, 1);
                FMA_TOKENS(w[2], base + 64 + 8 * k, 2);
                FMA_TOKENS(w[3], base + 96 + 8 * k, 3);
            }
        }
    }
    ACC_FINISH(T)
}

/* Q2_K / Q3_K: see q23_k_w8x4 (the code bytes of each 8 elements read once
 * for the 4 vectors they hold). */
ROW_KERNEL void row_q23_k(const uint8_t *row, const int three, int64_t nb, const float *x,
                          int64_t n_in, const int T, float *out) {
    ACC_DECLARE(T);
    const int bytes = three ? MUSER_Q3_K_BYTES : MUSER_Q2_K_BYTES;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bytes;
        float a[16], c[16];
        q23_k_factors(blk, three, a, c);
        for (int h = 0; h < 2; h++)
            for (int v = 0; v < 4; v++) {
                v8f w[4];
                q23_k_w8x4(blk, three, h, v, a, c, w);
                const int64_t base = b * QK_K + 128 * h + 8 * v;
                FMA_TOKENS(w[0], base, 0);
                FMA_TOKENS(w[1], base + 32, 1);
                FMA_TOKENS(w[2], base + 64, 2);
                FMA_TOKENS(w[3], base + 96, 3);
            }
    }
    ACC_FINISH(T)
}

/* NVFP4_E2M1: see nvfp4_e2m1_w16. */
ROW_KERNEL void row_nvfp4_e2m1(const uint8_t *row, const uint8_t *crow, const float *lut,
                               float s2, int64_t nb, const float *x, int64_t n_in, const int T,
                               float *out) {
    ACC_DECLARE(T);
    const __m256 table = _mm256_loadu_ps(E2M1);
    for (int64_t b = 0; b < nb; b++) {         /* 16 elements, 8 bytes, one scale */
        v8f w0, w1;
        nvfp4_e2m1_w16(table, row, lut[crow[b]] * s2, b, &w0, &w1);
        FMA_TOKENS(w0, 16 * b, 2 * (b & 1));
        FMA_TOKENS(w1, 16 * b + 8, 2 * (b & 1) + 1);
    }
    ACC_FINISH(T)
}

/* Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: see legacy_w32; `type` is a constant. */
_Static_assert(QK_LEGACY == 4 * 8 && MUSER_Q4_0_ELEMS == QK_LEGACY && MUSER_Q4_1_ELEMS == QK_LEGACY &&
                   MUSER_Q5_0_ELEMS == QK_LEGACY && MUSER_Q5_1_ELEMS == QK_LEGACY &&
                   MUSER_Q8_0_ELEMS == QK_LEGACY && MUSER_Q5_0_QH + 4 <= MUSER_Q5_0_QS &&
                   MUSER_Q5_1_QH + 4 <= MUSER_Q5_1_QS,
               "legacy_w32 decodes a block as 4 vectors of 8 with a 32-bit qh");
ROW_KERNEL void row_legacy(const uint8_t *row, const int type, const int bytes, int64_t nb,
                           const float *x, int64_t n_in, const int T, float *out) {
    ACC_DECLARE(T);
    for (int64_t b = 0; b < nb; b++) {
        v8f w[4];
        legacy_w32(row + b * bytes, type, w);
        for (int v = 0; v < 4; v++) FMA_TOKENS(w[v], QK_LEGACY * b + 8 * v, v);
    }
    ACC_FINISH(T)
}

/* IQ4_XS: sub-block j as an IQ4_NL block's codes, scaled by d * (ls_j - 32). */
_Static_assert(MUSER_IQ4_XS_ELEMS == 8 * QK_LEGACY && MUSER_IQ4_NL_ELEMS == QK_LEGACY &&
                   MUSER_MXFP4_ELEMS == QK_LEGACY,
               "the lookup-table types decode 32 elements at a time");
ROW_KERNEL void row_iq4_xs(const uint8_t *row, int64_t nb, const float *x, int64_t n_in,
                           const int T, float *out) {
    ACC_DECLARE(T);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * MUSER_IQ4_XS_BYTES;
        const float d = f16_scale(blk + MUSER_IQ4_XS_D);
        const unsigned h = blk[MUSER_IQ4_XS_SCALES_H] | (blk[MUSER_IQ4_XS_SCALES_H + 1] << 8);
        for (int j = 0; j < QK_K / QK_LEGACY; j++) {
            const int ls = ((blk[MUSER_IQ4_XS_SCALES_L + j / 2] >> (4 * (j % 2))) & 0xF) |
                           (((h >> (2 * j)) & 3) << 4);
            const v8f dl = splat(d * (float)(ls - 32));
            const __m256i codes = lut_values32(blk + MUSER_IQ4_XS_QS + 16 * j, IQ4_VALUES);
            for (int v = 0; v < 4; v++)
                FMA_TOKENS(dl * legacy_codes8(codes, v), QK_K * b + QK_LEGACY * j + 8 * v, v);
        }
    }
    ACC_FINISH(T)
}

/* IQ3_XXS / IQ3_S (`xxs`): each 32-element sub-block's grid bytes times its
 * scale, signs XORed in (simd.h's iq3_w32). */
ROW_KERNEL void row_iq3(const uint8_t *row, const int xxs, int64_t nb, const float *x, int64_t n_in,
                        const int T, float *out) {
    ACC_DECLARE(T);
    const int bytes = xxs ? MUSER_IQ3_XXS_BYTES : MUSER_IQ3_S_BYTES;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bytes;
        const float d = f16_scale(blk);
#pragma GCC unroll 8
        for (int s = 0; s < QK_K / 32; s++) {
            uint32_t signs;
            v8f w[4];
            const float db = iq3_db(d, iq3_signs(blk, s, xxs, &signs), xxs);
            iq3_w32(iq3_grid8(blk, s, xxs), signs, db, w);
            for (int v = 0; v < 4; v++) FMA_TOKENS(w[v], QK_K * b + 32 * s + 8 * v, v);
        }
    }
    ACC_FINISH(T)
}

/* F16 and BF16: 8 halves converted in registers (F16C's vcvtph2ps, exact;
 * BF16 a shift), 4 FMA chains with one token; a row's last n_in % 8
 * elements summed apart. Measured against the L1-scratch path it replaced
 * (bench ops --against ggml, 1 thread, 4096->14336, busy 2-core host): see
 * docs/cpu.md. */
ROW_KERNEL void row_half(const uint8_t *row, const int bf16, const float *x, int64_t n_in,
                         const int T, float *out) {
    ACC_DECLARE(T);
    const int64_t n8 = n_in & ~(int64_t)7, n32 = n_in & ~(int64_t)31;
#define HALF8(i)                                                                                   \
    (bf16 ? (v8f)_mm256_castsi256_ps(_mm256_slli_epi32(                                            \
                _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * (i)))), 16))     \
          : (v8f)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * (i)))))
    for (int64_t i = 0; i < n32; i += 32) {     /* constant chain sites keep acc in registers */
        FMA_TOKENS(HALF8(i), i, 0);
        FMA_TOKENS(HALF8(i + 8), i + 8, 1);
        FMA_TOKENS(HALF8(i + 16), i + 16, 2);
        FMA_TOKENS(HALF8(i + 24), i + 24, 3);
    }
    for (int64_t i = n32; i < n8; i += 8) FMA_TOKENS(HALF8(i), i, 0);
#undef HALF8
    ACC_FINISH(T)
    for (int64_t i = n8; i < n_in; i++) {
        float w;
        if (bf16) {
            const uint32_t bits = (uint32_t)(row[2 * i] | (row[2 * i + 1] << 8)) << 16;
            memcpy(&w, &bits, 4);
        } else {
            w = f16(row + 2 * i);
        }
        for (int t = 0; t < T; t++) out[t] += w * x[t * n_in + i];
    }
}

#if defined(__AVX512F__)
/* AVX-512: the same fused kernels 16 wide, over R = 1 or 2 weight rows at a
 * time. Each step widens 16 code bytes to int32 lanes (vpmovzxbd) and FMAs 16
 * weights per token; every weight rounds exactly as the 8-wide decoders above
 * (one fmsub for Q4_K/Q5_K, (d*sc)*(q-32) for Q6_K, e2m1 * (e4m3*s2) for
 * NVFP4_E2M1), only the summation order differs. With more tokens the
 * activations (T * n_in floats) no longer fit in L1 and are streamed from L2
 * for every row, so from PAIR_MIN_T tokens on two rows share each activation
 * load (matmul_rows16; at 3-4 tokens pairing was slower on weights streamed
 * from DRAM, faster only on L3-resident ones).
 * Measured (muser-torch bench ops --device cpu, 2-core AMD EPYC with AVX-512,
 * GCC 12), ms, 8-wide AVX2 kernels -> these, 1 thread:
 *   tokens:                      1               4               8
 *   attn_q Q4_K 6656->4096       1.88 -> 1.31    3.89 -> 3.38    5.41 -> 4.20
 *   ffn_gate/up Q4_K ->19968     9.51 -> 7.91   19.6  -> 18.9   25.6  -> 23.6
 *   ffn_down Q4_K 19968->6656   12.1  -> 11.2   19.3  -> 17.0   25.1  -> 19.8
 *   ffn_down_q6 Q6_K            21.8  -> 18.5   26.1  -> 22.9   36.1  -> 22.0
 *   lm_head Q5_K 6656->202048    147  -> 106     218  -> 182     319  -> 220
 *   NVFP4_E2M1 6656->4096        3.28 -> 2.17    4.33 -> 3.32    5.81 -> 3.52
 * and with 2 threads: attn_q 0.67 -> 0.64 / 1.51 -> 1.43 / 3.07 -> 1.83,
 * ffn_down_q6 8.85 -> 8.18 / 11.6 -> 11.2 / 18.5 -> 12.5, lm_head 54.7 ->
 * 53.2 / 94.3 -> 93.6 / 186 -> 113 (one token is near memory bound there). */
#define HAVE_FUSED16 1
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

static inline v16f splat16(float a) { return (v16f)_mm512_set1_ps(a); }
static inline v16f load16(const float *p) { return (v16f)_mm512_loadu_ps(p); }
static inline v16i widen16_u8(const uint8_t *p) {
    return (v16i)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}
static inline v16f to_f32_16(v16i v) { return (v16f)_mm512_cvtepi32_ps((__m512i)v); }
static inline v16f fma16(v16f a, v16f b, v16f c) {
    return (v16f)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
}
static inline v16f fms16(v16f a, v16f b, v16f c) {
    return (v16f)_mm512_fmsub_ps((__m512)a, (__m512)b, (__m512)c);
}

/* acc[chain][row][token]; CHAINS16 independent sums per (row, token). */
#define CHAINS16(RT) ((RT) == 1 ? 4 : (RT) == 2 ? 2 : 1)
#define ACC16_DECLARE(R, T)                                                   \
    v16f acc[4][2][TOKEN_GROUP];                                             \
    for (int c = 0; c < CHAINS16((R) * (T)); c++)                            \
        for (int r = 0; r < (R); r++)                                        \
            for (int t = 0; t < (T); t++) acc[c][r][t] = splat16(0.0f)
#define ACC16_FINISH(R, T)                                                    \
    for (int r = 0; r < (R); r++)                                            \
        for (int t = 0; t < (T); t++) {                                      \
            v16f a = acc[0][r][t];                                           \
            for (int c = 1; c < CHAINS16((R) * (T)); c++) a += acc[c][r][t]; \
            out[r][t] = _mm512_reduce_add_ps((__m512)a);                     \
        }
/* acc[site % chains][r][t] += w[r] * x[t][off .. off+16) */
#define FMA16_TOKENS(w, off, site)                                            \
    for (int t = 0; t < T; t++) {                                            \
        const v16f xv = load16(x + t * n_in + (off));                        \
        for (int r = 0; r < R; r++)                                          \
            acc[(site) % CHAINS16(R * T)][r][t] =                            \
                fma16((w)[r], xv, acc[(site) % CHAINS16(R * T)][r][t]);      \
    }

ROW_KERNEL void row_q45_k_16(const uint8_t *const *rows, const int five, int64_t nb,
                             const float *x, int64_t n_in, const int R, const int T,
                             float *const *out) {
    ACC16_DECLARE(R, T);
    const int bytes = Q45_K(five, BYTES);
    for (int64_t b = 0; b < nb; b++) {
        const int64_t base = b * QK_K;
        float d[2], dmin[2];
        for (int r = 0; r < R; r++) {
            d[r] = f16(rows[r] + b * bytes + MUSER_Q4_K_D);
            dmin[r] = f16(rows[r] + b * bytes + MUSER_Q4_K_DMIN);
        }
        for (int g = 0; g < 4; g++) {
            v16f a0[2], c0[2], a1[2], c1[2];
            for (int r = 0; r < R; r++) {
                const uint8_t *blk = rows[r] + b * bytes;
                float sc0, m0, sc1, m1;
                scale_min_k4(blk + MUSER_Q4_K_SCALES, 2 * g, &sc0, &m0);
                scale_min_k4(blk + MUSER_Q4_K_SCALES, 2 * g + 1, &sc1, &m1);
                a0[r] = splat16(d[r] * sc0), c0[r] = splat16(dmin[r] * m0);
                a1[r] = splat16(d[r] * sc1), c1[r] = splat16(dmin[r] * m1);
            }
            for (int k = 0; k < 2; k++) {
                v16f w0[2], w1[2];
                for (int r = 0; r < R; r++) {
                    const uint8_t *blk = rows[r] + b * bytes;
                    const uint8_t *qh = blk + MUSER_Q5_K_QH, *qs = blk + Q45_K(five, QS);
                    const v16i raw = widen16_u8(qs + 32 * g + 16 * k);
                    v16i lo = raw & 0xF, hi = raw >> 4;
                    if (five) {
                        const v16i h = widen16_u8(qh + 16 * k);
                        lo |= ((h >> (2 * g)) & 1) << 4;
                        hi |= ((h >> (2 * g + 1)) & 1) << 4;
                    }
                    w0[r] = fms16(a0[r], to_f32_16(lo), c0[r]);
                    w1[r] = fms16(a1[r], to_f32_16(hi), c1[r]);
                }
                FMA16_TOKENS(w0, base + 64 * g + 16 * k, 2 * k);
                FMA16_TOKENS(w1, base + 64 * g + 32 + 16 * k, 2 * k + 1);
            }
        }
    }
    ACC16_FINISH(R, T)
}

ROW_KERNEL void row_q6_k_16(const uint8_t *const *rows, int64_t nb, const float *x, int64_t n_in,
                            const int R, const int T, float *const *out) {
    ACC16_DECLARE(R, T);
    for (int64_t b = 0; b < nb; b++) {
        float d[2];
        for (int r = 0; r < R; r++) d[r] = f16(rows[r] + b * MUSER_Q6_K_BYTES + MUSER_Q6_K_D);
        for (int h = 0; h < 2; h++) {
            const int64_t base = b * QK_K + 128 * h;
            for (int k = 0; k < 2; k++) {          /* elements 16k.. of each quarter */
                v16f w0[2], w1[2], w2[2], w3[2];
                for (int r = 0; r < R; r++) {
                    const uint8_t *blk = rows[r] + b * MUSER_Q6_K_BYTES;
                    const int8_t *sc = (const int8_t *)(blk + MUSER_Q6_K_SCALES);
                    const uint8_t *ql = blk + MUSER_Q6_K_QL + 64 * h;
                    const uint8_t *qh = blk + MUSER_Q6_K_QH + 32 * h;
                    const int j = 8 * h + k;
                    const v16i l0 = widen16_u8(ql + 16 * k), l1 = widen16_u8(ql + 32 + 16 * k);
                    const v16i hb = widen16_u8(qh + 16 * k);
                    w0[r] = splat16(d[r] * (float)sc[j]) *
                            to_f32_16(((l0 & 0xF) | ((hb & 3) << 4)) - 32);
                    w1[r] = splat16(d[r] * (float)sc[j + 2]) *
                            to_f32_16(((l1 & 0xF) | (((hb >> 2) & 3) << 4)) - 32);
                    w2[r] = splat16(d[r] * (float)sc[j + 4]) *
                            to_f32_16(((l0 >> 4) | (((hb >> 4) & 3) << 4)) - 32);
                    w3[r] = splat16(d[r] * (float)sc[j + 6]) *
                            to_f32_16(((l1 >> 4) | (((hb >> 6) & 3) << 4)) - 32);
                }
                FMA16_TOKENS(w0, base + 16 * k, 0);
                FMA16_TOKENS(w1, base + 32 + 16 * k, 1);
                FMA16_TOKENS(w2, base + 64 + 16 * k, 2);
                FMA16_TOKENS(w3, base + 96 + 16 * k, 3);
            }
        }
    }
    ACC16_FINISH(R, T)
}

/* Q2_K / Q3_K: sub-block s = 8h + 2j + k is elements 128h + 32j + 16k .., whose codes are
 * bits 2j.. of qs[32h + 16k ..] (read once for the 4 j); w rounds as q23_k_w8x4 does
 * (Q3_K: fma(a, u, -4a) = a * (u - 4) in one rounding, 4a being exact). */
ROW_KERNEL void row_q23_k_16(const uint8_t *const *rows, const int three, int64_t nb,
                             const float *x, int64_t n_in, const int R, const int T,
                             float *const *out) {
    ACC16_DECLARE(R, T);
    const int bytes = three ? MUSER_Q3_K_BYTES : MUSER_Q2_K_BYTES;
    const int qs_at = three ? MUSER_Q3_K_QS : MUSER_Q2_K_QS;
    for (int64_t b = 0; b < nb; b++) {
        float a[2][16], c[2][16];
        for (int r = 0; r < R; r++) q23_k_factors(rows[r] + b * bytes, three, a[r], c[r]);
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 2; k++) {
                v16i raw[2], hb[2];
                for (int r = 0; r < R; r++) {
                    raw[r] = widen16_u8(rows[r] + b * bytes + qs_at + 32 * h + 16 * k);
                    if (three) hb[r] = widen16_u8(rows[r] + b * bytes + MUSER_Q3_K_HMASK + 16 * k);
                }
                for (int j = 0; j < 4; j++) {
                    const int sb = 8 * h + 2 * j + k;
                    v16f w[2];
                    for (int r = 0; r < R; r++) {
                        v16i u = (raw[r] >> (2 * j)) & 3;
                        const int bit = 4 * h + j;      /* the hmask bit, moved to bit 2 */
                        if (three) u |= (bit >= 2 ? hb[r] >> (bit - 2) : hb[r] << (2 - bit)) & 4;
                        w[r] = fms16(splat16(a[r][sb]), to_f32_16(u),
                                     splat16(three ? 4.0f * a[r][sb] : c[r][sb]));
                    }
                    FMA16_TOKENS(w, b * QK_K + 128 * h + 32 * j + 16 * k, j);
                }
            }
    }
    ACC16_FINISH(R, T)
}

/* NVFP4_E2M1 block b: the nibbles are split and interleaved back into element
 * order as bytes, widened, and looked up in the signed 16-entry table (vpermps). */
static inline v16f nvfp4_e2m1_v16(__m512 table, const uint8_t *row, float s, int64_t b) {
    return splat16(s) * (v16f)e2m1_values16(table, e2m1_codes16(row, b));
}

ROW_KERNEL void row_nvfp4_e2m1_16(const uint8_t *const *rows, const uint8_t *const *crows,
                                  const float *lut, float s2, int64_t nb, const float *x,
                                  int64_t n_in, const int R, const int T, float *const *out) {
    ACC16_DECLARE(R, T);
    const __m512 table = _mm512_loadu_ps(E2M1);
    for (int64_t b = 0; b < nb; b++) {
        v16f w[2];
        for (int r = 0; r < R; r++) w[r] = nvfp4_e2m1_v16(table, rows[r], lut[crows[r][b]] * s2, b);
        FMA16_TOKENS(w, 16 * b, b & 3);
    }
    ACC16_FINISH(R, T)
}

/* R rows (1 or 2) of a fused type, T tokens; `type` is a compile-time
 * constant in every matvec_<type> (so this picks its row kernel statically). */
ROW_KERNEL void rows_dot16(const int type, const uint8_t *const *rows, const uint8_t *const *crows,
                           const float *lut, float s2, const float *x, int64_t n_in, const int R,
                           const int T, float *const *out) {
    switch (type) {
    case MUSER_ID_Q4_K: row_q45_k_16(rows, 0, n_in / QK_K, x, n_in, R, T, out); return;
    case MUSER_ID_Q5_K: row_q45_k_16(rows, 1, n_in / QK_K, x, n_in, R, T, out); return;
    case MUSER_ID_Q6_K: row_q6_k_16(rows, n_in / QK_K, x, n_in, R, T, out); return;
    case MUSER_ID_Q2_K: row_q23_k_16(rows, 0, n_in / QK_K, x, n_in, R, T, out); return;
    case MUSER_ID_Q3_K: row_q23_k_16(rows, 1, n_in / QK_K, x, n_in, R, T, out); return;
    default: row_nvfp4_e2m1_16(rows, crows, lut, s2, n_in / NVFP4_GROUP, x, n_in, R, T, out);
    }
}
static inline int fused16(const int type) {
    return type == MUSER_ID_Q4_K || type == MUSER_ID_Q5_K || type == MUSER_ID_Q6_K ||
           type == MUSER_ID_NVFP4_E2M1 || type == MUSER_ID_Q2_K || type == MUSER_ID_Q3_K;
}
#undef FMA16_TOKENS
#undef ACC16_DECLARE
#undef ACC16_FINISH
#undef CHAINS16
#endif /* __AVX512F__ */
#undef FMA_TOKENS
#undef ACC_DECLARE
#undef ACC_FINISH
#undef CHAINS
#endif

#define FMA_TOKENS(w, off)                                                   \
    for (int t = 0; t < T; t++) acc[t] += (w) * load8(x + t * n_in + (off))

/* Every other type: decode CHUNK elements into an L1 scratch, then dot. Every
 * block holds a multiple of 8 elements except F16's and BF16's, whose rows
 * may end in a partial vector: its products are summed apart (`tail`). */
ROW_KERNEL void row_generic(const type_entry_t *k, const uint8_t *row, const uint8_t *crow,
                            const float *lut, float s2, const float *x, int64_t n_in, const int T,
                            float *out) {
    float w[CHUNK] __attribute__((aligned(64)));
    v8f acc[TOKEN_GROUP];
    float tail[TOKEN_GROUP];
    for (int t = 0; t < T; t++) acc[t] = splat(0.0f), tail[t] = 0.0f;
    const int64_t ch = chunk_elems(k);
    for (int64_t c0 = 0; c0 < n_in; c0 += ch) {
        const int64_t n = n_in - c0 < ch ? n_in - c0 : ch;
        decode_span(k, row, crow, lut, s2, c0, n, w);
        const int64_t n8 = n & ~(int64_t)7;
        for (int64_t i = 0; i < n8; i += 8) FMA_TOKENS(load8(w + i), c0 + i);
        for (int64_t i = n8; i < n; i++)
            for (int t = 0; t < T; t++) tail[t] += w[i] * x[t * n_in + c0 + i];
    }
    for (int t = 0; t < T; t++) out[t] = n_in % 8 ? hsum(acc[t]) + tail[t] : hsum(acc[t]);
}

/* One row for a compile-time T (1..TOKEN_GROUP) and type (see rows_dot16). */
ROW_KERNEL void row_dot(const type_entry_t *k, const int type, const uint8_t *row, const uint8_t *crow,
                        const float *lut, float s2, const float *x, int64_t n_in, const int T,
                        float *out) {
    switch (type) {
#ifdef HAVE_FUSED
    case MUSER_ID_Q4_K: row_q45_k(row, 0, n_in / QK_K, x, n_in, T, out); return;
    case MUSER_ID_Q5_K: row_q45_k(row, 1, n_in / QK_K, x, n_in, T, out); return;
    case MUSER_ID_Q6_K: row_q6_k(row, n_in / QK_K, x, n_in, T, out); return;
    case MUSER_ID_Q2_K: row_q23_k(row, 0, n_in / QK_K, x, n_in, T, out); return;
    case MUSER_ID_Q3_K: row_q23_k(row, 1, n_in / QK_K, x, n_in, T, out); return;
    case MUSER_ID_NVFP4_E2M1:
        row_nvfp4_e2m1(row, crow, lut, s2, n_in / NVFP4_GROUP, x, n_in, T, out);
        return;
#define LEGACY_CASE(TYPE)                                                                 \
    case MUSER_ID_##TYPE:                                                                 \
        row_legacy(row, MUSER_ID_##TYPE, MUSER_##TYPE##_BYTES, n_in / QK_LEGACY, x, n_in, T, out); \
        return
    LEGACY_CASE(Q4_0); LEGACY_CASE(Q4_1); LEGACY_CASE(Q5_0); LEGACY_CASE(Q5_1); LEGACY_CASE(Q8_0);
    LEGACY_CASE(IQ4_NL); LEGACY_CASE(MXFP4);
#undef LEGACY_CASE
    case MUSER_ID_IQ4_XS: row_iq4_xs(row, n_in / QK_K, x, n_in, T, out); return;
    case MUSER_ID_IQ3_XXS: row_iq3(row, 1, n_in / QK_K, x, n_in, T, out); return;
    case MUSER_ID_IQ3_S: row_iq3(row, 0, n_in / QK_K, x, n_in, T, out); return;
#if defined(__F16C__)
    case MUSER_ID_F16: row_half(row, 0, x, n_in, T, out); return;
#endif
    case MUSER_ID_BF16: row_half(row, 1, x, n_in, T, out); return;
#endif
    default: row_generic(k, row, crow, lut, s2, x, n_in, T, out);
    }
}

struct matmul_job {
    const type_entry_t *k;
    const uint8_t *packed, *scales;
    const float *lut;
    float s2;
    int64_t n_out, n_in, row_bytes, T;
    const float *x;
    float *y;
};

#ifdef HAVE_FUSED16
#ifndef PAIR_MIN_T
#define PAIR_MIN_T 5    /* token groups of at least this many run two rows at a time (measured) */
#endif
#define ROWS16_CASE(n)                                                                     \
    case n:                                                                                \
        if (R == 2 && n >= PAIR_MIN_T) rows_dot16(type, rows, crows, lut, s2, xg, n_in, 2, n, og); \
        else                                                                               \
            for (int i = 0; i < R; i++)                                                    \
                rows_dot16(type, rows + i, crows + i, lut, s2, xg, n_in, 1, n, og + i);       \
        break
/* Rows r .. r+R-1 (R = 1, or 2 when the tokens come in groups of PAIR_MIN_T or more). */
ROW_KERNEL void matmul_rows16(const matmul_job *j, const int type, int64_t r, int R) {
    const int64_t n_in = j->n_in, T = j->T, spr = n_in / NVFP4_GROUP;
    const float *lut = j->lut;
    const float s2 = j->s2;
    const uint8_t *rows[2], *crows[2] = {0, 0};
    float out0[MAX_TOKENS], out1[MAX_TOKENS];
    for (int i = 0; i < R; i++) {
        rows[i] = j->packed + (r + i) * j->row_bytes;
        if (j->scales) crows[i] = j->scales + (r + i) * spr;
    }
    for (int64_t t0 = 0; t0 < T; t0 += TOKEN_GROUP) {
        const float *xg = j->x + t0 * n_in;
        float *const og[2] = {out0 + t0, out1 + t0};
        switch (T - t0 < TOKEN_GROUP ? T - t0 : TOKEN_GROUP) {
            ROWS16_CASE(1); ROWS16_CASE(2); ROWS16_CASE(3); ROWS16_CASE(4);
            ROWS16_CASE(5); ROWS16_CASE(6); ROWS16_CASE(7);
        default: ROWS16_CASE(8);
        }
    }
    for (int64_t t = 0; t < T; t++) {
        j->y[t * j->n_out + r] = out0[t];
        if (R == 2) j->y[t * j->n_out + r + 1] = out1[t];
    }
}
#undef ROWS16_CASE
#endif

/* Rows [r0, r1) of a matmul of `type` (a compile-time constant: each
 * matvec_<type> below is this function specialized, and the type table
 * points at them; matvec_generic takes the L1-scratch path). */
ROW_KERNEL void matvec_rows(const matmul_job *j, int64_t r0, int64_t r1, const int type) {
    const type_entry_t *k = j->k;
    const int64_t n_in = j->n_in, T = j->T, spr = n_in / NVFP4_GROUP;
    const float *lut = j->lut;
    const float s2 = j->s2;
#ifdef HAVE_FUSED16
    if (fused16(type)) {
        const int pair = (T < TOKEN_GROUP ? T : TOKEN_GROUP) >= PAIR_MIN_T;
        for (int64_t r = r0; r < r1;) {
            const int R = pair && r + 1 < r1 ? 2 : 1;
            matmul_rows16(j, type, r, R);
            r += R;
        }
        return;
    }
#endif
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = j->packed + r * j->row_bytes;
        const uint8_t *crow = j->scales ? j->scales + r * spr : 0;
        float out[MAX_TOKENS];
        for (int64_t t0 = 0; t0 < T; t0 += TOKEN_GROUP) {  /* the row stays in L1 across groups */
            const float *xg = j->x + t0 * n_in;
            float *og = out + t0;
            switch (T - t0 < TOKEN_GROUP ? T - t0 : TOKEN_GROUP) {
            case 1: row_dot(k, type, row, crow, lut, s2, xg, n_in, 1, og); break;
            case 2: row_dot(k, type, row, crow, lut, s2, xg, n_in, 2, og); break;
            case 3: row_dot(k, type, row, crow, lut, s2, xg, n_in, 3, og); break;
            case 4: row_dot(k, type, row, crow, lut, s2, xg, n_in, 4, og); break;
            case 5: row_dot(k, type, row, crow, lut, s2, xg, n_in, 5, og); break;
            case 6: row_dot(k, type, row, crow, lut, s2, xg, n_in, 6, og); break;
            case 7: row_dot(k, type, row, crow, lut, s2, xg, n_in, 7, og); break;
            default: row_dot(k, type, row, crow, lut, s2, xg, n_in, 8, og); break;
            }
        }
        for (int64_t t = 0; t < T; t++) j->y[t * j->n_out + r] = out[t];
    }
}

#define MATVEC(name, type_id)                                                  \
    void name(const matmul_job *j, int64_t r0, int64_t r1) { matvec_rows(j, r0, r1, type_id); }
MATVEC(matvec_q4_0, MUSER_ID_Q4_0)
MATVEC(matvec_q4_1, MUSER_ID_Q4_1)
MATVEC(matvec_q5_0, MUSER_ID_Q5_0)
MATVEC(matvec_q5_1, MUSER_ID_Q5_1)
MATVEC(matvec_q8_0, MUSER_ID_Q8_0)
MATVEC(matvec_q4_k, MUSER_ID_Q4_K)
MATVEC(matvec_q5_k, MUSER_ID_Q5_K)
MATVEC(matvec_q6_k, MUSER_ID_Q6_K)
MATVEC(matvec_q2_k, MUSER_ID_Q2_K)
MATVEC(matvec_q3_k, MUSER_ID_Q3_K)
MATVEC(matvec_nvfp4_e2m1, MUSER_ID_NVFP4_E2M1)
MATVEC(matvec_f16, MUSER_ID_F16)
MATVEC(matvec_bf16, MUSER_ID_BF16)
MATVEC(matvec_iq4_nl, MUSER_ID_IQ4_NL)
MATVEC(matvec_iq4_xs, MUSER_ID_IQ4_XS)
MATVEC(matvec_mxfp4, MUSER_ID_MXFP4)
MATVEC(matvec_iq3_xxs, MUSER_ID_IQ3_XXS)
MATVEC(matvec_iq3_s, MUSER_ID_IQ3_S)
MATVEC(matvec_generic, -1)

static void matmul_task(const void *ctx, int64_t r0, int64_t r1) {
    const matmul_job *j = ctx;
    j->k->matvec(j, r0, r1);
}

int muser_matmul(int type, const uint8_t *packed, const uint8_t *scales, const float *lut,
                 float s2, int64_t n_out, int64_t n_in, const float *x, int64_t T, float *y,
                 int nthreads) {
    const type_entry_t *k = type_entry_for(type);
    if (!k || n_in % k->elems || T < 1 || T > MAX_TOKENS) return -1;
    const matmul_job j = {k, packed, scales, lut, s2, n_out, n_in, n_in / k->elems * k->bytes, T,
                          x, y};
    parallel_for(matmul_task, &j, n_out, nthreads);
    return 0;
}
