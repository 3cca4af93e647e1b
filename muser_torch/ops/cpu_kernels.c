/* CPU kernels for muser-torch: decode packed GGML blocks and multiply.
 *
 * Plain C (no torch headers) so it compiles in about two seconds on first use;
 * muser_torch/ops/cpu.py builds it with -O3 -pthread -ffp-contract=off and
 * calls it through ctypes with tensor data pointers.
 *
 * Contract with cpu.py:
 *  - type ids are GGMLType values (muser_torch/formats/types.py); block
 *    geometry (elements, bytes) is passed in from that table and checked
 *    against the decoder's own expectation by muser_geometry().
 *  - every decoder writes its blocks' floats in element order, multiplying in
 *    the same order as muser_torch.formats (gguf's order), so with
 *    -ffp-contract=off the decoded values are bit-identical to the reference
 *    dequantizer (tests/ops/test_qmatmul.py, tests/formats/test_dequantize.py
 *    and tests/formats/test_properties.py check this).
 *  - `lut` is a 256-entry float table for the scale bytes of the NVFP4 types
 *    (E4M3FN values for NVFP4_E2M1, halved UE4M3 for NVFP4), built by Python
 *    from the same tables the reference uses; NULL for other types.
 *  - `cmp` is the row's companion scale bytes (NVFP4_E2M1 only; one byte per
 *    16-element block) and `s2` its global scale.
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* GGMLType ids and block geometry, as in muser_torch/formats/types.py: every
 * KINDS entry below is checked against that table by muser_geometry() when
 * cpu.py loads the library, and the fused row kernels use the same names. */
enum { T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q4_K = 12,
       T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30, T_NVFP4 = 40, T_NVFP4_E2M1 = 1000 };
#define QK_K 256        /* elements of a K-quant super-block */
#define QK_LEGACY 32    /* elements of a Q4_0 .. Q8_0 block */
#define QK_NVFP4 64     /* elements of a llama.cpp NVFP4 block */
#define NVFP4_GROUP 16  /* elements per E4M3 scale (NVFP4_E2M1: one block) */
#define Q4_K_BYTES 144
#define Q5_K_BYTES 176
#define Q6_K_BYTES 210

#define CHUNK 256       /* elements decoded at a time into an L1 scratch */
#define MAX_TOKENS 64   /* activation rows per call (cpu.py: NATIVE_MAX_TOKENS) */
#define TOKEN_GROUP 8   /* rows dotted per decode of a weight row (a compile-time count) */

typedef float v8f __attribute__((vector_size(32)));

/* A decoder writes the floats of `nb` consecutive blocks starting at `b`
 * (and their companion bytes at `cmp`, NVFP4_E2M1 only): looping over blocks
 * inside the decoder, not around it, lets the compiler vectorize the small
 * legacy blocks and hoists the per-call work out of the block loop. */
typedef void (*decode_fn)(const uint8_t *b, const uint8_t *cmp, const float *lut, float s2,
                          int64_t nb, float *restrict w);

#define DECODER(name) \
    static void name(const uint8_t *b, const uint8_t *cmp, const float *lut, float s2, int64_t nb, \
                     float *restrict w)
#define UNUSED_ARGS (void)cmp; (void)lut; (void)s2

static float f16(const uint8_t *p) {
    /* IEEE half (little endian) to float, exactly. */
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {                       /* subnormal: normalize */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3FF) << 13);
        }
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* ---- K-quants (256 elements) ------------------------------------------------ */

