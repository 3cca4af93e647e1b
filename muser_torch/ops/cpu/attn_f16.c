/* ggml-cpu's flash attention in f16, for decode.c's ggml block: one query row
 * at a time, each key scored by an f16 dot product and folded into an online
 * softmax whose V sum is kept in f16 (ggml_compute_forward_flash_attn_ext_f16's
 * one-chunk path). K, V and q are f16 values held as floats; acc, the V sum,
 * is rounded to f16 after every operation on it, as ggml stores it.
 *
 * The order of every sum is fixed by the llama.cpp build we emulate, not by the
 * CPU we run on: `width` is the f16 vector width of that build's ggml_vec_dot_f16
 * (16 for AVX-512, 8 for AVX2, 0 for none: kernels.h's GGML_F16_WIDTH, the
 * width of the build this library is), and each kernel below computes that
 * order exactly:
 *   dot (n elements): 4 accumulators of `width` float lanes over the first
 *     n & ~(4 width - 1) elements, acc[j][l] = fma(a[i + width j + l], b[..], acc[j][l]);
 *     the lanes x[l] = (acc0 + acc2) + (acc1 + acc3); then for width 16
 *     t3[l] = x[l + 8] + x[l], t6[l] = t3[l + 4] + t3[l] and (t6[0] + t6[2]) +
 *     (t6[1] + t6[3]), for width 8 t0[l] = x[l] + x[l + 4] and (t0[0] + t0[1]) +
 *     (t0[2] + t0[3]), in float; the rest one by one in double, products in float.
 *     Width 0: every product in double, one by one.
 *   fold (per key): a new maximum scales acc by ms (f16(acc * ms)); then
 *     acc = f16(fma(v, vs, acc)) element by element; S = fma(S, ms, vs).
 * Element-wise operations and lane-wise sums are the same whatever the
 * register width, so the vector kernels give the plain C code's results bit
 * for bit (tests/ops/cpu/test_attn_f16.py checks every level the CPU has
 * against it, at both widths, with lengths that leave tails).
 *
 * f16 rounding: F16C's vcvtps2ph with round-to-nearest-even, which f16_round
 * (q8_act.c) also is, in software where the build lacks F16C (equal for every
 * float32 bit pattern: muser_f16_round_check, run by the same test).
 *
 * Run-time dispatch, as qdot_packed.c: kernels compiled with target attributes,
 * chosen by __builtin_cpu_supports at first use (one build serves any x86-64);
 * muser_attn_isa reports the level and lets the tests force a lower one.
 */
#include <math.h>

#include "kernels.h"

enum { ISA_C, ISA_AVX2, ISA_AVX512 };

/* ---- plain C: the reference ------------------------------------------------------------ */

static float dot_c(const float *a, const float *b, int64_t n, int width) {
    double sum = 0.0;
    int64_t np = 0;
    if (width) {
        float acc[4][16] = {{0}};
        np = n & ~(int64_t)(4 * width - 1);
        for (int64_t i = 0; i < np; i += 4 * width)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < width; l++)
                    acc[j][l] = fmaf(a[i + width * j + l], b[i + width * j + l], acc[j][l]);
        float x[16];
        for (int l = 0; l < width; l++) x[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
        if (width == 16) {
            float t3[8], t6[4];
            for (int l = 0; l < 8; l++) t3[l] = x[l + 8] + x[l];
            for (int l = 0; l < 4; l++) t6[l] = t3[l + 4] + t3[l];
            sum = (t6[0] + t6[2]) + (t6[1] + t6[3]);
        } else {
            float t0[4];
            for (int l = 0; l < 4; l++) t0[l] = x[l] + x[l + 4];
            sum = (t0[0] + t0[1]) + (t0[2] + t0[3]);
        }
    }
    for (int64_t i = np; i < n; i++) sum += (double)(a[i] * b[i]);
    return (float)sum;
}

static void scale_c(float *acc, float ms, int64_t D) {
    for (int64_t d = 0; d < D; d++) acc[d] = f16_round(acc[d] * ms);
}

static void mad_c(float *acc, const float *v, float vs, int64_t D) {
    for (int64_t d = 0; d < D; d++) acc[d] = f16_round(fmaf(v[d], vs, acc[d]));
}

static void round_c(const float *x, float s, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = f16_round(x[i] * s);
}

/* The tail of a dot past its 4-width chunks: one by one in double (every kernel). */
static inline double dot_tail(const float *a, const float *b, int64_t np, int64_t n, double sum) {
    for (int64_t i = np; i < n; i++) sum += (double)(a[i] * b[i]);
    return sum;
}

#if defined(__x86_64__)
#define T256 __attribute__((target("avx2,fma,f16c")))
#define T512 __attribute__((target("avx512f,avx2,fma,f16c")))
#define RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* ---- AVX2 + F16C ----------------------------------------------------------------------- */

T256 static inline __m256 f16r8(__m256 x) { return _mm256_cvtph_ps(_mm256_cvtps_ph(x, RNE)); }

