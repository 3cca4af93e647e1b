// One-token K-quant matvecs in CUDA C++: y[n_out] = W x for one half-precision
// activation row, from the packed blocks as the file stores them.
//
// The activation arrives as int8dot.py's two int8 levels per 32 columns
// (x ~ dxs * (254 a1 + a2)), with the integer sums s16 of each 16 columns; the
// dots are dp4a on the weight codes, exact in int32, and the block scales are
// applied in float32 per 16 columns: the arithmetic of int8dot.py's kernels,
// with a different order of the float sums.
//
// One warp walks R output rows (1, 2 or 4; or a K part of them, ksplit warps
// per row group, combined through shared memory). Eight lanes share a super-block: lane g of
// the eight loads one 16-byte piece of Q4_K's qs (a warp reads four blocks'
// qs as four 128-byte runs), so every load is a whole aligned vector and the
// warp keeps four blocks in flight per step.
//
// The block offsets (Q4_K_QS, Q6_K_QL, ...) come from formats/layout.py as -D
// definitions (ops/cuda/compiled.py); no offset is typed here.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#ifndef Q4_K_BYTES
#error "build through muser_torch/ops/cuda/compiled.py: the layout constants are -D definitions"
#endif

static_assert(QK_K == 256, "super-blocks of 256 columns");
static_assert(Q4_K_BYTES % 16 == 0 && Q4_K_QS % 16 == 0, "Q4_K's qs on 16-byte vectors");
static_assert(Q4_K_SCALES % 4 == 0 && Q4_K_D % 4 == 0 && Q4_K_DMIN == Q4_K_D + 2,
              "Q4_K's d, dmin and scales on 4-byte words");
static_assert(Q6_K_BYTES % 2 == 0 && Q6_K_QL % 2 == 0 && Q6_K_QH % 2 == 0 && Q6_K_D % 2 == 0,
              "Q6_K's fields on 2-byte words");

constexpr int WARPS = 4;          // per block
constexpr int LEVEL = 254;        // a2's unit is 1/254 of a1's

__device__ __forceinline__ int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }

__device__ __forceinline__ float half_bits(uint32_t h) {
    return __half2float(__ushort_as_half((unsigned short)(h & 0xFFFF)));
}

// A float16 field of a block (2-byte aligned)
__device__ __forceinline__ float load_f16(const uint8_t* p) {
    return half_bits(__ldg(reinterpret_cast<const unsigned short*>(p)));
}

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }

// The 6-bit scale and min of sub-block j of a Q4_K block, from its 12 scale bytes
// held as three little-endian words.
__device__ __forceinline__ void scale_min(const uint32_t s[3], int j, int& sc, int& m) {
    auto byte = [&](int i) { return (int)((s[i >> 2] >> (8 * (i & 3))) & 0xFF); };
    if (j < 4) {
        sc = byte(j) & 63;
        m = byte(j + 4) & 63;
    } else {
        sc = (byte(j + 4) & 0xF) | ((byte(j - 4) >> 6) << 4);
        m = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
    }
}

// Each warp's R row sums, added over its KSPLIT warps (in K order: deterministic)
// and written by the first.
template <typename T, int R>
__device__ __forceinline__ void finish_rows(float (&acc)[R], int row0, int n_out, int kpart,
                                            int ksplit, T* __restrict__ y) {
    __shared__ float parts[WARPS][R];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < R; ++r)
        for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xFFFFFFFFu, acc[r], o);
    if (ksplit > 1) {
        if (lane == 0)
            for (int r = 0; r < R; ++r) parts[warp][r] = acc[r];
        __syncthreads();
        if (kpart != 0 || lane != 0) return;
        for (int k = 1; k < ksplit; ++k)
            for (int r = 0; r < R; ++r) acc[r] += parts[warp + k][r];
    } else if (lane != 0) {
        return;
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
        if (row0 + r < n_out) y[row0 + r] = from_float<T>(acc[r]);
}

// The warp's first row and its K part: a block holds WARPS / ksplit row groups of
// R rows, each walked by ksplit consecutive warps.
struct WarpWork {
    int lane, kpart, row0;
    __device__ WarpWork(int R, int ksplit) {
        const int warp = threadIdx.x / 32;
        lane = threadIdx.x % 32;
        kpart = warp % ksplit;
        row0 = (blockIdx.x * (WARPS / ksplit) + warp / ksplit) * R;
    }
};

// ---- Q4_K ------------------------------------------------------------------------
// Lane g (0..7) of a block's eight: qs bytes 16 g .. 16 g + 15, which hold columns
// 64 (g/2) + 16 (g%2) + 0..15 in their low nibbles (sub-block 2 (g/2)) and the same
// + 32 in their high nibbles (sub-block 2 (g/2) + 1). The block's first 16 bytes
// (d, dmin, the 12 scale bytes) are one vector load. Each lane loads its
// activation columns once for the warp's R rows.
static_assert(Q4_K_D == 0 && Q4_K_SCALES == 4 && Q4_K_QS == 16, "Q4_K's header is its first 16 bytes");

