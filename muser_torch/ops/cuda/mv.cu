// One-token K-quant matvecs in CUDA C++: y[n_out] = W x for one half-precision
// activation row, from the packed blocks as the file stores them.
//
// The activation arrives as int8dot.py's two int8 levels per 32 columns
// (x ~ dxs * (254 a1 + a2)), with the integer sums s16 of each 16 columns; the
// dots are dp4a on the weight codes, exact in int32, and the block scales are
// applied in float32 per 16 columns: the arithmetic of int8dot.py's kernels,
// with a different order of the float sums.
//
// One warp walks one output row (or a K-part of it, KSPLIT warps per row,
// combined through shared memory). Eight lanes share a super-block: lane g of
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

// Sum of the warp's partial sums over its KSPLIT warps, written by the first.
template <typename T>
__device__ __forceinline__ void finish_row(float acc, int row, int n_out, int kpart, int ksplit,
                                           T* __restrict__ y) {
    __shared__ float parts[WARPS];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (ksplit > 1) {
        if (lane == 0) parts[warp] = acc;
        __syncthreads();
        if (kpart != 0 || lane != 0) return;
        for (int k = 1; k < ksplit; ++k) acc += parts[warp + k];   // in K order: deterministic
    } else if (lane != 0) {
        return;
    }
    if (row < n_out) y[row] = from_float<T>(acc);
}

// ---- Q4_K ------------------------------------------------------------------------
// Lane g (0..7) of a block's eight: qs bytes 16 g .. 16 g + 15, which hold columns
// 64 (g/2) + 16 (g%2) + 0..15 in their low nibbles (sub-block 2 (g/2)) and the same
// + 32 in their high nibbles (sub-block 2 (g/2) + 1).
template <typename T>
__global__ void __launch_bounds__(WARPS * 32)
q4k_mv_kernel(const uint8_t* __restrict__ w, const int8_t* __restrict__ a1,
              const int8_t* __restrict__ a2, const float* __restrict__ dxs,
              const int* __restrict__ s16, T* __restrict__ y, int n_out, int nb, int ksplit) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int kpart = warp % ksplit;
    const int row = blockIdx.x * (WARPS / ksplit) + warp / ksplit;
    const int g = lane % 8, pair = g / 2;
    float acc = 0.f;
    if (row < n_out) {
        const uint8_t* wr = w + (size_t)row * nb * Q4_K_BYTES;
        for (int b = kpart * 4 + lane / 8; b < nb; b += 4 * ksplit) {
            const uint8_t* blk = wr + (size_t)b * Q4_K_BYTES;
            const int4 q = __ldg(reinterpret_cast<const int4*>(blk + Q4_K_QS + 16 * g));
            const uint32_t dd = __ldg(reinterpret_cast<const uint32_t*>(blk + Q4_K_D));
            const uint32_t* sp = reinterpret_cast<const uint32_t*>(blk + Q4_K_SCALES);
            const uint32_t s[3] = {__ldg(sp), __ldg(sp + 1), __ldg(sp + 2)};
            const int c = b * QK_K + 64 * pair + 16 * (g % 2);         // low nibbles' columns
            const int4 x1l = __ldg(reinterpret_cast<const int4*>(a1 + c));
            const int4 x2l = __ldg(reinterpret_cast<const int4*>(a2 + c));
            const int4 x1h = __ldg(reinterpret_cast<const int4*>(a1 + c + 32));
            const int4 x2h = __ldg(reinterpret_cast<const int4*>(a2 + c + 32));
            const int q0 = q.x & 0x0F0F0F0F, q1 = q.y & 0x0F0F0F0F,
                      q2 = q.z & 0x0F0F0F0F, q3 = q.w & 0x0F0F0F0F;
            const int h0 = (q.x >> 4) & 0x0F0F0F0F, h1 = (q.y >> 4) & 0x0F0F0F0F,
                      h2 = (q.z >> 4) & 0x0F0F0F0F, h3 = (q.w >> 4) & 0x0F0F0F0F;
            int lo = dp4a(q3, x1l.w, dp4a(q2, x1l.z, dp4a(q1, x1l.y, dp4a(q0, x1l.x, 0))));
            lo = dp4a(q3, x2l.w, dp4a(q2, x2l.z, dp4a(q1, x2l.y, dp4a(q0, x2l.x, lo * LEVEL))));
            int hi = dp4a(h3, x1h.w, dp4a(h2, x1h.z, dp4a(h1, x1h.y, dp4a(h0, x1h.x, 0))));
            hi = dp4a(h3, x2h.w, dp4a(h2, x2h.z, dp4a(h1, x2h.y, dp4a(h0, x2h.x, hi * LEVEL))));
            int sc0, m0, sc1, m1;
            scale_min(s, 2 * pair, sc0, m0);
            scale_min(s, 2 * pair + 1, sc1, m1);
            const float d = half_bits(dd), dmin = half_bits(dd >> 16);
            acc += __ldg(dxs + c / 32) * ((d * sc0) * (float)lo - (dmin * m0) * (float)__ldg(s16 + c / 16));
            acc += __ldg(dxs + c / 32 + 1) *
                   ((d * sc1) * (float)hi - (dmin * m1) * (float)__ldg(s16 + c / 16 + 2));
        }
    }
    finish_row(acc, row, n_out, kpart, ksplit, y);
}

// ---- Q6_K ------------------------------------------------------------------------
// Half hf = g / 4, quarter r = g % 4 of lane g: l = 8 r .. 8 r + 7 of that half, so
// ql bytes 64 hf + l and 64 hf + 32 + l and qh bytes 32 hf + l; columns
// 128 hf + l + 32 k (k = 0..3), each run of 8 in scale group 8 hf + r / 2 + 2 k.
// Blocks are 210 bytes: words are built from two 2-byte loads.
__device__ __forceinline__ int word2(const uint8_t* p) {
    const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
    return (int)((uint32_t)__ldg(h) | ((uint32_t)__ldg(h + 1) << 16));
}