/* Width 8: one register per accumulator. */
T256 static float dot8_avx2(const float *a, const float *b, int64_t n) {
    const int64_t np = n & ~(int64_t)31;
    if (!np) return (float)dot_tail(a, b, 0, n, 0.0);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < np; i += 32)
        for (int j = 0; j < 4; j++)
            acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * j), _mm256_loadu_ps(b + i + 8 * j), acc[j]);
    const __m256 x = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    float t[4];
    _mm_storeu_ps(t, t0);
    return (float)dot_tail(a, b, np, n, (t[0] + t[1]) + (t[2] + t[3]));
}

/* Width 16 on 8-lane registers: each accumulator is a low and a high half. */
T256 static float dot16_avx2(const float *a, const float *b, int64_t n) {
    const int64_t np = n & ~(int64_t)63;
    if (!np) return (float)dot_tail(a, b, 0, n, 0.0);
    __m256 lo[4], hi[4];
    for (int j = 0; j < 4; j++) lo[j] = hi[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++) {
            lo[j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16 * j), _mm256_loadu_ps(b + i + 16 * j), lo[j]);
            hi[j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16 * j + 8), _mm256_loadu_ps(b + i + 16 * j + 8), hi[j]);
        }
    const __m256 xl = _mm256_add_ps(_mm256_add_ps(lo[0], lo[2]), _mm256_add_ps(lo[1], lo[3]));
    const __m256 xh = _mm256_add_ps(_mm256_add_ps(hi[0], hi[2]), _mm256_add_ps(hi[1], hi[3]));
    const __m256 t3 = _mm256_add_ps(xh, xl);
    const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
    float t[4];
    _mm_storeu_ps(t, t6);
    return (float)dot_tail(a, b, np, n, (t[0] + t[2]) + (t[1] + t[3]));
}

T256 static void scale_avx2(float *acc, float ms, int64_t D) {
    const __m256 m = _mm256_set1_ps(ms);
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) _mm256_storeu_ps(acc + d, f16r8(_mm256_mul_ps(_mm256_loadu_ps(acc + d), m)));
    scale_c(acc + d, ms, D - d);
}

T256 static void mad_avx2(float *acc, const float *v, float vs, int64_t D) {
    const __m256 s = _mm256_set1_ps(vs);
    int64_t d = 0;
    for (; d + 8 <= D; d += 8)
        _mm256_storeu_ps(acc + d, f16r8(_mm256_fmadd_ps(_mm256_loadu_ps(v + d), s, _mm256_loadu_ps(acc + d))));
    mad_c(acc + d, v + d, vs, D - d);
}

T256 static void round_avx2(const float *x, float s, float *out, int64_t n) {
    const __m256 m = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, f16r8(_mm256_mul_ps(_mm256_loadu_ps(x + i), m)));
    round_c(x + i, s, out + i, n - i);
}

/* ---- AVX-512 ----------------------------------------------------------------------------- */

T512 static inline __m512 f16r16(__m512 x) { return _mm512_cvtph_ps(_mm512_cvtps_ph(x, RNE)); }

T512 static float dot16_512(const float *a, const float *b, int64_t n) {
    const int64_t np = n & ~(int64_t)63;
    if (!np) return (float)dot_tail(a, b, 0, n, 0.0);
    __m512 acc[4];
    for (int j = 0; j < 4; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++)
            acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16 * j), _mm512_loadu_ps(b + i + 16 * j), acc[j]);
    const __m512 x = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
    /* the high 8 lanes through the AVX-512F extract (extractf32x8 is AVX-512DQ) */
    const __m256 xh = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
    const __m256 t3 = _mm256_add_ps(xh, _mm512_castps512_ps256(x));
    const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
    float t[4];
    _mm_storeu_ps(t, t6);
    return (float)dot_tail(a, b, np, n, (t[0] + t[2]) + (t[1] + t[3]));
}

T512 static void scale_512(float *acc, float ms, int64_t D) {
    const __m512 m = _mm512_set1_ps(ms);
    int64_t d = 0;
    for (; d + 16 <= D; d += 16) _mm512_storeu_ps(acc + d, f16r16(_mm512_mul_ps(_mm512_loadu_ps(acc + d), m)));
    scale_avx2(acc + d, ms, D - d);
}

T512 static void mad_512(float *acc, const float *v, float vs, int64_t D) {
    const __m512 s = _mm512_set1_ps(vs);
    int64_t d = 0;
    for (; d + 16 <= D; d += 16)
        _mm512_storeu_ps(acc + d, f16r16(_mm512_fmadd_ps(_mm512_loadu_ps(v + d), s, _mm512_loadu_ps(acc + d))));
    mad_avx2(acc + d, v + d, vs, D - d);
}

T512 static void round_512(const float *x, float s, float *out, int64_t n) {
    const __m512 m = _mm512_set1_ps(s);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, f16r16(_mm512_mul_ps(_mm512_loadu_ps(x + i), m)));
    round_avx2(x + i, s, out + i, n - i);
}
#endif /* __x86_64__ */

/* ---- dispatch ---------------------------------------------------------------------------- */

