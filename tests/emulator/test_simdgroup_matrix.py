"""Simdgroup matrices as MSL defines them, and function constants, in the emulator.

- a, b and c/d of a multiply each with their own element type (float, half, bfloat);
- ``thread_elements()`` with the lane layout Apple's hardware uses (docs/metal.md says where it comes
  from): lane l holds row ``((l/4)&4) + (l/2)%4``, columns ``((l/4)&2)*2 + (l%2)*2`` and the next;
- a matrix filled lane by lane is the matrix the multiply and the store see;
- ``simdgroup_load``/``store`` with strides and transposes, ``make_filled_simdgroup_matrix``;
- ``constant T x [[function_constant(i)]]`` read from the dispatch's values, with the refusals.
References are float64 numpy; every input is fresh random data.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from muser_torch_metal_emulator import emulator as em

TYPES = {"float": torch.float32, "half": torch.float16, "bfloat": torch.bfloat16}


def _lane_cell(lane: int) -> tuple[int, int]:
    return ((lane // 4) & 4) + (lane // 2) % 4, ((lane // 4) & 2) * 2 + (lane % 2) * 2


def _mma_source(ta: str, tb: str, tc: str) -> str:
    return f"""
#include <metal_stdlib>
using namespace metal;
kernel void mma(device const {ta}* A [[buffer(0)]], device const {tb}* B [[buffer(1)]],
                device const {tc}* C [[buffer(2)]], device {tc}* D [[buffer(3)]],
                ushort l [[thread_index_in_simdgroup]]) {{
  simdgroup_matrix<{ta}, 8, 8> a;
  simdgroup_matrix<{tb}, 8, 8> b;
  simdgroup_matrix<{tc}, 8, 8> c;
  simdgroup_load(a, A, 8);
  simdgroup_load(b, B, 16, ulong2(8, 0), true);   // B^T of the right half of a 8x16 array
  simdgroup_load(c, C, 8);
  simdgroup_multiply_accumulate(c, a, b, c);
  simdgroup_store(c, D, 8);
}}
"""


@pytest.mark.parametrize("ta,tb,tc", [("half", "float", "float"), ("float", "half", "float"),
                                      ("bfloat", "half", "float"), ("half", "half", "half"),
                                      ("float", "bfloat", "half")])
def test_mixed_type_multiply_accumulate(ta, tb, tc):
    g = torch.Generator().manual_seed(random.SystemRandom().randrange(1 << 31))
    a = torch.randn(8, 8, generator=g).to(TYPES[ta])
    b = torch.randn(8, 16, generator=g).to(TYPES[tb])
    c = torch.randn(8, 8, generator=g).to(TYPES[tc])
    d = torch.full((8, 8), float("nan")).to(TYPES[tc])
    em.compile_shader(_mma_source(ta, tb, tc)).mma(a, b, c, d, threads=32, group_size=32)
    # Every operand widened to float (exact), products and sums in float32, one rounding to d's type.
    ref = (a.double() @ b[:, 8:].double().T + c.double())
    tol = {"float": 1e-5, "half": 2e-3, "bfloat": 1e-2}[tc] * ref.abs().max().item()
    assert (d.double() - ref).abs().max().item() <= tol, f"{ta} x {tb} + {tc}"


LANES_SOURCE = """
#include <metal_stdlib>
using namespace metal;
kernel void lanes(device const float* A [[buffer(0)]], device float* own [[buffer(1)]],
                  device half* filled [[buffer(2)]], device float* prod [[buffer(3)]],
                  ushort l [[thread_index_in_simdgroup]]) {
  simdgroup_float8x8 a;
  simdgroup_load(a, A, 8);
  own[2*l + 0] = a.thread_elements()[0];          // which elements this lane holds
  own[2*l + 1] = a.thread_elements()[1];
  simdgroup_half8x8 m;                              // filled lane by lane: lane + e/2
  m.thread_elements()[0] = half(float(l));
  m.thread_elements()[1] = half(float(l) + 0.5f);
  simdgroup_store(m, filled, 8);
  simdgroup_float8x8 p = make_filled_simdgroup_matrix<float, 8>(0.0f);
  simdgroup_multiply_accumulate(p, m, a, p);        // the lane-filled half matrix times a float one
  simdgroup_store(p, prod, 8);
}
"""


def test_thread_elements_follow_apples_lane_layout():
    g = torch.Generator().manual_seed(random.SystemRandom().randrange(1 << 31))
    a = torch.randn(8, 8, generator=g)
    own, filled, prod = torch.zeros(64), torch.zeros(8, 8, dtype=torch.float16), torch.zeros(8, 8)
    em.compile_shader(LANES_SOURCE).lanes(a, own, filled, prod, threads=32, group_size=32)
    want = torch.empty(8, 8)
    for lane in range(32):
        r, c = _lane_cell(lane)
        assert own[2 * lane].item() == a[r, c].item() and own[2 * lane + 1].item() == a[r, c + 1].item(), lane
        want[r, c], want[r, c + 1] = lane, lane + 0.5
    assert torch.equal(filled.float(), want)
    assert sorted(_lane_cell(lane) for lane in range(32)) == [(r, c) for r in range(8) for c in range(0, 8, 2)]
    assert torch.allclose(prod.double(), want.double() @ a.double(), rtol=1e-6, atol=1e-5)


FC_SOURCE = """
#include <metal_stdlib>
using namespace metal;
constant short FC_n     [[function_constant(100 + 0)]];
constant bool  FC_twice [[function_constant(100 + 1)]];
constant float FC_scale [[function_constant(7)]];
kernel void k(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  float v = float(i%FC_n) * FC_scale;
  y[i] = is_function_constant_defined(FC_twice) && FC_twice ? 2*v : v;
}
"""


def test_function_constants_are_read_per_dispatch():
    lib = em.new_library_with_source(FC_SOURCE)
    n, scale = random.randrange(2, 9), random.uniform(0.5, 2.0)
    for twice in (False, True, None):
        fc = {100: n, 7: scale} | ({} if twice is None else {101: twice})
        y = torch.zeros(32)
        lib.k(y, threads=32, group_size=32, function_constants=fc)
        want = torch.tensor([(i % n) * np.float32(scale) * (2 if twice else 1) for i in range(32)], dtype=torch.float32)
        assert torch.equal(y, want), (n, scale, twice)


@pytest.mark.parametrize("fc,message", [
    ({7: 1.0}, r"function constant FC_n \(index 100\) is used, but the dispatch set no value"),
    ({100: True, 7: 1.0}, r"FC_n \(index 100\) is an integer; the dispatch set a bool"),
    ({100: 40000, 7: 1.0}, r"FC_n \(index 100\): 40000 does not fit its 2-byte type"),
    ({100: 3, 7: 1}, r"FC_scale \(index 7\) is floating; the dispatch set an integer"),
])
def test_function_constant_mistakes_are_reported(fc, message):
    with pytest.raises(em.MetalEmulatorError, match=message):
        em.new_library_with_source(FC_SOURCE).k(torch.zeros(32), threads=32, group_size=32, function_constants=fc)


def test_kernel_subset_and_its_refusal():
    src = FC_SOURCE + "kernel void other(device float* y [[buffer(0)]]) { y[0] = 1.0f; }\n"
    assert dir(em.new_library_with_source(src, kernels=["k"])) == ["k"]
    with pytest.raises(em.MetalCompileError, match="the source defines no kernel named nope"):
        em.new_library_with_source(src, kernels=["k", "nope"])


def test_range_designator_initializer():
    src = """
