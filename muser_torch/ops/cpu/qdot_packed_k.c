/* ggml numerics on repacked K-quant weights: Q6_K and Q4_K (called by qdot_packed.c's
 * muser_matmul_q8p, whose header draws the layout: 16 rows per group, each
 * field of a block in struct order, 4-byte chunks row by row; for Q6_K
 * ql 16 x 128 B, qh 16 x 64 B, scales 16 x 16 B, d 16 x 2 B).
 *
 * The arithmetic is ggml's vec_dot_q6_K_q8_K on x86 (its AVX2 path, which
 * AVX-512 builds run too), so each row's result equals ggml's bit for bit:
 * per block, 8 int32 lanes, lane m summing over the block's eight 32-element
 * groups G the scaled products of elements 32G + 4m .. 32G + 4m + 3, less the
 * codes' offset of 32 for sub-blocks 2m and 2m + 1 (ggml's q8sclsub),
 *   I_m = sum_G sc[2G + m/4] * sum_j q * y - 32 (sc[2m] bsum[2m] + sc[2m+1] bsum[2m+1]),
 * then acc_m = fma(d_x * d_w, (float)I_m, acc_m) over the blocks, and the 8
 * accumulators summed as hsum_float_8: ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)).
 * Element e = 128h + 32g + l (g = 0..3) has its low 4 bits in ql[64h + 32(g&1) + l]
 * (low nibble for g < 2, high for g >= 2) and its top 2 in bits 2g, 2g+1 of
 * qh[32h + l], so lane (G, m)'s 4 codes are one ql chunk and one qh chunk.
 *
 * Kernels: AVX-512 VNNI (vpdpbusd on the unsigned codes, then vpdpwssd adds
 * the sum times the row's scale; the offset taken off each lane at the end)
 * and plain C (the reference; also the rows past the last group,
 * in the file's layout). On a CPU without AVX-512 VNNI the op keeps Q6_K on
 * the row kernel (ops/cpu/packed.py serves it only here); Q4_K has an AVX2
 * kernel too (below), each row's sums in its own lane as on AVX-512.
 */
#include <stdlib.h>

#include "kernels.h"

#define LANES 8
#define GROUPS 8                       /* 32-element groups of a block */
#define QL (PACKED_ROWS * MUSER_Q6_K_QL)
#define QH (PACKED_ROWS * MUSER_Q6_K_QH)
#define SC (PACKED_ROWS * MUSER_Q6_K_SCALES)
#define DW (PACKED_ROWS * MUSER_Q6_K_D)
#define GROUP_BYTES (PACKED_ROWS * MUSER_Q6_K_BYTES)
_Static_assert(QK_K == GROUPS * 32, "a Q6_K block is 8 groups of 32");

typedef struct {
    const actk_t *a;         /* [T][nb] */
    int64_t nb;
} acts_k_t;

/* The unsigned 6-bit code of element e of one Q6_K block in the file's layout. */
static inline int q6_code(const uint8_t *blk, int e) {
    const int h = e / 128, g = (e % 128) / 32, l = e % 32;
    const uint8_t lo = blk[MUSER_Q6_K_QL + 64 * h + 32 * (g & 1) + l];
    const int hi = (blk[MUSER_Q6_K_QH + 32 * h + l] >> (2 * g)) & 3;
    return (g < 2 ? lo & 0xF : lo >> 4) | hi << 4;
}

/* One row (nb blocks in the file's layout) against token t, in ggml's order:
 * vec_dot's, or with `tiled` its tiled matmul's (kernels.h, GGML_TILED_MIN_TOKENS). */
