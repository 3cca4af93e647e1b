/* ggml numerics on weights repacked at load: muser_matmul_q8p.
 *
 * The layout (ops/cpu/packed.py writes it; tests/ops/cpu/test_packed.py
 * un-permutes it): rows are taken PACKED_ROWS (16) at a time; for each group
 * of rows and each block b, the 16 rows' block b are interleaved field by
 * field in struct order, each field chunk by chunk (4 bytes; a 2-byte d is one
 * chunk), row by row:
 *
 *   Q8_0 (d 2, qs 32)          Q5_0 (d 2, qh 4, qs 16)       Q4_0 (d 2, qs 16)
 *   d  r0 r1 .. r15   32 B      d  r0 .. r15          32 B     d  r0 .. r15   32 B
 *   qs[0:4]  r0..r15  64 B      qh r0 .. r15          64 B     qs[0:4]   64 B
 *   qs[4:8]  r0..r15  64 B      qs[0:4]   r0..r15     64 B     ...
 *   ...   (8 chunks)            ...   (4 chunks)               (4 chunks)
 *
 * so a field's bytes start at PACKED_ROWS * its offset in the file's block,
 * one 64-byte load holds one chunk of 16 rows, and the group's blocks follow
 * one another (a group of rows is one contiguous panel). Rows past the last
 * whole group stay in the file's layout after the groups. Every byte of the
 * file is kept, only moved: no offset is added (the test checks the
 * permutation), so the kernels move the codes to unsigned in registers.
 *
 * The arithmetic is ggml's vec_dot_q8_0_q8_0 / q4_0 / q5_0 (x86), the order
 * qdot.c's qdot_legacy keeps, so the result equals muser_matmul_q8 on the
 * file's layout bit for bit on every ISA: the 32 products of a block are
 * summed exactly in 8 int32 lanes of 4 consecutive elements (lane L: elements
 * 4L..4L+3), each lane is converted to float and fused-multiply-added with
 * d_w * d_x into its own float accumulator over the blocks, and the 8 lanes
 * are summed as ggml's hsum_float_8: ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)).
 * Here a vector holds one lane of 16 rows, so that order costs nothing.
 * A lane's 4 codes are one chunk (Q8_0: chunk L; Q4_0/Q5_0: the low nibbles
 * of chunk L for L < 4, the high nibbles of chunk L-4 for L >= 4, Q5_0's fifth
 * bits from bits 4L..4L+3 of each row's qh).
 *
 * Q4_K's and Q6_K's kernels live in qdot_packed_k.c (same layout rule, Q8_K activations).
 *
 * Run-time dispatch (one build serves any x86-64): the AVX-512 VNNI and AVX2
 * kernels are compiled with target attributes and chosen by __builtin_cpu_supports
 * at first use; the plain C kernel serves every other CPU. muser_packed_isa
 * reports the choice and lets the tests force a lower one.
 *   AVX-512 VNNI: vpdpbusd (u8 x s8) on the codes made unsigned (Q8_0: w ^ 0x80,
 *     Q4_0/Q5_0: the stored nibbles), the accumulator seeded with -off * (sum
 *     of the activation lane's 4 codes), off = 128, 8, 16: exact.
 *   AVX2: vpmaddubsw + vpmaddwd; Q8_0 moves the weight's sign onto the
 *     activation (|w| <= 128, so no pair saturates), Q4_0/Q5_0 use the
 *     unsigned codes (<= 31) and the same seed.
 */
#include <stdlib.h>

#include "kernels.h"

#define LANES 8            /* int32 lanes of 4 elements per 32-element block */

enum { ISA_C = PACKED_ISA_C, ISA_AVX2 = PACKED_ISA_AVX2, ISA_AVX512 = PACKED_ISA_AVX512 };

/* Per type: the file block's size, its qs / qh offsets and the offset that
 * makes its codes unsigned (AVX-512). */
typedef struct { int type, bytes, qs, qh, off; } ptype_t;