static int cpu_isa(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                     __builtin_cpu_supports("f16c");
    if (avx2 && __builtin_cpu_supports("avx512f")) return ISA_AVX512;
    if (avx2) return ISA_AVX2;
#endif
    return ISA_C;
}

static int isa = -1;    /* the kernels in use: the CPU's best unless a test forced a lower one */

/* force < 0: the level in use (0 plain C, 1 AVX2 + F16C, 2 AVX-512); else use level
 * `force`, refused (-1) when the CPU lacks it. Not for use while a step runs. */
int muser_attn_isa(int force) {
    const int best = cpu_isa();
    if (isa < 0) isa = best;
    if (force < 0) return isa;
    if (force > best) return -1;
    return isa = force;
}

static inline int level(void) { return isa < 0 ? (isa = cpu_isa()) : isa; }

float dot_f16_ggml(const float *a, const float *b, int64_t n, int width) {
#if defined(__x86_64__)
    const int l = level();
    if (width == 16 && l == ISA_AVX512) return dot16_512(a, b, n);
    if (width == 16 && l >= ISA_AVX2) return dot16_avx2(a, b, n);
    if (width == 8 && l >= ISA_AVX2) return dot8_avx2(a, b, n);
#endif
    return dot_c(a, b, n, width);
}

void f16_round_scaled(const float *x, float s, float *out, int64_t n) {
#if defined(__x86_64__)
    const int l = level();
    if (l == ISA_AVX512) return round_512(x, s, out, n);
    if (l == ISA_AVX2) return round_avx2(x, s, out, n);
#endif
    round_c(x, s, out, n);
}

void fa_key(fa_t *st, float *acc, const float *qh, const float *k, const float *v, int64_t D,
            float scale, int width) {
    const float s = dot_f16_ggml(qh, k, D, width) * scale;   /* scale 1 when q was scaled */
    float ms = 1.0f, vs = 1.0f;
    const int l = level();
    if (s > st->M) {
        ms = expf(st->M - s);
        st->M = s;
#if defined(__x86_64__)
        if (l == ISA_AVX512) scale_512(acc, ms, D);
        else if (l == ISA_AVX2) scale_avx2(acc, ms, D);
        else
#endif
            scale_c(acc, ms, D);
    } else {
        vs = expf(s - st->M);
    }
#if defined(__x86_64__)
    if (l == ISA_AVX512) mad_512(acc, v, vs, D);
    else if (l == ISA_AVX2) mad_avx2(acc, v, vs, D);
    else
#endif
        mad_c(acc, v, vs, D);
    st->S = fmaf(st->S, ms, vs);
    (void)l;
}

void fa_end(const fa_t *st, float *acc, int64_t D) {
    const float inv = st->S == 0.0f ? 0.0f : 1.0f / st->S;
    for (int64_t d = 0; d < D; d++) acc[d] *= inv;
}

/* ---- for the tests ------------------------------------------------------------------------ */

/* One query row q [D] over n keys and values (K, V: [n, stride] floats, the first
 * D of each used), as decode.c's ggml block runs it at the current level: q times
 * q_scale rounded to f16, every key folded in turn, o [D] the result. K and V
 * should hold f16 values (as the block's cache does). */
void muser_fa_row(const float *q, const float *K, const float *V, int64_t n, int64_t D, int64_t stride,
                  float q_scale, float scale, int width, float *qh, float *o) {
    fa_t st = {-INFINITY, 0.0f};
    f16_round_scaled(q, q_scale, qh, D);
    for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
    for (int64_t i = 0; i < n; i++) fa_key(&st, o, qh, K + i * stride, V + i * stride, D, scale, width);
    fa_end(&st, o, D);
}

/* How many of the n float32 bit patterns `bits` f16_round_soft (q8_act.c) rounds
 * otherwise than F16C's vcvtps2ph (round to nearest even) and back; -1 on a CPU
 * without F16C. */
#if defined(__x86_64__)
T256 static int64_t f16c_mismatches(const uint32_t *bits, int64_t n) {
    int64_t bad = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint32_t hw[8];
        _mm256_storeu_si256((__m256i *)hw, _mm256_castps_si256(f16r8(_mm256_loadu_ps((const float *)(bits + i)))));
        for (int l = 0; l < 8; l++) {
            float x, r;
            memcpy(&x, bits + i + l, 4);
            r = f16_round_soft(x);
            bad += memcmp(&r, hw + l, 4) != 0;
        }
    }
    for (; i < n; i++) {      /* the last few through the scalar instruction */
        float x, r;
        memcpy(&x, bits + i, 4);
        const uint16_t h = _cvtss_sh(x, RNE);
        const float hw = _cvtsh_ss(h);
        r = f16_round_soft(x);
        bad += memcmp(&r, &hw, 4) != 0;
    }
    return bad;
}
#endif

int64_t muser_f16_round_check(const uint32_t *bits, int64_t n) {
#if defined(__x86_64__)
    if (cpu_isa() < ISA_AVX2) return -1;
    return f16c_mismatches(bits, n);
#else
    (void)bits, (void)n;
    return -1;
#endif
}