static float q6_row_c(const uint8_t *row, const acts_k_t *x, int64_t t, int tiled) {
    float acc[LANES] = {0}, y = 0.0f;
    for (int64_t b = 0; b < x->nb; b++) {
        const uint8_t *blk = row + b * MUSER_Q6_K_BYTES;
        const actk_t *a = x->a + t * x->nb + b;
        const int8_t *sc = (const int8_t *)(blk + MUSER_Q6_K_SCALES);
        const float d = a->d * f16(blk + MUSER_Q6_K_D);
        int32_t It = 0;      /* the block's integer sum (the tiled order) */
        for (int m = 0; m < LANES; m++) {
            int32_t I = -32 * (sc[2 * m] * a->bsums[2 * m] + sc[2 * m + 1] * a->bsums[2 * m + 1]);
            for (int G = 0; G < GROUPS; G++) {
                int s = 0;
                for (int j = 0; j < 4; j++) {
                    const int e = 32 * G + 4 * m + j;
                    s += q6_code(blk, e) * a->qs[e];
                }
                I += sc[2 * G + m / 4] * s;
            }
            acc[m] = __builtin_fmaf(d, (float)I, acc[m]);
            It += I;
        }
        if (tiled) y = tiled_fold(y, (float)It * f16(blk + MUSER_Q6_K_D), a->d);
    }
    if (tiled) return y;
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/* A panel's blocks back in the file's layout: rows[r][b] (fields {offset, bytes}
 * in struct order, as ops/cpu/packed.py's repack moves them). */
static void unpermute(const uint8_t *panel, int64_t nb, int bytes, const int (*fields)[2], int nf,
                      uint8_t *rows) {
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *g = panel + b * PACKED_ROWS * bytes;
        for (int f = 0; f < nf; f++) {
            const int off = fields[f][0], n = fields[f][1], c = n < 4 ? n : 4;
            for (int k = 0; k < n / c; k++)
                for (int r = 0; r < PACKED_ROWS; r++)
                    memcpy(rows + (r * nb + b) * bytes + off + k * c, g + PACKED_ROWS * off + (k * PACKED_ROWS + r) * c, c);
        }
    }
}

static const int Q6_FIELDS[4][2] = {{MUSER_Q6_K_QL, 128}, {MUSER_Q6_K_QH, 64}, {MUSER_Q6_K_SCALES, 16},
                                    {MUSER_Q6_K_D, 2}};
static const int Q4_FIELDS[4][2] = {{MUSER_Q4_K_D, 2}, {MUSER_Q4_K_DMIN, 2}, {MUSER_Q4_K_SCALES, 12},
                                    {MUSER_Q4_K_QS, 128}};
_Static_assert(MUSER_Q6_K_QH == MUSER_Q6_K_QL + 128 && MUSER_Q6_K_SCALES == MUSER_Q6_K_QH + 64 &&
                   MUSER_Q6_K_D == MUSER_Q6_K_SCALES + 16 && MUSER_Q6_K_BYTES == MUSER_Q6_K_D + 2 &&
                   MUSER_Q4_K_DMIN == MUSER_Q4_K_D + 2 && MUSER_Q4_K_SCALES == MUSER_Q4_K_DMIN + 2 &&
                   MUSER_Q4_K_QS == MUSER_Q4_K_SCALES + 12 && MUSER_Q4_K_BYTES == MUSER_Q4_K_QS + 128,
               "the field tables list every byte of the block");

/* ---- Q4_K, as qdot.c's qdot_q4_k_rows (llama.cpp's repacked q4_K_8x8 on x86) -------------
 * per block, the scaled code sums of each pair of sub-blocks g (elements 64g ..
 * 64g + 63: low nibbles of qs[32g ..], then their high nibbles) and the mins'
 * m_j bsum32_j; a gemm token (below T - T % 4 of the call) folds each pair into
 * acc = fma((float)I_g, d_w * d_x, acc) and accm with dmin_w * d_x, a gemv token the
 * block's totals, one fma each; y = acc - accm. */

static void q4k_scales(const uint8_t *s, uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 8; j++) {
        float a, b;
        scale_min_k4(s, j, &a, &b);
        sc[j] = (uint8_t)a, m[j] = (uint8_t)b;
    }
}

/* Whether token t of a call of T tokens takes ggml's repack gemm (else its gemv). */
static inline int q4k_gemm(int64_t t, int64_t T) { return t < T - T % 4; }

