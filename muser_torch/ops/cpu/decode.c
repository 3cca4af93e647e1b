/* One step of a transformer block, whole: B sequences of one token each
 * (muser_decode_block), or T new tokens of one sequence (muser_extend_block:
 * a speculative verify, a short prompt). ops/cpu/step.py builds the block
 * from models/layer_plan.py's plan of a layer and calls it; models/parts.py is the same
 * block in torch, and the tests hold the two together.
 *
 *   xn = norm(x); q, k, v (, gate) = projections of xn
 *   q, k = per-head norms (optional), then RoPE on their first n_rot features
 *   k, v -> the cache ring at entry position % capacity of the sequence's slot
 *   o = softmax(q.K * scale) V over the ring's filled entries (GQA); o *= sigmoid(gate)
 *   x = x + post_norm(wo o)                  (post norms: optional, "sandwich")
 *   x = x + post_norm(w_down(act(w_gate xn') * w_up xn')),  xn' = norm(x)
 *
 * The projections run the library's own matmuls (muser_matmul, or in ggml's
 * numerics muser_matmul_q8, or muser_matmul on x rounded to F16/BF16 as
 * ops/cpu's qmatmul_ggml does), so they give exactly what the op gives. Everything else is float32 element-wise arithmetic in torch's order
 * of operations (RoPE, the activations, residuals); the norms sum squares in
 * double and the attention sums in 8 float lanes, so those differ from
 * torch's reductions by rounding only.
 *
 * A block with `ggml` set (its projections run in ggml's numerics) does the rest
 * as ggml-cpu does too (llama.cpp's CPU graph: docs/cpu.md, "Whole model against
 * llama.cpp"): norms summing squares in double one by one, RoPE angles by
 * ggml's running product and the rotation with its fused multiply-adds, K and V
 * rounded to f16 (llama.cpp's f16 cache), attention as its flash attention
 * (q rounded to f16, f16 dot products in the order of the build's SIMD width,
 * an online softmax accumulating V in f16) and GELU through its f16 table.
 *
 * A step of one token attends over the entries [0, min(length + 1, capacity))
 * after its own write: every filled entry of a ring is within the window
 * (models/parts.py: Attention.make_mask gives the same set). An extension
 * attends before it writes (extend_task says over what).
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "kernels.h"

/* How a projection multiplies (ops/cpu: qmatmul, qmatmul_ggml). */
enum { MUL_FLOAT, MUL_Q8, MUL_ROUNDED, MUL_Q8P };   /* float x; Q8 activations and integer dots;
                                                       x rounded to the weight's F16/BF16, then float;
                                                       MUL_Q8 on the repacked weight (qdot_packed.c) */

typedef struct {             /* one projection; type < 0: absent */
    int type, mul;           /* GGMLType id; MUL_* */
    const uint8_t *packed, *scales;
    const float *lut;
    float s2;
    int64_t n_out, n_in;
    const float *bias;       /* [n_out] or NULL */
} linear_t;

typedef struct {             /* an RMSNorm; w NULL: absent */
    const float *w;
    float eps;
} norm_t;

enum { ROPE_NONE, ROPE_NEOX, ROPE_NORMAL };
enum { ACT_SILU, ACT_GELU_TANH };

typedef struct {
    int64_t hidden, n_heads, n_kv, head_dim, ffn;
    norm_t attn_norm, q_norm, k_norm, post_attn_norm, ffn_norm, post_ffw_norm;
    linear_t wq, wk, wv, wgate, wo, w_gate, w_up, w_down;
    int rope, act;
    int64_t n_rot;           /* features rotated per head, from the first */
    float mscale, scale;     /* cos and sin are scaled by mscale; q.k by scale */
    float *k_cache, *v_cache;   /* float32 [slots, capacity, n_kv, head_dim] */
    int64_t capacity;
    int ggml;                /* 1: the non-projection arithmetic as ggml-cpu's (see the top) */
    int scale_q;             /* 1: llama.cpp scales q, not q.k (Gemma): ggml's f16 q is of q * scale */
} block_t;

int muser_block_size(void) { return (int)sizeof(block_t); }

/* ---- element-wise pieces ---------------------------------------------------------------- */

