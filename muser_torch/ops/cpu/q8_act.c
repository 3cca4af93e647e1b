/* ggml numerics, part 1: the activation quantizers.
 *
 * In its `ggml` numerics mode muser_matmul_q8 (qdot.c) quantizes every
 * activation row per block exactly as ggml-cpu quantizes it for the weight
 * type's vec_dot_type, so that the integer dot products that follow see the
 * same codes ggml's do:
 *   Q8_0 (for Q4_0, Q5_0, Q8_0) and Q8_1 (Q4_1, Q5_1): 32 elements; ggml-cpu's
 *     x86 quantize_row_q8_0/_q8_1 (the AVX/AVX2 path, which libggml-python and
 *     llama.cpp run on every x86 CPU with AVX): amax = max |x|, d = amax / 127
 *     stored as f16, id = 127 / amax (not 1 / d), q = round-half-even(x * id);
 *     Q8_1 also stores s = f16(d * sum(q)) with the unrounded d.
 *   Q8_K (the K-quants): 256 elements; ggml's quantize_row_q8_K_ref: the
 *     first element of largest magnitude is `max` (signed), iscale = -127 / max,
 *     q = min(127, nearest_int(iscale * x)), d = 1 / iscale as a float, plus the
 *     sums of each 16 codes (bsums).
 * Every build (AVX-512, AVX2, plain C) computes these the same way with the
 * scalar code below: its cost is one pass over the activations, small
 * beside the weights. The f16 stores are kept as the float they round to.
 */
#include "kernels.h"

/* Round-half-even of |v| < 2^22 in the default rounding mode, as ggml's
 * nearest_int and _mm256_round_ps(v, _MM_ROUND_NEAREST) both do (built with
 * -ffp-contract=off and without -ffast-math, so the compiler keeps it). */
static inline int nearest_int(float v) {
    const float big = 12582912.0f;      /* 1.5 * 2^23 */
    return (int)((v + big) - big);
}

/* f as an IEEE half, rounded to nearest even (its bits; f16_round_soft: returned as
 * a float): what F16C's
 * vcvtps2ph (imm 0) and vcvtph2ps give, in software, for every float32 bit
 * pattern (attn_f16.c's muser_f16_round_check compares the two), NaNs included:
 * F16C keeps a NaN's sign and the top 10 bits of its payload and sets the quiet bit. */
uint16_t f16_encode_soft(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = x & 0x80000000u, ax = x ^ sign;
    uint32_t h;
    if (ax > 0x7F800000u) {
        h = 0x7E00 | ((ax >> 13) & 0x3FF);                  /* NaN */
    } else if (ax >= 0x477FF000u) {
        h = 0x7C00;                                         /* inf, and what rounds past 65504 */
    } else if (ax < 0x38800000u) {                          /* below 2^-14: subnormal */
        float v;
        memcpy(&v, &ax, 4);
        h = (uint32_t)nearest_int(v * 16777216.0f);         /* in units of 2^-24, exact */
    } else {
        h = (ax + 0xFFFu + ((ax >> 13) & 1u) - 0x38000000u) >> 13;
    }
    return (uint16_t)(h | sign >> 16);
}

float f16_round_soft(float f) {
    const uint16_t h = f16_encode_soft(f);
    const uint8_t b[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
    return f16(b);
}

/* The same through F16C's scalar conversion where the build has it. */
float f16_round(float f) {
#if defined(__F16C__)
    return _cvtsh_ss(_cvtss_sh(f, 0));
#else
    return f16_round_soft(f);
#endif
}

/* Q8_0 / Q8_1: n / 32 blocks of x into a. */
void quantize_act_q8_0(const float *x, int64_t n, act32_t *a, int with_sum) {
    for (int64_t b = 0; b < n / QK_LEGACY; b++, x += QK_LEGACY) {
        float amax = 0.0f;
        for (int j = 0; j < QK_LEGACY; j++) {
            const float ax = x[j] < 0 ? -x[j] : x[j];
            amax = ax > amax ? ax : amax;
        }
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK_LEGACY; j++) {
            int q = nearest_int(x[j] * id);
            q = q > 127 ? 127 : q < -128 ? -128 : q;        /* vpacksswb saturates */
            a[b].qs[j] = (int8_t)q;
            sum += q;
        }
        a[b].d = f16_round(d);
        a[b].s = with_sum ? f16_round(d * (float)sum) : 0.0f;
    }
}

/* Q8_K: n / 256 blocks of x into a. */
void quantize_act_q8_k(const float *x, int64_t n, actk_t *a) {
    for (int64_t b = 0; b < n / QK_K; b++, x += QK_K) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK_K; j++) {
            const float ax = x[j] < 0 ? -x[j] : x[j];
            if (ax > amax) amax = ax, max = x[j];
        }
        if (amax == 0.0f) {
            memset(&a[b], 0, sizeof a[b]);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) {
            const int q = nearest_int(iscale * x[j]);
            a[b].qs[j] = (int8_t)(q < 127 ? q : 127);
        }
        for (int g = 0; g < QK_K / 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += a[b].qs[16 * g + j];
            a[b].bsums[g] = (int16_t)s;
        }
        a[b].d = 1.0f / iscale;
    }
}