static float q4k_row_c(const uint8_t *row, const acts_k_t *x, int64_t t, int gemm) {
    float acc = 0.0f, accm = 0.0f;
    for (int64_t b = 0; b < x->nb; b++) {
        const uint8_t *blk = row + b * MUSER_Q4_K_BYTES;
        const actk_t *a = x->a + t * x->nb + b;
        uint8_t sc[8], mn[8];
        q4k_scales(blk + MUSER_Q4_K_SCALES, sc, mn);
        const float d = f16(blk + MUSER_Q4_K_D) * a->d, dm = f16(blk + MUSER_Q4_K_DMIN) * a->d;
        int32_t I[4], M[4];
        for (int g = 0; g < 4; g++) {
            int lo = 0, hi = 0;
            for (int l = 0; l < 32; l++) {
                const uint8_t q = blk[MUSER_Q4_K_QS + 32 * g + l];
                lo += (q & 0xF) * a->qs[64 * g + l];
                hi += (q >> 4) * a->qs[64 * g + 32 + l];
            }
            I[g] = sc[2 * g] * lo + sc[2 * g + 1] * hi;
            M[g] = mn[2 * g] * (a->bsums[4 * g] + a->bsums[4 * g + 1]) +
                   mn[2 * g + 1] * (a->bsums[4 * g + 2] + a->bsums[4 * g + 3]);
        }
        if (gemm) {
            for (int g = 0; g < 4; g++) {
                acc = __builtin_fmaf((float)I[g], d, acc);
                accm = __builtin_fmaf((float)M[g], dm, accm);
            }
        } else {
            acc = __builtin_fmaf((float)(I[0] + I[1] + I[2] + I[3]), d, acc);
            accm = __builtin_fmaf((float)(M[0] + M[1] + M[2] + M[3]), dm, accm);
        }
    }
    return acc - accm;
}

/* The plain C panels: the blocks un-permuted, then the row arithmetic above. */
static void panel_k_c(int type, const uint8_t *panel, const acts_k_t *x, int T, float *y, int64_t n_out) {
    const int six = type == MUSER_ID_Q6_K, bytes = six ? MUSER_Q6_K_BYTES : MUSER_Q4_K_BYTES;
    uint8_t *rows = malloc((size_t)(PACKED_ROWS * x->nb * bytes));
    if (!rows) return;      /* muser_matmul_q8p allocates far more before: not reached in practice */
    unpermute(panel, x->nb, bytes, six ? Q6_FIELDS : Q4_FIELDS, 4, rows);
    for (int t = 0; t < T; t++)
        for (int r = 0; r < PACKED_ROWS; r++)
            y[t * n_out + r] = six ? q6_row_c(rows + r * x->nb * bytes, x, t, T >= GGML_TILED_MIN_TOKENS)
                                   : q4k_row_c(rows + r * x->nb * bytes, x, t, q4k_gemm(t, T));
    free(rows);
}

#if defined(__x86_64__)
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma,avx2")))

/* A K-quant group block (2-3 KB) is read in lane order, which jumps between
 * its chunks; from DRAM (a decode step reads every weight once) the hardware
 * prefetchers did not keep up: in a Gemma 3 270M step the Q6_K panel took
 * about 150 us per call against 40 us with the weights in cache. So each
 * block asks for the one PREFETCH_AHEAD blocks on, whole (past a panel's end
 * that is the next panel's start, or nothing: a prefetch never faults). */
#define PREFETCH_AHEAD 4
static inline __attribute__((always_inline)) void prefetch_block(const uint8_t *g, int bytes) {
    for (int i = 0; i < bytes; i += 64) __builtin_prefetch(g + i, 0, 1);
}
#define Q6_TT 2   /* tokens per pass over a panel: 8 float accumulators each */

/* Lanes (4h + gh, m), gh = 0..3, of 16 rows' block g as unsigned codes 0..63
 * (4 bytes per row): two ql chunks (low nibbles for gh < 2, high for gh >= 2)
 * and one qh chunk (bits 2gh, 2gh+1) hold all four. */
T512 static inline __attribute__((always_inline)) void q6_lanes512(const uint8_t *g, int h, int m,
                                                                  __m512i u[4]) {
    const __m512i ql0 = _mm512_loadu_si512(g + QL + 64 * (16 * h + m));
    const __m512i ql1 = _mm512_loadu_si512(g + QL + 64 * (16 * h + 8 + m));
    const __m512i qh = _mm512_loadu_si512(g + QH + 64 * (8 * h + m));
    const __m512i m4 = _mm512_set1_epi8(0xF), m3 = _mm512_set1_epi8(3);
    const __m512i lo[4] = {_mm512_and_si512(ql0, m4), _mm512_and_si512(ql1, m4),
                           _mm512_and_si512(_mm512_srli_epi16(ql0, 4), m4),
                           _mm512_and_si512(_mm512_srli_epi16(ql1, 4), m4)};
    for (int gh = 0; gh < 4; gh++)
        u[gh] = _mm512_or_si512(lo[gh], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 2 * gh), m3), 4));
}