template <typename T, int R>
__global__ void __launch_bounds__(WARPS * 32)
q4k_mv_kernel(const uint8_t* __restrict__ w, const int8_t* __restrict__ a1,
              const int8_t* __restrict__ a2, const float* __restrict__ dxs,
              const int* __restrict__ s16, T* __restrict__ y, int n_out, int nb, int ksplit) {
    const WarpWork ww(R, ksplit);
    const int g = ww.lane % 8, pair = g / 2;
    float acc[R] = {};
    const uint8_t* rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r)     // rows past the end read the last one; never written
        rows[r] = w + (size_t)min(ww.row0 + r, n_out - 1) * nb * Q4_K_BYTES;
    // The next step's weight vectors are loaded before this step's are used: two
    // steps of loads in flight per lane.
    const int step = 4 * ksplit;
    int b = ww.kpart * 4 + ww.lane / 8;
    int4 hd[R], q[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const uint8_t* blk = rows[r] + (size_t)min(b, nb - 1) * Q4_K_BYTES;
        hd[r] = __ldg(reinterpret_cast<const int4*>(blk));
        q[r] = __ldg(reinterpret_cast<const int4*>(blk + Q4_K_QS + 16 * g));
    }
    for (; b < nb; b += step) {
        int4 hd_next[R], q_next[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint8_t* blk = rows[r] + (size_t)min(b + step, nb - 1) * Q4_K_BYTES;
            hd_next[r] = __ldg(reinterpret_cast<const int4*>(blk));
            q_next[r] = __ldg(reinterpret_cast<const int4*>(blk + Q4_K_QS + 16 * g));
        }
        const int c = b * QK_K + 64 * pair + 16 * (g % 2);             // low nibbles' columns
        const int4 x1l = __ldg(reinterpret_cast<const int4*>(a1 + c));
        const int4 x2l = __ldg(reinterpret_cast<const int4*>(a2 + c));
        const int4 x1h = __ldg(reinterpret_cast<const int4*>(a1 + c + 32));
        const int4 x2h = __ldg(reinterpret_cast<const int4*>(a2 + c + 32));
        const float dl = __ldg(dxs + c / 32), dh = __ldg(dxs + c / 32 + 1);
        const float sl = (float)__ldg(s16 + c / 16), sh = (float)__ldg(s16 + c / 16 + 2);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int q0 = q[r].x & 0x0F0F0F0F, q1 = q[r].y & 0x0F0F0F0F,
                      q2 = q[r].z & 0x0F0F0F0F, q3 = q[r].w & 0x0F0F0F0F;
            const int h0 = (q[r].x >> 4) & 0x0F0F0F0F, h1 = (q[r].y >> 4) & 0x0F0F0F0F,
                      h2 = (q[r].z >> 4) & 0x0F0F0F0F, h3 = (q[r].w >> 4) & 0x0F0F0F0F;
            int lo = dp4a(q3, x1l.w, dp4a(q2, x1l.z, dp4a(q1, x1l.y, dp4a(q0, x1l.x, 0))));
            lo = dp4a(q3, x2l.w, dp4a(q2, x2l.z, dp4a(q1, x2l.y, dp4a(q0, x2l.x, lo * LEVEL))));
            int hi = dp4a(h3, x1h.w, dp4a(h2, x1h.z, dp4a(h1, x1h.y, dp4a(h0, x1h.x, 0))));
            hi = dp4a(h3, x2h.w, dp4a(h2, x2h.z, dp4a(h1, x2h.y, dp4a(h0, x2h.x, hi * LEVEL))));
            const uint32_t sc3[3] = {(uint32_t)hd[r].y, (uint32_t)hd[r].z, (uint32_t)hd[r].w};
            int sc0, m0, sc1, m1;
            scale_min(sc3, 2 * pair, sc0, m0);
            scale_min(sc3, 2 * pair + 1, sc1, m1);
            const float d = half_bits((uint32_t)hd[r].x), dmin = half_bits((uint32_t)hd[r].x >> 16);
            acc[r] += dl * ((d * sc0) * (float)lo - (dmin * m0) * sl);
            acc[r] += dh * ((d * sc1) * (float)hi - (dmin * m1) * sh);
            hd[r] = hd_next[r];
            q[r] = q_next[r];
        }
    }
    finish_rows<T, R>(acc, ww.row0, n_out, ww.kpart, ksplit, y);
}

// ---- Q6_K ------------------------------------------------------------------------
// Half hf = g / 4, quarter r = g % 4 of lane g: l = 8 r .. 8 r + 7 of that half, so
// ql bytes 64 hf + l and 64 hf + 32 + l and qh bytes 32 hf + l; columns
// 128 hf + l + 32 k (k = 0..3), each run of 8 in scale group 8 hf + r / 2 + 2 k.
// Blocks are 210 bytes, so a run of 8 bytes sits at 0 or 2 mod 4: it is read as
// three aligned words and funnel-shifted into two.
__device__ __forceinline__ int2 run8(const uint8_t* p) {
    const uint32_t* a = reinterpret_cast<const uint32_t*>(reinterpret_cast<uintptr_t>(p) & ~(uintptr_t)3);
    const unsigned sh = 8 * (reinterpret_cast<uintptr_t>(p) & 3);
    const uint32_t w0 = __ldg(a), w1 = __ldg(a + 1), w2 = __ldg(a + 2);
    return make_int2((int)__funnelshift_r(w0, w1, sh), (int)__funnelshift_r(w1, w2, sh));
}

template <typename T, int R>
__global__ void __launch_bounds__(WARPS * 32)
q6k_mv_kernel(const uint8_t* __restrict__ w, const int8_t* __restrict__ a1,
              const int8_t* __restrict__ a2, const float* __restrict__ dxs,
              T* __restrict__ y, int n_out, int nb, int ksplit) {
    const WarpWork ww(R, ksplit);
    const int g = ww.lane % 8, hf = g / 4, r4 = g % 4;
    float acc[R] = {};
    const uint8_t* rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r)
        rows[r] = w + (size_t)min(ww.row0 + r, n_out - 1) * nb * Q6_K_BYTES;
