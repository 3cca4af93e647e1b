/* muser_gemm: many activation rows.
 *
 * y[t, r] = sum_i x[t, i] * W[r, i] for any T (cpu.py uses it above its
 * FUSED_MAX_TOKENS, where it measured 2-4x faster than the fused kernel or
 * torch's matmul on dequantized tiles). A register-blocked GEMM over the
 * packed bytes, read (and decoded) once for all T tokens:
 *  - x is first packed into token panels of GT tokens (the last one GV or GT
 *    wide, zero-padded): panel p holds xp[k][j] = x[p*GT + j, k], so the inner
 *    loop streams it with vector loads.
 *  - threads take blocks of GRB weight rows; a block decodes GK columns of
 *    its rows at a time (the type table's tile_fn) into a stack tile, then a
 *    GR-rows x GT-tokens microkernel runs over every token panel, with
 *    accumulators in registers (GR*GNV vectors) and the weights broadcast.
 *  - each GK chunk's sum (float32, in k order, FMA) is added into a per-block
 *    C[r][t] scratch, which is stored transposed into y at the end.
 * Memory: the packed x (about T*n_in floats) and GRB*T floats per thread.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "kernels.h"
#include "simd.h"

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

/* The microkernel for full (GNV vectors) and narrow (one vector) panels, each
 * compiled as a function of its own: inlined into gemm_task, its register
 * allocation followed whatever else gemm_task held, and once (when f16()
 * was inlined there too) it re-read half the activations from memory in every
 * FMA, 10-15% slower at 128 tokens. */
static __attribute__((noinline)) void gemm_micro_full(const float *w, int64_t ldw,
                                                      const float *xp, int64_t kn, float *c,
                                                      int64_t ldc) {
    gemm_micro(w, ldw, xp, kn, GNV, c, ldc);
}
static __attribute__((noinline)) void gemm_micro_narrow(const float *w, int64_t ldw,
                                                        const float *xp, int64_t kn, float *c,
                                                        int64_t ldc) {
    gemm_micro(w, ldw, xp, kn, 1, c, ldc);
}

/* Elements [c0, c0 + n) of one row into w: each type's tile_fn in the type
 * table. The hot types decode 8 at a time in registers as the fused row
 * kernels do (last bits may differ from the reference: Q4_K/Q5_K fuse
 * d*sc*q - dmin*m into one FMA, NVFP4_E2M1 computes e2m1 * (e4m3 * s2)); the
 * scalar reference decoders cost as much as the multiply itself below 64
 * tokens (NVFP4_E2M1: 2x). Without AVX2+FMA every type takes tile_generic. */
#define TILE_ARGS const type_entry_t *k, const uint8_t *row, const uint8_t *crow, const float *lut, \
                  float s2, int64_t c0, int64_t n, float *w

void tile_generic(TILE_ARGS) { decode_span(k, row, crow, lut, s2, c0, n, w); }

#ifdef HAVE_FUSED
void tile_nvfp4_e2m1(TILE_ARGS) {
    (void)k;
    const __m256 table = _mm256_loadu_ps(E2M1);
    for (int64_t b = c0 / NVFP4_GROUP; b < (c0 + n) / NVFP4_GROUP; b++, w += NVFP4_GROUP) {
        v8f w0, w1;
        nvfp4_e2m1_w16(table, row, lut[crow[b]] * s2, b, &w0, &w1);
        memcpy(w, &w0, 32);
        memcpy(w + 8, &w1, 32);
    }
}

/* as row_q45_k: w = fma(d*sc, q, -dmin*m) */
static inline __attribute__((always_inline)) void tile_q45_k(TILE_ARGS, const int five) {
    (void)crow, (void)lut, (void)s2;
    for (int64_t b = c0 / QK_K; b < (c0 + n) / QK_K; b++, w += QK_K) {
        const uint8_t *blk = row + b * k->bytes;
        const uint8_t *qh = blk + MUSER_Q5_K_QH, *qs = blk + Q45_K(five, QS);
        const float d = f16(blk + MUSER_Q4_K_D), dmin = f16(blk + MUSER_Q4_K_DMIN);
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
}
void tile_q4_k(TILE_ARGS) { tile_q45_k(k, row, crow, lut, s2, c0, n, w, 0); }
void tile_q5_k(TILE_ARGS) { tile_q45_k(k, row, crow, lut, s2, c0, n, w, 1); }

/* as row_q6_k */
void tile_q6_k(TILE_ARGS) {
    (void)k, (void)crow, (void)lut, (void)s2;
    for (int64_t b = c0 / QK_K; b < (c0 + n) / QK_K; b++, w += QK_K) {
        const uint8_t *blk = row + b * MUSER_Q6_K_BYTES;
        const float d = f16(blk + MUSER_Q6_K_D);
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
}
#else
void tile_nvfp4_e2m1(TILE_ARGS) { tile_generic(k, row, crow, lut, s2, c0, n, w); }
void tile_q4_k(TILE_ARGS) { tile_generic(k, row, crow, lut, s2, c0, n, w); }
void tile_q5_k(TILE_ARGS) { tile_generic(k, row, crow, lut, s2, c0, n, w); }
void tile_q6_k(TILE_ARGS) { tile_generic(k, row, crow, lut, s2, c0, n, w); }
#endif

typedef struct {
    const type_entry_t *k;
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
    const type_entry_t *k = j->k;
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
                k->tile(k, j->packed + (r0 + r) * j->row_bytes,
                            j->scales ? j->scales + (r0 + r) * spr : 0, j->lut, j->s2, k0, kn,
                            wt + r * GK);
            for (int64_t r = nr; r < groups * GR; r++) memset(wt + r * GK, 0, sizeof(float) * kn);
            for (int64_t p = 0; p < panels; p++) {
                const int64_t wp = panel_width(j, p);
                const float *xpp = j->xp + p * GT * n_in + k0 * wp;
                for (int64_t g = 0; g < groups; g++) {
                    float *cg = c + g * GR * tpad + p * GT;
                    if (wp == GT) gemm_micro_full(wt + g * GR * GK, GK, xpp, kn, cg, tpad);
                    else gemm_micro_narrow(wt + g * GR * GK, GK, xpp, kn, cg, tpad);
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
    const type_entry_t *k = type_entry_for(type);
    if (!k || n_in % k->elems || T < 1) return -1;
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