T512 static inline __attribute__((always_inline)) void panel_q6_512_tt(const uint8_t *panel,
                                                                      const acts_k_t *x, int64_t t0,
                                                                      const int TT, float *y,
                                                                      int64_t n_out, int tiled) {
    __m512 acc[Q6_TT][LANES], yt[Q6_TT];
    for (int t = 0; t < TT; t++) {
        yt[t] = _mm512_setzero_ps();
        for (int m = 0; m < LANES; m++) acc[t][m] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < x->nb; b++) {
        const uint8_t *g = panel + b * GROUP_BYTES;
        prefetch_block(g + PREFETCH_AHEAD * GROUP_BYTES, GROUP_BYTES);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g + DW)));
        __m512 ds[Q6_TT];
        for (int t = 0; t < TT; t++) ds[t] = _mm512_mul_ps(_mm512_set1_ps(x->a[(t0 + t) * x->nb + b].d), dw);
        /* the 16 sub-block scales of each row as int32 lanes whose high 16 bits are 0,
         * so vpdpwssd multiplies the low 16 bits of a lane sum (|sum| < 2^15) by them */
        __m512i sc[16], sc32[16];
        for (int s = 0; s < 16; s++) {
            const __m512i sv = _mm512_loadu_si512(g + SC + 64 * (s >> 2));
            sc32[s] = _mm512_srai_epi32(_mm512_slli_epi32(sv, 24 - 8 * (s & 3)), 24);
            sc[s] = _mm512_and_si512(sc32[s], _mm512_set1_epi32(0xFFFF));
        }
        __m512i It[Q6_TT];    /* the block's integer sums (the tiled order) */
        for (int t = 0; t < TT; t++) It[t] = _mm512_setzero_si512();
        for (int m = 0; m < LANES; m++) {
            __m512i I[Q6_TT];
            for (int t = 0; t < TT; t++) I[t] = _mm512_setzero_si512();
            for (int h = 0; h < 2; h++) {
                __m512i u[4];
                q6_lanes512(g, h, m, u);
                for (int gh = 0; gh < 4; gh++) {
                    const int G = 4 * h + gh;
                    for (int t = 0; t < TT; t++) {
                        const int64_t i = (t0 + t) * x->nb + b;
                        int32_t yq;
                        memcpy(&yq, x->a[i].qs + 32 * G + 4 * m, 4);
                        /* sum q y over the lane's 4 elements: |.| <= 4 * 63 * 128 < 2^15 */
                        const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[gh],
                                                              _mm512_set1_epi32(yq));
                        I[t] = _mm512_dpwssd_epi32(I[t], p, sc[2 * G + m / 4]);
                    }
                }
            }
            for (int t = 0; t < TT; t++) {   /* the offset of sub-blocks 2m, 2m + 1 */
                const int16_t *bs = x->a[(t0 + t) * x->nb + b].bsums;
                const __m512i off = _mm512_add_epi32(
                    _mm512_mullo_epi32(sc32[2 * m], _mm512_set1_epi32(bs[2 * m])),
                    _mm512_mullo_epi32(sc32[2 * m + 1], _mm512_set1_epi32(bs[2 * m + 1])));
                I[t] = _mm512_sub_epi32(I[t], _mm512_slli_epi32(off, 5));
            }
            for (int t = 0; t < TT; t++) {
                acc[t][m] = _mm512_fmadd_ps(ds[t], _mm512_cvtepi32_ps(I[t]), acc[t][m]);
                It[t] = _mm512_add_epi32(It[t], I[t]);
            }
        }
        if (tiled)
            for (int t = 0; t < TT; t++) {
                const __m512 res = _mm512_mul_ps(_mm512_cvtepi32_ps(It[t]), dw);
                const __m512 dx = _mm512_set1_ps(x->a[(t0 + t) * x->nb + b].d);
                yt[t] = GGML_TILED_FOLD_FMA ? _mm512_fmadd_ps(res, dx, yt[t])
                                            : _mm512_add_ps(yt[t], _mm512_mul_ps(res, dx));
            }
    }
    for (int t = 0; t < TT && tiled; t++) _mm512_storeu_ps(y + (t0 + t) * n_out, yt[t]);
    for (int t = 0; t < TT && !tiled; t++) {
        const __m512 *v = acc[t];
        const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(v[0], v[4]), _mm512_add_ps(v[2], v[6])),
                                       _mm512_add_ps(_mm512_add_ps(v[1], v[5]), _mm512_add_ps(v[3], v[7])));
        _mm512_storeu_ps(y + (t0 + t) * n_out, s);
    }
}