#pragma unroll 2
    for (int b = ww.kpart * 4 + ww.lane / 8; b < nb; b += 4 * ksplit) {
        const int c = b * QK_K + 128 * hf + 8 * r4;
        int2 x1[4], x2[4];
        float dx[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            x1[k] = __ldg(reinterpret_cast<const int2*>(a1 + c + 32 * k));
            x2[k] = __ldg(reinterpret_cast<const int2*>(a2 + c + 32 * k));
            dx[k] = __ldg(dxs + (c + 32 * k) / 32);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint8_t* blk = rows[r] + (size_t)b * Q6_K_BYTES;
            const int2 lw = run8(blk + Q6_K_QL + 64 * hf + 8 * r4);
            const int2 uw = run8(blk + Q6_K_QL + 64 * hf + 32 + 8 * r4);
            const int2 gw = run8(blk + Q6_K_QH + 32 * hf + 8 * r4);
            const float d = load_f16(blk + Q6_K_D);
            const int8_t* scales = reinterpret_cast<const int8_t*>(blk + Q6_K_SCALES) + 8 * hf + r4 / 2;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                // codes 0..63 of the 8 columns c + 32 k .. + 7, recentred to -32..31 per byte
                const int2 qw = (k & 1) ? uw : lw;
                const int sh = 4 * (k >> 1);
                const int c0 = __vsubss4(((qw.x >> sh) & 0x0F0F0F0F) | (((gw.x >> (2 * k)) & 0x03030303) << 4),
                                         0x20202020);
                const int c1 = __vsubss4(((qw.y >> sh) & 0x0F0F0F0F) | (((gw.y >> (2 * k)) & 0x03030303) << 4),
                                         0x20202020);
                int dot = dp4a(c1, x1[k].y, dp4a(c0, x1[k].x, 0));
                dot = dp4a(c1, x2[k].y, dp4a(c0, x2[k].x, dot * LEVEL));
                acc[r] += dx[k] * (d * (float)__ldg(scales + 2 * k)) * (float)dot;
            }
        }
    }
    finish_rows<T, R>(acc, ww.row0, n_out, ww.kpart, ksplit, y);
}

// ---- 1..16 activation rows: int8 tensor cores -------------------------------------
// A warp owns 16 weight rows (the M of mma.sync) and up to NTILE x 8 tokens (its N);
// every weight word is decoded once for all of them. One mma covers exactly one
// weight scale and one activation block: a Q4_K sub-block of 32 columns
// (m16n8k32) or a Q6_K scale group of 16 (m16n8k16), so each int32 dot is exact
// and is scaled once in float32, as int8dot.py's kernels scale theirs.
//
// Fragments (PTX ISA, mma with .s8 operands), lane = 4 g + t: A's registers hold
// rows g and g + 8 at k-slots 4t..4t+3 (and 16 + 4t.. for k32), B's hold token g
// at the same slots, C's four int32 are (row g; tokens 2t, 2t + 1) and (row g + 8;
// the same tokens). A dot does not care which column sits in which slot as long
// as A and B agree: a Q4_K lane puts columns 8t..8t+3 of the sub-block in slots
// 4t.. and 8t+4..8t+7 in slots 16 + 4t.., so its codes and its activation bytes
// are one 8-byte load each. Q6_K keeps the natural order (4 columns a lane).
//
// The block's warps split K (warp w walks super-blocks w, w + ks, ...) and are
// summed in warp order through shared memory: deterministic, no atomics.
constexpr int MM_ROWS = 16;      // weight rows per warp (mma's M)
constexpr int MM_WARPS = 8;      // the most warps a block splits K over

__device__ __forceinline__ void mma_k32(int (&c)[4], const int (&a)[4], int b0, int b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_k16(int (&c)[4], int a0, int a1, int b0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 "
                 "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

// The activation of up to 16 tokens in int8dot's two levels, stored in the fragments'
// order (ops/cuda/__init__.py's _quantize_frag), so that a warp's loads are whole
// contiguous runs: a12[tile][block][lane] holds lane 4 g + t's 16 bytes of a 32-column
// block, its k-slots' a1 bytes of token 8 tile + g then their a2 bytes; sc[tile][pair][t][e]
// holds token 8 tile + 2 t + e's (dx, dx, dx s, dx s) of a pair of blocks (the block
// scales, and the scales times the blocks' integer sums). Tokens past M are zeros there.
struct MmTokens {
    const int4* __restrict__ a12;
    const float4* __restrict__ sc;
    int M, n_blk;

    __device__ __forceinline__ int4 frag(int tile, int blk, int lane) const {
        return __ldg(a12 + ((size_t)tile * n_blk + blk) * 32 + lane);
    }
    __device__ __forceinline__ const float4* scales_at(int tile, int pair, int t, int e) const {
        return sc + (((size_t)tile * (n_blk / 2) + pair) * 4 + t) * 2 + e;
    }
    __device__ __forceinline__ float4 scales(int tile, int pair, int t, int e) const {
        return __ldg(scales_at(tile, pair, t, e));
    }
    __device__ __forceinline__ float2 dx(int tile, int pair, int t, int e) const {   // the scales alone
        return __ldg(reinterpret_cast<const float2*>(scales_at(tile, pair, t, e)));
    }
};

// The integer dot of both levels: 254 A.B1 + A.B2 for the k32 and k16 shapes.
__device__ __forceinline__ void dot2_k32(int (&c)[4], const int (&a)[4], int2 x1, int2 x2) {
    c[0] = c[1] = c[2] = c[3] = 0;
    mma_k32(c, a, x1.x, x1.y);
#pragma unroll
    for (int e = 0; e < 4; ++e) c[e] *= LEVEL;
    mma_k32(c, a, x2.x, x2.y);
}

__device__ __forceinline__ void dot2_k16(int (&c)[4], int a0, int a1, int x1, int x2) {
    c[0] = c[1] = c[2] = c[3] = 0;
    mma_k16(c, a0, a1, x1);
#pragma unroll
    for (int e = 0; e < 4; ++e) c[e] *= LEVEL;
    mma_k16(c, a0, a1, x2);
}

// The block's ks warps' sums, added in warp order; the first warp writes y[tok, row]
// for the tokens below M and the rows below n_out. acc[mt][nt][e] is C element e of
// row tile mt (rows row0 + 16 mt ..) and token tile nt.
template <typename T, int MT, int NTILE>
__device__ __forceinline__ void finish_tiles(float (&acc)[MT][NTILE][4], int row0, int n_out, int M, int ks,
                                             T* __restrict__ y) {
    __shared__ float parts[MM_WARPS][MT * NTILE * 4][32];     // [warp][value][lane]: no bank conflicts
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    if (ks > 1) {
        if (warp != 0) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NTILE; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) parts[warp][(mt * NTILE + nt) * 4 + e][lane] = acc[mt][nt][e];
        }
        __syncthreads();
        if (warp != 0) return;
        for (int k = 1; k < ks; ++k)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NTILE; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[mt][nt][e] += parts[k][(mt * NTILE + nt) * 4 + e][lane];
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NTILE; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = row0 + 16 * mt + g + 8 * (e >> 1), tok = 8 * nt + 2 * t + (e & 1);
                if (row < n_out && tok < M) y[(size_t)tok * n_out + row] = from_float<T>(acc[mt][nt][e]);
            }
}