kernel void k(device float* y [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  float s[6] = { [ 1 ... 3 ] = 2.5f };
  y[i] = s[i];
}
"""
    y = torch.full((6,), float("nan"))
    em.compile_shader(src).k(y, threads=6, group_size=6)
    assert y.tolist() == [0.0, 2.5, 2.5, 2.5, 0.0, 0.0]


IDIOMS_SOURCE = """
#include <metal_stdlib>
using namespace metal;
#define NAME(t) "idioms_" t
template <typename T>
kernel void idioms(device const ushort4* q [[buffer(0)]], device const char* c [[buffer(1)]],
                   device float* y [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  const ushort2 w = i < 2 ? q[0].xy : q[0].zw;            // two swizzle types in ?:
  const T b = i % 2 ? T(float(w.x)) : 0;                  // bfloat (or float) and an int in ?:
  const float4 f = float4(*(device const packed_char4*) (c + 4*i));
  y[i] = float(b) + float(w.y) + f.x + f.y + f.z + f.w;
}
template [[host_name(NAME("bfloat"))]] kernel void idioms<bfloat>(device const ushort4*, device const char*,
                                                                  device float*, uint);
"""


def test_llamacpp_idioms():
    """Constructs llama.cpp's kernels use, each with its Metal meaning."""
    rng = np.random.default_rng(random.SystemRandom().randrange(1 << 31))
    q = torch.from_numpy(rng.integers(0, 256, 4, dtype=np.int64).astype(np.uint16).astype(np.int16))
    c = torch.from_numpy(rng.integers(-128, 128, 16).astype(np.int8))
    y = torch.zeros(4)
    em.new_library_with_source(IDIOMS_SOURCE).idioms_bfloat(q, c, y, threads=4, group_size=4)
    qs, cs = q.numpy().astype(np.uint16), c.numpy().astype(np.float64)
    for i in range(4):
        w = qs[0:2] if i < 2 else qs[2:4]
        want = (float(w[0]) if i % 2 else 0.0) + float(w[1]) + cs[4 * i:4 * i + 4].sum()
        assert y[i].item() == want, (i, y[i].item(), want)      # values below 256: exact in bfloat and float