static float dot(const float *a, const float *b, int64_t n) {
    v8f acc0 = splat(0.0f), acc1 = splat(0.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 += load8(a + i) * load8(b + i);
        acc1 += load8(a + i + 8) * load8(b + i + 8);
    }
    for (; i + 8 <= n; i += 8) acc0 += load8(a + i) * load8(b + i);
    float s = hsum(acc0 + acc1);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* out = x * (1 / sqrt(mean(x^2) + eps)) * w, as models/parts.py's RMSNorm
 * (w NULL: no weight). In place when out == x. The squares are summed in 16
 * float lanes (as torch sums in lanes), each lane's total then in double. */
static void rmsnorm(const float *x, const float *w, float eps, int64_t n, float *out) {
    v8f s0 = splat(0.0f), s1 = splat(0.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const v8f a = load8(x + i), b = load8(x + i + 8);
        s0 += a * a;
        s1 += b * b;
    }
    double ss = 0.0;
    for (int l = 0; l < 8; l++) ss += (double)s0[l] + (double)s1[l];
    for (; i < n; i++) ss += (double)x[i] * x[i];
    const float r = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int64_t i = 0; i < n; i++) out[i] = w ? (x[i] * r) * w[i] : x[i] * r;
}

/* rows x n, normed in place when out == x */
void muser_rmsnorm(const float *x, const float *w, float eps, int64_t rows, int64_t n, float *out) {
    for (int64_t r = 0; r < rows; r++) rmsnorm(x + r * n, w, eps, n, out + r * n);
}

/* ggml-cpu's rms_norm (then its mul by w): squares summed one by one in double. */
static void rmsnorm_ggml(const float *x, const float *w, float eps, int64_t n, float *out) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)(x[i] * x[i]);
    const float mean = (float)(ss / (double)n);
    const float r = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < n; i++) out[i] = w ? (x[i] * r) * w[i] : x[i] * r;
}

void muser_rmsnorm_ggml(const float *x, const float *w, float eps, int64_t rows, int64_t n, float *out) {
    for (int64_t r = 0; r < rows; r++) rmsnorm_ggml(x + r * n, w, eps, n, out + r * n);
}

static void norm_rows(int ggml, const float *x, const float *w, float eps, int64_t rows, int64_t n,
                      float *out) {
    (ggml ? muser_rmsnorm_ggml : muser_rmsnorm)(x, w, eps, rows, n, out);
}

/* RoPE of one head's first n_rot features: "neox" pairs (i, i + n_rot/2),
 * "normal" (2i, 2i+1); c and s hold n_rot/2 angles' cos and sin. */
static void rope_head(float *h, int mode, int64_t n_rot, const float *c, const float *s,
                      float mscale) {
    const int64_t half = n_rot / 2;
    for (int64_t i = 0; i < half; i++) {
        const float ci = mscale != 1.0f ? c[i] * mscale : c[i];
        const float si = mscale != 1.0f ? s[i] * mscale : s[i];
        float *p1 = mode == ROPE_NEOX ? h + i : h + 2 * i;
        float *p2 = mode == ROPE_NEOX ? h + i + half : h + 2 * i + 1;
        const float x1 = *p1, x2 = *p2;
        *p1 = x1 * ci - x2 * si;
        *p2 = x2 * ci + x1 * si;
    }
}

/* ggml's rotate_pairs over its cache (cos and sin times mscale): the products
 * fused as its build (GCC, contraction on) fuses them. */
static void rope_head_ggml(float *h, int mode, int64_t n_rot, const float *c, const float *s,
                           float mscale) {
    const int64_t half = n_rot / 2;
    for (int64_t i = 0; i < half; i++) {
        const float ci = c[i] * mscale, si = s[i] * mscale;
        float *p1 = mode == ROPE_NEOX ? h + i : h + 2 * i;
        float *p2 = mode == ROPE_NEOX ? h + i + half : h + 2 * i + 1;
        const float x0 = *p1, x1 = *p2;
        *p1 = fmaf(x0, ci, -(x1 * si));
        *p2 = fmaf(x0, si, x1 * ci);
    }
}

/* cos and sin [B, half] as ggml's rope cache makes them: theta starts at the
 * position and is multiplied by theta_scale (base^(-2/n_rot), as powf gives it)
 * pair by pair in float, then times freq_scale (linear scaling); mscale 1. */