T512 static void panel_q6_512(const uint8_t *panel, const acts_k_t *x, int T, float *y, int64_t n_out) {
    const int tiled = T >= GGML_TILED_MIN_TOKENS;
    int64_t t0 = 0;
    for (; T >= Q6_TT; T -= Q6_TT, t0 += Q6_TT) panel_q6_512_tt(panel, x, t0, Q6_TT, y, n_out, tiled);
    if (T) panel_q6_512_tt(panel, x, t0, 1, y, n_out, tiled);
}
_Static_assert(Q6_TT == 2, "panel_q6_512's remainder is one token");
#endif

#if defined(__x86_64__)
#define Q4_QS (PACKED_ROWS * MUSER_Q4_K_QS)
#define Q4_SC (PACKED_ROWS * MUSER_Q4_K_SCALES)
#define Q4_GROUP_BYTES (PACKED_ROWS * MUSER_Q4_K_BYTES)

/* The scales and mins of 16 rows' block (each row's 12-byte strip as 3 dwords: qdot.c's
 * k4_scales, lane-wise): sc_j in byte j % 4 of w[j / 4], m_j in byte j % 4 of w[2 + j / 4]. */
#define Q4K_SCALES(SI, AND, OR, SRL, SLL, LOAD, SET1, g, w)                                          \
    do {                                                                                           \
        const SI u0 = LOAD(g), u1 = LOAD(g + 64), u2 = LOAD(g + 128);                              \
        const SI k3f = SET1(0x3F3F3F3F), k0f = SET1(0x0F0F0F0F), k03 = SET1(0x03030303);           \
        w[0] = AND(u0, k3f);                                                                       \
        w[1] = OR(AND(u2, k0f), SLL(AND(SRL(u0, 6), k03), 4));                                     \
        w[2] = AND(u1, k3f);                                                                       \
        w[3] = OR(AND(SRL(u2, 4), k0f), SLL(AND(SRL(u1, 6), k03), 4));                             \
    } while (0)

#define Q4_TT 4   /* tokens per pass over a panel: each block's codes unpacked once for all */

/* Tokens t0 .. t0 + TT - 1 (all gemm or all gemv: q4k_gemm's boundary is a multiple of 4)
 * against a panel: per token and row one float accumulator and one for the mins. The
 * integer sums are exact, so how they are grouped is free; the floats are folded per
 * pair (gemm) or per block (gemv) as q4k_row_c folds them. */
