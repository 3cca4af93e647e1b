"""The emulator's own checks: it must catch what real Metal would get wrong
silently (missing barriers, out-of-bounds reads, divergent collectives,
oversized threadgroup memory) and bind arguments as compile_shader does."""
from __future__ import annotations

import pytest
import torch

from muser_torch_metal_emulator import emulator as em

from ..ops.metal.helpers import fresh_seed

SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

// Reverse 64 values through threadgroup memory; `sync` selects the barrier.
kernel void reverse_tile(device const float *x [[buffer(0)]], device float *y [[buffer(1)]],
                         constant long &sync [[buffer(2)]],
                         ushort t [[thread_index_in_threadgroup]]) {
  threadgroup float tile[64];
  tile[t] = x[t];
  if (sync) threadgroup_barrier(mem_flags::mem_threadgroup);
  y[t] = tile[63 - t];
}

// Like reverse_tile, but a simd_sum sits between the write and the read: it
// synchronises a simdgroup, not the threadgroup, so the barrier is still needed.
kernel void reverse_tile_simd(device const float *x [[buffer(0)]], device float *y [[buffer(1)]],
                              constant long &sync [[buffer(2)]],
                              ushort t [[thread_index_in_threadgroup]]) {
  threadgroup float tile[64];
  tile[t] = x[t];
  const float lanes = simd_sum(1.0f);
  if (sync) threadgroup_barrier(mem_flags::mem_threadgroup);
  y[t] = tile[63 - t] * (lanes / 32.0f);
}