template <typename T, int NTILE>
__device__ __forceinline__ void finish_tile(float (&acc)[NTILE][4], int row0, int n_out, int M, int ks,
                                            T* __restrict__ y) {
    finish_tiles<T, 1, NTILE>(reinterpret_cast<float (&)[1][NTILE][4]>(acc), row0, n_out, M, ks, y);
}

// Q4_K: sub-block j = 2p + h of a super-block is columns 32 j .. 32 j + 31, codes in
// the low (h = 0) or high (h = 1) nibbles of qs bytes 32 p .. 32 p + 31. Lane t loads
// qs bytes 32 p + 8 t .. + 7 of its two rows for each p (4 x 8 bytes a row), and the
// 16-byte header (d, dmin, scales) of each row. Q5_K (FIFTH) is the same with a
// fifth bit per code: bit j of qh byte l (l = column % 32), so lane t also loads qh
// bytes 8 t .. + 7 of each row.
static_assert(Q5_K_D == Q4_K_D && Q5_K_DMIN == Q4_K_DMIN && Q5_K_SCALES == Q4_K_SCALES,
              "Q5_K's header is Q4_K's");
static_assert(Q5_K_BYTES % 16 == 0 && Q5_K_QS % 8 == 0 && Q5_K_QH % 8 == 0, "Q5_K's qs and qh on 8-byte words");

template <typename T, int NTILE, bool FIFTH, int MT>
__global__ void __launch_bounds__(MM_WARPS * 32)
q45k_mm_kernel(const uint8_t* __restrict__ w, MmTokens x, T* __restrict__ y, int n_out, int nb, int ks) {
    // MT row tiles of 16 a warp share each activation fragment: 2 MT rows a lane, row r at
    // row0 + 16 (r / 2) + g + 8 (r % 2). One tile keeps the next super-block's weights in
    // flight while it works; two hold twice the registers already and load as they go.
    constexpr int BYTES = FIFTH ? Q5_K_BYTES : Q4_K_BYTES, QS = FIFTH ? Q5_K_QS : Q4_K_QS, R = 2 * MT;
    constexpr bool PREFETCH = MT == 1;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row0 = blockIdx.x * MM_ROWS * MT;
    const size_t row_bytes = (size_t)nb * BYTES;
    const uint8_t* rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r)     // rows past the end read the last one; never written
        rows[r] = w + (size_t)min(row0 + 16 * (r / 2) + g + 8 * (r % 2), n_out - 1) * row_bytes;
    float acc[MT][NTILE][4] = {};
    int4 hd[R], hd_next[R];
    uint2 q[R][4], q_next[R][4], qh[R], qh_next[R];
    auto load = [&](int b, int4 (&h)[R], uint2 (&qq)[R][4], uint2 (&hh)[R]) {
        const int bb = min(b, nb - 1);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint8_t* blk = rows[r] + (size_t)bb * BYTES;
            h[r] = __ldg(reinterpret_cast<const int4*>(blk));
#pragma unroll
            for (int p = 0; p < 4; ++p)
                qq[r][p] = __ldg(reinterpret_cast<const uint2*>(blk + QS + 32 * p + 8 * t));
            if (FIFTH) hh[r] = __ldg(reinterpret_cast<const uint2*>(blk + Q5_K_QH + 8 * t));
        }
    };
    if (PREFETCH) load(warp, hd, q, qh);
    for (int b = warp; b < nb; b += ks) {
        if (PREFETCH)
            load(b + ks, hd_next, q_next, qh_next);      // the next step's weights in flight during this one
        else
            load(b, hd, q, qh);
        float d[R], dmin[R];
        uint32_t sc3[R][3];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            d[r] = half_bits((uint32_t)hd[r].x);
            dmin[r] = half_bits((uint32_t)hd[r].x >> 16);
            sc3[r][0] = (uint32_t)hd[r].y; sc3[r][1] = (uint32_t)hd[r].z; sc3[r][2] = (uint32_t)hd[r].w;
        }
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            // this lane's C tokens' scales (and scales times sums) of sub-blocks 2p, 2p + 1
            float4 sc[NTILE][2];
#pragma unroll
            for (int nt = 0; nt < NTILE; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) sc[nt][e] = x.scales(nt, 4 * b + p, t, e);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int j = 2 * p + h, sh = 4 * h;
                int a[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    const int r0 = 2 * mt, r1 = 2 * mt + 1;
                    a[mt][0] = (int)((q[r0][p].x >> sh) & 0x0F0F0F0Fu);
                    a[mt][1] = (int)((q[r1][p].x >> sh) & 0x0F0F0F0Fu);
                    a[mt][2] = (int)((q[r0][p].y >> sh) & 0x0F0F0F0Fu);
                    a[mt][3] = (int)((q[r1][p].y >> sh) & 0x0F0F0F0Fu);
                    if (FIFTH) {
                        a[mt][0] |= (int)(((qh[r0].x >> j) & 0x01010101u) << 4);
                        a[mt][1] |= (int)(((qh[r1].x >> j) & 0x01010101u) << 4);
                        a[mt][2] |= (int)(((qh[r0].y >> j) & 0x01010101u) << 4);
                        a[mt][3] |= (int)(((qh[r1].y >> j) & 0x01010101u) << 4);
                    }
                }
                float ds[R], ms[R];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    int sc, m;
                    scale_min(sc3[r], j, sc, m);
                    ds[r] = d[r] * (float)sc;
                    ms[r] = dmin[r] * (float)m;
                }