void muser_rope_angles_ggml(const int64_t *positions, int64_t B, float theta_scale, float freq_scale,
                            int64_t half, float *cos_out, float *sin_out) {
    for (int64_t b = 0; b < B; b++) {
        float theta = (float)positions[b];
        for (int64_t i = 0; i < half; i++) {
            const float a = freq_scale * theta;
            cos_out[b * half + i] = cosf(a);
            sin_out[b * half + i] = sinf(a);
            theta *= theta_scale;
        }
    }
}

/* cos and sin [B, half] of the angles positions[b] * inv_freq[i], as
 * models/parts.py's rope_angles makes them (float32 product, then cos, sin). */
void muser_rope_angles(const int64_t *positions, int64_t B, const float *inv_freq, int64_t half,
                       float *cos_out, float *sin_out) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < half; i++) {
            const float a = (float)positions[b] * inv_freq[i];
            cos_out[b * half + i] = cosf(a);
            sin_out[b * half + i] = sinf(a);
        }
}

static float activate(int act, float g) {
    if (act == ACT_SILU) return g / (1.0f + expf(-g));
    /* GELU, tanh approximation, in torch's order of operations */
    const float beta = (float)(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = 0.044715f;
    const float inner = beta * (g + kappa * (g * g * g));
    return 0.5f * g * (1.0f + tanhf(inner));
}

/* ggml-cpu's GELU (tanh form) with its build's one fused multiply-add, in float. */
static float gelu_ggml_f32(float x) {
    const float a = 0.044715f, s2p = 0.79788456080286535587989211986876f;
    return 0.5f * x * (1.0f + tanhf(s2p * x * fmaf(a * x, x, 1.0f)));
}

/* ggml_vec_geglu_f32 with GGML_GELU_FP16: the gate rounded to f16 looks up the
 * f16 table of gelu_ggml_f32, 0 and x past -10 and 10. The table is made once,
 * as ggml makes its own: entry h is f16(gelu_ggml_f32(the f16 value h)), the
 * value a tanhf per element gave (about a tenth of a ggml-numerics prefill). */
static float GELU_F16[1 << 16];
static pthread_once_t gelu_once = PTHREAD_ONCE_INIT;

static void gelu_table_init(void) {
    for (uint32_t h = 0; h < (1u << 16); h++) {
        const uint8_t b[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
        GELU_F16[h] = f16_round(gelu_ggml_f32(f16(b)));
    }
}

static inline float geglu_ggml(float g, float u) {
    if (g <= -10.0f) return 0.0f;
    if (g >= 10.0f) return g * u;
    return GELU_F16[f16_bits(g)] * u;
}

/* ---- projections -------------------------------------------------------------------------- */

int muser_matmul(int type, const uint8_t *packed, const uint8_t *scales, const float *lut,
                 float s2, int64_t n_out, int64_t n_in, const float *x, int64_t T, float *y,
                 int nthreads);
int muser_matmul_q8(int type, const uint8_t *packed, int64_t n_out, int64_t n_in, const float *x,
                    int64_t T, float *y, int nthreads);
int muser_matmul_q8p(int type, const uint8_t *packed, int64_t n_out, int64_t n_in, const float *x,
                     int64_t T, float *y, int nthreads);
int muser_gemm(int type, const uint8_t *packed, const uint8_t *scales, const float *lut, float s2,
               int64_t n_out, int64_t n_in, const float *x, int64_t T, float *y, int nthreads);

/* y[T, n_out] = x[T, n_in] @ W.T (+ bias), on as many threads as the op
 * would take (ops/cpu: at least min_bytes of weights per thread); also the
 * eager path of QLinear (ops/cpu/eager.py). */
/* x as torch rounds float32 to bfloat16 (nearest even; NaN to 0x7FC0). */
static float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC00000u : ((u + ((u >> 16) & 1u) + 0x7FFFu) >> 16) << 16;
    memcpy(&f, &u, 4);
    return f;
}

/* The float kernels as the op's ladder picks them: fused up to its top rung,
 * the GEMM above. */
static int float_matmul(const linear_t *l, const float *x, int64_t T, float *y, int th) {
    return T > MUSER_FUSED_MAX_TOKENS
        ? muser_gemm(l->type, l->packed, l->scales, l->lut, l->s2, l->n_out, l->n_in, x, T, y, th)
        : muser_matmul(l->type, l->packed, l->scales, l->lut, l->s2, l->n_out, l->n_in, x, T, y, th);
}

int muser_linear(const linear_t *l, const float *x, int64_t T, float *y, int nthreads,
                 int64_t min_bytes) {
    const type_entry_t *k = type_entry_for(l->type);
    if (!k) return -1;
    int64_t work = l->n_out * (l->n_in / k->elems) * k->bytes;
    if ((l->mul == MUL_Q8 || l->mul == MUL_Q8P) && T / 4 > 1) work *= T / 4;
    int64_t th = work / min_bytes;
    th = th < 1 ? 1 : th > nthreads ? nthreads : th;
    int rc;
    if (l->mul == MUL_Q8) {
        rc = muser_matmul_q8(l->type, l->packed, l->n_out, l->n_in, x, T, y, (int)th);
    } else if (l->mul == MUL_Q8P) {
        rc = muser_matmul_q8p(l->type, l->packed, l->n_out, l->n_in, x, T, y, (int)th);
    } else if (l->mul == MUL_ROUNDED) {
        float *xr = malloc(sizeof(float) * T * l->n_in);
        if (!xr) return -2;
        for (int64_t i = 0; i < T * l->n_in; i++)
            xr[i] = l->type == MUSER_ID_BF16 ? bf16_round(x[i]) : f16_round(x[i]);
        rc = float_matmul(l, xr, T, y, (int)th);
        free(xr);
    } else {
        rc = float_matmul(l, x, T, y, (int)th);
    }
    if (rc || !l->bias) return rc;
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < l->n_out; r++) y[t * l->n_out + r] += l->bias[r];
    return 0;
}

