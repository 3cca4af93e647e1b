/* One decode step of a transformer block, whole, for B sequences of one
 * token each (models/native_step.py builds the block from the model's
 * modules and calls it; models/parts.py is the same block in torch, and
 * the tests hold the two together).
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
 * A step of one token attends over the entries [0, min(length + 1, capacity))
 * after its own write: every filled entry of a ring is within the window
 * (models/parts.py: Attention.make_mask gives the same set).
 */
#include <math.h>
#include <stdlib.h>

#include "kernels.h"

/* How a projection multiplies (ops/cpu: qmatmul, qmatmul_ggml). */
enum { MUL_FLOAT, MUL_Q8, MUL_ROUNDED };   /* float x; Q8 activations and integer dots;
                                              x rounded to the weight's F16/BF16, then float */

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

/* ---- projections -------------------------------------------------------------------------- */

int muser_matmul(int type, const uint8_t *packed, const uint8_t *scales, const float *lut,
                 float s2, int64_t n_out, int64_t n_in, const float *x, int64_t T, float *y,
                 int nthreads);
int muser_matmul_q8(int type, const uint8_t *packed, int64_t n_out, int64_t n_in, const float *x,
                    int64_t T, float *y, int nthreads);

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

int muser_linear(const linear_t *l, const float *x, int64_t T, float *y, int nthreads,
                 int64_t min_bytes) {
    const type_entry_t *k = type_entry_for(l->type);
    if (!k) return -1;
    int64_t work = l->n_out * (l->n_in / k->elems) * k->bytes;
    if (l->mul == MUL_Q8 && T / 4 > 1) work *= T / 4;
    int64_t th = work / min_bytes;
    th = th < 1 ? 1 : th > nthreads ? nthreads : th;
    int rc;
    if (l->mul == MUL_Q8) {
        rc = muser_matmul_q8(l->type, l->packed, l->n_out, l->n_in, x, T, y, (int)th);
    } else if (l->mul == MUL_ROUNDED) {
        float *xr = malloc(sizeof(float) * T * l->n_in);
        if (!xr) return -2;
        for (int64_t i = 0; i < T * l->n_in; i++)
            xr[i] = l->type == MUSER_ID_BF16 ? bf16_round(x[i]) : f16_round(x[i]);
        rc = muser_matmul(l->type, l->packed, l->scales, l->lut, l->s2, l->n_out, l->n_in, xr, T,
                          y, (int)th);
        free(xr);
    } else {
        rc = muser_matmul(l->type, l->packed, l->scales, l->lut, l->s2, l->n_out, l->n_in, x, T,
                          y, (int)th);
    }
    if (rc || !l->bias) return rc;
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < l->n_out; r++) y[t * l->n_out + r] += l->bias[r];
    return 0;
}

/* ---- attention over the ring -------------------------------------------------------------- */

typedef struct {
    const block_t *b;
    const int64_t *slots, *lengths;
    const float *q;          /* [B, n_heads, head_dim] */
    float *o;                /* [B, n_heads, head_dim] */
    float *scores;           /* [B * n_heads, capacity] */
} attn_job;

