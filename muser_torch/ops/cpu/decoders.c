/* Block decoders: packed GGML blocks to float32, bit-identical to the
 * reference (muser_torch.formats), the type table, and muser_dequant_rows.
 * Offsets and sizes are the MUSER_* macros of the generated muser_layout.h. */
#include "kernels.h"
#include "simd.h"

#define DECODER(name) \
    static void name(const uint8_t *b, const uint8_t *cmp, const float *lut, float s2, int64_t nb, \
                     float *restrict w)
#define UNUSED_ARGS (void)cmp; (void)lut; (void)s2

/* ---- K-quants (256 elements) ------------------------------------------------ */

/* Q4_K and Q5_K share everything but Q5_K's fifth bits (qh, before the
 * nibbles); `five` is a constant in each caller, so each gets its own loop. */
static inline __attribute__((always_inline)) void q45_k_blocks(const uint8_t *b, int64_t nb,
                                                               float *restrict w, const int five) {
    const int bytes = Q45_K(five, BYTES);
    for (; nb > 0; nb--, b += bytes, w += QK_K) {
        const float d = f16(b + MUSER_Q4_K_D), dmin = f16(b + MUSER_Q4_K_DMIN);
        const uint8_t *qh = b + MUSER_Q5_K_QH, *qs = b + Q45_K(five, QS);
        for (int g = 0; g < 4; g++) {
            float sc0, m0, sc1, m1;
            scale_min_k4(b + MUSER_Q4_K_SCALES, 2 * g, &sc0, &m0);
            scale_min_k4(b + MUSER_Q4_K_SCALES, 2 * g + 1, &sc1, &m1);
            const float a0 = d * sc0, c0 = dmin * m0, a1 = d * sc1, c1 = dmin * m1;
            for (int l = 0; l < 32; l++) {
                int lo = qs[32 * g + l] & 0xF, hi = qs[32 * g + l] >> 4;
                if (five) {
                    lo |= ((qh[l] >> (2 * g)) & 1) << 4;
                    hi |= ((qh[l] >> (2 * g + 1)) & 1) << 4;
                }
                w[64 * g + l] = a0 * (float)lo - c0;
                w[64 * g + 32 + l] = a1 * (float)hi - c1;
            }
        }
    }
}

DECODER(dec_q4_k) { UNUSED_ARGS; q45_k_blocks(b, nb, w, 0); }
DECODER(dec_q5_k) { UNUSED_ARGS; q45_k_blocks(b, nb, w, 1); }

/* One block; the l loop runs in two halves of 16 so each has one scale per
 * output run and vectorizes. */
static inline void q6_k_block(const uint8_t *b, float *restrict w) {
    const float d = f16(b + MUSER_Q6_K_D);
    const int8_t *sc = (const int8_t *)(b + MUSER_Q6_K_SCALES);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b + MUSER_Q6_K_QL + 64 * h, *qh = b + MUSER_Q6_K_QH + 32 * h;
        float *o = w + 128 * h;
        for (int half = 0; half < 2; half++) {
            const int j = 8 * h + half;
            const float s0 = d * (float)sc[j], s1 = d * (float)sc[j + 2];
            const float s2 = d * (float)sc[j + 4], s3 = d * (float)sc[j + 6];
            for (int l = 16 * half; l < 16 * half + 16; l++) {
                int q0 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q1 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                o[l] = s0 * (float)q0;
                o[l + 32] = s1 * (float)q1;
                o[l + 64] = s2 * (float)q2;
                o[l + 96] = s3 * (float)q3;
            }
        }
    }
}

DECODER(dec_q6_k) {
    UNUSED_ARGS;
    for (; nb > 0; nb--, b += MUSER_Q6_K_BYTES, w += QK_K) q6_k_block(b, w);
}