kernel void shifted_copy(device const float *x [[buffer(0)]], device float *y [[buffer(1)]],
                         constant long &shift [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  y[i] = x[i + shift];
}

kernel void half_sum(device const float *x [[buffer(0)]], device float *y [[buffer(1)]],
                     constant long &split [[buffer(2)]], ushort lane [[thread_index_in_simdgroup]]) {
  float v = x[lane];
  if (lane < split) {
    v = simd_sum(v);
  }
  y[lane] = v;
}

kernel void two_sums(device const float *x [[buffer(0)]], device float *y [[buffer(1)]],
                     ushort lane [[thread_index_in_simdgroup]]) {
  float v = x[lane];
  if (lane < 16) {
    v = simd_sum(v);
  } else {
    v = simd_sum(v * 2.0f);
  }
  y[lane] = v;
}

kernel void early_return(device float *y [[buffer(0)]], ushort t [[thread_index_in_threadgroup]]) {
  threadgroup float a[64];
  a[t] = float(t);
  if (t == 40) return;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  y[t] = a[63 - t];
}

kernel void two_barriers(device float *y [[buffer(0)]], ushort t [[thread_index_in_threadgroup]]) {
  if (t < 32) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  } else {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  y[t] = 1.0f;
}

kernel void shuffles(device const float *x [[buffer(0)]], device float *y [[buffer(1)]],
                     ushort lane [[thread_index_in_simdgroup]]) {
  const float v = x[lane];
  y[lane] = simd_shuffle_down(v, ushort(3));
  y[32 + lane] = simd_broadcast(v, ushort(5));
  y[64 + lane] = simd_max(v);
  y[96 + lane] = simd_shuffle_xor(v, ushort(1));
}

kernel void row_sums(device const float *x [[buffer(0)]], device float *y [[buffer(1)]],
                     constant long &n [[buffer(2)]], uint row [[threadgroup_position_in_grid]],
                     ushort lane [[thread_index_in_simdgroup]]) {
  float acc = 0.0f;
  for (long i = lane; i < n; i += 32) acc += x[row * n + i];
  acc = simd_sum(acc);
  if (lane == 0) y[row] = acc;
}

kernel void too_much_shared(device float *y [[buffer(0)]], ushort t [[thread_index_in_threadgroup]]) {
  threadgroup float a[4096];
  threadgroup float b[4096 + 1];
  a[t] = 1.0f; b[t] = 2.0f;
  y[t] = a[t] + b[t];
}

kernel void read_unwritten(device float *y [[buffer(0)]], ushort t [[thread_index_in_threadgroup]]) {
  threadgroup float a[32];
  threadgroup half h[32];
  y[t] = a[t] + float(h[t]);
}

// Writes its position; checks the calling convention and partial edge groups.
kernel void positions(device long *out [[buffer(0)]], constant int &tag [[buffer(1)]],
                      constant float &scale [[buffer(2)]], device float *f [[buffer(3)]],
                      uint2 pos [[thread_position_in_grid]], uint2 grid [[threads_per_grid]],
                      uint2 tg [[threadgroup_position_in_grid]]) {
  out[pos.y * grid.x + pos.x] = 1000000 * long(tag) + 1000 * long(tg.y) + long(tg.x);
  f[pos.y * grid.x + pos.x] = scale;
}

kernel void matrix_product(device const float *a [[buffer(0)]], device const float *b [[buffer(1)]],
                           device float *c [[buffer(2)]], ushort t [[thread_index_in_threadgroup]]) {
  threadgroup float sa[64];
  threadgroup float sb[64];
  sa[t] = a[t]; sa[t + 32] = a[t + 32];
  sb[t] = b[t]; sb[t + 32] = b[t + 32];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  simdgroup_float8x8 A, B, C = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  simdgroup_load(A, sa, 8);
  simdgroup_load(B, sb, 8, ulong2(0, 0), true);
  simdgroup_multiply_accumulate(C, A, B, C);
  simdgroup_store(C, c, 8);
}

kernel void nonuniform_load(device const float *a [[buffer(0)]], device float *c [[buffer(1)]],
                            ushort t [[thread_index_in_threadgroup]]) {
  simdgroup_float8x8 A;
  simdgroup_load(A, a + (t & 1), 8);
  simdgroup_store(A, c, 8);
}
"""


@pytest.fixture(scope="module")
def lib():
    return em.compile_shader(SOURCE)


@pytest.mark.parametrize("kernel", ["reverse_tile", "reverse_tile_simd"],
                         ids=["within_a_simdgroup", "between_simdgroups"])
def test_missing_barrier_is_caught(lib, kernel):
    seed = fresh_seed()
    x = torch.randn(64, generator=torch.Generator().manual_seed(seed))
    run = getattr(lib, kernel)
    for name in em.SCHEDULES:
        with em.schedule(name, seed):
            y = torch.zeros(64)
            run(x, y, 1, threads=64, group_size=64)
            assert torch.equal(y, x.flip(0)), f"{kernel} with the barrier, schedule {name} (seed {seed})"
            y = torch.zeros(64)
            run(x, y, 0, threads=64, group_size=64)
            # The lanes that run first read slots nobody has written: NaN.
            assert torch.isnan(y).any(), \
                f"{kernel}: missing barrier not exposed by schedule {name} (seed {seed})"


def test_out_of_bounds_read_is_caught(lib):
    x, y = torch.randn(40), torch.zeros(40)
    lib.shifted_copy(x, y, 0, threads=40, group_size=32)
    assert torch.equal(x, y)
    with pytest.raises(em.MetalEmulatorError, match=r"shifted_copy: out-of-bounds access to buffer\(0\): "
                                                     r"byte 160 of a 160-byte buffer"):
        lib.shifted_copy(x, y, 1, threads=40, group_size=32)
    # The start is guarded only a page away (the end gets the exact guard).
    with pytest.raises(em.MetalEmulatorError, match=r"buffer\(0\): 4096 bytes before its start"):
        lib.shifted_copy(x, y, -1024, threads=40, group_size=32)


def test_divergent_simd_sum_covers_the_active_lanes(lib):
    """Inside `if (lane < split)` the lanes outside the branch are inactive, as
    on Metal: simd_sum adds the lanes that take it. Lanes waiting at two
    different collectives are divergence the emulator cannot order: reported."""
    x = torch.randn(32)
    y = torch.zeros(32)
    lib.half_sum(x, y, 32, threads=32, group_size=32)
    assert torch.allclose(y, x.sum().expand(32), rtol=1e-6, atol=1e-6)
    lib.half_sum(x, y, 16, threads=32, group_size=32)
    assert torch.allclose(y[:16], x[:16].sum().expand(16), rtol=1e-6, atol=1e-6)
    assert torch.equal(y[16:], x[16:])
    with pytest.raises(em.MetalEmulatorError,
                       match=r"lane 0 is at simd_sum \(source\.metal:\d+\), lane 16 at simd_sum"):
        lib.two_sums(x, y, threads=32, group_size=32)


def test_divergent_barriers_are_caught(lib):
    y = torch.zeros(64)
    with pytest.raises(em.MetalEmulatorError, match=r"threadgroup_barrier at source\.metal:\d+ is not reached by "
                                                     r"threadgroup \(0,0,0\) thread 40"):
        lib.early_return(y, threads=64, group_size=64)
    with pytest.raises(em.MetalEmulatorError, match=r"threads 0 and 32 wait at different barriers"):
        lib.two_barriers(y, threads=64, group_size=64)


def test_simd_sum_reduces_every_row(lib, lane_schedule):
    seed = fresh_seed()
    x = torch.randn(5, 100, generator=torch.Generator().manual_seed(seed))
    y = torch.zeros(5)
    lib.row_sums(x, y, 100, threads=5 * 32, group_size=32)
    assert torch.allclose(y.double(), x.double().sum(1), rtol=1e-5, atol=1e-5), f"seed {seed}"


def test_simd_shuffles(lib, lane_schedule):
    x = torch.randn(32)
    y = torch.zeros(128)
    lib.shuffles(x, y, threads=32, group_size=32)
    lanes = torch.arange(32)
    down = torch.where(lanes + 3 < 32, (lanes + 3).clamp(max=31), lanes)
    assert torch.equal(y[:32], x[down])
    assert torch.equal(y[32:64], x[5].expand(32))
    assert torch.equal(y[64:96], x.max().expand(32))
    assert torch.equal(y[96:], x[lanes ^ 1])


def test_threadgroup_memory_limit(lib):
    with pytest.raises(em.MetalEmulatorError, match=r"threadgroup memory 32772 bytes .* exceeds "
                                                     r"Metal's limit of 32768 bytes"):
        lib.too_much_shared(torch.zeros(32), threads=32, group_size=32)


def test_threadgroup_memory_starts_as_nan(lib):
    y = torch.zeros(32)
    lib.read_unwritten(y, threads=32, group_size=32)
    assert torch.isnan(y).all()


def test_calling_convention(lib):
    # 2-D grid 10 x 3 in groups of 4 x 2: edge groups are partial (dispatchThreads).
    out = torch.full((3, 10), -1, dtype=torch.int64)
    f = torch.zeros(3, 10)
    lib.positions(out, 7, 0.5, f, threads=(10, 3), group_size=(4, 2), arg_casts={1: "int32"})
    gx = torch.arange(10) // 4
    gy = torch.arange(3) // 2
    want = 7_000_000 + 1000 * gy[:, None] + gx[None, :]
    assert torch.equal(out, want)
    assert torch.equal(f, torch.full((3, 10), 0.5))
    with pytest.raises(TypeError, match="binds 4 buffers, got 3"):
        lib.positions(out, 7, 0.5, threads=1, group_size=1)
    with pytest.raises(ValueError, match="contiguous"):
        lib.positions(out.t(), 7, 0.5, f, threads=1, group_size=1)


def test_const_buffers_are_not_written_back(lib):
    x, y = torch.randn(64), torch.zeros(64)
    before = x.clone()
    lib.reverse_tile(x, y, 1, threads=64, group_size=64)
    assert torch.equal(x, before)


def test_simdgroup_matrices(lib):
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    a, b, c = torch.randn(64, generator=g), torch.randn(64, generator=g), torch.zeros(64)
    lib.matrix_product(a, b, c, threads=32, group_size=32)
    want = a.view(8, 8).double() @ b.view(8, 8).double().T       # B was loaded transposed
    assert torch.allclose(c.view(8, 8).double(), want, rtol=1e-5, atol=1e-5), f"seed {seed}"
    with pytest.raises(em.MetalEmulatorError, match=r"simdgroup_load at source\.metal:\d+ needs the same address"):
        lib.nonuniform_load(a, c, threads=32, group_size=32)


def test_threadgroup_declarations_outside_a_function_are_rejected():
    src = "threadgroup float t[4];\nkernel void k(device float *y [[buffer(0)]]) { y[0] = t[0]; }"
    with pytest.raises(em.MetalCompileError, match=r"source\.metal:1: threadgroup variables can only be declared "
                                                    r"inside a function"):
        em.compile_shader(src)


def test_compile_errors_are_reported():
    with pytest.raises(em.MetalEmulatorError, match="compiling the Metal source"):
        em.compile_shader("kernel void k(device float *y [[buffer(0)]]) { y[0] = undefined_name; }")


def test_a_compile_says_so_once(tmp_path, monkeypatch, capfd):
    """A library built into an empty cache prints one line saying so, naming
    the cache; built again from the cache, nothing. (The toolchain's shared
    parts, the precompiled shim and the runtime, come from the usual cache.)"""
    from muser_torch_metal_emulator import msl_build
    em.compile_shader(SOURCE)                      # the shared parts exist after any build
    real, key = msl_build.cache_root(), msl_build._toolchain_key()
    for part in (f"include-{key}", f"runtime-{key}.o"):
        (tmp_path / part).symlink_to(real / part)
    monkeypatch.setenv("MUSER_METAL_CACHE", str(tmp_path))
    source = "kernel void one(device float *y [[buffer(0)]], uint i [[thread_position_in_grid]]) { y[i] = 1.0f; }"
    capfd.readouterr()
    msl_build.build(source, frozenset({"one"}))
    cold = capfd.readouterr().err
    msl_build.build(source, frozenset({"one"}))
    warm = capfd.readouterr().err
    assert cold == f"muser-torch: compiling 1 Metal kernel(s) for the emulator with g++ (once, cached in {tmp_path})\n", cold
    assert warm == "", warm