static const ptype_t PTYPES[] = {
    {MUSER_ID_Q8_0, MUSER_Q8_0_BYTES, MUSER_Q8_0_QS, -1, 128},
    {MUSER_ID_Q4_0, MUSER_Q4_0_BYTES, MUSER_Q4_0_QS, -1, 8},
    {MUSER_ID_Q5_0, MUSER_Q5_0_BYTES, MUSER_Q5_0_QS, MUSER_Q5_0_QH, 16},
};
_Static_assert(MUSER_Q8_0_D == 0 && MUSER_Q4_0_D == 0 && MUSER_Q5_0_D == 0,
               "the packed kernels read the 16 d's at the group block's start");
_Static_assert(QK_LEGACY == 4 * LANES, "a legacy block is 8 lanes of 4");

static const ptype_t *ptype_for(int type) {
    for (unsigned i = 0; i < sizeof PTYPES / sizeof PTYPES[0]; i++)
        if (PTYPES[i].type == type) return &PTYPES[i];
    return 0;
}

/* The activation of one token: its Q8_0 blocks (q8_act.c) and, per block and
 * lane, -off * (the sum of the lane's 4 codes): the seed of the lane's sum. */
typedef struct {
    const act32_t *a;        /* [T][nb] */
    const int32_t *seed;     /* [T][nb][LANES] */
    int64_t nb;
} acts_t;

/* Group blocks prefetched ahead of the one in use (to L2), whole: the panels are
 * read once per decode step, from DRAM; qdot_packed_k.c says what it bought. A
 * prefetch past the panel reads into the next one, or nothing (it never faults). */
#define PREFETCH_AHEAD 4

#define TOK_TT 2            /* tokens per pass over a panel in the AVX-512 kernel (8 accumulators each) */

/* ---- plain C ------------------------------------------------------------------------- */

/* The signed code of element 4L + j of row r in the group block g. */
static inline int code_c(const ptype_t *p, const uint8_t *g, int r, int L, int j) {
    if (p->type == MUSER_ID_Q8_0) return (int8_t)g[PACKED_ROWS * p->qs + 64 * L + 4 * r + j];
    const uint8_t q = g[PACKED_ROWS * p->qs + 64 * (L & 3) + 4 * r + j];
    int v = L < 4 ? q & 0xF : q >> 4;
    if (p->qh >= 0) {
        uint32_t qh;
        memcpy(&qh, g + PACKED_ROWS * p->qh + 4 * r, 4);
        v |= ((qh >> (4 * L + j)) & 1) << 4;
    }
    return v - p->off;
}

static void panel_c(const ptype_t *p, const uint8_t *panel, const acts_t *x, int64_t t0, int T,
                    float *y, int64_t n_out) {
    for (int t = 0; t < T; t++) {
        float acc[PACKED_ROWS][LANES] = {{0}};
        for (int64_t b = 0; b < x->nb; b++) {
            const uint8_t *g = panel + b * PACKED_ROWS * p->bytes;
            const act32_t *a = x->a + (t0 + t) * x->nb + b;
            for (int r = 0; r < PACKED_ROWS; r++) {
                const float ds = f16(g + 2 * r) * a->d;
                for (int L = 0; L < LANES; L++) {
                    int s = 0;
                    for (int j = 0; j < 4; j++) s += code_c(p, g, r, L, j) * a->qs[4 * L + j];
                    acc[r][L] = __builtin_fmaf(ds, (float)s, acc[r][L]);
                }
            }
        }
        for (int r = 0; r < PACKED_ROWS; r++) {
            const float *v = acc[r];
            y[(t0 + t) * n_out + r] = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
        }
    }
}

#if defined(__x86_64__)
/* ---- AVX-512 VNNI -------------------------------------------------------------------- */

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma,avx2")))