/* Q2_K and Q3_K: 16 sub-blocks of 16; element 128h + 32j + l (l < 32) is bits
 * 2j.. of qs[32h + l] (muser_torch/formats/kquant.py). Q2_K: y = (d*sc)*q - dmin*m. */
DECODER(dec_q2_k) {
    UNUSED_ARGS;
    for (; nb > 0; nb--, b += MUSER_Q2_K_BYTES, w += QK_K) {
        const float d = f16(b + MUSER_Q2_K_D), dmin = f16(b + MUSER_Q2_K_DMIN);
        const uint8_t *sc = b + MUSER_Q2_K_SCALES, *qs = b + MUSER_Q2_K_QS;
        for (int s = 0; s < QK_K / 16; s++) {      /* sub-block s: half s / 8, j = (s / 2) % 4 */
            const float dl = d * (float)(sc[s] & 0xF), ml = dmin * (float)(sc[s] >> 4);
            const uint8_t *q = qs + 32 * (s / 8) + 16 * (s & 1);
            const int shift = 2 * ((s / 2) % 4);
            for (int l = 0; l < 16; l++) w[16 * s + l] = dl * (float)((q[l] >> shift) & 3) - ml;
        }
    }
}

/* Q3_K: y = (d * s_j) * (q - 4), q - 4 raised by 4 where the hmask bit is set. */
DECODER(dec_q3_k) {
    UNUSED_ARGS;
    for (; nb > 0; nb--, b += MUSER_Q3_K_BYTES, w += QK_K) {
        const float d = f16(b + MUSER_Q3_K_D);
        const uint8_t *qs = b + MUSER_Q3_K_QS, *hm = b + MUSER_Q3_K_HMASK;
        uint8_t s6[16];
        q3_k_scales6(b + MUSER_Q3_K_SCALES, s6);
        for (int s = 0; s < QK_K / 16; s++) {
            const float dl = d * (float)(s6[s] - 32);
            const int l0 = 16 * (s & 1), j = (s / 2) % 4, h = s / 8;
            for (int l = 0; l < 16; l++) {
                const int q = ((qs[32 * h + l0 + l] >> (2 * j)) & 3) -
                              ((hm[l0 + l] >> (4 * h + j)) & 1 ? 0 : 4);
                w[16 * s + l] = dl * (float)q;
            }
        }
    }
}

/* ---- 32-element legacy blocks: element j in the low nibble of qs[j], j + 16 in the high ---- */

#define HALF (QK_LEGACY / 2)

DECODER(dec_q4_0) {
    UNUSED_ARGS;
    for (; nb > 0; nb--, b += MUSER_Q4_0_BYTES, w += QK_LEGACY) {
        const float d = f16(b + MUSER_Q4_0_D);
        const uint8_t *qs = b + MUSER_Q4_0_QS;
        for (int j = 0; j < HALF; j++) {
            w[j] = d * (float)((qs[j] & 0xF) - 8);
            w[j + HALF] = d * (float)((qs[j] >> 4) - 8);
        }
    }
}