static void scale_min_k4(const uint8_t *s, int j, float *sc, float *m) {
    /* The 12-byte 6-bit (sc, m) strip; see muser_torch/formats/kquant.py. */
    if (j < 4) {
        *sc = (float)(s[j] & 63);
        *m = (float)(s[j + 4] & 63);
    } else {
        *sc = (float)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *m = (float)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Q4_K and Q5_K share everything but Q5_K's fifth bits (qh, 32 bytes before
 * the nibbles); `five` is a constant in each caller, so each gets its own loop. */
static inline __attribute__((always_inline)) void q45_k_blocks(const uint8_t *b, int64_t nb,
                                                               float *restrict w, const int five) {
    const int bytes = five ? Q5_K_BYTES : Q4_K_BYTES;
    for (; nb > 0; nb--, b += bytes, w += QK_K) {
        const float d = f16(b), dmin = f16(b + 2);
        const uint8_t *qh = b + 16, *qs = b + (five ? 48 : 16);
        for (int g = 0; g < 4; g++) {
            float sc0, m0, sc1, m1;
            scale_min_k4(b + 4, 2 * g, &sc0, &m0);
            scale_min_k4(b + 4, 2 * g + 1, &sc1, &m1);
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
    const float d = f16(b + 208);
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
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
    for (; nb > 0; nb--, b += Q6_K_BYTES, w += QK_K) q6_k_block(b, w);
}

/* ---- 32-element legacy blocks ------------------------------------------------ */

DECODER(dec_q4_0) {
    UNUSED_ARGS;
    for (; nb > 0; nb--, b += 18, w += QK_LEGACY) {
        const float d = f16(b);
        for (int j = 0; j < 16; j++) {
            w[j] = d * (float)((b[2 + j] & 0xF) - 8);
            w[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
    }
}

DECODER(dec_q4_1) {
    UNUSED_ARGS;
    for (; nb > 0; nb--, b += 20, w += QK_LEGACY) {
        const float d = f16(b), m = f16(b + 2);
        for (int j = 0; j < 16; j++) {
            w[j] = d * (float)(b[4 + j] & 0xF) + m;
            w[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
    }
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

DECODER(dec_q5_0) {
    UNUSED_ARGS;
    for (; nb > 0; nb--, b += 22, w += QK_LEGACY) {
        const float d = f16(b);
        const uint32_t qh = le32(b + 2);
        for (int j = 0; j < 16; j++) {
            int lo = (b[6 + j] & 0xF) | (((qh >> j) & 1) << 4);
            int hi = (b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            w[j] = d * (float)(lo - 16);
            w[j + 16] = d * (float)(hi - 16);
        }
    }
}

DECODER(dec_q5_1) {
    UNUSED_ARGS;
    for (; nb > 0; nb--, b += 24, w += QK_LEGACY) {
        const float d = f16(b), m = f16(b + 2);
        const uint32_t qh = le32(b + 4);
        for (int j = 0; j < 16; j++) {
            int lo = (b[8 + j] & 0xF) | (((qh >> j) & 1) << 4);
            int hi = (b[8 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            w[j] = d * (float)lo + m;
            w[j + 16] = d * (float)hi + m;
        }
    }
}

DECODER(dec_q8_0) {
    UNUSED_ARGS;
    for (; nb > 0; nb--, b += 34, w += QK_LEGACY) {
        const float d = f16(b);
        const int8_t *q = (const int8_t *)(b + 2);
        for (int j = 0; j < 32; j++) w[j] = d * (float)q[j];
    }
}

/* ---- NVFP4 ------------------------------------------------------------------- */

static const float E2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
static const float GGML_DOUBLED[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* NVFP4_E2M1 block b of a row as unscaled E2M1 values, for the dequantize
 * decoder below and the fused kernels alike: its 16 codes in element order
 * (element 2i is the low nibble of byte i), then a permute looks them up
 * (AVX-512: all 16 values; AVX2: the 8 magnitudes, the sign bit set apart). */
#if defined(__AVX2__)
static inline __m128i e2m1_codes16(const uint8_t *row, int64_t b) {
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m128i raw = _mm_loadl_epi64((const __m128i *)(row + 8 * b));
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
        for (int j = 0; j < 8; j++) {
            w[16 * i + 2 * j] = (E2M1[b[8 * i + j] & 0xF] * s) * s2;
            w[16 * i + 2 * j + 1] = (E2M1[b[8 * i + j] >> 4] * s) * s2;
        }
    }
}

/* llama.cpp type 40: 4 UE4M3 scales then 32 nibble bytes per 64 elements. */
DECODER(dec_nvfp4) {
    (void)cmp; (void)s2;
    for (; nb > 0; nb--, b += 36, w += QK_NVFP4) {
        for (int s = 0; s < 4; s++) {
            const float d = lut[b[s]];
            for (int i = 0; i < 8; i++) {
                w[16 * s + i] = d * GGML_DOUBLED[b[4 + 8 * s + i] & 0xF];
                w[16 * s + 8 + i] = d * GGML_DOUBLED[b[4 + 8 * s + i] >> 4];
            }
        }
    }
}

/* ---- plain floats (dequantize only; cpu.py keeps their matmuls in torch) -------- */

/* Exact: every half is a float (subnormals included; F16C ignores DAZ). */
DECODER(dec_f16) {
    UNUSED_ARGS;
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= nb; i += 8)
        _mm256_storeu_ps(w + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 2 * i))));
#elif defined(__aarch64__)
    const _Float16 *h = (const _Float16 *)b;
    for (; i < nb; i++) w[i] = (float)h[i];
#endif
    for (; i < nb; i++) w[i] = f16(b + 2 * i);
}

/* A bfloat16 is the top half of a float32. */
DECODER(dec_bf16) {
    UNUSED_ARGS;
    const uint16_t *h = (const uint16_t *)b;
    uint32_t *o = (uint32_t *)w;
    for (int64_t i = 0; i < nb; i++) o[i] = (uint32_t)h[i] << 16;
}

/* ---- the type table ------------------------------------------------------------ */

typedef struct { int type, elems, bytes; decode_fn dec; } kind_t;

static const kind_t KINDS[] = {
    {T_Q4_0, QK_LEGACY, 18, dec_q4_0},    {T_Q4_1, QK_LEGACY, 20, dec_q4_1},
    {T_Q5_0, QK_LEGACY, 22, dec_q5_0},    {T_Q5_1, QK_LEGACY, 24, dec_q5_1},
    {T_Q8_0, QK_LEGACY, 34, dec_q8_0},    {T_Q4_K, QK_K, Q4_K_BYTES, dec_q4_k},
    {T_Q5_K, QK_K, Q5_K_BYTES, dec_q5_k}, {T_Q6_K, QK_K, Q6_K_BYTES, dec_q6_k},
    {T_NVFP4, QK_NVFP4, 36, dec_nvfp4},   {T_NVFP4_E2M1, NVFP4_GROUP, 8, dec_nvfp4_e2m1},
    {T_F16, 1, 2, dec_f16},               {T_BF16, 1, 2, dec_bf16},
};

static const kind_t *kind_for(int type) {
    for (unsigned i = 0; i < sizeof(KINDS) / sizeof(KINDS[0]); i++)
        if (KINDS[i].type == type) return &KINDS[i];
    return 0;
}

/* 0 when this library decodes `type` with exactly this geometry, else -1. */
int muser_geometry(int type, int elems, int bytes) {
    const kind_t *k = kind_for(type);
    return (k && k->elems == elems && k->bytes == bytes) ? 0 : -1;
}

int muser_max_tokens(void) { return MAX_TOKENS; }

/* Decode elements [c0, c0 + n) of one row (c0, n multiples of the block size). */
static void decode_span(const kind_t *k, const uint8_t *row, const uint8_t *crow, const float *lut,
                        float s2, int64_t c0, int64_t n, float *w) {
    const int64_t b0 = c0 / k->elems;
    k->dec(row + b0 * k->bytes, crow ? crow + b0 : 0, lut, s2, n / k->elems, w);
}

static int64_t chunk_elems(const kind_t *k) {
    return k->elems >= CHUNK ? k->elems : (CHUNK / k->elems) * k->elems;
}

/* ---- the thread pool ----------------------------------------------------------------
 *
 * Work is split into chunks that the caller and up to want-1 helpers claim
 * from one atomic word. The caller never waits for a helper that has not
 * claimed anything: on a busy machine a sleeping helper may get a CPU only
 * after a scheduler slice (milliseconds), and a fork-join that waits for it
 * (OpenMP's barrier) turns a 0.2 ms matvec into 10 ms. The caller waits only
 * for chunks already claimed.
 *
 * The claim word holds generation (16 bits) | want (8) | total (20) | next (20),
 * so a helper decides from one atomic load whether chunk `next` exists for the
 * job it is looking at; the job's other fields are read only after a
 * successful claim (the caller cannot post a new job before every claimed
 * chunk is done, so they are still this job's).
 */

typedef void (*task_fn)(const void *ctx, int64_t begin, int64_t end);

#define POOL_MAX 64
#define CLAIM(gen, want, total, next)                                                     \
    (((uint64_t)(gen) << 48) | ((uint64_t)(want) << 40) | ((uint64_t)(total) << 20) | (uint64_t)(next))
#define C_GEN(c) ((unsigned)((c) >> 48))
#define C_WANT(c) ((int)(((c) >> 40) & 0xFF))
#define C_TOTAL(c) ((int64_t)(((c) >> 20) & 0xFFFFF))
#define C_NEXT(c) ((int64_t)((c) & 0xFFFFF))

static struct {
    pthread_mutex_t mu;          /* guards posted and the helpers' sleep */
    pthread_cond_t cv;
    pthread_mutex_t job;         /* one job at a time; a second caller runs inline */
    unsigned posted;             /* generation of the last job posted */
    int helpers;                 /* started */
    pid_t pid;                   /* a forked child starts a fresh pool */
    _Atomic uint64_t claim;
    _Atomic int64_t done;
    task_fn fn;
    const void *ctx;
    int64_t n, per;              /* items, items per chunk */
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
            .job = PTHREAD_MUTEX_INITIALIZER};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Claim and run chunks of generation `gen` as participant `who` (0 = caller). */
static void run_chunks(unsigned gen, int who) {
    uint64_t c = atomic_load_explicit(&pool.claim, memory_order_acquire);
    for (;;) {
        if (C_GEN(c) != (gen & 0xFFFF) || who >= C_WANT(c) || C_NEXT(c) >= C_TOTAL(c)) return;
        if (!atomic_compare_exchange_weak_explicit(&pool.claim, &c, c + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        const int64_t i = C_NEXT(c), b = i * pool.per;
        const int64_t e = b + pool.per < pool.n ? b + pool.per : pool.n;
        pool.fn(pool.ctx, b, e);
        atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
        c = atomic_load_explicit(&pool.claim, memory_order_acquire);
    }
}

static void *helper_main(void *arg) {
    const int who = (int)(intptr_t)arg;
    unsigned seen = 0;
    for (;;) {
        /* spin briefly (back-to-back matvecs), then sleep until a new job */
        unsigned gen = 0;
        for (int spin = 0; spin < 1000; spin++) {
            gen = C_GEN(atomic_load_explicit(&pool.claim, memory_order_acquire));
            if (gen != (seen & 0xFFFF)) break;
            cpu_relax();
        }
        pthread_mutex_lock(&pool.mu);
        while (pool.posted == seen) pthread_cond_wait(&pool.cv, &pool.mu);
        seen = pool.posted;
        pthread_mutex_unlock(&pool.mu);
        run_chunks(seen, who);
    }
    return 0;
}

static void parallel_for(task_fn fn, const void *ctx, int64_t n, int nthreads) {
    if (nthreads > POOL_MAX) nthreads = POOL_MAX;
    if (nthreads <= 1 || n <= 1 || pthread_mutex_trylock(&pool.job) != 0) {
        fn(ctx, 0, n);
        return;
    }
    if (pool.pid != getpid()) {                  /* first use, or a forked child */
        if (pool.pid) {                          /* the parent's helpers did not come along */
            pthread_mutex_init(&pool.mu, 0);
            pthread_cond_init(&pool.cv, 0);
        }
        pool.pid = getpid();
        pool.helpers = 0;
    }
    while (pool.helpers < nthreads - 1) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &attr, helper_main, (void *)(intptr_t)(pool.helpers + 1));
        pthread_attr_destroy(&attr);
        if (rc) break;
        pool.helpers++;
    }
    const int want = pool.helpers + 1 < nthreads ? pool.helpers + 1 : nthreads;
    int64_t chunks = 8 * (int64_t)want;          /* small chunks: a late helper still helps */
    if (chunks > n) chunks = n;
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    pool.per = (n + chunks - 1) / chunks;
    chunks = (n + pool.per - 1) / pool.per;
    atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
    pthread_mutex_lock(&pool.mu);
    const unsigned gen = ++pool.posted;
    atomic_store_explicit(&pool.claim, CLAIM(gen & 0xFFFF, want, chunks, 0), memory_order_release);
    pthread_cond_broadcast(&pool.cv);
    pthread_mutex_unlock(&pool.mu);
    run_chunks(gen, 0);
    for (int spin = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < chunks; spin++) {
        if (spin < 4096) cpu_relax();
        else sched_yield();
    }
    pthread_mutex_unlock(&pool.job);
}

/* out[r, :] = the float32 values of rows [0, n_rows). */
typedef struct {
    const kind_t *k;
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
    const kind_t *k = kind_for(type);
    if (!k || n_in % k->elems) return -1;
    const dequant_job j = {k, packed, scales, lut, s2, n_in, n_in / k->elems * k->bytes, out};
    parallel_for(dequant_task, &j, n_rows, nthreads);
    return 0;
}

/* ---- matmul ---------------------------------------------------------------------------
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

#define ROW_KERNEL static inline __attribute__((always_inline))

static inline v8f splat(float a) { return (v8f){a, a, a, a, a, a, a, a}; }
static inline v8f load8(const float *p) { v8f v; memcpy(&v, p, 32); return v; }
static inline float hsum(v8f a) {
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

#if defined(__AVX2__) && defined(__FMA__)
/* Fused row kernels for the hot types: each 8 codes are widened to int32
 * lanes, decoded to floats in registers and FMA'd into the accumulators
 * (GCC 12 scalarizes __builtin_convertvector from bytes, hence intrinsics).
 * Other CPUs use row_generic for every type. */
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

/* Register decoders of the hot types, shared by the fused row kernels and the
 * GEMM tile decode so that both round the same way. */

/* Q4_K / Q5_K group g (64 elements): (d*sc, dmin*m) of sub-blocks 2g, 2g+1. */
static inline void q45_k_group(const uint8_t *blk, float d, float dmin, int g,
                               v8f *a0, v8f *c0, v8f *a1, v8f *c1) {
    float sc0, m0, sc1, m1;
    scale_min_k4(blk + 4, 2 * g, &sc0, &m0);
    scale_min_k4(blk + 4, 2 * g + 1, &sc1, &m1);
    *a0 = splat(d * sc0), *c0 = splat(dmin * m0);
    *a1 = splat(d * sc1), *c1 = splat(dmin * m1);
}
/* ... and its elements 64g+8q.. (w0, low nibbles) and 64g+32+8q.. (w1):
 * w = fma(d*sc, q, -dmin*m). */
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
    const int8_t *sc = (const int8_t *)(blk + 192);
    const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
    const int j = 8 * h + q / 2;
    const v8i l0 = widen_u8(ql + 8 * q), l1 = widen_u8(ql + 32 + 8 * q);
    const v8i hb = widen_u8(qh + 8 * q);
    w[0] = splat(d * (float)sc[j]) * to_f32(((l0 & 0xF) | ((hb & 3) << 4)) - 32);
    w[1] = splat(d * (float)sc[j + 2]) * to_f32(((l1 & 0xF) | (((hb >> 2) & 3) << 4)) - 32);
    w[2] = splat(d * (float)sc[j + 4]) * to_f32(((l0 >> 4) | (((hb >> 4) & 3) << 4)) - 32);
    w[3] = splat(d * (float)sc[j + 6]) * to_f32(((l1 >> 4) | (((hb >> 6) & 3) << 4)) - 32);
}

/* NVFP4_E2M1 block b (16 elements, 8 bytes, one scale): w = e2m1(code) *
 * (e4m3(scale) * scale_2), the values looked up by e2m1_values8. */
static inline void nvfp4_e2m1_w16(__m256 table, const uint8_t *row, float s, int64_t b,
                                  v8f *w0, v8f *w1) {
    const __m128i codes = e2m1_codes16(row, b);
    *w0 = splat(s) * (v8f)e2m1_values8(table, codes);
    *w1 = splat(s) * (v8f)e2m1_values8(table, _mm_srli_si128(codes, 8));
}

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
    const int bytes = five ? Q5_K_BYTES : Q4_K_BYTES;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bytes;
        const uint8_t *qh = blk + 16, *qs = blk + (five ? 48 : 16);
        const float d = f16(blk), dmin = f16(blk + 2);
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
        const uint8_t *blk = row + b * Q6_K_BYTES;
        const float d = f16(blk + 208);
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
    const int bytes = five ? Q5_K_BYTES : Q4_K_BYTES;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t base = b * QK_K;
        float d[2], dmin[2];
        for (int r = 0; r < R; r++) d[r] = f16(rows[r] + b * bytes), dmin[r] = f16(rows[r] + b * bytes + 2);
        for (int g = 0; g < 4; g++) {
            v16f a0[2], c0[2], a1[2], c1[2];
            for (int r = 0; r < R; r++) {
                const uint8_t *blk = rows[r] + b * bytes;
                float sc0, m0, sc1, m1;
                scale_min_k4(blk + 4, 2 * g, &sc0, &m0);
                scale_min_k4(blk + 4, 2 * g + 1, &sc1, &m1);
                a0[r] = splat16(d[r] * sc0), c0[r] = splat16(dmin[r] * m0);
                a1[r] = splat16(d[r] * sc1), c1[r] = splat16(dmin[r] * m1);
            }
            for (int k = 0; k < 2; k++) {
                v16f w0[2], w1[2];
                for (int r = 0; r < R; r++) {
                    const uint8_t *blk = rows[r] + b * bytes;
                    const uint8_t *qh = blk + 16, *qs = blk + (five ? 48 : 16);
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
        for (int r = 0; r < R; r++) d[r] = f16(rows[r] + b * Q6_K_BYTES + 208);
        for (int h = 0; h < 2; h++) {
            const int64_t base = b * QK_K + 128 * h;
            for (int k = 0; k < 2; k++) {          /* elements 16k.. of each quarter */
                v16f w0[2], w1[2], w2[2], w3[2];
                for (int r = 0; r < R; r++) {
                    const uint8_t *blk = rows[r] + b * Q6_K_BYTES;
                    const int8_t *sc = (const int8_t *)(blk + 192);
                    const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
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

/* R rows (1 or 2) of a fused type, T tokens. */
ROW_KERNEL void rows_dot16(const kind_t *k, const uint8_t *const *rows, const uint8_t *const *crows,
                           const float *lut, float s2, const float *x, int64_t n_in, const int R,
                           const int T, float *const *out) {
    switch (k->type) {
    case T_Q4_K: row_q45_k_16(rows, 0, n_in / QK_K, x, n_in, R, T, out); return;
    case T_Q5_K: row_q45_k_16(rows, 1, n_in / QK_K, x, n_in, R, T, out); return;
    case T_Q6_K: row_q6_k_16(rows, n_in / QK_K, x, n_in, R, T, out); return;
    default: row_nvfp4_e2m1_16(rows, crows, lut, s2, n_in / NVFP4_GROUP, x, n_in, R, T, out);
    }
}
static int fused16(const kind_t *k) {
    return k->type == T_Q4_K || k->type == T_Q5_K || k->type == T_Q6_K ||
           k->type == T_NVFP4_E2M1;
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

/* Every other type: decode CHUNK elements into an L1 scratch, then dot. */
ROW_KERNEL void row_generic(const kind_t *k, const uint8_t *row, const uint8_t *crow,
                            const float *lut, float s2, const float *x, int64_t n_in, const int T,
                            float *out) {
    float w[CHUNK] __attribute__((aligned(64)));
    v8f acc[TOKEN_GROUP];
    for (int t = 0; t < T; t++) acc[t] = splat(0.0f);
    const int64_t ch = chunk_elems(k);
    for (int64_t c0 = 0; c0 < n_in; c0 += ch) {
        const int64_t n = n_in - c0 < ch ? n_in - c0 : ch;   /* a multiple of 16 */
        decode_span(k, row, crow, lut, s2, c0, n, w);
        for (int64_t i = 0; i < n; i += 8) FMA_TOKENS(load8(w + i), c0 + i);
    }
    for (int t = 0; t < T; t++) out[t] = hsum(acc[t]);
}

/* One row for a compile-time T (muser_matmul instantiates 1..TOKEN_GROUP). */
ROW_KERNEL void row_dot(const kind_t *k, const uint8_t *row, const uint8_t *crow, const float *lut,
                        float s2, const float *x, int64_t n_in, const int T, float *out) {
    switch (k->type) {
#ifdef HAVE_FUSED
    case T_Q4_K: row_q45_k(row, 0, n_in / QK_K, x, n_in, T, out); return;
    case T_Q5_K: row_q45_k(row, 1, n_in / QK_K, x, n_in, T, out); return;
    case T_Q6_K: row_q6_k(row, n_in / QK_K, x, n_in, T, out); return;
    case T_NVFP4_E2M1:
        row_nvfp4_e2m1(row, crow, lut, s2, n_in / NVFP4_GROUP, x, n_in, T, out);
        return;
#endif
    default: row_generic(k, row, crow, lut, s2, x, n_in, T, out);
    }
}

typedef struct {
    const kind_t *k;
    const uint8_t *packed, *scales;
    const float *lut;
    float s2;
    int64_t n_out, n_in, row_bytes, T;
    const float *x;
    float *y;
} matmul_job;

#ifdef HAVE_FUSED16
#ifndef PAIR_MIN_T
#define PAIR_MIN_T 5    /* token groups of at least this many run two rows at a time (measured) */
#endif
#define ROWS16_CASE(n)                                                                     \
    case n:                                                                                \
        if (R == 2 && n >= PAIR_MIN_T) rows_dot16(k, rows, crows, lut, s2, xg, n_in, 2, n, og); \
        else                                                                               \
            for (int i = 0; i < R; i++)                                                    \
                rows_dot16(k, rows + i, crows + i, lut, s2, xg, n_in, 1, n, og + i);       \
        break
/* Rows r .. r+R-1 (R = 1, or 2 when the tokens come in groups of PAIR_MIN_T or more). */
static void matmul_rows16(const matmul_job *j, int64_t r, int R) {
    const kind_t *k = j->k;
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

static void matmul_task(const void *ctx, int64_t r0, int64_t r1) {
    const matmul_job *j = ctx;
    const kind_t *k = j->k;
    const int64_t n_in = j->n_in, T = j->T, spr = n_in / NVFP4_GROUP;
    const float *lut = j->lut;
    const float s2 = j->s2;
#ifdef HAVE_FUSED16
    if (fused16(k)) {
        const int pair = (T < TOKEN_GROUP ? T : TOKEN_GROUP) >= PAIR_MIN_T;
        for (int64_t r = r0; r < r1;) {
            const int R = pair && r + 1 < r1 ? 2 : 1;
            matmul_rows16(j, r, R);
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
            case 1: row_dot(k, row, crow, lut, s2, xg, n_in, 1, og); break;
            case 2: row_dot(k, row, crow, lut, s2, xg, n_in, 2, og); break;
            case 3: row_dot(k, row, crow, lut, s2, xg, n_in, 3, og); break;
            case 4: row_dot(k, row, crow, lut, s2, xg, n_in, 4, og); break;
            case 5: row_dot(k, row, crow, lut, s2, xg, n_in, 5, og); break;
            case 6: row_dot(k, row, crow, lut, s2, xg, n_in, 6, og); break;
            case 7: row_dot(k, row, crow, lut, s2, xg, n_in, 7, og); break;
            default: row_dot(k, row, crow, lut, s2, xg, n_in, 8, og); break;
            }
        }
        for (int64_t t = 0; t < T; t++) j->y[t * j->n_out + r] = out[t];
    }
}

int muser_matmul(int type, const uint8_t *packed, const uint8_t *scales, const float *lut,
                 float s2, int64_t n_out, int64_t n_in, const float *x, int64_t T, float *y,
                 int nthreads) {
    const kind_t *k = kind_for(type);
    if (!k || n_in % k->elems || n_in % 16 || T < 1 || T > MAX_TOKENS) return -1;
    const matmul_job j = {k, packed, scales, lut, s2, n_out, n_in, n_in / k->elems * k->bytes, T,
                          x, y};
    parallel_for(matmul_task, &j, n_out, nthreads);
    return 0;
}

/* ---- gemm: many activation rows -------------------------------------------------------
 *
 * y[t, r] = sum_i x[t, i] * W[r, i] for any T (cpu.py uses it above its
 * FUSED_MAX_TOKENS, where it measured 2-4x faster than the fused kernel or
 * torch's matmul on dequantized tiles). A register-blocked GEMM over the
 * packed bytes, read (and decoded) once for all T tokens:
 *  - x is first packed into token panels of GT tokens (the last one GV or GT
 *    wide, zero-padded): panel p holds xp[k][j] = x[p*GT + j, k], so the inner
 *    loop streams it with vector loads.
 *  - threads take blocks of GRB weight rows; a block decodes GK columns of
 *    its rows at a time (gemm_decode) into a stack tile, then a
 *    GR-rows x GT-tokens microkernel runs over every token panel, with
 *    accumulators in registers (GR*GNV vectors) and the weights broadcast.
 *  - each GK chunk's sum (float32, in k order, FMA) is added into a per-block
 *    C[r][t] scratch, which is stored transposed into y at the end.
 * Memory: the packed x (about T*n_in floats) and GRB*T floats per thread.
 */

#if defined(__AVX512F__)
#define GV 16           /* floats per vector */
#define GR 12           /* weight rows per microkernel: GR*GNV accumulators */
typedef float vgf __attribute__((vector_size(64)));
static inline vgf gfma(vgf a, vgf b, vgf c) {
    return (vgf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
}
static inline vgf gsplat(float a) { return (vgf)_mm512_set1_ps(a); }
#elif defined(__AVX2__) && defined(__FMA__)
#define GV 8
#define GR 6
typedef float vgf __attribute__((vector_size(32)));
static inline vgf gfma(vgf a, vgf b, vgf c) {
    return (vgf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
}
static inline vgf gsplat(float a) { return (vgf)_mm256_set1_ps(a); }
#else
#define GV 8
#define GR 4
typedef float vgf __attribute__((vector_size(32)));
static inline vgf gfma(vgf a, vgf b, vgf c) { return a * b + c; }
static inline vgf gsplat(float a) { return (vgf){a, a, a, a, a, a, a, a}; }
#endif
#define GNV 2           /* vectors of tokens per full panel */
#define GT (GV * GNV)   /* tokens per full panel */
#ifndef GM
#define GM 2            /* microkernel row groups per block */
#endif
#define GRB (GR * GM)   /* weight rows per block */
#ifndef GK
#define GK 256          /* columns decoded at a time (a multiple of every block size) */
#endif
_Static_assert(GK % QK_K == 0, "GK must hold whole blocks of every type");

static inline vgf gload(const float *p) { vgf v; memcpy(&v, p, sizeof v); return v; }
static inline void gstore(float *p, vgf v) { memcpy(p, &v, sizeof v); }

/* c[r][0 .. NV*GV) += sum_k w[r*ldw + k] * xp[k][..] for r < GR. */
ROW_KERNEL void gemm_micro(const float *w, int64_t ldw, const float *xp, int64_t kn, const int NV,
                           float *c, int64_t ldc) {
    vgf acc[GR][GNV];
    for (int r = 0; r < GR; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = gsplat(0.0f);
    for (int64_t k = 0; k < kn; k++) {
        vgf xv[GNV];
        for (int v = 0; v < NV; v++) xv[v] = gload(xp + k * NV * GV + v * GV);
        for (int r = 0; r < GR; r++) {
            const vgf b = gsplat(w[r * ldw + k]);
            for (int v = 0; v < NV; v++) acc[r][v] = gfma(b, xv[v], acc[r][v]);
        }
    }
    for (int r = 0; r < GR; r++)
        for (int v = 0; v < NV; v++) gstore(c + r * ldc + v * GV, gload(c + r * ldc + v * GV) + acc[r][v]);
}

/* Elements [c0, c0 + n) of one row into w. The hot types decode 8 at a time in
 * registers as the fused row kernels do (last bits may differ from the
 * reference: Q4_K/Q5_K fuse d*sc*q - dmin*m into one FMA, NVFP4_E2M1 computes
 * e2m1 * (e4m3 * s2)); the scalar reference decoders cost as much as the
 * multiply itself below 64 tokens (NVFP4_E2M1: 2x). */
static void gemm_decode(const kind_t *k, const uint8_t *row, const uint8_t *crow, const float *lut,
                        float s2, int64_t c0, int64_t n, float *w) {
#ifdef HAVE_FUSED
    if (k->type == T_NVFP4_E2M1) {
        const __m256 table = _mm256_loadu_ps(E2M1);
        for (int64_t b = c0 / NVFP4_GROUP; b < (c0 + n) / NVFP4_GROUP; b++, w += NVFP4_GROUP) {
            v8f w0, w1;
            nvfp4_e2m1_w16(table, row, lut[crow[b]] * s2, b, &w0, &w1);
            memcpy(w, &w0, 32);
            memcpy(w + 8, &w1, 32);
        }
        return;
    }
    if (k->type == T_Q4_K || k->type == T_Q5_K) {     /* as row_q45_k: w = fma(d*sc, q, -dmin*m) */
        const int five = k->type == T_Q5_K;
        for (int64_t b = c0 / QK_K; b < (c0 + n) / QK_K; b++, w += QK_K) {
            const uint8_t *blk = row + b * k->bytes;
            const uint8_t *qh = blk + 16, *qs = blk + (five ? 48 : 16);
            const float d = f16(blk), dmin = f16(blk + 2);
            for (int g = 0; g < 4; g++) {
                v8f a0, c0v, a1, c1v, w0, w1;
                q45_k_group(blk, d, dmin, g, &a0, &c0v, &a1, &c1v);
                for (int q = 0; q < 4; q++) {
                    q45_k_w8(qs, qh, five, g, q, a0, c0v, a1, c1v, &w0, &w1);
                    memcpy(w + 64 * g + 8 * q, &w0, 32);
                    memcpy(w + 64 * g + 32 + 8 * q, &w1, 32);
                }
            }
        }
        return;
    }
    if (k->type == T_Q6_K) {                          /* as row_q6_k */
        for (int64_t b = c0 / QK_K; b < (c0 + n) / QK_K; b++, w += QK_K) {
            const uint8_t *blk = row + b * Q6_K_BYTES;
            const float d = f16(blk + 208);
            for (int h = 0; h < 2; h++) {
                float *o = w + 128 * h;
                for (int q = 0; q < 4; q++) {
                    v8f w4[4];
                    q6_k_w8(blk, d, h, q, w4);
                    memcpy(o + 8 * q, &w4[0], 32);
                    memcpy(o + 32 + 8 * q, &w4[1], 32);
                    memcpy(o + 64 + 8 * q, &w4[2], 32);
                    memcpy(o + 96 + 8 * q, &w4[3], 32);
                }
            }
        }
        return;
    }
#endif
    decode_span(k, row, crow, lut, s2, c0, n, w);
}

typedef struct {
    const kind_t *k;
    const uint8_t *packed, *scales;
    const float *lut;
    float s2;
    int64_t n_out, n_in, row_bytes, T, tpad;
    const float *x;
    float *xp;
    float *y;
    _Atomic int *failed;         /* set when a thread cannot allocate its scratch */
} gemm_job;

static int64_t panel_width(const gemm_job *j, int64_t p) {
    return j->T - p * GT <= GV ? GV : GT;
}

static void gemm_pack_task(const void *ctx, int64_t p0, int64_t p1) {
    const gemm_job *j = ctx;
    for (int64_t p = p0; p < p1; p++) {
        const int64_t wp = panel_width(j, p);
        float *dst = j->xp + p * GT * j->n_in;
        for (int64_t i = 0; i < wp; i++) {
            const int64_t t = p * GT + i;
            if (t < j->T) {
                const float *src = j->x + t * j->n_in;
                for (int64_t k = 0; k < j->n_in; k++) dst[k * wp + i] = src[k];
            } else {
                for (int64_t k = 0; k < j->n_in; k++) dst[k * wp + i] = 0.0f;
            }
        }
    }
}

static void gemm_task(const void *ctx, int64_t b0, int64_t b1) {
    const gemm_job *j = ctx;
    const kind_t *k = j->k;
    const int64_t n_in = j->n_in, T = j->T, tpad = j->tpad, spr = n_in / NVFP4_GROUP;
    const int64_t panels = (T + GT - 1) / GT;
    float wt[GRB * GK] __attribute__((aligned(64)));
    float *c = malloc(sizeof(float) * GRB * tpad);
    if (!c) {
        atomic_store(j->failed, 1);
        return;
    }
    for (int64_t blk = b0; blk < b1; blk++) {
        const int64_t r0 = blk * GRB, nr = j->n_out - r0 < GRB ? j->n_out - r0 : GRB;
        const int64_t groups = (nr + GR - 1) / GR;
        memset(c, 0, sizeof(float) * GRB * tpad);
        for (int64_t k0 = 0; k0 < n_in; k0 += GK) {
            const int64_t kn = n_in - k0 < GK ? n_in - k0 : GK;
            for (int64_t r = 0; r < nr; r++)
                gemm_decode(k, j->packed + (r0 + r) * j->row_bytes,
                            j->scales ? j->scales + (r0 + r) * spr : 0, j->lut, j->s2, k0, kn,
                            wt + r * GK);
            for (int64_t r = nr; r < groups * GR; r++) memset(wt + r * GK, 0, sizeof(float) * kn);
            for (int64_t p = 0; p < panels; p++) {
                const int64_t wp = panel_width(j, p);
                const float *xpp = j->xp + p * GT * n_in + k0 * wp;
                for (int64_t g = 0; g < groups; g++) {
                    float *cg = c + g * GR * tpad + p * GT;
                    if (wp == GT) gemm_micro(wt + g * GR * GK, GK, xpp, kn, GNV, cg, tpad);
                    else gemm_micro(wt + g * GR * GK, GK, xpp, kn, 1, cg, tpad);
                }
            }
        }
        for (int64_t t = 0; t < T; t++)
            for (int64_t r = 0; r < nr; r++) j->y[t * j->n_out + r0 + r] = c[r * tpad + t];
    }
    free(c);
}

int muser_gemm(int type, const uint8_t *packed, const uint8_t *scales, const float *lut, float s2,
               int64_t n_out, int64_t n_in, const float *x, int64_t T, float *y, int nthreads) {
    const kind_t *k = kind_for(type);
    if (!k || n_in % k->elems || n_in % 16 || T < 1) return -1;
    const int64_t panels = (T + GT - 1) / GT, tpad = panels * GT;
    float *xp = malloc(sizeof(float) * tpad * n_in);
    if (!xp) return -2;
    _Atomic int failed = 0;
    const gemm_job j = {k, packed, scales, lut, s2, n_out, n_in, n_in / k->elems * k->bytes, T,
                        tpad, x, xp, y, &failed};
    parallel_for(gemm_pack_task, &j, panels, nthreads);
    parallel_for(gemm_task, &j, (n_out + GRB - 1) / GRB, nthreads);
    free(xp);
    return atomic_load(&failed) ? -2 : 0;
}