#pragma unroll
                for (int nt = 0; nt < NTILE; ++nt) {
                    const int4 v = x.frag(nt, 8 * b + j, lane);     // columns 8t.. of token 8 nt + g
                    const int2 x1 = make_int2(v.x, v.y), x2 = make_int2(v.z, v.w);
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {      // one activation fragment, MT weight tiles
                        int c[4];
                        dot2_k32(c, a[mt], x1, x2);
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int r = 2 * mt + (e >> 1), tk = e & 1;
                            const float dxe = h ? sc[nt][tk].y : sc[nt][tk].x;
                            const float dse = h ? sc[nt][tk].w : sc[nt][tk].z;
                            acc[mt][nt][e] += dxe * (ds[r] * (float)c[e]) - ms[r] * dse;
                        }
                    }
                }
            }
        }
        if (PREFETCH) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                hd[r] = hd_next[r];
                qh[r] = qh_next[r];
#pragma unroll
                for (int p = 0; p < 4; ++p) q[r][p] = q_next[r][p];
            }
        }
    }
    finish_tiles<T, MT, NTILE>(acc, row0, n_out, x.M, ks, y);
}

// A 32-bit word of a Q6_K block at a 2-byte aligned address (blocks are 210 bytes).
__device__ __forceinline__ uint32_t load_word2(const uint8_t* p) {
    if ((reinterpret_cast<uintptr_t>(p) & 3) == 0) return __ldg(reinterpret_cast<const uint32_t*>(p));
    const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
    return (uint32_t)__ldg(h) | ((uint32_t)__ldg(h + 1) << 16);
}

// Q6_K: group (hf, kq, u) is columns 128 hf + 32 kq + 16 u .. + 15, scale 8 hf + 2 kq + u;
// lane t's four columns 4t.. of it have their low four bits in ql word 4 hf + 2 (kq & 1) + u
// (nibble kq >> 1) and their top two in qh word 2 hf + u (bits 2 kq), each word at byte
// 16 (word) + 4t of its field. A lane reads 8 ql words, 4 qh words and the 16 scales of
// each of its rows per super-block.
template <typename T, int NTILE>
__global__ void __launch_bounds__(MM_WARPS * 32)
q6k_mm_kernel(const uint8_t* __restrict__ w, MmTokens x, T* __restrict__ y, int n_out, int nb, int ks) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row0 = blockIdx.x * MM_ROWS;
    const size_t row_bytes = (size_t)nb * Q6_K_BYTES;
    const uint8_t* rows[2] = {w + (size_t)min(row0 + g, n_out - 1) * row_bytes,
                              w + (size_t)min(row0 + g + 8, n_out - 1) * row_bytes};
    float acc[NTILE][4] = {};
    for (int b = warp; b < nb; b += ks) {
        uint32_t ql[2][8], qh[2][4], scw[2][4];
        float d[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint8_t* blk = rows[r] + (size_t)b * Q6_K_BYTES;
#pragma unroll
            for (int i = 0; i < 8; ++i) ql[r][i] = load_word2(blk + Q6_K_QL + 16 * i + 4 * t);
#pragma unroll
            for (int i = 0; i < 4; ++i) qh[r][i] = load_word2(blk + Q6_K_QH + 16 * i + 4 * t);
#pragma unroll
            for (int i = 0; i < 4; ++i) scw[r][i] = load_word2(blk + Q6_K_SCALES + 4 * i);
            d[r] = load_f16(blk + Q6_K_D);
        }
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            float2 dx[NTILE][2][2];  // this lane's C tokens' scales of the half's two block pairs
#pragma unroll
            for (int nt = 0; nt < NTILE; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e)
#pragma unroll
                    for (int q = 0; q < 2; ++q) dx[nt][e][q] = x.dx(nt, 4 * b + 2 * hf + q, t, e);
#pragma unroll
            for (int kq = 0; kq < 4; ++kq) {
                int4 v[NTILE];      // columns 4t.. (v.x, v.z) and 16 + 4t.. (v.y, v.w) of block 4 hf + kq
#pragma unroll
                for (int nt = 0; nt < NTILE; ++nt) v[nt] = x.frag(nt, 8 * b + 4 * hf + kq, lane);
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    const int s = 8 * hf + 2 * kq + u;
                    int a[2];
                    float ds[2];
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const uint32_t lo = (ql[r][4 * hf + 2 * (kq & 1) + u] >> (4 * (kq >> 1))) & 0x0F0F0F0Fu;
                        const uint32_t hi = ((qh[r][2 * hf + u] >> (2 * kq)) & 0x03030303u) << 4;
                        a[r] = (int)__vsubss4(lo | hi, 0x20202020u);
                        ds[r] = d[r] * (float)(int8_t)((scw[r][s / 4] >> (8 * (s % 4))) & 0xFF);
                    }
#pragma unroll
                    for (int nt = 0; nt < NTILE; ++nt) {
                        int c[4];
                        dot2_k16(c, a[0], a[1], u ? v[nt].y : v[nt].x, u ? v[nt].w : v[nt].z);
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const float2 d2 = dx[nt][e & 1][kq >> 1];
                            acc[nt][e] += ((kq & 1) ? d2.y : d2.x) * (ds[e >> 1] * (float)c[e]);
                        }
                    }
                }
            }
        }
    }
    finish_tile<T, NTILE>(acc, row0, n_out, x.M, ks, y);
}

// Legacy 32-column blocks (Q8_0, Q5_0, Q4_0): one block, one scale, one k32 mma. The
// natural slot order: lane t's codes are columns 4t..4t+3 and 16 + 4t..16 + 4t + 3 of the
// block, which for Q4_0 / Q5_0 are the low and high nibbles of qs bytes 4t..4t+3. The
// codes are recentred (-8, -16) per byte, so no activation sums are needed. Blocks are
// 2-byte aligned; a warp takes LEGACY_STEP blocks of each row per step.
enum LegacyKind { LEGACY_Q8_0, LEGACY_Q5_0, LEGACY_Q4_0 };
constexpr int LEGACY_STEP = 4;
static_assert(LEGACY_STEP % 2 == 0 && 8 % LEGACY_STEP == 0, "a step takes whole block pairs of a super-block");

template <int KIND>
struct Legacy {
    static constexpr int BYTES = KIND == LEGACY_Q8_0 ? Q8_0_BYTES : KIND == LEGACY_Q5_0 ? Q5_0_BYTES : Q4_0_BYTES;