/* ---- attention over the ring -------------------------------------------------------------- */

typedef struct {
    const block_t *b;
    const int64_t *slots, *lengths;   /* a decode step: row i's slot and cached length */
    int64_t slot, length;             /* an extension: the one slot and its length before it */
    const float *q;          /* [rows, n_heads, head_dim] */
    const float *k, *v;      /* an extension's new keys and values [rows, n_kv, head_dim] */
    float *o;                /* [rows, n_heads, head_dim] */
    float *scores;           /* [rows * n_heads, stride] */
    int64_t stride;
} attn_job;

/* o = softmax(s) V over n keys, s[i] = -inf for a key the query does not see;
 * value i is ring entry i of V0 for i < n_ring, else new row i - n_ring of Vnew. */
static void softmax_values(float *s, int64_t n, float *o, int64_t D, const float *V0,
                           int64_t n_ring, int64_t row, const float *Vnew) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = s[i] > mx ? s[i] : mx;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += (s[i] = expf(s[i] - mx));
    for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const float p = s[i];
        if (p == 0.0f) continue;
        const float *v = i < n_ring ? V0 + i * row : Vnew + (i - n_ring) * row;
        int64_t d = 0;
        for (; d + 8 <= D; d += 8) {
            v8f acc = load8(o + d) + splat(p) * load8(v + d);
            memcpy(o + d, &acc, 32);
        }
        for (; d < D; d++) o[d] += p * v[d];
    }
    const float inv = 1.0f / sum;
    for (int64_t d = 0; d < D; d++) o[d] *= inv;
}

/* ggml's CPU flash attention for one query row (ggml_compute_forward_flash_attn_ext_f16's
 * one_chunk path: fewer than 64 query rows; attn_f16.c): q rounded to f16, each
 * visible key in turn scored and folded into an online softmax whose V sum is
 * kept in f16. Starts a row: qh = q (times the scale when the block scales q)
 * rounded to f16; returns the scale the scores then take. */
static float fa_begin(const block_t *b, fa_t *st, float *acc, float *qh, const float *q, int64_t D) {
    st->M = -INFINITY, st->S = 0.0f;
    for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
    f16_round_scaled(q, b->scale_q ? b->scale : 1.0f, qh, D);   /* x * 1 is x */
    return b->scale_q ? 1.0f : b->scale;
}