/* Lane L of 16 rows' block g as unsigned bytes (4 per row). */
T512 static inline __attribute__((always_inline)) __m512i lane512(const uint8_t *g, const int type, int L) {
    if (type == MUSER_ID_Q8_0)
        return _mm512_xor_si512(_mm512_loadu_si512(g + PACKED_ROWS * MUSER_Q8_0_QS + 64 * L),
                                _mm512_set1_epi8((char)0x80));
    const int qs = type == MUSER_ID_Q5_0 ? MUSER_Q5_0_QS : MUSER_Q4_0_QS;
    const __m512i raw = _mm512_loadu_si512(g + PACKED_ROWS * qs + 64 * (L & 3));
    __m512i u = _mm512_and_si512(L < 4 ? raw : _mm512_srli_epi16(raw, 4), _mm512_set1_epi8(0xF));
    if (type == MUSER_ID_Q5_0) {
        /* byte j of each row's u32: bit 4L + j of its qh, i.e. bit 4(L&1) + j of qh byte L/2
         * (vpshufb picks within 16 bytes: row dword p's 4 bytes take byte 4p + L/2) */
        const __m512i qh = _mm512_loadu_si512(g + PACKED_ROWS * MUSER_Q5_0_QH);
        const __m512i rep = _mm512_shuffle_epi8(
            qh, _mm512_add_epi8(_mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0),
                                _mm512_set1_epi8((char)(L >> 1))));
        const __mmask64 m = _mm512_test_epi8_mask(rep, _mm512_set1_epi32((int)(0x08040201u << (4 * (L & 1)))));
        u = _mm512_mask_add_epi8(u, m, u, _mm512_set1_epi8(16));
    }
    return u;
}

T512 static inline __attribute__((always_inline)) void panel512_tt(const ptype_t *p, const int type,
                                                                  const uint8_t *panel, const acts_t *x,
                                                                  int64_t t0, const int TT, float *y,
                                                                  int64_t n_out) {
    __m512 acc[TOK_TT][LANES];
    for (int t = 0; t < TT; t++)
        for (int L = 0; L < LANES; L++) acc[t][L] = _mm512_setzero_ps();
    const int bytes = PACKED_ROWS * p->bytes;
    for (int64_t b = 0; b < x->nb; b++) {
        const uint8_t *g = panel + b * bytes;
        for (int i = 0; i < bytes; i += 64) __builtin_prefetch(g + PREFETCH_AHEAD * bytes + i, 0, 1);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g));
        __m512 ds[TOK_TT];
        for (int t = 0; t < TT; t++) ds[t] = _mm512_mul_ps(dw, _mm512_set1_ps(x->a[(t0 + t) * x->nb + b].d));
        for (int L = 0; L < LANES; L++) {
            const __m512i u = lane512(g, type, L);
            for (int t = 0; t < TT; t++) {
                const int64_t i = (t0 + t) * x->nb + b;
                int32_t yq;
                memcpy(&yq, x->a[i].qs + 4 * L, 4);
                const __m512i s = _mm512_dpbusd_epi32(_mm512_set1_epi32(x->seed[i * LANES + L]), u,
                                                      _mm512_set1_epi32(yq));
                acc[t][L] = _mm512_fmadd_ps(ds[t], _mm512_cvtepi32_ps(s), acc[t][L]);
            }
        }
    }
    for (int t = 0; t < TT; t++) {
        const __m512 *v = acc[t];
        const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(v[0], v[4]), _mm512_add_ps(v[2], v[6])),
                                       _mm512_add_ps(_mm512_add_ps(v[1], v[5]), _mm512_add_ps(v[3], v[7])));
        _mm512_storeu_ps(y + (t0 + t) * n_out, s);
    }
}

#define PANEL512(NAME, TYPE)                                                                   \
    T512 static void NAME(const ptype_t *p, const uint8_t *panel, const acts_t *x, int64_t t0,  \
                          int T, float *y, int64_t n_out) {                                      \
        for (; T >= TOK_TT; T -= TOK_TT, t0 += TOK_TT)                                          \
            panel512_tt(p, TYPE, panel, x, t0, TOK_TT, y, n_out);                               \
        if (T) panel512_tt(p, TYPE, panel, x, t0, 1, y, n_out);                                 \
    }
_Static_assert(TOK_TT == 2, "PANEL512's remainder is one token");
PANEL512(panel512_q8_0, MUSER_ID_Q8_0)
PANEL512(panel512_q4_0, MUSER_ID_Q4_0)
PANEL512(panel512_q5_0, MUSER_ID_Q5_0)

/* ---- AVX2 -------------------------------------------------------------------------- */

#define T256 __attribute__((target("avx2,fma,f16c")))

/* Lane L of rows 8h .. 8h+7 of block g: the unsigned bytes (Q8_0: |w|), and
 * for Q8_0 the signed codes themselves in *w (to move their sign onto x). */
