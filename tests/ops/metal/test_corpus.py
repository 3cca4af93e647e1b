"""Kernels written the way other projects write them, run unmodified through
the emulator under every lane schedule, each checked against numpy / float64:

- PyTorch's compile_shader style: no buffer attributes, scalars as
  ``constant T&``, templates instantiated with ``[[host_name]]``;
- a llama.cpp-style Q4_K matrix-vector kernel (16-bit mask unpacking,
  simd_sum), checked against gguf's numpy dequantizer;
- an MLX-style row reduction over threadgroup memory
  (``decltype`` instantiations), also with the barrier deleted;
- a tiled simdgroup-matrix GEMM, half operands into float accumulators,
  with a transposed operand;
- atomics on threadgroup and device memory; simd/quad scans, shuffles, votes;
  vectors, swizzles, as_type, bfloat.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from muser_torch.formats import GGMLType, random_weight
from muser_torch_metal_emulator import emulator as em

from .helpers import fresh_seed, rel_err

PYTORCH_STYLE = r"""
#include <metal_stdlib>
using namespace metal;

kernel void full(device float* out, constant float& val, uint idx [[thread_position_in_grid]]) {
  out[idx] = val;
}

kernel void axpby(device float* out, device const float* x, device const half* y, constant float& a,
                  constant float& b, uint tid [[thread_position_in_grid]]) {
  out[tid] = a * x[tid] + b * float(y[tid]);
}

kernel void arange_3d(device float* out, constant float& start, constant float& step,
                      uint3 pos [[thread_position_in_grid]], uint3 size [[threads_per_grid]]) {
  const uint idx = pos.x + size.x * (pos.y + size.y * pos.z);
  out[idx] = start + step * idx;
}

kernel void scale_half(device half* out, device const half* x, constant half& s, constant int& n,
                       uint i [[thread_position_in_grid]]) {
  if (i >= uint(n)) return;
  out[i] = x[i] * s;
}

template <typename T>
kernel void add_one(device T* out, device const T* x, uint i [[thread_position_in_grid]]) {
  out[i] = x[i] + T(1);
}
template [[host_name("add_one_float")]] kernel void add_one<float>(device float*, device const float*, uint);
template [[host_name("add_one_int")]] kernel void add_one<int>(device int*, device const int*, uint);

kernel void vector_ops(device const float4* x, device float4* y, device uint* bits, device bfloat* b,
                       device float* norms, uint i [[thread_position_in_grid]]) {
  const float4 v = x[i];
  const float2 s = v.xy * v.zw + v.yx;
  float4 r = float4(s, dot(v, v), 0.0);
  r.w = length(v.xyz);
  r.zw = r.wz;
  y[i] = r;
  bits[i] = as_type<uint>(half2(v.xw));
  b[i] = bfloat(v.z);
  norms[i] = metal::precise::sqrt(fma(v.x, v.x, v.y * v.y));
}
"""

# llama.cpp's Q4_K matrix-vector product, in its style: each simdgroup owns two
# rows; 8 lanes share a super-block, each lane 16 bytes of qs (low nibbles of one
# sub-block, high nibbles of the next) read as 16-bit words, masked without
# shifts against pre-scaled activations; scales unpacked with 16-bit masks.
LLAMA_STYLE = r"""
#include <metal_stdlib>
using namespace metal;
#define QK_K 256
#define N_DST 2
#define N_SIMDGROUP 2

typedef struct {
  half d;
  half dmin;
  uchar scales[12];
  uchar qs[QK_K / 2];
} block_q4_K;

typedef struct {
  int64_t ne00;   // elements per row
  int64_t ne01;   // rows
  uint64_t nb01;  // bytes per row
} mv_args;