/* A decode step: row bi's token attends over its ring after its own write. */
static void attn_task(const void *ctx, int64_t i0, int64_t i1) {
    const attn_job *j = ctx;
    const block_t *b = j->b;
    const int64_t D = b->head_dim, H = b->n_heads, group = H / b->n_kv;
    const int64_t row = b->n_kv * D;    /* floats per ring entry */
    for (int64_t item = i0; item < i1; item++) {
        const int64_t bi = item / H, h = item % H, g = h / group;
        const int64_t len = j->lengths[bi] + 1;
        const int64_t n = len < b->capacity ? len : b->capacity;
        const float *K = b->k_cache + j->slots[bi] * b->capacity * row + g * D;
        const float *V = b->v_cache + j->slots[bi] * b->capacity * row + g * D;
        const float *q = j->q + (bi * H + h) * D;
        float *s = j->scores + item * j->stride, *o = j->o + (bi * H + h) * D;
        if (b->ggml) {   /* the scores' row holds q as f16 */
            fa_t st;
            const float scale = fa_begin(b, &st, o, s, q, D);
            for (int64_t i = 0; i < n; i++)
                fa_key(&st, o, s, K + i * row, V + i * row, D, scale, GGML_F16_WIDTH);
            fa_end(&st, o, D);
            continue;
        }
        for (int64_t i = 0; i < n; i++) s[i] = dot(q, K + i * row, D) * b->scale;
        softmax_values(s, n, o, D, V, n, row, NULL);
    }
}

/* An extension: new row i (position length + i) attends, before any write,
 * over the ring's entries whose position is within the last `capacity`
 * positions up to its own (entry e holds position e + capacity *
 * floor((length-1-e) / capacity)), then over new rows 0..i within the same
 * reach. For a sliding layer the capacity is the window; a global layer's
 * ring holds every position (Decoder.check_room), so this is causal
 * attention within the window, as Attention.make_mask gives it. */
static void extend_task(const void *ctx, int64_t i0, int64_t i1) {
    const attn_job *j = ctx;
    const block_t *b = j->b;
    const int64_t D = b->head_dim, H = b->n_heads, group = H / b->n_kv, cap = b->capacity;
    const int64_t row = b->n_kv * D, L = j->length;
    const int64_t filled = L < cap ? L : cap;
    for (int64_t item = i0; item < i1; item++) {
        const int64_t i = item / H, h = item % H, g = h / group;
        const int64_t lowest = L + i - cap + 1;          /* the oldest position row i sees */
        const float *K = b->k_cache + j->slot * cap * row + g * D;
        const float *V = b->v_cache + j->slot * cap * row + g * D;
        const float *q = j->q + (i * H + h) * D;
        float *s = j->scores + item * j->stride, *o = j->o + (i * H + h) * D;
        if (b->ggml) {   /* the visible keys in position order (the ring has not wrapped past them) */
            fa_t st;
            const float scale = fa_begin(b, &st, o, s, q, D);
            for (int64_t e = 0; e < filled; e++)
                if (e + cap * ((L - 1 - e) / cap) >= lowest)
                    fa_key(&st, o, s, K + e * row, V + e * row, D, scale, GGML_F16_WIDTH);
            for (int64_t r = 0; r <= i; r++)
                if (L + r >= lowest)
                    fa_key(&st, o, s, j->k + r * row + g * D, j->v + r * row + g * D, D, scale,
                           GGML_F16_WIDTH);
            fa_end(&st, o, D);
            continue;
        }
        for (int64_t e = 0; e < filled; e++) {
            const int64_t pos = e + cap * ((L - 1 - e) / cap);
            s[e] = pos >= lowest ? dot(q, K + e * row, D) * b->scale : -INFINITY;
        }
        for (int64_t r = 0; r <= i; r++)
            s[filled + r] = L + r >= lowest ? dot(q, j->k + r * row + g * D, D) * b->scale : -INFINITY;
        softmax_values(s, filled + i + 1, o, D, V, filled, row, j->v + g * D);
    }
}

/* ---- the block ------------------------------------------------------------------------------ */

/* Floats per (row, head) for the attention's scores (or, in ggml's attention, q as f16). */
static int64_t score_stride(const block_t *b, int64_t B) {
    return b->capacity + B > b->head_dim ? b->capacity + B : b->head_dim;
}

/* Floats of scratch a block needs for B rows (the caller allocates it once):
 * enough for B sequences of one token or one sequence of B new tokens. */
int64_t muser_block_work(const block_t *b, int64_t B) {
    const int64_t qd = b->n_heads * b->head_dim, kvd = b->n_kv * b->head_dim;
    return B * (2 * b->hidden + 3 * qd + 2 * kvd + 2 * b->ffn + b->n_heads * score_stride(b, B));
}

typedef struct { float *xn, *q, *gate, *o, *k, *v, *a, *g, *u, *scores; } scratch_t;