static void attn_task(const void *ctx, int64_t i0, int64_t i1) {
    const attn_job *j = ctx;
    const block_t *b = j->b;
    const int64_t D = b->head_dim, H = b->n_heads, group = H / b->n_kv;
    for (int64_t item = i0; item < i1; item++) {
        const int64_t bi = item / H, h = item % H, g = h / group;
        const int64_t len = j->lengths[bi] + 1;
        const int64_t n = len < b->capacity ? len : b->capacity;
        const int64_t row = b->n_kv * D;    /* floats per ring entry */
        const float *K = b->k_cache + j->slots[bi] * b->capacity * row + g * D;
        const float *V = b->v_cache + j->slots[bi] * b->capacity * row + g * D;
        const float *q = j->q + (bi * H + h) * D;
        float *s = j->scores + item * b->capacity, *o = j->o + (bi * H + h) * D;
        float mx = -INFINITY;
        for (int64_t i = 0; i < n; i++) {
            s[i] = dot(q, K + i * row, D) * b->scale;
            mx = s[i] > mx ? s[i] : mx;
        }
        float sum = 0.0f;
        for (int64_t i = 0; i < n; i++) sum += (s[i] = expf(s[i] - mx));
        for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            const float p = s[i];
            const float *v = V + i * row;
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
}

/* ---- the block ------------------------------------------------------------------------------ */

/* Floats of scratch a block needs for B rows (the caller allocates it once). */
int64_t muser_block_work(const block_t *b, int64_t B) {
    const int64_t qd = b->n_heads * b->head_dim, kvd = b->n_kv * b->head_dim;
    return B * (2 * b->hidden + 3 * qd + 2 * kvd + 2 * b->ffn + b->n_heads * b->capacity);
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
    const int64_t hid = b->hidden, H = b->n_heads, D = b->head_dim, KV = b->n_kv;
    const int64_t qd = H * D, kvd = KV * D, half = b->n_rot / 2;
    float *xn = work, *q = xn + B * hid, *gate = q + B * qd, *o = gate + B * qd;
    float *k = o + B * qd, *v = k + B * kvd, *a = v + B * kvd, *g = a + B * hid;
    float *u = g + B * b->ffn, *scores = u + B * b->ffn;
    int rc = 0;
    for (int64_t i = 0; i < B; i++)
        if (lengths[i] < 0 || slots[i] < 0) return -3;

    muser_rmsnorm(x, b->attn_norm.w, b->attn_norm.eps, B, hid, xn);
    rc |= muser_linear(&b->wq, xn, B, q, nthreads, min_bytes);
    rc |= muser_linear(&b->wk, xn, B, k, nthreads, min_bytes);
    rc |= muser_linear(&b->wv, xn, B, v, nthreads, min_bytes);
    if (b->wgate.type >= 0) rc |= muser_linear(&b->wgate, xn, B, gate, nthreads, min_bytes);
    if (rc) return rc;
    for (int64_t i = 0; i < B; i++) {
        if (b->q_norm.w) muser_rmsnorm(q + i * qd, b->q_norm.w, b->q_norm.eps, H, D, q + i * qd);
        if (b->k_norm.w) muser_rmsnorm(k + i * kvd, b->k_norm.w, b->k_norm.eps, KV, D, k + i * kvd);
        if (b->rope != ROPE_NONE) {
            for (int64_t h = 0; h < H; h++)
                rope_head(q + i * qd + h * D, b->rope, b->n_rot, cos + i * half, sin + i * half,
                          b->mscale);
            for (int64_t h = 0; h < KV; h++)
                rope_head(k + i * kvd + h * D, b->rope, b->n_rot, cos + i * half, sin + i * half,
                          b->mscale);
        }
        const int64_t entry = (slots[i] * b->capacity + lengths[i] % b->capacity) * kvd;
        memcpy(b->k_cache + entry, k + i * kvd, sizeof(float) * kvd);
        memcpy(b->v_cache + entry, v + i * kvd, sizeof(float) * kvd);
    }
    /* one item per (row, query head); split only when the ring is long enough to pay */
    const attn_job aj = {b, slots, lengths, q, o, scores};
    int64_t kv_read = 0;
    for (int64_t i = 0; i < B; i++) kv_read += (lengths[i] + 1 < b->capacity ? lengths[i] + 1 : b->capacity);
    parallel_for(attn_task, &aj, B * H, kv_read * kvd * 8 >= min_bytes ? nthreads : 1);
    if (b->wgate.type >= 0)
        for (int64_t i = 0; i < B * qd; i++) o[i] *= 1.0f / (1.0f + expf(-gate[i]));
    if ((rc = muser_linear(&b->wo, o, B, a, nthreads, min_bytes))) return rc;
    if (b->post_attn_norm.w) muser_rmsnorm(a, b->post_attn_norm.w, b->post_attn_norm.eps, B, hid, a);
    for (int64_t i = 0; i < B * hid; i++) x[i] += a[i];

    muser_rmsnorm(x, b->ffn_norm.w, b->ffn_norm.eps, B, hid, xn);
    rc |= muser_linear(&b->w_gate, xn, B, g, nthreads, min_bytes);
    rc |= muser_linear(&b->w_up, xn, B, u, nthreads, min_bytes);
    if (rc) return rc;
    for (int64_t i = 0; i < B * b->ffn; i++) g[i] = activate(b->act, g[i]) * u[i];
    if ((rc = muser_linear(&b->w_down, g, B, a, nthreads, min_bytes))) return rc;
    if (b->post_ffw_norm.w) muser_rmsnorm(a, b->post_ffw_norm.w, b->post_ffw_norm.eps, B, hid, a);
    for (int64_t i = 0; i < B * hid; i++) x[i] += a[i];
    return 0;
}