template <typename T>
__global__ void __launch_bounds__(WARPS * 32)
q6k_mv_kernel(const uint8_t* __restrict__ w, const int8_t* __restrict__ a1,
              const int8_t* __restrict__ a2, const float* __restrict__ dxs,
              T* __restrict__ y, int n_out, int nb, int ksplit) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int kpart = warp % ksplit;
    const int row = blockIdx.x * (WARPS / ksplit) + warp / ksplit;
    const int g = lane % 8, hf = g / 4, r = g % 4;
    float acc = 0.f;
    if (row < n_out) {
        const uint8_t* wr = w + (size_t)row * nb * Q6_K_BYTES;
        for (int b = kpart * 4 + lane / 8; b < nb; b += 4 * ksplit) {
            const uint8_t* blk = wr + (size_t)b * Q6_K_BYTES;
            const uint8_t* ql = blk + Q6_K_QL + 64 * hf + 8 * r;
            const uint8_t* qh = blk + Q6_K_QH + 32 * hf + 8 * r;
            const int l0 = word2(ql), l1 = word2(ql + 4), u0 = word2(ql + 32), u1 = word2(ql + 36);
            const int g0 = word2(qh), g1 = word2(qh + 4);
            const float d = __half2float(__ushort_as_half(
                __ldg(reinterpret_cast<const unsigned short*>(blk + Q6_K_D))));
            const int8_t* scales = reinterpret_cast<const int8_t*>(blk + Q6_K_SCALES) + 8 * hf + r / 2;
            const int c = b * QK_K + 128 * hf + 8 * r;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                // codes 0..63 of the 8 columns c + 32 k .. + 7, recentred to -32..31 per byte
                const int lw0 = (k & 1) ? u0 : l0, lw1 = (k & 1) ? u1 : l1;
                const int sh = 4 * (k >> 1);
                const int c0 = __vsubss4(((lw0 >> sh) & 0x0F0F0F0F) | (((g0 >> (2 * k)) & 0x03030303) << 4),
                                         0x20202020);
                const int c1 = __vsubss4(((lw1 >> sh) & 0x0F0F0F0F) | (((g1 >> (2 * k)) & 0x03030303) << 4),
                                         0x20202020);
                const int cc = c + 32 * k;
                const int2 x1 = __ldg(reinterpret_cast<const int2*>(a1 + cc));
                const int2 x2 = __ldg(reinterpret_cast<const int2*>(a2 + cc));
                int dot = dp4a(c1, x1.y, dp4a(c0, x1.x, 0));
                dot = dp4a(c1, x2.y, dp4a(c0, x2.x, dot * LEVEL));
                acc += __ldg(dxs + cc / 32) * (d * (float)__ldg(scales + 2 * k)) * (float)dot;
            }
        }
    }
    finish_row(acc, row, n_out, kpart, ksplit, y);
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

static int ksplit_for(int64_t n_out, int64_t nb) {
    // Enough warps in flight to cover the memory latency: ~48 per SM on 132 SMs,
    // and at least one block of four per K-part.
    int k = 1;
    while (k < WARPS && n_out * k < 132 * 48 && nb >= 8 * k) k *= 2;
    return k;
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

void q4k_mv(torch::Tensor packed, torch::Tensor a1, torch::Tensor a2, torch::Tensor dxs,
            torch::Tensor s16, torch::Tensor y) {
    const int64_t n_out = y.numel(), nb = a1.size(-1) / QK_K;
    check_args(packed, a1, y, Q4_K_BYTES, 16, n_out, nb);
    const at::cuda::CUDAGuard guard(packed.device());
    const int ks = ksplit_for(n_out, nb);
    const dim3 grid((unsigned)((n_out + WARPS / ks - 1) / (WARPS / ks)));
    auto stream = at::cuda::getCurrentCUDAStream();
    by_out_type(y, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        q4k_mv_kernel<T><<<grid, WARPS * 32, 0, stream>>>(
            packed.data_ptr<uint8_t>(), a1.data_ptr<int8_t>(), a2.data_ptr<int8_t>(),
            dxs.data_ptr<float>(), s16.data_ptr<int>(), reinterpret_cast<T*>(y.data_ptr()),
            (int)n_out, (int)nb, ks);
    });
}

void q6k_mv(torch::Tensor packed, torch::Tensor a1, torch::Tensor a2, torch::Tensor dxs,
            torch::Tensor y) {
    const int64_t n_out = y.numel(), nb = a1.size(-1) / QK_K;
    check_args(packed, a1, y, Q6_K_BYTES, 2, n_out, nb);
    const at::cuda::CUDAGuard guard(packed.device());
    const int ks = ksplit_for(n_out, nb);
    const dim3 grid((unsigned)((n_out + WARPS / ks - 1) / (WARPS / ks)));
    auto stream = at::cuda::getCurrentCUDAStream();
    by_out_type(y, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        q6k_mv_kernel<T><<<grid, WARPS * 32, 0, stream>>>(
            packed.data_ptr<uint8_t>(), a1.data_ptr<int8_t>(), a2.data_ptr<int8_t>(),
            dxs.data_ptr<float>(), reinterpret_cast<T*>(y.data_ptr()), (int)n_out, (int)nb, ks);
    });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("q4k_mv", &q4k_mv, "one-token Q4_K matvec on int8dot's two-level activation");
    m.def("q6k_mv", &q6k_mv, "one-token Q6_K matvec on int8dot's two-level activation");
}