static scratch_t carve(const block_t *b, int64_t B, float *work) {
    const int64_t qd = b->n_heads * b->head_dim, kvd = b->n_kv * b->head_dim;
    scratch_t w;
    w.xn = work; w.q = w.xn + B * b->hidden; w.gate = w.q + B * qd; w.o = w.gate + B * qd;
    w.k = w.o + B * qd; w.v = w.k + B * kvd; w.a = w.v + B * kvd; w.g = w.a + B * b->hidden;
    w.u = w.g + B * b->ffn; w.scores = w.u + B * b->ffn;
    return w;
}

/* The attention's inputs of B rows: norm, projections, per-head norms, RoPE
 * (cos and sin [B, n_rot/2]: row i's angles). */
static int attention_inputs(const block_t *b, const float *x, int64_t B, const float *cos,
                            const float *sin, const scratch_t *w, int nthreads, int64_t min_bytes) {
    const int64_t H = b->n_heads, D = b->head_dim, KV = b->n_kv, qd = H * D, kvd = KV * D;
    const int64_t half = b->n_rot / 2;
    int rc = 0;
    norm_rows(b->ggml, x, b->attn_norm.w, b->attn_norm.eps, B, b->hidden, w->xn);
    rc |= muser_linear(&b->wq, w->xn, B, w->q, nthreads, min_bytes);
    rc |= muser_linear(&b->wk, w->xn, B, w->k, nthreads, min_bytes);
    rc |= muser_linear(&b->wv, w->xn, B, w->v, nthreads, min_bytes);
    if (b->wgate.type >= 0) rc |= muser_linear(&b->wgate, w->xn, B, w->gate, nthreads, min_bytes);
    if (rc) return rc;
    for (int64_t i = 0; i < B; i++) {
        float *q = w->q + i * qd, *k = w->k + i * kvd;
        if (b->q_norm.w) norm_rows(b->ggml, q, b->q_norm.w, b->q_norm.eps, H, D, q);
        if (b->k_norm.w) norm_rows(b->ggml, k, b->k_norm.w, b->k_norm.eps, KV, D, k);
        if (b->rope != ROPE_NONE) {
            const float *c = cos + i * half, *s = sin + i * half;
            for (int64_t h = 0; h < H + KV; h++) {
                float *v = h < H ? q + h * D : k + (h - H) * D;
                if (b->ggml) rope_head_ggml(v, b->rope, b->n_rot, c, s, b->mscale);
                else rope_head(v, b->rope, b->n_rot, c, s, b->mscale);
            }
        }
        if (b->ggml) {   /* llama.cpp's f16 cache: K and V as f16 from here on */
            float *v = w->v + i * kvd;
            f16_round_scaled(k, 1.0f, k, kvd);
            f16_round_scaled(v, 1.0f, v, kvd);
        }
    }
    return 0;
}

/* After the attention (o): the output gate, wo, the residuals and the MLP. */
static int attention_out_and_mlp(const block_t *b, float *x, int64_t B, const scratch_t *w,
                                 int nthreads, int64_t min_bytes) {
    const int64_t hid = b->hidden, qd = b->n_heads * b->head_dim;
    int rc = 0;
    if (b->wgate.type >= 0)
        for (int64_t i = 0; i < B * qd; i++) w->o[i] *= 1.0f / (1.0f + expf(-w->gate[i]));
    if ((rc = muser_linear(&b->wo, w->o, B, w->a, nthreads, min_bytes))) return rc;
    if (b->post_attn_norm.w) norm_rows(b->ggml, w->a, b->post_attn_norm.w, b->post_attn_norm.eps, B, hid, w->a);
    for (int64_t i = 0; i < B * hid; i++) x[i] += w->a[i];

    norm_rows(b->ggml, x, b->ffn_norm.w, b->ffn_norm.eps, B, hid, w->xn);
    rc |= muser_linear(&b->w_gate, w->xn, B, w->g, nthreads, min_bytes);
    rc |= muser_linear(&b->w_up, w->xn, B, w->u, nthreads, min_bytes);
    if (rc) return rc;
    if (b->ggml && b->act == ACT_GELU_TANH) {
        pthread_once(&gelu_once, gelu_table_init);
        for (int64_t i = 0; i < B * b->ffn; i++) w->g[i] = geglu_ggml(w->g[i], w->u[i]);
    } else {
        for (int64_t i = 0; i < B * b->ffn; i++) w->g[i] = activate(b->act, w->g[i]) * w->u[i];
    }
    if ((rc = muser_linear(&b->w_down, w->g, B, w->a, nthreads, min_bytes))) return rc;
    if (b->post_ffw_norm.w) norm_rows(b->ggml, w->a, b->post_ffw_norm.w, b->post_ffw_norm.eps, B, hid, w->a);
    for (int64_t i = 0; i < B * hid; i++) x[i] += w->a[i];
    return 0;
}