DECODER(dec_q4_1) {
    UNUSED_ARGS;
    for (; nb > 0; nb--, b += MUSER_Q4_1_BYTES, w += QK_LEGACY) {
        const float d = f16(b + MUSER_Q4_1_D), m = f16(b + MUSER_Q4_1_M);
        const uint8_t *qs = b + MUSER_Q4_1_QS;
        for (int j = 0; j < HALF; j++) {
            w[j] = d * (float)(qs[j] & 0xF) + m;
            w[j + HALF] = d * (float)(qs[j] >> 4) + m;
        }
    }
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

DECODER(dec_q5_0) {
    UNUSED_ARGS;
    for (; nb > 0; nb--, b += MUSER_Q5_0_BYTES, w += QK_LEGACY) {
        const float d = f16(b + MUSER_Q5_0_D);
        const uint32_t qh = le32(b + MUSER_Q5_0_QH);
        const uint8_t *qs = b + MUSER_Q5_0_QS;
        for (int j = 0; j < HALF; j++) {
            int lo = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
            int hi = (qs[j] >> 4) | (((qh >> (j + HALF)) & 1) << 4);
            w[j] = d * (float)(lo - 16);
            w[j + HALF] = d * (float)(hi - 16);
        }
    }
}

DECODER(dec_q5_1) {
    UNUSED_ARGS;
    for (; nb > 0; nb--, b += MUSER_Q5_1_BYTES, w += QK_LEGACY) {
        const float d = f16(b + MUSER_Q5_1_D), m = f16(b + MUSER_Q5_1_M);
        const uint32_t qh = le32(b + MUSER_Q5_1_QH);
        const uint8_t *qs = b + MUSER_Q5_1_QS;
        for (int j = 0; j < HALF; j++) {
            int lo = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
            int hi = (qs[j] >> 4) | (((qh >> (j + HALF)) & 1) << 4);
            w[j] = d * (float)lo + m;
            w[j + HALF] = d * (float)hi + m;
        }
    }
}

DECODER(dec_q8_0) {
    UNUSED_ARGS;
    for (; nb > 0; nb--, b += MUSER_Q8_0_BYTES, w += QK_LEGACY) {
        const float d = f16(b + MUSER_Q8_0_D);
        const int8_t *q = (const int8_t *)(b + MUSER_Q8_0_QS);
        for (int j = 0; j < QK_LEGACY; j++) w[j] = d * (float)q[j];
    }
}

/* ---- NVFP4 ------------------------------------------------------------------- */

/* Muser-native: 16 elements in 8 bytes, element 2i in the low nibble of byte i;
 * w = (e2m1 * scale) * scale_2, in that order. The vector paths look the codes
 * up with a permute, as gcc would gather from E2M1 one by one. */
DECODER(dec_nvfp4_e2m1) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 table = _mm512_loadu_ps(E2M1), vs2 = _mm512_set1_ps(s2);
    for (; i < nb; i++) {
        const __m512 e = e2m1_values16(table, e2m1_codes16(b, i));
        _mm512_storeu_ps(w + 16 * i, _mm512_mul_ps(_mm512_mul_ps(e, _mm512_set1_ps(lut[cmp[i]])), vs2));
    }
#elif defined(__AVX2__)
    const __m256 mags = _mm256_loadu_ps(E2M1), vs2 = _mm256_set1_ps(s2);
    for (; i < nb; i++) {
        const __m128i codes = e2m1_codes16(b, i);
        const __m256 vs = _mm256_set1_ps(lut[cmp[i]]);
        for (int half = 0; half < 2; half++) {
            const __m256 e = e2m1_values8(mags, half ? _mm_srli_si128(codes, 8) : codes);
            _mm256_storeu_ps(w + 16 * i + 8 * half, _mm256_mul_ps(_mm256_mul_ps(e, vs), vs2));
        }
    }
#endif
    for (; i < nb; i++) {
        const float s = lut[cmp[i]];
        const uint8_t *qs = b + MUSER_NVFP4_E2M1_BYTES * i + MUSER_NVFP4_E2M1_QS;
        for (int j = 0; j < NVFP4_GROUP / 2; j++) {
            w[16 * i + 2 * j] = (E2M1[qs[j] & 0xF] * s) * s2;
            w[16 * i + 2 * j + 1] = (E2M1[qs[j] >> 4] * s) * s2;
        }
    }
}

/* llama.cpp type 40: 4 UE4M3 scales then 32 nibble bytes per 64 elements;
 * sub-block s holds elements 16s + i (low nibbles) and 16s + 8 + i (high). */
