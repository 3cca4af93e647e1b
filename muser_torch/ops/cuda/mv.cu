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
            const float d = __half2float(__ushort_as_half(
                __ldg(reinterpret_cast<const unsigned short*>(blk + Q6_K_D))));
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("q4k_mv", &q4k_mv, "one-token Q4_K matvec on int8dot's two-level activation");
    m.def("q6k_mv", &q6k_mv, "one-token Q6_K matvec on int8dot's two-level activation");
}