T256 static inline __attribute__((always_inline)) __m256i lane256(const uint8_t *g, const int type, int h,
                                                                   int L, __m256i *w) {
    if (type == MUSER_ID_Q8_0) {
        *w = _mm256_loadu_si256((const __m256i *)(g + PACKED_ROWS * MUSER_Q8_0_QS + 64 * L + 32 * h));
        return _mm256_sign_epi8(*w, *w);
    }
    const int qs = type == MUSER_ID_Q5_0 ? MUSER_Q5_0_QS : MUSER_Q4_0_QS;
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(g + PACKED_ROWS * qs + 64 * (L & 3) + 32 * h));
    __m256i u = _mm256_and_si256(L < 4 ? raw : _mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0xF));
    if (type == MUSER_ID_Q5_0) {
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(g + PACKED_ROWS * MUSER_Q5_0_QH + 32 * h));
        const __m256i rep = _mm256_shuffle_epi8(
            qh, _mm256_add_epi8(_mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404,
                                                  0x08080808, 0x0C0C0C0C),
                                _mm256_set1_epi8((char)(L >> 1))));
        const __m256i bit = _mm256_set1_epi32((int)(0x08040201u << (4 * (L & 1))));
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(rep, bit), bit);
        u = _mm256_or_si256(u, _mm256_and_si256(set, _mm256_set1_epi8(16)));
    }
    return u;
}

T256 static inline __attribute__((always_inline)) void panel256(const ptype_t *p, const int type,
                                                               const uint8_t *panel, const acts_t *x,
                                                               int64_t t0, int T, float *y, int64_t n_out) {
    const int bytes = PACKED_ROWS * p->bytes;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < 2; h++) {
            __m256 acc[LANES];
            for (int L = 0; L < LANES; L++) acc[L] = _mm256_setzero_ps();
            for (int64_t b = 0; b < x->nb; b++) {
                const uint8_t *g = panel + b * bytes;
                const int64_t i = (t0 + t) * x->nb + b;
                const __m256 ds = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 16 * h))),
                                                _mm256_set1_ps(x->a[i].d));
                for (int L = 0; L < LANES; L++) {
                    __m256i w;
                    const __m256i u = lane256(g, type, h, L, &w);
                    int32_t yq;
                    memcpy(&yq, x->a[i].qs + 4 * L, 4);
                    __m256i yv = _mm256_set1_epi32(yq), s;
                    if (type == MUSER_ID_Q8_0) {
                        s = _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(yv, w)), ones);
                    } else {
                        s = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(u, yv), ones),
                                             _mm256_set1_epi32(x->seed[i * LANES + L]));
                    }
                    acc[L] = _mm256_fmadd_ps(ds, _mm256_cvtepi32_ps(s), acc[L]);
                }
            }
            const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6])),
                                           _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7])));
            _mm256_storeu_ps(y + (t0 + t) * n_out + 8 * h, s);
        }
}

#define PANEL256(NAME, TYPE)                                                                   \
    T256 static void NAME(const ptype_t *p, const uint8_t *panel, const acts_t *x, int64_t t0,  \
                          int T, float *y, int64_t n_out) {                                      \
        panel256(p, TYPE, panel, x, t0, T, y, n_out);                                           \
    }
PANEL256(panel256_q8_0, MUSER_ID_Q8_0)
PANEL256(panel256_q4_0, MUSER_ID_Q4_0)
PANEL256(panel256_q5_0, MUSER_ID_Q5_0)
#endif /* __x86_64__ */

/* ---- dispatch ------------------------------------------------------------------------ */

typedef void (*panel_fn)(const ptype_t *, const uint8_t *, const acts_t *, int64_t, int, float *, int64_t);

static int cpu_isa(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return ISA_AVX2;
#endif
    return ISA_C;
}

static int isa = -1;    /* the kernels in use: the CPU's best unless a test forced a lower one */

/* force < 0: the ISA in use (0 plain C, 1 AVX2, 2 AVX-512 VNNI); else use ISA
 * `force`, refused (-1) when the CPU lacks it. Not for use while a matmul runs. */