static void store_kv(const block_t *b, int64_t slot, int64_t position, const float *k, const float *v) {
    const int64_t kvd = b->n_kv * b->head_dim;
    const int64_t entry = (slot * b->capacity + position % b->capacity) * kvd;
    memcpy(b->k_cache + entry, k, sizeof(float) * kvd);
    memcpy(b->v_cache + entry, v, sizeof(float) * kvd);
}

/* x [B, hidden] (float32) becomes the block's output, in place. Row i is
 * the next token of the sequence in cache slot slots[i], holding lengths[i]
 * tokens before this step; cos and sin [B, n_rot/2] are its position's
 * angles. `work` holds muser_block_work(b, B) floats. Returns 0, or -1 for a
 * projection the library does not run, -2 when scratch cannot be allocated,
 * -3 for a negative length or slot. */
int muser_decode_block(const block_t *b, float *x, int64_t B, const int64_t *slots,
                       const int64_t *lengths, const float *cos, const float *sin, float *work,
                       int nthreads, int64_t min_bytes) {
    const int64_t H = b->n_heads, kvd = b->n_kv * b->head_dim;
    const scratch_t w = carve(b, B, work);
    int rc;
    for (int64_t i = 0; i < B; i++)
        if (lengths[i] < 0 || slots[i] < 0) return -3;
    if ((rc = attention_inputs(b, x, B, cos, sin, &w, nthreads, min_bytes))) return rc;
    for (int64_t i = 0; i < B; i++) store_kv(b, slots[i], lengths[i], w.k + i * kvd, w.v + i * kvd);
    /* one item per (row, query head); split only when the ring is long enough to pay */
    const attn_job aj = {.b = b, .slots = slots, .lengths = lengths, .q = w.q, .o = w.o,
                         .scores = w.scores, .stride = score_stride(b, B)};
    int64_t kv_read = 0;
    for (int64_t i = 0; i < B; i++) kv_read += (lengths[i] + 1 < b->capacity ? lengths[i] + 1 : b->capacity);
    parallel_for(attn_task, &aj, B * H, kv_read * kvd * 8 >= min_bytes ? nthreads : 1);
    return attention_out_and_mlp(b, x, B, &w, nthreads, min_bytes);
}

/* x [T, hidden] becomes the block's output, in place: T new tokens of the one
 * sequence in cache slot `slot`, which holds `length` tokens before them
 * (a prefill chunk, or a speculative verify). cos and sin [T, n_rot/2] are
 * positions length .. length+T-1's angles; `work` holds muser_block_work(b, T)
 * floats. The rows attend first (extend_task), then the last min(T,
 * capacity) of them are stored, so no row loses a key it needs. Returns as
 * muser_decode_block does. */
int muser_extend_block(const block_t *b, float *x, int64_t T, int64_t slot, int64_t length,
                       const float *cos, const float *sin, float *work, int nthreads,
                       int64_t min_bytes) {
    const int64_t H = b->n_heads, kvd = b->n_kv * b->head_dim;
    const scratch_t w = carve(b, T, work);
    int rc;
    if (length < 0 || slot < 0) return -3;
    if ((rc = attention_inputs(b, x, T, cos, sin, &w, nthreads, min_bytes))) return rc;
    const attn_job aj = {.b = b, .slot = slot, .length = length, .q = w.q, .k = w.k, .v = w.v,
                         .o = w.o, .scores = w.scores, .stride = score_stride(b, T)};
    const int64_t filled = length < b->capacity ? length : b->capacity;
    parallel_for(extend_task, &aj, T * H, T * (filled + T) * kvd * 8 >= min_bytes ? nthreads : 1);
    for (int64_t i = T > b->capacity ? T - b->capacity : 0; i < T; i++)
        store_kv(b, slot, length + i, w.k + i * kvd, w.v + i * kvd);
    return attention_out_and_mlp(b, x, T, &w, nthreads, min_bytes);
}