    // lane t's codes (as signed bytes: columns 4t.. in lo, 16 + 4t.. in hi) and the block's scale
    __device__ __forceinline__ static void codes(const uint8_t* blk, int t, int& lo, int& hi, float& d) {
        if (KIND == LEGACY_Q8_0) {
            d = load_f16(blk + Q8_0_D);
            lo = (int)load_word2(blk + Q8_0_QS + 4 * t);
            hi = (int)load_word2(blk + Q8_0_QS + 16 + 4 * t);
        } else if (KIND == LEGACY_Q4_0) {
            d = load_f16(blk + Q4_0_D);
            const uint32_t w = load_word2(blk + Q4_0_QS + 4 * t);
            lo = (int)__vsubss4(w & 0x0F0F0F0Fu, 0x08080808u);
            hi = (int)__vsubss4((w >> 4) & 0x0F0F0F0Fu, 0x08080808u);
        } else {
            d = load_f16(blk + Q5_0_D);
            const uint32_t w = load_word2(blk + Q5_0_QS + 4 * t), h = load_word2(blk + Q5_0_QH);
            lo = (int)__vsubss4((w & 0x0F0F0F0Fu) | spread4(h >> (4 * t)), 0x10101010u);
            hi = (int)__vsubss4(((w >> 4) & 0x0F0F0F0Fu) | spread4(h >> (16 + 4 * t)), 0x10101010u);
        }
    }

    // bits 0..3 of v to bit 4 of bytes 0..3
    __device__ __forceinline__ static uint32_t spread4(uint32_t v) {
        return ((v & 1u) | ((v & 2u) << 7) | ((v & 4u) << 14) | ((v & 8u) << 21)) << 4;
    }
};

template <typename T, int NTILE, int KIND>
__global__ void __launch_bounds__(MM_WARPS * 32)
legacy_mm_kernel(const uint8_t* __restrict__ w, MmTokens x, T* __restrict__ y, int n_out, int n_blocks, int ks) {
    using L = Legacy<KIND>;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int row0 = blockIdx.x * MM_ROWS;
    const size_t row_bytes = (size_t)n_blocks * L::BYTES;
    const uint8_t* rows[2] = {w + (size_t)min(row0 + g, n_out - 1) * row_bytes,
                              w + (size_t)min(row0 + g + 8, n_out - 1) * row_bytes};
    float acc[NTILE][4] = {};
    for (int b0 = warp * LEGACY_STEP; b0 < n_blocks; b0 += ks * LEGACY_STEP) {
        int lo[LEGACY_STEP][2], hi[LEGACY_STEP][2];
        float d[LEGACY_STEP][2];
#pragma unroll
        for (int i = 0; i < LEGACY_STEP; ++i)
#pragma unroll
            for (int r = 0; r < 2; ++r)     // blocks past the row's end read its last, scaled by 0
                L::codes(rows[r] + (size_t)min(b0 + i, n_blocks - 1) * L::BYTES, t, lo[i][r], hi[i][r], d[i][r]);
        // this lane's C tokens' scales of the step's two block pairs (b0 is a multiple of 4
        // and the activation has whole super-blocks, so all four blocks are there)
        float2 dx[NTILE][2][LEGACY_STEP / 2];
#pragma unroll
        for (int nt = 0; nt < NTILE; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e)
#pragma unroll
                for (int q = 0; q < LEGACY_STEP / 2; ++q) dx[nt][e][q] = x.dx(nt, b0 / 2 + q, t, e);
#pragma unroll
        for (int i = 0; i < LEGACY_STEP; ++i) {
            const int b = b0 + i;
            if (b >= n_blocks) break;
            const int a[4] = {lo[i][0], lo[i][1], hi[i][0], hi[i][1]};
#pragma unroll
            for (int nt = 0; nt < NTILE; ++nt) {
                const int4 v = x.frag(nt, b, lane);   // columns 4t.. (v.x, v.z) and 16 + 4t.. (v.y, v.w)
                int c[4];
                dot2_k32(c, a, make_int2(v.x, v.y), make_int2(v.z, v.w));
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float2 d2 = dx[nt][e & 1][i / 2];
                    acc[nt][e] += ((i & 1) ? d2.y : d2.x) * (d[i][e >> 1] * (float)c[e]);
                }
            }
        }
    }
    finish_tile<T, NTILE>(acc, row0, n_out, x.M, ks, y);
}

// ---- launchers -------------------------------------------------------------------

static void check_args(const torch::Tensor& packed, const torch::Tensor& a1, const torch::Tensor& y,
                       int64_t block_bytes, int64_t align, int64_t n_out, int64_t nb) {
    TORCH_CHECK(packed.is_cuda() && packed.dtype() == torch::kUInt8 && packed.dim() == 2 &&
                packed.is_contiguous(), "packed: a contiguous 2-D uint8 CUDA tensor");
    TORCH_CHECK(packed.size(0) == n_out && packed.size(1) == block_bytes * nb,
                "packed: ", n_out, " rows of ", block_bytes * nb, " bytes");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(packed.data_ptr()) % align == 0,
                "packed: ", align, "-byte aligned");
    TORCH_CHECK(a1.is_contiguous() && reinterpret_cast<uintptr_t>(a1.data_ptr()) % 16 == 0,
                "activation: contiguous, 16-byte aligned");
    TORCH_CHECK(a1.size(-1) == nb * QK_K, "activation: ", nb * QK_K, " columns");
    TORCH_CHECK(y.numel() == n_out && y.is_contiguous(), "y: ", n_out, " contiguous elements");
}

static int ksplit_for(int64_t warp_rows, int64_t nb) {
    // Enough warps in flight to cover the memory latency (~48 per SM on 132 SMs),
    // and at least two steps of four blocks per K part.
    int k = 1;
    while (k < WARPS && warp_rows * k < 132 * 48 && nb >= 8 * k) k *= 2;
    return k;
}

// Rows per warp (1, 2 or 4): each lane's activation loads serve that many rows.
template <typename Body>
static void by_rows(int64_t rows, Body&& body) {
    switch (rows) {
        case 1: body(std::integral_constant<int, 1>{}); break;
        case 2: body(std::integral_constant<int, 2>{}); break;
        case 4: body(std::integral_constant<int, 4>{}); break;
        default: TORCH_CHECK(false, "rows per warp: 1, 2 or 4, got ", rows);
    }
}