int muser_packed_isa(int force) {
    const int best = cpu_isa();
    if (isa < 0) isa = best;
    if (force < 0) return isa;
    if (force > best) return -1;
    return isa = force;
}

static panel_fn panel_for(int type) {
    if (isa < 0) isa = cpu_isa();
#if defined(__x86_64__)
    if (isa == ISA_AVX512)
        return type == MUSER_ID_Q8_0 ? panel512_q8_0 : type == MUSER_ID_Q4_0 ? panel512_q4_0 : panel512_q5_0;
    if (isa == ISA_AVX2)
        return type == MUSER_ID_Q8_0 ? panel256_q8_0 : type == MUSER_ID_Q4_0 ? panel256_q4_0 : panel256_q5_0;
#endif
    (void)type;
    return panel_c;
}

/* ---- the matmul ------------------------------------------------------------------------ */

typedef struct {
    const ptype_t *p;
    panel_fn panel;
    const uint8_t *packed;
    acts_t x;
    int64_t T, n_out;
    float *y;
} packed_job;

static void packed_task(const void *ctx, int64_t g0, int64_t g1) {
    const packed_job *j = ctx;
    const int64_t panel_bytes = PACKED_ROWS * j->x.nb * j->p->bytes;
    for (int64_t g = g0; g < g1; g++)
        j->panel(j->p, j->packed + g * panel_bytes, &j->x, 0, (int)j->T, j->y + g * PACKED_ROWS, j->n_out);
}

/* y[T, n_out] = x[T, n_in] @ W.T in ggml's numerics, W repacked as above: -1 for a
 * type without a packed kernel or a bad width, -2 when memory runs out. */
int muser_matmul_q8p(int type, const uint8_t *packed, int64_t n_out, int64_t n_in, const float *x,
                     int64_t T, float *y, int nthreads) {
    if (isa < 0) isa = cpu_isa();
    if (type == MUSER_ID_Q6_K || type == MUSER_ID_Q4_K)
        return n_in % QK_K || n_in <= 0 || T < 1 ? -1
                                                 : matmul_k_packed(type, packed, n_out, n_in, x, T, y, nthreads, isa);
    const ptype_t *p = ptype_for(type);
    const type_entry_t *k = type_entry_for(type);
    if (!p || !k || n_in % QK_LEGACY || n_in <= 0 || T < 1) return -1;
    const int64_t nb = n_in / QK_LEGACY;
    act32_t *a = malloc(sizeof(act32_t) * (size_t)(T * nb));
    int32_t *seed = malloc(sizeof(int32_t) * (size_t)(T * nb * LANES));
    if (!a || !seed) {
        free(a), free(seed);
        return -2;
    }
    for (int64_t t = 0; t < T; t++) {
        quantize_act_q8_0(x + t * n_in, n_in, a + t * nb, 0);
        for (int64_t b = 0; b < nb; b++)
            for (int L = 0; L < LANES; L++) {
                const int8_t *q = a[t * nb + b].qs + 4 * L;
                seed[(t * nb + b) * LANES + L] = -p->off * (q[0] + q[1] + q[2] + q[3]);
            }
    }
    const int64_t groups = n_out / PACKED_ROWS;
    const packed_job j = {p, panel_for(type), packed, {a, seed, nb}, T, n_out, y};
    parallel_for(packed_task, &j, groups, nthreads);
    /* the rows after the last group, in the file's layout: the row kernel (same order) */
    const int64_t row_bytes = nb * p->bytes;
    const uint8_t *tail = packed + groups * PACKED_ROWS * row_bytes;
    for (int64_t r = groups * PACKED_ROWS; r < n_out; r++, tail += row_bytes)
        for (int64_t t0 = 0; t0 < T; t0 += QDOT_TOKENS) {
            const int n = T - t0 < QDOT_TOKENS ? (int)(T - t0) : QDOT_TOKENS;
            float out[QDOT_TOKENS];
            k->qdot(tail, (const uint8_t *)(a + t0 * nb), nb * (int64_t)sizeof(act32_t), nb, n, out);
            for (int t = 0; t < n; t++) y[(t0 + t) * n_out + r] = out[t];
        }
    free(a), free(seed);
    return 0;
}

int muser_packed_rows(void) { return PACKED_ROWS; }