T512 static inline __attribute__((always_inline)) void panel_q4k_512_tt(const uint8_t *panel,
                                                                       const acts_k_t *x, int64_t t0,
                                                                       const int TT, const int gemm,
                                                                       float *y, int64_t n_out) {
    const __m512i lo8 = _mm512_set1_epi32(0xFF), m4 = _mm512_set1_epi8(0xF);
    __m512 acc[Q4_TT], accm[Q4_TT];
    for (int t = 0; t < TT; t++) acc[t] = accm[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < x->nb; b++) {
        const uint8_t *g = panel + b * Q4_GROUP_BYTES;
        prefetch_block(g + PREFETCH_AHEAD * Q4_GROUP_BYTES, Q4_GROUP_BYTES);
        const actk_t *a[Q4_TT];
        for (int t = 0; t < TT; t++) a[t] = x->a + (t0 + t) * x->nb + b;
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g));
        const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g + PACKED_ROWS * MUSER_Q4_K_DMIN)));
        __m512 ds[Q4_TT], dm[Q4_TT];
        for (int t = 0; t < TT; t++) {
            ds[t] = _mm512_mul_ps(dw, _mm512_set1_ps(a[t]->d));
            dm[t] = _mm512_mul_ps(mw, _mm512_set1_ps(a[t]->d));
        }
        __m512i w[4];
        Q4K_SCALES(__m512i, _mm512_and_si512, _mm512_or_si512, _mm512_srli_epi32, _mm512_slli_epi32,
                   _mm512_loadu_si512, _mm512_set1_epi32, g + Q4_SC, w);
        __m512i Ib[Q4_TT], Mb[Q4_TT];        /* gemv: the block's totals */
        for (int t = 0; t < TT; t++) Ib[t] = Mb[t] = _mm512_setzero_si512();
        for (int p = 0; p < 4; p++) {        /* pair p: sub-blocks G = 2p (low nibbles), 2p + 1 (high) */
            const __m512i sc0 = _mm512_and_si512(_mm512_srli_epi32(w[p / 2], 16 * (p & 1)), lo8);
            const __m512i sc1 = _mm512_and_si512(_mm512_srli_epi32(w[p / 2], 16 * (p & 1) + 8), lo8);
            const __m512i mn0 = _mm512_and_si512(_mm512_srli_epi32(w[2 + p / 2], 16 * (p & 1)), lo8);
            const __m512i mn1 = _mm512_and_si512(_mm512_srli_epi32(w[2 + p / 2], 16 * (p & 1) + 8), lo8);
            __m512i I[Q4_TT];
            for (int t = 0; t < TT; t++) I[t] = _mm512_setzero_si512();
            for (int m = 0; m < LANES; m++) {
                const __m512i raw = _mm512_loadu_si512(g + Q4_QS + 64 * (8 * p + m));
                const __m512i u0 = _mm512_and_si512(raw, m4), u1 = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
                for (int t = 0; t < TT; t++) {
                    int32_t y0, y1;
                    memcpy(&y0, a[t]->qs + 64 * p + 4 * m, 4);
                    memcpy(&y1, a[t]->qs + 64 * p + 32 + 4 * m, 4);
                    /* sum q * y over 4 elements: |.| <= 4 * 15 * 128 < 2^15, times the 6-bit scale */
                    const __m512i q0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u0, _mm512_set1_epi32(y0));
                    const __m512i q1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u1, _mm512_set1_epi32(y1));
                    I[t] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(I[t], q0, sc0), q1, sc1);
                }
            }
            for (int t = 0; t < TT; t++) {
                const int16_t *bs = a[t]->bsums;
                const __m512i M = _mm512_add_epi32(_mm512_mullo_epi32(mn0, _mm512_set1_epi32(bs[4 * p] + bs[4 * p + 1])),
                                                   _mm512_mullo_epi32(mn1, _mm512_set1_epi32(bs[4 * p + 2] + bs[4 * p + 3])));
                if (gemm) {
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[t]), ds[t], acc[t]);
                    accm[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(M), dm[t], accm[t]);
                } else {
                    Ib[t] = _mm512_add_epi32(Ib[t], I[t]);
                    Mb[t] = _mm512_add_epi32(Mb[t], M);
                }
            }
        }
        if (!gemm)
            for (int t = 0; t < TT; t++) {
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(Ib[t]), ds[t], acc[t]);
                accm[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(Mb[t]), dm[t], accm[t]);
            }
    }
    for (int t = 0; t < TT; t++) _mm512_storeu_ps(y + (t0 + t) * n_out, _mm512_sub_ps(acc[t], accm[t]));
}

/* The call's tokens Q4_TT at a time (the gemm ones: T - T % 4 of them), then its gemv
 * tail one at a time. */
T512 static void panel_q4k_512(const uint8_t *panel, const acts_k_t *x, int T, float *y, int64_t n_out) {
    const int n_gemm = T - T % 4;
    int t0 = 0;
    for (; t0 + Q4_TT <= n_gemm; t0 += Q4_TT) panel_q4k_512_tt(panel, x, t0, Q4_TT, 1, y, n_out);
    for (; t0 < T; t0++) panel_q4k_512_tt(panel, x, t0, 1, 0, y, n_out);
}
_Static_assert(Q4_TT == 4, "panel_q4k_512 takes the gemm tokens 4 at a time");
#endif

#if defined(__x86_64__)
#define T256 __attribute__((target("avx2,fma,f16c")))
#define Q4_TT2 2   /* AVX2: tokens per pass (16 registers) */