DECODER(dec_nvfp4) {
    (void)cmp; (void)s2;
    for (; nb > 0; nb--, b += MUSER_NVFP4_BYTES, w += QK_NVFP4) {
        const uint8_t *qs = b + MUSER_NVFP4_QS;
        for (int s = 0; s < QK_NVFP4 / NVFP4_GROUP; s++) {
            const float d = lut[b[MUSER_NVFP4_D + s]];
            for (int i = 0; i < NVFP4_GROUP / 2; i++) {
                w[16 * s + i] = d * (float)FP4_DOUBLED[qs[8 * s + i] & 0xF];
                w[16 * s + 8 + i] = d * (float)FP4_DOUBLED[qs[8 * s + i] >> 4];
            }
        }
    }
}

/* ---- the lookup-table types: 4-bit codes into a table of 16 values -------------- */

/* IQ4_NL: w = d * IQ4_VALUES[q]; element j in the low nibble of qs[j], j + 16 in the high. */
DECODER(dec_iq4_nl) {
    UNUSED_ARGS;
    for (; nb > 0; nb--, b += MUSER_IQ4_NL_BYTES, w += MUSER_IQ4_NL_ELEMS) {
        const float d = f16(b + MUSER_IQ4_NL_D);
        const uint8_t *qs = b + MUSER_IQ4_NL_QS;
        for (int j = 0; j < HALF; j++) {
            w[j] = d * (float)IQ4_VALUES[qs[j] & 0xF];
            w[j + HALF] = d * (float)IQ4_VALUES[qs[j] >> 4];
        }
    }
}

/* IQ4_XS: sub-block j (32 elements, laid out as an IQ4_NL block's codes) has
 * the 6-bit scale ls_j: 4 low bits in nibble j%2 of scales_l[j/2], 2 high
 * bits at bits 2j of the little-endian u16 scales_h; w = (d * (ls_j - 32)) * v. */
DECODER(dec_iq4_xs) {
    UNUSED_ARGS;
    for (; nb > 0; nb--, b += MUSER_IQ4_XS_BYTES, w += QK_K) {
        const float d = f16(b + MUSER_IQ4_XS_D);
        const unsigned h = b[MUSER_IQ4_XS_SCALES_H] | (b[MUSER_IQ4_XS_SCALES_H + 1] << 8);
        for (int j = 0; j < QK_K / 32; j++) {
            const int ls = ((b[MUSER_IQ4_XS_SCALES_L + j / 2] >> (4 * (j % 2))) & 0xF) |
                           (((h >> (2 * j)) & 3) << 4);
            const float dl = d * (float)(ls - 32);
            const uint8_t *qs = b + MUSER_IQ4_XS_QS + 16 * j;
            for (int i = 0; i < 16; i++) {
                w[32 * j + i] = dl * (float)IQ4_VALUES[qs[i] & 0xF];
                w[32 * j + 16 + i] = dl * (float)IQ4_VALUES[qs[i] >> 4];
            }
        }
    }
}

/* MXFP4: w = e8m0_half(e) * FP4_DOUBLED[q], nibbles as IQ4_NL's. */
DECODER(dec_mxfp4) {
    UNUSED_ARGS;
    for (; nb > 0; nb--, b += MUSER_MXFP4_BYTES, w += MUSER_MXFP4_ELEMS) {
        const float d = e8m0_half(b[MUSER_MXFP4_E]);
        const uint8_t *qs = b + MUSER_MXFP4_QS;
        for (int j = 0; j < HALF; j++) {
            w[j] = d * (float)FP4_DOUBLED[qs[j] & 0xF];
            w[j + HALF] = d * (float)FP4_DOUBLED[qs[j] >> 4];
        }
    }
}
_Static_assert(MUSER_IQ4_NL_ELEMS == 2 * HALF && MUSER_MXFP4_ELEMS == 2 * HALF,
               "IQ4_NL and MXFP4 nibbles split at the legacy blocks' half");

/* ---- the 3-bit grid types: a qs byte picks 4 magnitudes (formats/iq3.py) ---------- */

/* w = db * grid byte, negated where the element's sign bit is set (db rounds
 * first, as in ggml and gguf-py); `xxs` is a constant in each caller. */