kernel void kernel_mul_mv_q4_K_f32(device const char* src0, device const float* src1, device float* dst,
                                   constant mv_args& args, uint3 tgpig [[threadgroup_position_in_grid]],
                                   ushort tiisg [[thread_index_in_simdgroup]],
                                   ushort sgitg [[simdgroup_index_in_threadgroup]]) {
  const uint16_t kmask1 = 0x3f3f, kmask2 = 0x0f0f, kmask3 = 0xc0c0;
  const int nb = args.ne00 / QK_K;
  const int first_row = (tgpig.x * N_SIMDGROUP + sgitg) * N_DST;
  const short ix = tiisg / 8, it = tiisg % 8, g = it / 2, h = it % 2;
  float yl[16], yh[16];
  float sumf[N_DST] = {0.f};
  for (int ib = ix; ib < nb; ib += 4) {
    device const float* y4 = src1 + ib * QK_K + 64 * g + 16 * h;
    float sumy_l = 0.f, sumy_h = 0.f;
    for (short i = 0; i < 16; i += 2) {
      yl[i] = y4[i];            yl[i + 1] = y4[i + 1] / 256.f;
      yh[i] = y4[i + 32] / 16.f; yh[i + 1] = y4[i + 33] / 4096.f;
      sumy_l += y4[i] + y4[i + 1];
      sumy_h += y4[i + 32] + y4[i + 33];
    }
    for (short row = 0; row < N_DST; ++row) {
      const int r = min(first_row + row, int(args.ne01) - 1);
      device const block_q4_K* x = (device const block_q4_K*)(src0 + r * args.nb01) + ib;
      device const uint16_t* sc = (device const uint16_t*)x->scales;
      uint16_t s16, m16;
      if (g < 2) {
        s16 = sc[g] & kmask1;
        m16 = sc[g + 2] & kmask1;
      } else {
        s16 = (sc[g + 2] & kmask2) | ((sc[g - 2] & kmask3) >> 2);
        m16 = ((sc[g + 2] >> 4) & kmask2) | ((sc[g] & kmask3) >> 2);
      }
      device const uint16_t* q = (device const uint16_t*)(x->qs + 32 * g + 16 * h);
      float4 acc = 0.f;
      for (short i = 0; i < 8; ++i) {
        acc[0] += yl[2 * i] * (q[i] & 0x000F);
        acc[1] += yl[2 * i + 1] * (q[i] & 0x0F00);
        acc[2] += yh[2 * i] * (q[i] & 0x00F0);
        acc[3] += yh[2 * i + 1] * (q[i] & 0xF000);
      }
      const float d = x->d, dmin = x->dmin;
      sumf[row] += d * (float(s16 & 0xFF) * (acc[0] + acc[1]) + float(s16 >> 8) * (acc[2] + acc[3])) -
                   dmin * (float(m16 & 0xFF) * sumy_l + float(m16 >> 8) * sumy_h);
    }
  }
  for (short row = 0; row < N_DST; ++row) {
    const float all = simd_sum(sumf[row]);
    if (tiisg == 0 && first_row + row < args.ne01) dst[first_row + row] = all;
  }
}
"""

# MLX's row reduction: strided loads, simd_sum, one partial per simdgroup in
# threadgroup memory, a second simd_sum in the first simdgroup.
MLX_STYLE = r"""
#include <metal_stdlib>
using namespace metal;
static constant constexpr const int SIMD_SIZE = 32;

template <typename T, int N_READS>
[[kernel]] void row_reduce_sum(const device T* in [[buffer(0)]], device float* out [[buffer(1)]],
                               const constant size_t& row_size [[buffer(2)]],
                               uint gid [[threadgroup_position_in_grid]], uint lid [[thread_position_in_threadgroup]],
                               uint lsize [[threads_per_threadgroup]], uint simd_lane_id [[thread_index_in_simdgroup]],
                               uint simd_group_id [[simdgroup_index_in_threadgroup]],
                               uint simd_per_group [[simdgroups_per_threadgroup]]) {
  threadgroup float local_sums[SIMD_SIZE];
  in += gid * row_size;
  float total = 0;
  for (size_t r = lid * N_READS; r < row_size; r += lsize * N_READS) {
    for (int i = 0; i < N_READS && r + i < row_size; ++i) total += static_cast<float>(in[r + i]);
  }
  total = simd_sum(total);
  if (simd_lane_id == 0) local_sums[simd_group_id] = total;
  SYNC_POINT
  if (simd_group_id == 0) {
    total = simd_lane_id < simd_per_group ? local_sums[simd_lane_id] : 0;
    total = simd_sum(total);
    if (lid == 0) out[gid] = total;
  }
}
template [[host_name("row_reduce_sum_float")]] [[kernel]] decltype(row_reduce_sum<float, 4>) row_reduce_sum<float, 4>;
template [[host_name("row_reduce_sum_half")]] [[kernel]] decltype(row_reduce_sum<half, 4>) row_reduce_sum<half, 4>;
"""

# C[M, N] = A[M, K] B[K, N]: half operands, float accumulators. A threadgroup
# (4 simdgroups) owns a 32x32 tile of C; per K step of 16 the threads stage
# A and B tiles in threadgroup memory; simdgroup s owns a 16x16 quarter as
# 2x2 8x8 matrices. The _bt variant takes B transposed ([N, K]) and loads it
# with transpose = true.
GEMM = r"""
#include <metal_stdlib>
using namespace metal;
#define BM 32
#define BN 32
#define BK 16