/* AVX2 (llama.cpp's q4_K_8x8 layout is 8 rows; here a panel's 16 rows are two halves
 * of 8, each row's sums in its own 32-bit lane, no sum across lanes): half hh's bytes
 * are the second 32 of each 64-byte chunk. The 4-element sums by vpmaddubsw (u4 x s8,
 * pairs <= 2 * 15 * 128, no saturation), times the scale by vpmaddwd against the scale
 * in both 16-bit halves of the lane: exact, so the same integers as the AVX-512 kernel. */
T256 static inline __attribute__((always_inline)) void panel_q4k_256_tt(const uint8_t *panel,
                                                                       const acts_k_t *x, int64_t t0,
                                                                       const int TT, const int gemm,
                                                                       const int hh, float *y, int64_t n_out) {
    const __m256i lo8 = _mm256_set1_epi32(0xFF), m4 = _mm256_set1_epi8(0xF);
    __m256 acc[Q4_TT2], accm[Q4_TT2];
    for (int t = 0; t < TT; t++) acc[t] = accm[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < x->nb; b++) {
        const uint8_t *g = panel + b * Q4_GROUP_BYTES;
        if (!hh) prefetch_block(g + PREFETCH_AHEAD * Q4_GROUP_BYTES, Q4_GROUP_BYTES);
        const actk_t *a[Q4_TT2];
        for (int t = 0; t < TT; t++) a[t] = x->a + (t0 + t) * x->nb + b;
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 16 * hh)));
        const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + PACKED_ROWS * MUSER_Q4_K_DMIN + 16 * hh)));
        __m256 ds[Q4_TT2], dm[Q4_TT2];
        for (int t = 0; t < TT; t++) {
            ds[t] = _mm256_mul_ps(dw, _mm256_set1_ps(a[t]->d));
            dm[t] = _mm256_mul_ps(mw, _mm256_set1_ps(a[t]->d));
        }
#define LOAD256(q) _mm256_loadu_si256((const __m256i *)(q))
        __m256i w[4];
        Q4K_SCALES(__m256i, _mm256_and_si256, _mm256_or_si256, _mm256_srli_epi32, _mm256_slli_epi32,
                   LOAD256, _mm256_set1_epi32, g + Q4_SC + 32 * hh, w);
        __m256i Ib[Q4_TT2], Mb[Q4_TT2];
        for (int t = 0; t < TT; t++) Ib[t] = Mb[t] = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            const __m256i sc0 = _mm256_and_si256(_mm256_srli_epi32(w[p / 2], 16 * (p & 1)), lo8);
            const __m256i sc1 = _mm256_and_si256(_mm256_srli_epi32(w[p / 2], 16 * (p & 1) + 8), lo8);
            const __m256i sw0 = _mm256_or_si256(sc0, _mm256_slli_epi32(sc0, 16));
            const __m256i sw1 = _mm256_or_si256(sc1, _mm256_slli_epi32(sc1, 16));
            __m256i I[Q4_TT2];
            for (int t = 0; t < TT; t++) I[t] = _mm256_setzero_si256();
            for (int m = 0; m < LANES; m++) {
                const __m256i raw = LOAD256(g + Q4_QS + 64 * (8 * p + m) + 32 * hh);
                const __m256i u0 = _mm256_and_si256(raw, m4), u1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                for (int t = 0; t < TT; t++) {
                    int32_t y0, y1;
                    memcpy(&y0, a[t]->qs + 64 * p + 4 * m, 4);
                    memcpy(&y1, a[t]->qs + 64 * p + 32 + 4 * m, 4);
                    const __m256i q0 = _mm256_madd_epi16(_mm256_maddubs_epi16(u0, _mm256_set1_epi32(y0)), sw0);
                    const __m256i q1 = _mm256_madd_epi16(_mm256_maddubs_epi16(u1, _mm256_set1_epi32(y1)), sw1);
                    I[t] = _mm256_add_epi32(I[t], _mm256_add_epi32(q0, q1));
                }
            }
            const __m256i mn0 = _mm256_and_si256(_mm256_srli_epi32(w[2 + p / 2], 16 * (p & 1)), lo8);
            const __m256i mn1 = _mm256_and_si256(_mm256_srli_epi32(w[2 + p / 2], 16 * (p & 1) + 8), lo8);
            for (int t = 0; t < TT; t++) {
                const int16_t *bs = a[t]->bsums;
                const __m256i M = _mm256_add_epi32(_mm256_mullo_epi32(mn0, _mm256_set1_epi32(bs[4 * p] + bs[4 * p + 1])),
                                                   _mm256_mullo_epi32(mn1, _mm256_set1_epi32(bs[4 * p + 2] + bs[4 * p + 3])));
                if (gemm) {
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[t]), ds[t], acc[t]);
                    accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(M), dm[t], accm[t]);
                } else {
                    Ib[t] = _mm256_add_epi32(Ib[t], I[t]);
                    Mb[t] = _mm256_add_epi32(Mb[t], M);
                }
            }
        }