static inline __attribute__((always_inline)) void iq3_blocks(const uint8_t *b, int64_t nb,
                                                             float *restrict w, const int xxs) {
    const int bytes = xxs ? MUSER_IQ3_XXS_BYTES : MUSER_IQ3_S_BYTES;
    for (; nb > 0; nb--, b += bytes, w += QK_K) {
        const float d = f16(b);
        for (int s = 0; s < QK_K / 32; s++) {
            uint32_t signs;
            const float db = iq3_db(d, iq3_signs(b, s, xxs, &signs), xxs);
#if defined(HAVE_FUSED)
            v8f v[4];
            iq3_w32(iq3_grid8(b, s, xxs), signs, db, v);
            memcpy(w + 32 * s, v, sizeof v);
#else
            uint32_t g[8];
            iq3_grid(b, s, xxs, g);
            for (int i = 0; i < 32; i++) {
                const float m = db * (float)((g[i / 4] >> (8 * (i % 4))) & 0xFF);
                w[32 * s + i] = (signs >> i) & 1 ? -m : m;
            }
#endif
        }
    }
}

DECODER(dec_iq3_xxs) { UNUSED_ARGS; iq3_blocks(b, nb, w, 1); }
DECODER(dec_iq3_s) { UNUSED_ARGS; iq3_blocks(b, nb, w, 0); }

/* ---- plain floats -------------------------------------------------------------- */

/* Exact: every half is a float (subnormals included; F16C ignores DAZ). */
DECODER(dec_f16) {
    UNUSED_ARGS;
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= nb; i += 8)
        _mm256_storeu_ps(w + i, _mm256_cvtph_ps(
            _mm_loadu_si128((const __m128i *)(b + MUSER_F16_BYTES * i))));
#elif defined(__aarch64__)
    const _Float16 *h = (const _Float16 *)b;
    for (; i < nb; i++) w[i] = (float)h[i];
#endif
    for (; i < nb; i++) w[i] = f16(b + MUSER_F16_BYTES * i);
}

/* A bfloat16 is the top half of a float32. */
DECODER(dec_bf16) {
    UNUSED_ARGS;
    const uint16_t *h = (const uint16_t *)b;
    uint32_t *o = (uint32_t *)w;
    for (int64_t i = 0; i < nb; i++) o[i] = (uint32_t)h[i] << 16;
}

/* ---- the type table: every type this library runs, with its geometry ------------ */

