// common.metal: the loops every weight format shares.
//
// ops/metal compiles prelude + common.metal + the format files (kquant,
// legacy, nvfp4, floats) as one source. The prelude #defines every block's
// geometry and field offsets from muser_torch/formats/layout.py (MUSER_Q4_K_BYTES,
// MUSER_Q4_K_QS, ...: c_header) and the launch geometry the host uses
// (MUSER_CHUNK, MUSER_MV_*, MUSER_MM_*); the static_asserts check what the
// code below and the decoders assume of them.
//
// A format is a struct F with
//   static long row_bytes(long n_in);
//   static void chunk(device const uchar *row, device const uchar *srow,
//                     float scale_2, uint c, thread float *w);
// where chunk() writes elements 16c .. 16c+15 of one row, exactly as
// muser_torch.dequantize computes them (float32, same operation order).
// `srow` is the row's NVFP4 scale bytes and `scale_2` the global scale; other
// formats ignore both. Every loop below walks a row in these chunks, so only
// the decode differs per format. Chunk and row indices are 32-bit (Apple GPUs
// have no native 64-bit divide); byte offsets are 64-bit.
#include <metal_stdlib>
using namespace metal;

static_assert(MUSER_CHUNK == 16, "decoders produce 16-element chunks");
static_assert(MUSER_MV_LANES == 32, "a simdgroup is 32 lanes");
static_assert(MUSER_MV_THREADS == MUSER_MV_SIMDGROUPS * MUSER_MV_LANES, "mv threadgroup shape");
static_assert(MUSER_MAX_EXT_TOKENS <= 8, "the ext kernel keeps 8 x rows accumulators per lane");
static_assert(MUSER_MM_THREADS == 128 && MUSER_MM_BM == 32 && MUSER_MM_BN == 32,
              "mm_impl assigns 4 simdgroups a 16x16 quarter of a 32x32 tile each");
static_assert(MUSER_MM_BK == 4 * MUSER_CHUNK, "each mm thread decodes one chunk per K step");
static_assert((MUSER_MM_BK * MUSER_MM_BM + MUSER_MM_BN * MUSER_MM_BK) * 4 <= 32768,
              "mm tiles must fit Metal's 32 KiB of threadgroup memory");
static_assert(MUSER_MM_BN * MUSER_MM_BM <= MUSER_MM_BN * MUSER_MM_BK, "the output tile reuses xs");

// A block field: the f16 at byte `offset` (offsets stay even: the layouts keep halfs aligned).
inline float f16_at(device const uchar *blk, int offset) { return float(*(device const half *)(blk + offset)); }

// Sequential 16-term dot product: the per-chunk step of every reduction.
inline float dot_chunk(thread const float *w, thread const float *x) {
  float s = 0.0f;
  for (int i = 0; i < MUSER_CHUNK; ++i) s += w[i] * x[i];
  return s;
}

inline void load_chunk(device const float *p, thread float *x) {
  for (int i = 0; i < MUSER_CHUNK; ++i) x[i] = p[i];
}

// ---- dequantize: one thread per chunk ---------------------------------------
template <class F>
inline void dequant_impl(device const uchar *W, device const uchar *S, device const float *S2,
                         device float *out, long n_out, long n_in, uint gid) {
  const uint nch = uint(n_in / MUSER_CHUNK);
  const uint r = gid / nch, c = gid % nch;
  if (r >= n_out) return;
  float w[MUSER_CHUNK];
  F::chunk(W + long(r) * F::row_bytes(n_in), S + long(r) * nch, S2[0], c, w);
  device float *o = out + long(r) * n_in + long(c) * MUSER_CHUNK;
  for (int i = 0; i < MUSER_CHUNK; ++i) o[i] = w[i];
}

// ---- embedding: rows ids of W, one thread per chunk ---------------------------
template <class F>
inline void embed_impl(device const uchar *W, device const uchar *S, device const float *S2,
                       device const long *ids, device float *out, long n_ids, long n_in, uint gid) {
  const uint nch = uint(n_in / MUSER_CHUNK);
  const uint k = gid / nch, c = gid % nch;
  if (k >= n_ids) return;
  const long r = ids[k];  // range-checked by the host
  float w[MUSER_CHUNK];
  F::chunk(W + r * F::row_bytes(n_in), S + r * nch, S2[0], c, w);
  device float *o = out + long(k) * n_in + long(c) * MUSER_CHUNK;
  for (int i = 0; i < MUSER_CHUNK; ++i) o[i] = w[i];
}