#undef LOAD256
        if (!gemm)
            for (int t = 0; t < TT; t++) {
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Ib[t]), ds[t], acc[t]);
                accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Mb[t]), dm[t], accm[t]);
            }
    }
    for (int t = 0; t < TT; t++) _mm256_storeu_ps(y + (t0 + t) * n_out + 8 * hh, _mm256_sub_ps(acc[t], accm[t]));
}

T256 static void panel_q4k_256(const uint8_t *panel, const acts_k_t *x, int T, float *y, int64_t n_out) {
    const int n_gemm = T - T % 4;
    for (int hh = 0; hh < 2; hh++) {
        int t0 = 0;
        for (; t0 + Q4_TT2 <= n_gemm; t0 += Q4_TT2) panel_q4k_256_tt(panel, x, t0, Q4_TT2, 1, hh, y, n_out);
        for (; t0 < T; t0++) panel_q4k_256_tt(panel, x, t0, 1, 0, hh, y, n_out);
    }
}
_Static_assert(4 % Q4_TT2 == 0, "a pass's tokens are all gemm or all gemv");
#endif

typedef struct {
    int type;
    const uint8_t *packed;
    acts_k_t x;
    int64_t T, n_out;
    float *y;
    int isa;                 /* PACKED_ISA_* */
} k_job;

static void k_task(const void *ctx, int64_t g0, int64_t g1) {
    const k_job *j = ctx;
    const int six = j->type == MUSER_ID_Q6_K;
    const int64_t panel_bytes = PACKED_ROWS * (six ? MUSER_Q6_K_BYTES : MUSER_Q4_K_BYTES) * j->x.nb;
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *panel = j->packed + g * panel_bytes;
        float *y = j->y + g * PACKED_ROWS;
#if defined(__x86_64__)
        if (j->isa == PACKED_ISA_AVX512) {
            (six ? panel_q6_512 : panel_q4k_512)(panel, &j->x, (int)j->T, y, j->n_out);
            continue;
        }
        if (j->isa == PACKED_ISA_AVX2 && !six) {
            panel_q4k_256(panel, &j->x, (int)j->T, y, j->n_out);
            continue;
        }
#endif
        panel_k_c(j->type, panel, &j->x, (int)j->T, y, j->n_out);
    }
}

/* muser_matmul_q8p for Q4_K and Q6_K (arguments checked by the caller): 0, or -2 when
 * memory runs out. */
int matmul_k_packed(int type, const uint8_t *packed, int64_t n_out, int64_t n_in, const float *x,
                    int64_t T, float *y, int nthreads, int isa) {
    const int64_t nb = n_in / QK_K;
    actk_t *a = malloc(sizeof(actk_t) * (size_t)(T * nb));
    if (!a) return -2;
    for (int64_t t = 0; t < T; t++) quantize_act_q8_k(x + t * n_in, n_in, a + t * nb);
    const int64_t groups = n_out / PACKED_ROWS;
    const k_job j = {type, packed, {a, nb}, T, n_out, y, isa};
    parallel_for(k_task, &j, groups, nthreads);
    const int six = type == MUSER_ID_Q6_K;
    const int64_t row_bytes = nb * (six ? MUSER_Q6_K_BYTES : MUSER_Q4_K_BYTES);
    for (int64_t r = groups * PACKED_ROWS; r < n_out; r++)
        for (int64_t t = 0; t < T; t++)
            y[t * n_out + r] = six ? q6_row_c(packed + r * row_bytes, &j.x, t, T >= GGML_TILED_MIN_TOKENS)
                                   : q4k_row_c(packed + r * row_bytes, &j.x, t, q4k_gemm(t, T));
    free(a);
    return 0;
}