// y's dtype picks the kernel's output type: float16 and bfloat16 (the model's), float32
// (the tests, to see the kernel's own error).
template <typename Launch>
static void by_out_type(const torch::Tensor& y, Launch&& launch) {
    switch (y.scalar_type()) {
        case torch::kHalf: launch((__half*)nullptr); break;
        case torch::kBFloat16: launch((__nv_bfloat16*)nullptr); break;
        case torch::kFloat: launch((float*)nullptr); break;
        default: TORCH_CHECK(false, "y: float16, bfloat16 or float32, got ", y.scalar_type());
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

static dim3 grid_for(int64_t n_out, int rows, int ks) {
    const int64_t per_block = (int64_t)(WARPS / ks) * rows;
    return dim3((unsigned)((n_out + per_block - 1) / per_block));
}

void q4k_mv(torch::Tensor packed, torch::Tensor a1, torch::Tensor a2, torch::Tensor dxs,
            torch::Tensor s16, torch::Tensor y, int64_t rows) {
    const int64_t n_out = y.numel(), nb = a1.size(-1) / QK_K;
    check_args(packed, a1, y, Q4_K_BYTES, 16, n_out, nb);
    const at::cuda::CUDAGuard guard(packed.device());
    const int ks = ksplit_for((n_out + rows - 1) / rows, nb);
    auto stream = at::cuda::getCurrentCUDAStream();
    by_out_type(y, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        by_rows(rows, [&](auto R) {
            q4k_mv_kernel<T, R.value><<<grid_for(n_out, R.value, ks), WARPS * 32, 0, stream>>>(
                packed.data_ptr<uint8_t>(), a1.data_ptr<int8_t>(), a2.data_ptr<int8_t>(),
                dxs.data_ptr<float>(), s16.data_ptr<int>(), reinterpret_cast<T*>(y.data_ptr()),
                (int)n_out, (int)nb, ks);
        });
    });
}

void q6k_mv(torch::Tensor packed, torch::Tensor a1, torch::Tensor a2, torch::Tensor dxs,
            torch::Tensor y, int64_t rows) {
    const int64_t n_out = y.numel(), nb = a1.size(-1) / QK_K;
    check_args(packed, a1, y, Q6_K_BYTES, 4, n_out, nb);
    const at::cuda::CUDAGuard guard(packed.device());
    const int ks = ksplit_for((n_out + rows - 1) / rows, nb);
    auto stream = at::cuda::getCurrentCUDAStream();
    by_out_type(y, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        by_rows(rows, [&](auto R) {
            q6k_mv_kernel<T, R.value><<<grid_for(n_out, R.value, ks), WARPS * 32, 0, stream>>>(
                packed.data_ptr<uint8_t>(), a1.data_ptr<int8_t>(), a2.data_ptr<int8_t>(),
                dxs.data_ptr<float>(), reinterpret_cast<T*>(y.data_ptr()), (int)n_out, (int)nb, ks);
        });
    });
}

// 1..16 tokens (y [M, n_out]) in fragment order: a12 [tiles, n_pad / 32, 32, 16] int8 and
// sc [tiles, n_pad / 64, 4, 2, 4] float32, tiles of 8 tokens (MmTokens).
static MmTokens mm_tokens(const torch::Tensor& packed, const torch::Tensor& a12, const torch::Tensor& sc,
                          const torch::Tensor& y, int64_t block_bytes, int64_t block_cols, int64_t align) {
    TORCH_CHECK(y.dim() == 2 && y.is_contiguous(), "y: a contiguous [M, n_out] tensor");
    const int64_t M = y.size(0), n_out = y.size(-1), tiles = (M + 7) / 8;
    TORCH_CHECK(M >= 1 && M <= 16, "the tensor-core kernels take 1 to 16 activation rows, got ", M);
    TORCH_CHECK(a12.dtype() == torch::kInt8 && a12.dim() == 4 && a12.size(0) == tiles && a12.size(1) % 8 == 0 &&
                a12.size(2) == 32 && a12.size(3) == 16 && a12.is_contiguous() && a12.is_cuda() &&
                reinterpret_cast<uintptr_t>(a12.data_ptr()) % 16 == 0,
                "activation: 16-byte aligned int8 fragments [", tiles, ", n_pad / 32, 32, 16], n_pad a multiple of ",
                QK_K);
    const int64_t n_pad = a12.size(1) * 32;
    TORCH_CHECK(sc.dtype() == torch::kFloat && sc.is_contiguous() && sc.is_cuda() &&
                sc.numel() == tiles * (n_pad / 64) * 32 && reinterpret_cast<uintptr_t>(sc.data_ptr()) % 16 == 0,
                "activation scales: 16-byte aligned float32 [", tiles, ", ", n_pad / 64, ", 4, 2, 4]");
    TORCH_CHECK(packed.is_cuda() && packed.dtype() == torch::kUInt8 && packed.dim() == 2 && packed.is_contiguous() &&
                packed.size(0) == n_out && packed.size(1) % block_bytes == 0 &&
                packed.size(1) / block_bytes * block_cols > n_pad - QK_K &&
                packed.size(1) / block_bytes * block_cols <= n_pad,
                "packed: ", n_out, " contiguous uint8 rows of whole ", block_bytes, "-byte blocks, ", n_pad - QK_K + 1,
                " to ", n_pad, " columns");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(packed.data_ptr()) % align == 0, "packed: ", align, "-byte aligned");
    return MmTokens{reinterpret_cast<const int4*>(a12.data_ptr()), reinterpret_cast<const float4*>(sc.data_ptr()),
                    (int)M, (int)(n_pad / 32)};
}

// Warps over K until about warps_per_sm warps an SM are in flight (0: 32), each with
// two steps of K or more.
static int mm_ksplit(int64_t row_groups, int64_t steps, int64_t warps_per_sm) {
    const int64_t want = (warps_per_sm > 0 ? warps_per_sm : 32) *
                         at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    int k = 1;
    while (k < MM_WARPS && row_groups * k < want && steps >= 2 * k) k *= 2;
    return k;
}

