"""The emulator's compile_shader keeps PyTorch's contract (torch/csrc/mps/Module.cpp,
MetalKernelFunction::dispatch in OperationUtils.mm) and refuses, with a message
naming the feature and the line, what it cannot model."""
from __future__ import annotations

import pytest
import torch

from muser_torch_metal_emulator import emulator as em

SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

kernel void shape(device uint* out, uint3 pos [[thread_position_in_grid]], uint3 grid [[threads_per_grid]],
                  uint3 tptg [[threads_per_threadgroup]], uint3 disp [[dispatch_threads_per_threadgroup]],
                  uint tid [[thread_index_in_threadgroup]], uint sgs [[simdgroups_per_threadgroup]]) {
  const uint i = 6 * (pos.x + grid.x * (pos.y + grid.y * pos.z));
  out[i] = tptg.x; out[i + 1] = tptg.y; out[i + 2] = disp.x; out[i + 3] = disp.y; out[i + 4] = tid; out[i + 5] = sgs;
}

kernel void scalars(device long* out, constant long& a, constant int& b, constant float& c, constant half& d,
                    constant bool& e, constant float4& f, constant int* g, constant float* h) {
  out[0] = a; out[1] = b; out[2] = as_type<int>(c); out[3] = as_type<ushort>(d); out[4] = e ? 1 : 0;
  out[5] = long(f.x + f.y + f.z + f.w); out[6] = g[0] + g[1]; out[7] = long(h[1]);
}

kernel void copy(device float* out, device const float* in, uint i [[thread_position_in_grid]]) {
  out[i] = in[i] * 2.0;
}

kernel void scribble(device const float* in, device float* out, uint i [[thread_position_in_grid]]) {
  ((device float*)in)[i] = 1.0;
  out[i] = in[i];
}

kernel void gather(constant ulong* ptrs, device float* out, uint i [[thread_position_in_grid]]) {
  device float* p = reinterpret_cast<device float*>(ptrs[i]);
  out[i] = p[0];
  p[0] = float(i);
}

[[max_total_threads_per_threadgroup(64)]]
kernel void small_groups(device float* out, uint i [[thread_position_in_grid]]) { out[i] = 1.0; }