// ---- matvec for 1 .. MUSER_MAX_EXT_TOKENS tokens ------------------------------
// Threadgroup: MUSER_MV_SIMDGROUPS simdgroups x 32 lanes; simdgroup s owns
// rows (MUSER_MV_SIMDGROUPS * tg + s) * MUSER_MV_ROWS + 0 .. MUSER_MV_ROWS-1.
// Lane l walks chunks l, l + 32, ... of those rows, decoding each chunk of
// weights once and dotting it with every token's activations; per (token,
// row) it adds one 16-term sequential dot per chunk, and simd_sum adds the
// 32 lane partials. The single-token rung is this loop with NT = 1, so its
// results are bit-identical to the multi-token rung's for each token.
template <class F, int NT>
inline void matvec_impl(device const uchar *W, device const uchar *S, device const float *S2,
                        device const float *x, device float *y, long n_out, long n_in, long n_tok,
                        uint tg, ushort sg, ushort lane) {
  const uint nch = uint(n_in / MUSER_CHUNK);
  const long rb = F::row_bytes(n_in);
  const long r0 = (long(tg) * MUSER_MV_SIMDGROUPS + sg) * MUSER_MV_ROWS;
  const float s2 = S2[0];
  float acc[NT][MUSER_MV_ROWS];
  for (int t = 0; t < NT; ++t)
    for (int j = 0; j < MUSER_MV_ROWS; ++j) acc[t][j] = 0.0f;
  for (uint c = lane; c < nch; c += MUSER_MV_LANES) {
    float w[MUSER_MV_ROWS][MUSER_CHUNK];
    for (int j = 0; j < MUSER_MV_ROWS; ++j) {
      const long r = r0 + j;
      if (r < n_out) {
        F::chunk(W + r * rb, S + r * nch, s2, c, w[j]);
      } else {
        for (int i = 0; i < MUSER_CHUNK; ++i) w[j][i] = 0.0f;
      }
    }
    for (int t = 0; t < NT; ++t) {
      if (t < n_tok) {
        float xv[MUSER_CHUNK];
        load_chunk(x + t * n_in + long(c) * MUSER_CHUNK, xv);
        for (int j = 0; j < MUSER_MV_ROWS; ++j) acc[t][j] += dot_chunk(w[j], xv);
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    if (t < n_tok) {  // uniform across the simdgroup
      for (int j = 0; j < MUSER_MV_ROWS; ++j) {
        const float total = simd_sum(acc[t][j]);
        if (lane == 0 && r0 + j < n_out) y[t * n_out + r0 + j] = total;
      }
    }
  }
}

// ---- tiled matmul for larger batches (prefill) --------------------------------
// Threadgroup (tx, ty) computes tokens 32 tx .. +32 of rows 32 ty .. +32 with
// 128 threads. Token tiles vary fastest in the grid, so the threadgroups that
// re-read one row tile's weights are dispatched next to each other.
// Per K step of 64: every thread decodes one 16-element chunk of one weight
// row into wt (stored k-major, [k][row]) and copies 16 activations into xs
// ([token][k]); out-of-range rows, tokens and chunks are zeros. Simdgroup s
// then multiplies its 16x16 quarter as 2x2 8x8 matrices, k in steps of 8.
template <class F>
inline void matmul_impl(device const uchar *W, device const uchar *S, device const float *S2,
                        device const float *x, device float *y, long n_out, long n_in, long n_tok,
                        uint3 tgpig, ushort tid, threadgroup float *wt, threadgroup float *xs) {
  const uint nch = uint(n_in / MUSER_CHUNK);
  const long rb = F::row_bytes(n_in);
  const long tok0 = long(tgpig.x) * MUSER_MM_BN, row0 = long(tgpig.y) * MUSER_MM_BM;
  const ushort sg = tid / 32;
  const ushort sr = (sg & 1) * 16, st = (sg >> 1) * 16;  // this simdgroup's quarter
  const ushort lr = tid / 4, lc = tid % 4;                 // this thread's row/token and chunk
  const float s2 = S2[0];
  simdgroup_float8x8 acc[2][2];
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b) acc[a][b] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);

  for (long k0 = 0; k0 < n_in; k0 += MUSER_MM_BK) {
    const uint c = uint(k0 / MUSER_CHUNK) + lc;
    float w[MUSER_CHUNK];
    const long r = row0 + lr;
    if (r < n_out && c < nch) {
      F::chunk(W + r * rb, S + r * nch, s2, c, w);
    } else {
      for (int i = 0; i < MUSER_CHUNK; ++i) w[i] = 0.0f;
    }
    for (int i = 0; i < MUSER_CHUNK; ++i) wt[(lc * MUSER_CHUNK + i) * MUSER_MM_BM + lr] = w[i];
    const long t = tok0 + lr;
    for (int i = 0; i < MUSER_CHUNK; ++i)
      xs[lr * MUSER_MM_BK + lc * MUSER_CHUNK + i] =
          (t < n_tok && c < nch) ? x[t * n_in + long(c) * MUSER_CHUNK + i] : 0.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int kk = 0; kk < MUSER_MM_BK; kk += 8) {
      simdgroup_float8x8 A[2], B[2];
      for (int a = 0; a < 2; ++a) simdgroup_load(A[a], xs + (st + 8 * a) * MUSER_MM_BK + kk, MUSER_MM_BK);
      for (int b = 0; b < 2; ++b) simdgroup_load(B[b], wt + kk * MUSER_MM_BM + sr + 8 * b, MUSER_MM_BM);
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 2; ++b) simdgroup_multiply_accumulate(acc[a][b], A[a], B[b], acc[a][b]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  // Stage the 32x32 output tile ([token][row]) in xs, then write the in-range part.
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b) simdgroup_store(acc[a][b], xs + (st + 8 * a) * MUSER_MM_BM + sr + 8 * b, MUSER_MM_BM);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int i = tid; i < MUSER_MM_BN * MUSER_MM_BM; i += MUSER_MM_THREADS) {
    const long t = tok0 + i / MUSER_MM_BM, r = row0 + i % MUSER_MM_BM;
    if (t < n_tok && r < n_out) y[t * n_out + r] = xs[i];
  }
}