#define TYPE_ROW(T, dec, matvec, tile, act, qdot) \
    {MUSER_ID_##T, MUSER_##T##_ELEMS, MUSER_##T##_BYTES, dec, matvec, tile, act, qdot}

/* matvec/tile: the fused kernels' per-type specializations (generic: the L1
 * scratch through `dec`). act/qdot: ggml's vec_dot_type and vec_dot for the
 * type (ggml-cpu.c's type_traits_cpu); F16 and BF16 round the activations in
 * Python and take the float kernels, whose products of two halves are exact. */
static const type_entry_t TYPE_TABLE[] = {
    TYPE_ROW(Q4_0, dec_q4_0, matvec_q4_0, tile_generic, ACT_Q8_0, qdot_q4_0),
    TYPE_ROW(Q4_1, dec_q4_1, matvec_q4_1, tile_generic, ACT_Q8_1, qdot_q4_1),
    TYPE_ROW(Q5_0, dec_q5_0, matvec_q5_0, tile_generic, ACT_Q8_0, qdot_q5_0),
    TYPE_ROW(Q5_1, dec_q5_1, matvec_q5_1, tile_generic, ACT_Q8_1, qdot_q5_1),
    TYPE_ROW(Q8_0, dec_q8_0, matvec_q8_0, tile_generic, ACT_Q8_0, qdot_q8_0),
    TYPE_ROW(Q4_K, dec_q4_k, matvec_q4_k, tile_q4_k, ACT_Q8_K, qdot_q4_k),
    TYPE_ROW(Q5_K, dec_q5_k, matvec_q5_k, tile_q5_k, ACT_Q8_K, qdot_q5_k),
    TYPE_ROW(Q6_K, dec_q6_k, matvec_q6_k, tile_q6_k, ACT_Q8_K, qdot_q6_k),
    TYPE_ROW(Q2_K, dec_q2_k, matvec_q2_k, tile_generic, ACT_Q8_K, qdot_q2_k),
    TYPE_ROW(Q3_K, dec_q3_k, matvec_q3_k, tile_generic, ACT_Q8_K, qdot_q3_k),
    TYPE_ROW(NVFP4, dec_nvfp4, matvec_generic, tile_generic, ACT_NONE, 0),
    TYPE_ROW(NVFP4_E2M1, dec_nvfp4_e2m1, matvec_nvfp4_e2m1, tile_nvfp4_e2m1, ACT_NONE, 0),
    TYPE_ROW(F16, dec_f16, matvec_f16, tile_generic, ACT_NONE, 0),
    TYPE_ROW(BF16, dec_bf16, matvec_bf16, tile_generic, ACT_NONE, 0),
    TYPE_ROW(IQ4_NL, dec_iq4_nl, matvec_iq4_nl, tile_generic, ACT_Q8_0, qdot_iq4_nl),
    TYPE_ROW(IQ4_XS, dec_iq4_xs, matvec_iq4_xs, tile_generic, ACT_Q8_K, qdot_iq4_xs),
    TYPE_ROW(MXFP4, dec_mxfp4, matvec_mxfp4, tile_generic, ACT_Q8_0, qdot_mxfp4),
    TYPE_ROW(IQ3_XXS, dec_iq3_xxs, matvec_iq3_xxs, tile_generic, ACT_Q8_K, qdot_iq3_xxs),
    TYPE_ROW(IQ3_S, dec_iq3_s, matvec_iq3_s, tile_generic, ACT_Q8_K, qdot_iq3_s),
};

const type_entry_t *type_entry_for(int type) {
    for (unsigned i = 0; i < sizeof(TYPE_TABLE) / sizeof(TYPE_TABLE[0]); i++)
        if (TYPE_TABLE[i].type == type) return &TYPE_TABLE[i];
    return 0;
}

/* 0 when this library runs `type` with exactly this geometry, else -1. */
int muser_geometry(int type, int elems, int bytes) {
    const type_entry_t *k = type_entry_for(type);
    return (k && k->elems == elems && k->bytes == bytes) ? 0 : -1;
}

int muser_max_tokens(void) { return MAX_TOKENS; }

/* ---- dequantize: out[r, :] = the float32 values of rows [0, n_rows) ---------------- */

typedef struct {
    const type_entry_t *k;
    const uint8_t *packed, *scales;
    const float *lut;
    float s2;
    int64_t n_in, row_bytes;
    float *out;
} dequant_job;

static void dequant_task(const void *ctx, int64_t r0, int64_t r1) {
    const dequant_job *j = ctx;
    const int64_t spr = j->n_in / NVFP4_GROUP;
    for (int64_t r = r0; r < r1; r++)
        decode_span(j->k, j->packed + r * j->row_bytes, j->scales ? j->scales + r * spr : 0,
                    j->lut, j->s2, 0, j->n_in, j->out + r * j->n_in);
}

int muser_dequant_rows(int type, const uint8_t *packed, const uint8_t *scales, const float *lut,
                       float s2, int64_t n_rows, int64_t n_in, float *out, int nthreads) {
    const type_entry_t *k = type_entry_for(type);
    if (!k || n_in % k->elems) return -1;
    const dequant_job j = {k, packed, scales, lut, s2, n_in, n_in / k->elems * k->bytes, out};
    parallel_for(dequant_task, &j, n_rows, nthreads);
    return 0;
}