// nb: the blocks a row has; per_step: how many of them one warp takes a step; a warp's
// rows: rows_per_warp (16 or 32)
template <typename Launch>
static void mm_launch(const torch::Tensor& packed, const MmTokens& x, torch::Tensor& y, int64_t nb, int per_step,
                      int64_t warps_per_sm, int64_t rows_per_warp, Launch&& launch) {
    TORCH_CHECK(rows_per_warp == MM_ROWS || rows_per_warp == 2 * MM_ROWS, "rows per warp: ", MM_ROWS, " or ",
                2 * MM_ROWS, ", got ", rows_per_warp);
    const int64_t n_out = y.size(-1), groups = (n_out + rows_per_warp - 1) / rows_per_warp;
    const at::cuda::CUDAGuard guard(packed.device());
    const int ks = mm_ksplit(groups, (nb + per_step - 1) / per_step, warps_per_sm);
    auto stream = at::cuda::getCurrentCUDAStream();
    by_out_type(y, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        if (x.M <= 8)
            launch(std::integral_constant<int, 1>{}, (T*)nullptr, dim3((unsigned)groups), dim3(32 * ks), stream,
                   (int)n_out, (int)nb, ks);
        else
            launch(std::integral_constant<int, 2>{}, (T*)nullptr, dim3((unsigned)groups), dim3(32 * ks), stream,
                   (int)n_out, (int)nb, ks);
    });
}

template <bool FIFTH>
static void q45k_mm(torch::Tensor packed, torch::Tensor a12, torch::Tensor sc, torch::Tensor y,
                    int64_t warps_per_sm, int64_t rows_per_warp) {
    const MmTokens x = mm_tokens(packed, a12, sc, y, FIFTH ? Q5_K_BYTES : Q4_K_BYTES, QK_K, 16);
    mm_launch(packed, x, y, x.n_blk / 8, 1, warps_per_sm, rows_per_warp,
              [&](auto NT, auto* tag, dim3 grid, dim3 block, cudaStream_t stream, int n_out, int nb, int ks) {
        using T = std::remove_pointer_t<decltype(tag)>;
        T* out = reinterpret_cast<T*>(y.data_ptr());
        if (rows_per_warp == MM_ROWS)
            q45k_mm_kernel<T, NT.value, FIFTH, 1><<<grid, block, 0, stream>>>(packed.data_ptr<uint8_t>(), x, out,
                                                                              n_out, nb, ks);
        else
            q45k_mm_kernel<T, NT.value, FIFTH, 2><<<grid, block, 0, stream>>>(packed.data_ptr<uint8_t>(), x, out,
                                                                              n_out, nb, ks);
    });
}

void q6k_mm(torch::Tensor packed, torch::Tensor a12, torch::Tensor sc, torch::Tensor y, int64_t warps_per_sm,
            int64_t rows_per_warp) {
    TORCH_CHECK(rows_per_warp == MM_ROWS, "Q6_K: ", MM_ROWS, " rows per warp, got ", rows_per_warp);
    const MmTokens x = mm_tokens(packed, a12, sc, y, Q6_K_BYTES, QK_K, 4);
    mm_launch(packed, x, y, x.n_blk / 8, 1, warps_per_sm, MM_ROWS, [&](auto NT, auto* tag, dim3 grid, dim3 block, cudaStream_t stream, int n_out, int nb,
                                int ks) {
        using T = std::remove_pointer_t<decltype(tag)>;
        q6k_mm_kernel<T, NT.value><<<grid, block, 0, stream>>>(packed.data_ptr<uint8_t>(), x,
                                                               reinterpret_cast<T*>(y.data_ptr()), n_out, nb, ks);
    });
}

template <int KIND>
static void legacy_mm(torch::Tensor packed, torch::Tensor a12, torch::Tensor sc, torch::Tensor y,
                      int64_t warps_per_sm, int64_t rows_per_warp) {
    TORCH_CHECK(rows_per_warp == MM_ROWS, "32-column blocks: ", MM_ROWS, " rows per warp, got ", rows_per_warp);
    const MmTokens x = mm_tokens(packed, a12, sc, y, Legacy<KIND>::BYTES, 32, 2);
    const int64_t n_blocks = packed.size(1) / Legacy<KIND>::BYTES;
    mm_launch(packed, x, y, n_blocks, LEGACY_STEP, warps_per_sm, MM_ROWS, [&](auto NT, auto* tag, dim3 grid, dim3 block,
                                                       cudaStream_t stream, int n_out, int nb, int ks) {
        using T = std::remove_pointer_t<decltype(tag)>;
        legacy_mm_kernel<T, NT.value, KIND><<<grid, block, 0, stream>>>(
            packed.data_ptr<uint8_t>(), x, reinterpret_cast<T*>(y.data_ptr()), n_out, nb, ks);
    });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("q8_0_mm", &legacy_mm<LEGACY_Q8_0>, "1..16-token Q8_0 matmul on int8 tensor cores");
    m.def("q5_0_mm", &legacy_mm<LEGACY_Q5_0>, "1..16-token Q5_0 matmul on int8 tensor cores");
    m.def("q4_0_mm", &legacy_mm<LEGACY_Q4_0>, "1..16-token Q4_0 matmul on int8 tensor cores");
    m.def("q4k_mm", &q45k_mm<false>, "1..16-token Q4_K matmul on int8 tensor cores (int8dot's two-level activation)");
    m.def("q5k_mm", &q45k_mm<true>, "1..16-token Q5_K matmul on int8 tensor cores (int8dot's two-level activation)");
    m.def("q6k_mm", &q6k_mm, "1..16-token Q6_K matmul on int8 tensor cores (int8dot's two-level activation)");
    m.def("q4k_mv", &q4k_mv, "one-token Q4_K matvec on int8dot's two-level activation");
    m.def("q6k_mv", &q6k_mv, "one-token Q6_K matvec on int8dot's two-level activation");
}