// ---- entry points --------------------------------------------------------------
// Names are muser_<rung>_<type> with <type> the GGMLType name in lower case;
// ops/metal's kernel_name() builds the same string (tests check every pair).
#define MUSER_WEIGHT_ARGS                                                              \
  device const uchar *W [[buffer(0)]], device const uchar *S [[buffer(1)]],           \
      device const float *S2 [[buffer(2)]]

#define MUSER_DEFINE_KERNELS(tname, F)                                                 \
  kernel void muser_dequant_##tname(MUSER_WEIGHT_ARGS, device float *out [[buffer(3)]], \
                                    constant long &n_out [[buffer(4)]],                \
                                    constant long &n_in [[buffer(5)]],                 \
                                    uint gid [[thread_position_in_grid]]) {            \
    dequant_impl<F>(W, S, S2, out, n_out, n_in, gid);                                  \
  }                                                                                    \
  kernel void muser_embed_##tname(MUSER_WEIGHT_ARGS, device const long *ids [[buffer(3)]], \
                                  device float *out [[buffer(4)]],                     \
                                  constant long &n_ids [[buffer(5)]],                  \
                                  constant long &n_in [[buffer(6)]],                   \
                                  uint gid [[thread_position_in_grid]]) {              \
    embed_impl<F>(W, S, S2, ids, out, n_ids, n_in, gid);                               \
  }                                                                                    \
  kernel void muser_mv_##tname(MUSER_WEIGHT_ARGS, device const float *x [[buffer(3)]], \
                               device float *y [[buffer(4)]],                          \
                               constant long &n_out [[buffer(5)]],                     \
                               constant long &n_in [[buffer(6)]],                      \
                               constant long &n_tok [[buffer(7)]],                     \
                               uint tg [[threadgroup_position_in_grid]],               \
                               ushort sg [[simdgroup_index_in_threadgroup]],           \
                               ushort lane [[thread_index_in_simdgroup]]) {            \
    matvec_impl<F, 1>(W, S, S2, x, y, n_out, n_in, n_tok, tg, sg, lane);               \
  }                                                                                    \
  kernel void muser_ext_##tname(MUSER_WEIGHT_ARGS, device const float *x [[buffer(3)]], \
                                device float *y [[buffer(4)]],                         \
                                constant long &n_out [[buffer(5)]],                    \
                                constant long &n_in [[buffer(6)]],                     \
                                constant long &n_tok [[buffer(7)]],                    \
                                uint tg [[threadgroup_position_in_grid]],              \
                                ushort sg [[simdgroup_index_in_threadgroup]],          \
                                ushort lane [[thread_index_in_simdgroup]]) {           \
    matvec_impl<F, MUSER_MAX_EXT_TOKENS>(W, S, S2, x, y, n_out, n_in, n_tok, tg, sg, lane); \
  }                                                                                    \
  kernel void muser_mm_##tname(MUSER_WEIGHT_ARGS, device const float *x [[buffer(3)]], \
                               device float *y [[buffer(4)]],                          \
                               constant long &n_out [[buffer(5)]],                     \
                               constant long &n_in [[buffer(6)]],                      \
                               constant long &n_tok [[buffer(7)]],                     \
                               uint3 tgpig [[threadgroup_position_in_grid]],           \
                               ushort tid [[thread_index_in_threadgroup]]) {           \
    threadgroup float wt[MUSER_MM_BK * MUSER_MM_BM];                                   \
    threadgroup float xs[MUSER_MM_BN * MUSER_MM_BK];                                   \
    matmul_impl<F>(W, S, S2, x, y, n_out, n_in, n_tok, tgpig, tid, wt, xs);            \
  }