kernel void tg_param(device const float* in, device float* out, threadgroup float* shared [[threadgroup(0)]],
                     uint lid [[thread_position_in_threadgroup]], uint n [[threads_per_threadgroup]]) {
  shared[lid] = in[lid];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[lid] = shared[n - 1 - lid];
}
"""


@pytest.fixture(scope="module")
def lib():
    return em.compile_shader(SOURCE)


def test_unknown_kernel_is_a_runtime_error(lib):
    assert sorted(dir(lib)) == ["copy", "gather", "scalars", "scribble", "shape", "small_groups", "tg_param"]
    with pytest.raises(RuntimeError, match="Failed to create function state object for: nope"):
        lib.nope


def test_dispatch_sizes(lib):
    out = torch.zeros(5 * 3 * 6, dtype=torch.int32)
    lib.shape(out, threads=(5, 3), group_size=(4, 2))
    got = out.view(3, 5, 6)
    # Edge threadgroups are smaller (dispatchThreads): threads_per_threadgroup
    # says their own size, dispatch_threads_per_threadgroup the one asked for.
    assert got[0, 0].tolist() == [4, 2, 4, 2, 0, 1]
    assert got[0, 4].tolist() == [1, 2, 4, 2, 0, 1]
    assert got[2, 4].tolist() == [1, 1, 4, 2, 0, 1]
    assert got[1, 3].tolist() == [4, 2, 4, 2, 7, 1]
    # 1-D without group_size: min(threads, max_threads_per_threadgroup).
    big = torch.zeros(2000 * 6, dtype=torch.int32)
    lib.shape(big, threads=2000)
    assert big.view(2000, 6)[0, 0] == 1024 and big.view(2000, 6)[-1, 0] == 2000 - 1024
    # n-D without group_size: (max, 1, 1).
    out = torch.zeros(3 * 2 * 6, dtype=torch.int32)
    lib.shape(out, threads=(3, 2))
    assert out.view(2, 3, 6)[1, 2].tolist() == [3, 1, 1024, 1, 2, 1]
    with pytest.raises(RuntimeError, match="same number of dimensions"):
        lib.shape(out, threads=(3, 2), group_size=3)
    with pytest.raises(RuntimeError, match="1 to 3 dimensions"):
        lib.shape(out, threads=(1, 1, 1, 1))
    with pytest.raises(ValueError, match="Threadgroup size exceeds 1024 limit"):
        lib.shape(big, threads=2000, group_size=1025)
    with pytest.raises(ValueError, match="Threadgroup size exceeds 1024 limit"):
        lib.shape(out, threads=(64, 64), group_size=(64, 32))


def test_kernel_limits(lib):
    k = lib.small_groups
    assert k.max_threads_per_threadgroup == 64 and k.thread_execution_width == 32
    assert lib.copy.max_threads_per_threadgroup == 1024
    k(torch.zeros(64), group_size=64)
    with pytest.raises(ValueError, match="exceeds 64 limit"):
        k(torch.zeros(128), group_size=128)
    lib.tg_param(torch.zeros(8), torch.zeros(8), threadgroup_memory={0: 32}, threads=8)
    assert lib.tg_param.static_thread_group_memory_length == 0


GOOD = [1 << 40, -7, 1.5, 0.75, True, [1.0, 2.0, 3.0, 4.5], [3, 4], [0.5, 9.0]]   # buffers 1..8
GOOD_CASTS = {4: "fp16", 7: "int32"}


def test_scalars_bind_as_pytorch_binds_them(lib):
    out = torch.zeros(8, dtype=torch.int64)
    lib.scalars(out, *GOOD, arg_casts=GOOD_CASTS)
    assert out.tolist() == [1 << 40, -7, torch.tensor(1.5).view(torch.int32).item(),
                            torch.tensor(0.75, dtype=torch.half).view(torch.int16).item(), 1, 10, 7, 9]


@pytest.mark.parametrize("index,value,casts,message", [
    (2, 1 << 33, GOOD_CASTS, r"8589934592 does not fit the parameter's 4 bytes"),
    (2, 2.0, GOOD_CASTS, r"read the bits of a float as an integer"),
    (3, 3, GOOD_CASTS, r"read the bits of an integer as a float"),
    (4, 0.5, {7: "int32"}, r"elements of 4 bytes, the parameter reads elements of 2"),
    (6, [1.0, 2.0], GOOD_CASTS, r"the parameter reads 16 bytes, the argument has 8"),
    (7, [3, 4], {4: "fp16"}, r"elements of 8 bytes, the parameter reads elements of 4"),
])
def test_scalars_the_kernel_would_misread_are_refused(lib, index, value, casts, message):
    args = list(GOOD)
    args[index - 1] = value
    with pytest.raises(em.MetalEmulatorError, match=message):
        lib.scalars(torch.zeros(8, dtype=torch.int64), *args, arg_casts=casts)


def test_arg_casts_contract(lib):
    x, y = torch.randn(16), torch.zeros(16)
    with pytest.raises(RuntimeError, match="Unsupported cast instruction float32"):
        lib.scalars(torch.zeros(8, dtype=torch.int64), *GOOD, arg_casts={4: "float32"})
    with pytest.raises(RuntimeError, match="Unexpected caster arg type list"):
        lib.copy(y, x, arg_casts=["fp16"])
    with pytest.raises(RuntimeError, match="Empty list/tuple"):
        lib.scalars(torch.zeros(8, dtype=torch.int64), *GOOD[:5], [], *GOOD[6:], arg_casts=GOOD_CASTS)
    with pytest.raises(RuntimeError, match="Unsupported argument type str"):
        lib.copy(y, "x")
    with pytest.raises(em.MetalEmulatorError, match="error_buf_idx"):
        lib.copy(y, x, error_buf_idx=2)


def test_buffers_aliasing_and_read_only(lib):
    x = torch.randn(16)
    want = x * 2
    lib.copy(x, x)                                   # in place: one buffer for both parameters
    assert torch.equal(x, want)
    base = torch.randn(32)
    with pytest.raises(em.MetalEmulatorError, match="arguments 0 and 1 overlap"):
        lib.copy(base[:16], base[8:24])
    with pytest.raises(em.MetalEmulatorError, match=r"write to buffer\(0\), which is bound only to const"):
        lib.scribble(torch.randn(4), torch.zeros(4))


def test_a_list_of_tensors_binds_their_addresses(lib):
    parts = [torch.tensor([float(10 + k)]) for k in range(3)]
    out = torch.zeros(3)
    lib.gather(parts, out, threads=3)
    assert out.tolist() == [10.0, 11.0, 12.0]
    assert [p.item() for p in parts] == [0.0, 1.0, 2.0]      # written back


def test_threadgroup_parameters_need_a_length(lib):
    x = torch.randn(32)
    y = torch.zeros(32)
    with pytest.raises(em.MetalEmulatorError, match=r"\[\[threadgroup\(0\)\]\] needs a threadgroup memory length"):
        lib.tg_param(x, y, threads=32)
    lib.tg_param(x, y, threads=32, threadgroup_memory={0: 128})
    assert torch.equal(y, x.flip(0))


@pytest.mark.parametrize("src,message", [
    ("kernel void k(device float* y) {\n  y[0] = 1.0; // caf\u00e9\n}", r"line 2: non-ASCII character"),
    ("kernel void k(device float* y) {\n  double d = 1.0;\n  y[0] = d;\n}", r"line 2: double is not supported"),
    ("kernel void k(texture2d<float> t [[texture(0)]], device float* y) { y[0] = 1.0; }",
     r"source\.metal:1: .*textures are not supported by the Metal emulator"),
    ("kernel void k(device float* a, device float* b [[buffer(1)]]) { a[0] = b[0]; }",
     r"mixes \[\[buffer\(i\)\]\] parameters with unattributed"),
    ("kernel void k(float x, device float* y) { y[0] = x; }",
     r"parameter 'float x' has no attribute and is not in the device"),
    ("kernel void k(device float* y, bool b [[function_constant(0)]]) { y[0] = b; }",
     r"\[\[function_constant\(0\)\]\]: function constants as parameters are not supported"),
    ("kernel void k(device float* y) { threadgroup float t[4] = {0}; y[0] = t[0]; }",
     r"threadgroup variables cannot be initialized"),
    ("#pragma METAL fp math_mode(fast)\nkernel void k(device float* y) { y[0] = 1.0; }",
     r"line 1: .*the emulator models safe math only"),
])
def test_unsupported_features_are_named_with_their_line(src, message):
    with pytest.raises(em.MetalCompileError, match=message) as info:
        em.compile_shader(src)
    assert isinstance(info.value, SyntaxError)          # as compile_shader raises for Metal's compiler


def test_fast_math_is_refused(monkeypatch):
    monkeypatch.setenv("PYTORCH_MPS_FAST_MATH", "1")
    with pytest.raises(em.MetalEmulatorError, match="PYTORCH_MPS_FAST_MATH"):
        em.compile_shader(SOURCE)