template <bool B_TRANSPOSED>
kernel void gemm(device const half* A, device const half* B, device float* C, constant uint& M, constant uint& N,
                 constant uint& K, uint2 tg [[threadgroup_position_in_grid]],
                 ushort tid [[thread_index_in_threadgroup]], ushort sg [[simdgroup_index_in_threadgroup]]) {
  threadgroup half As[BM * BK];
  threadgroup half Bs[BK * BN];
  const uint row0 = tg.y * BM, col0 = tg.x * BN;
  const uint sr = (sg / 2) * 16, sc = (sg % 2) * 16;
  simdgroup_float8x8 acc[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.f);
  for (uint k0 = 0; k0 < K; k0 += BK) {
    for (uint e = tid; e < BM * BK; e += 128) {
      As[e] = A[(row0 + e / BK) * K + k0 + e % BK];
      // Bs is [BK][BN], or [BN][BK] when B is transposed.
      Bs[e] = B_TRANSPOSED ? B[(col0 + e / BK) * K + k0 + e % BK] : B[(k0 + e / BN) * N + col0 + e % BN];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint kk = 0; kk < BK; kk += 8) {
      simdgroup_half8x8 a[2], b[2];
      for (int i = 0; i < 2; ++i) simdgroup_load(a[i], As, BK, ulong2(kk, sr + 8 * i));
      for (int j = 0; j < 2; ++j) {
        if (B_TRANSPOSED) simdgroup_load(b[j], Bs + (sc + 8 * j) * BK + kk, BK, ulong2(0, 0), true);
        else simdgroup_load(b[j], Bs, BN, ulong2(sc + 8 * j, kk));
      }
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) simdgroup_multiply_accumulate(acc[i][j], a[i], b[j], acc[i][j]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) simdgroup_store(acc[i][j], C, N, ulong2(col0 + sc + 8 * j, row0 + sr + 8 * i));
}
template [[host_name("gemm_nn")]] kernel void gemm<false>(device const half*, device const half*, device float*,
    constant uint&, constant uint&, constant uint&, uint2, ushort, ushort);
template [[host_name("gemm_nt")]] kernel void gemm<true>(device const half*, device const half*, device float*,
    constant uint&, constant uint&, constant uint&, uint2, ushort, ushort);
"""

COLLECTIVES = r"""
#include <metal_stdlib>
using namespace metal;

kernel void histogram(device const uint* x, device atomic_uint* hist, device float* total, constant uint& n,
                      uint i [[thread_position_in_grid]], uint lid [[thread_index_in_threadgroup]],
                      uint lsize [[threads_per_threadgroup]]) {
  threadgroup atomic_uint local[16];
  for (uint b = lid; b < 16; b += lsize) atomic_store_explicit(&local[b], 0u, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (i < n) {
    atomic_fetch_add_explicit(&local[x[i] % 16], 1u, memory_order_relaxed);
    atomic_fetch_add_explicit((device atomic_float*)total, float(x[i]), memory_order_relaxed);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint b = lid; b < 16; b += lsize)
    atomic_fetch_add_explicit(&hist[b], atomic_load_explicit(&local[b], memory_order_relaxed), memory_order_relaxed);
}

kernel void lanes(device const float* x, device float* out, uint i [[thread_position_in_grid]]) {
  const float v = x[i];
  const uint n = 9;   // outputs per thread
  out[n * i + 0] = simd_prefix_inclusive_sum(v);
  out[n * i + 1] = simd_prefix_exclusive_sum(v);
  out[n * i + 2] = quad_sum(v);
  out[n * i + 3] = simd_shuffle_rotate_down(v, 5);
  out[n * i + 4] = simd_shuffle_up(v, 3);
  out[n * i + 5] = quad_shuffle_xor(v, 1);
  out[n * i + 6] = simd_broadcast(v, 7);
  out[n * i + 7] = simd_max(v);
  out[n * i + 8] = quad_prefix_exclusive_sum(v);
}

// Also for a partial last simdgroup: only its active lanes take part.
kernel void partial(device const float* x, device float* out, device uint* votes,
                    uint i [[thread_position_in_grid]]) {
  const float v = x[i];
  out[3 * i] = simd_prefix_inclusive_sum(v);
  out[3 * i + 1] = simd_prefix_exclusive_sum(v);
  out[3 * i + 2] = quad_sum(v);
  votes[2 * i] = uint(simd_vote::vote_t(simd_ballot(v > 0.0f)));
  votes[2 * i + 1] = simd_is_first() ? 1 : 0;
}
"""


def _arrays(seed: int, *shapes):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) for s in shapes]


@pytest.fixture(scope="module")
def pytorch_style():
    return em.compile_shader(PYTORCH_STYLE)


def test_pytorch_style(pytorch_style, lane_schedule):
    lib, seed = pytorch_style, fresh_seed()
    x, y = _arrays(seed, (100,), (100,))
    out = torch.zeros(100)
    lib.full(out, 3.14)                                  # threads: the first tensor's numel
    assert torch.equal(out, torch.full((100,), 3.14))
    y = y.half()
    lib.axpby(out, x, y, 2.0, -0.5)
    want = 2.0 * x.double() - 0.5 * y.double()
    assert rel_err(out, want) < 1e-6, f"axpby ({lane_schedule}, seed {seed})"
    grid = torch.zeros(4, 3, 5)
    lib.arange_3d(grid, 1.5, 0.25, threads=(5, 3, 4), group_size=(2, 2, 2))
    assert torch.allclose(grid.flatten().double(), 1.5 + 0.25 * torch.arange(60).double()), lane_schedule
    xh, oh = x.half(), torch.zeros(100, dtype=torch.half)
    lib.scale_half(oh, xh, 0.75, 90, arg_casts={2: "fp16"}, threads=128, group_size=64)
    assert torch.equal(oh[:90], (xh[:90].float() * 0.75).half()) and torch.equal(oh[90:], torch.zeros(10).half())
    ints = torch.randint(-100, 100, (50,), dtype=torch.int32, generator=torch.Generator().manual_seed(seed))
    oi = torch.zeros(50, dtype=torch.int32)
    lib.add_one_int(oi, ints)
    lib.add_one_float(out, x)
    assert torch.equal(oi, ints + 1) and torch.equal(out, x + 1), lane_schedule


def test_pytorch_metal_headers(lane_schedule):
    """compile_shader inlines PyTorch's own headers (#include <c10/metal/...>);
    so does the emulator, and they run."""
    lib = em.compile_shader("#include <c10/metal/special_math.h>\nusing namespace metal;\n"
                            "kernel void erf_k(device float* out, device const float* x,\n"
                            "                  uint i [[thread_position_in_grid]]) {\n"
                            "  out[i] = c10::metal::erf(x[i]);\n}\n")
    seed = fresh_seed()
    (x,) = _arrays(seed, (200,))
    out = torch.zeros(200)
    lib.erf_k(out, 2 * x)
    err = float((out.double() - torch.erf(2 * x.double())).abs().max())
    assert err < 1e-6, f"{err:.3g} ({lane_schedule}, seed {seed})"


def test_vectors_swizzles_and_conversions(pytorch_style, lane_schedule):
    seed = fresh_seed()
    (x,) = _arrays(seed, (40, 4))
    y, bits, b, norms = torch.zeros(40, 4), torch.zeros(40, dtype=torch.int32), \
        torch.zeros(40, dtype=torch.bfloat16), torch.zeros(40)
    pytorch_style.vector_ops(x, y, bits, b, norms, threads=40)
    xd = x.double()
    s = xd[:, :2] * xd[:, 2:] + xd[:, [1, 0]]
    want = torch.stack([s[:, 0], s[:, 1], xd[:, :3].norm(dim=1), (xd * xd).sum(1)], 1)
    assert rel_err(y, want) < 1e-6, f"seed {seed}"
    assert torch.equal(bits.view(torch.int16).view(40, 2), x[:, [0, 3]].half().view(torch.int16))
    assert torch.equal(b, x[:, 2].to(torch.bfloat16))     # round to nearest even, as torch
    assert rel_err(norms, (xd[:, 0] ** 2 + xd[:, 1] ** 2).sqrt()) < 1e-6


def _q4_k_rows(n_rows: int, n_in: int, seed: int) -> torch.Tensor:
    """Random Q4_K rows (``formats.random_weight``: random codes, small d and dmin)."""
    return random_weight(GGMLType.Q4_K, n_rows, n_in,
                         generator=torch.Generator().manual_seed(seed)).packed


@pytest.mark.parametrize("n_rows,n_in", [(10, 1024), (7, 768)])
def test_llama_style_q4_k_matvec(n_rows, n_in, lane_schedule):
    seed = fresh_seed()
    w = _q4_k_rows(n_rows, n_in, seed)
    (x,) = _arrays(seed + 1, (n_in,))
    dst = torch.zeros(n_rows)
    args = torch.tensor([n_in, n_rows, w.shape[1]], dtype=torch.int64)
    lib = em.compile_shader(LLAMA_STYLE)
    lib.kernel_mul_mv_q4_K_f32(w, x, dst, args, threads=(-(-n_rows // 4) * 64, 1, 1), group_size=(64, 1, 1))
    ref = gguf_dequantize(w.numpy(), GGMLQuantizationType.Q4_K).astype(np.float64) @ x.double().numpy()
    err = rel_err(dst, torch.from_numpy(ref))
    assert err < 1e-5, f"rel err {err:.3g} ({lane_schedule}, seed {seed})"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mlx_style_row_reduce(dtype, lane_schedule):
    seed = fresh_seed()
    (x,) = _arrays(seed, (5, 1000))
    x = x.to(dtype)
    lib = em.compile_shader(MLX_STYLE.replace("SYNC_POINT", "threadgroup_barrier(mem_flags::mem_threadgroup);"))
    out = torch.zeros(5)
    kernel = getattr(lib, "row_reduce_sum_" + ("float" if dtype == torch.float32 else "half"))
    kernel(x, out, 1000, threads=5 * 96, group_size=96)        # 3 simdgroups a row
    err = rel_err(out, x.double().sum(1))
    assert err < 1e-5, f"rel err {err:.3g} ({lane_schedule}, seed {seed})"


def test_mlx_style_reduce_without_its_barrier_is_exposed():
    """With the barrier deleted, the first simdgroup reads partial sums the
    others have not written: NaN under the forward schedule (threadgroup
    memory starts as NaN)."""
    seed = fresh_seed()
    (x,) = _arrays(seed, (5, 1000))
    lib = em.compile_shader(MLX_STYLE.replace("SYNC_POINT", ""))
    exposed = []
    for name in em.SCHEDULES:
        with em.schedule(name, seed):
            out = torch.zeros(5)
            lib.row_reduce_sum_float(x, out, 1000, threads=5 * 96, group_size=96)
            if not rel_err(out, x.double().sum(1)) < 1e-5:
                exposed.append(name)
    assert "forward" in exposed, f"the missing barrier went unnoticed (seed {seed})"


@pytest.mark.parametrize("variant", ["gemm_nn", "gemm_nt"])
def test_tiled_simdgroup_matrix_gemm(variant, lane_schedule):
    seed = fresh_seed()
    M, N, K = 64, 96, 48
    a, b = _arrays(seed, (M, K), (K, N))
    a, b = a.half(), b.half()
    bt = b.t().contiguous() if variant == "gemm_nt" else b
    c = torch.zeros(M, N)
    lib = em.compile_shader(GEMM)
    getattr(lib, variant)(a, bt, c, M, N, K, threads=(N // 32 * 128, M // 32), group_size=(128, 1),
                          arg_casts="int32")
    err = rel_err(c, a.double() @ b.double())
    assert err < 1e-5, f"{variant}: rel err {err:.3g} ({lane_schedule}, seed {seed})"


def test_atomics_and_lane_functions(lane_schedule):
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    lib = em.compile_shader(COLLECTIVES)
    x = torch.randint(0, 1000, (300,), dtype=torch.int32, generator=g)
    hist, total = torch.zeros(16, dtype=torch.int32), torch.zeros(1)
    lib.histogram(x, hist, total, 300, threads=320, group_size=64, arg_casts={3: "int32"})
    assert torch.equal(hist.long(), torch.bincount(x.long() % 16, minlength=16)), lane_schedule
    assert abs(float(total) - float(x.double().sum())) < 1e-6 * float(x.double().sum())

    v = torch.randn(64, generator=g)
    out = torch.zeros(64 * 9)
    lib.lanes(v, out, threads=64, group_size=64)
    out, vd = out.view(64, 9).double(), v.double()
    for lo in (0, 32):
        s, lane = vd[lo:lo + 32], torch.arange(32)
        quads = s.view(-1, 4)
        assert torch.allclose(out[lo:lo + 32, 0], s.cumsum(0), atol=1e-5), lane_schedule
        assert torch.allclose(out[lo:lo + 32, 1], s.cumsum(0) - s, atol=1e-5)
        assert torch.allclose(out[lo:lo + 32, 2], quads.sum(1).repeat_interleave(4), atol=1e-5)
        assert torch.equal(out[lo:lo + 32, 3], s[(lane + 5) % 32])
        assert torch.equal(out[lo:lo + 32, 4], s[torch.where(lane >= 3, lane - 3, lane)])
        assert torch.equal(out[lo:lo + 32, 5], s[lane ^ 1])
        assert torch.equal(out[lo:lo + 32, 6], s[7].expand(32))
        assert torch.equal(out[lo:lo + 32, 7], s.max().expand(32))
        assert torch.allclose(out[lo:lo + 32, 8], (quads.cumsum(1) - quads).flatten(), atol=1e-5)

    v = torch.randn(40, generator=g)           # two simdgroups: 32 lanes and 8
    out, votes = torch.zeros(40 * 3), torch.zeros(80, dtype=torch.int32)
    lib.partial(v, out, votes, threads=40, group_size=40)
    out, votes, vd = out.view(40, 3).double(), votes.view(40, 2), v.double()
    for lo, hi in ((0, 32), (32, 40)):
        s, n = vd[lo:hi], hi - lo
        assert torch.allclose(out[lo:hi, 0], s.cumsum(0), atol=1e-5), lane_schedule
        assert torch.allclose(out[lo:hi, 1], s.cumsum(0) - s, atol=1e-5)
        assert torch.allclose(out[lo:hi, 2], s.view(-1, 4).sum(1).repeat_interleave(4), atol=1e-5)
        mask = sum(1 << k for k in range(n) if s[k] > 0)
        assert votes[lo:hi, 0].tolist() == [mask - (1 << 32) if mask >= 1 << 31 else mask] * n
        assert votes[lo:hi, 1].tolist() == [1] + [0] * (n - 1)


def test_rotate_reading_a_missing_lane_is_reported():
    """In the 8-lane simdgroup, rotating by 5 reads lanes that do not exist."""
    lib = em.compile_shader(COLLECTIVES)
    with pytest.raises(em.MetalEmulatorError, match=r"simd_shuffle_rotate_down on lane \d+ reads lane \d+, "
                                                     r"which is not active"):
        lib.lanes(torch.randn(40), torch.zeros(360), threads=40, group_size=40)
