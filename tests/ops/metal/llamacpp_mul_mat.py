"""llama.cpp's Metal mat-mul kernels, dispatched the way ggml-metal dispatches them, through the
emulator; and ggml's CPU ``mul_mat`` (libggml-python) on the same bytes as the reference.

Each ``*_plan`` function follows one path of ``ggml_metal_op_mul_mat`` (ggml-metal-ops.cpp) and
its pipeline getter (ggml-metal-device.cpp, ggml-metal-common.cpp) for a contiguous 2-D src0
``[ne01, ne00]`` (quantized) and src1 ``[ne11, ne00]`` (f32): kernel name, function constants,
``ggml_metal_kargs_*`` fields, threadgroup memory and the threadgroup grid. The tuning numbers
(N_R0_*, N_SG_*, FC_* bases) are read from ggml-metal-impl.h; the few that live in .cpp files are
restated here with the function they come from.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import torch

from ...formats.ggml_ref import quantize_chunk
from ...models.ggml_rope import _InitParams, lib as ggml_cpu
from . import llamacpp_metal as lm

GGML_TYPES = {"q4_0": 2, "q8_0": 8, "q4_K": 12, "q5_K": 13, "q6_K": 14}
BLOCK = {"q4_0": 32, "q8_0": 32, "q4_K": 256, "q5_K": 256, "q6_K": 256}
KINDS = ("mv", "ext", "mm", "mma")
# Against float64 x @ dequantize(W).T (gguf's numpy dequantizer), per output element relative to
# sum |x||W|: float32 arithmetic for every path but mul_mm, which stages both operands in half
# (unit roundoff 2^-11) before its simdgroup multiplies.
ERROR_BOUND = {"mv": 1e-5, "ext": 1e-5, "mma": 1e-5, "mm": 2e-3}


@dataclass
class Plan:
    library: str                 # kernels/<library>.metal
    kernel: str
    constants: dict[int, object]
    kargs: bytes
    smem: int
    groups: tuple[int, int, int]
    group: tuple[int, int, int]
    with_src2: bool = False      # mul_mv_mma binds the residual (dst itself when nothing is fused)


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _common(t: str, ne00: int, ne01: int, ne11: int) -> dict:
    """GGML_TENSOR_LOCALS of a contiguous src0 / src1 / dst (f32 src1 and dst)."""
    row = ne00 // BLOCK[t] * _block_bytes(t)
    return dict(ne00=ne00, ne01=ne01, ne02=1, nb00=_block_bytes(t), nb01=row, nb02=row * ne01, nb03=row * ne01,
                ne10=ne00, ne11=ne11, ne12=1, nb10=4, nb11=4 * ne00, nb12=4 * ne00 * ne11, nb13=4 * ne00 * ne11,
                ne0=ne01, ne1=ne11)


def _block_bytes(t: str) -> int:
    return int(quantize_lib().ggml_row_size(GGML_TYPES[t], BLOCK[t]))


def quantize_lib():
    from ...formats.ggml_ref import lib
    return lib()


def mv_plan(t: str, ne00: int, ne01: int, ne11: int) -> Plan:
    """ggml_metal_op_mul_mat_mv with ggml_metal_library_get_pipeline_mul_mv."""
    T = t.upper()
    nsg, nr0, nr1 = lm.impl_define(f"N_SG_{T}"), lm.impl_define(f"N_R0_{T}"), 1
    smem = 32 * 4 * nr0 if t == "q8_0" else 0
    fc = lm.impl_define("FC_MUL_MV")
    constants = {fc + 0: nsg, fc + 2: 1, fc + 3: 1, fc + 4: 1, fc + 5: False}
    c = _common(t, ne00, ne01, ne11)
    args = lm.kargs("ggml_metal_kargs_mul_mv", **c, nr0=nr0, r2=1, r3=1)
    gx = _cdiv(ne01, nr0) if t == "q8_0" else _cdiv(ne01, nr0 * nsg)
    return Plan("mul_mv", f"kernel_mul_mv_{t}_f32", constants, args, smem, (gx, _cdiv(ne11, nr1), 1), (32, nsg, 1))


def ext_plan(t: str, ne00: int, ne01: int, ne11: int) -> Plan:
    """The small-batch branch of ggml_metal_op_mul_mat (ne11 2..8, K-quants 4..8, ne00 % 128 == 0)."""
    nsg = 2
    nxpsg = 16 if ne00 % 256 == 0 and ne11 < 3 else 8 if ne00 % 128 == 0 else 4
    r0ptg = (32 // nxpsg) * nsg
    r1ptg = {2: 2, 3: 3, 6: 3, 4: 4, 7: 4, 8: 4, 5: 5}[ne11]
    fc = lm.impl_define("FC_MUL_MV")
    constants = {fc + 0: nsg, fc + 1: nxpsg, fc + 2: 1, fc + 3: 1, fc + 4: 1}
    args = lm.kargs("ggml_metal_kargs_mul_mv_ext", **_common(t, ne00, ne01, ne11), r2=1, r3=1)
    return Plan("mul_mv", f"kernel_mul_mv_ext_{t}_f32_r1_{r1ptg}", constants, args, 0,
                (_cdiv(ne01, r0ptg), _cdiv(ne11, r1ptg), 1), (32, nsg, 1))


def mm_plan(t: str, ne00: int, ne01: int, ne11: int) -> Plan:
    """The simdgroup-matrix branch (ne11 > 8, ne00 >= 64) with ggml_metal_library_get_pipeline_mul_mm on a
    GPU without the tensor API."""
    bc_inp, bc_out = ne00 % 32 != 0, ne01 % 64 != 0 or ne11 % 32 != 0
    fc = lm.impl_define("FC_MUL_MM")
    constants = {fc + 0: bc_inp, fc + 1: bc_out, fc + 2: 1, fc + 3: 1, fc + 4: 1, fc + 5: 1}
    c = _common(t, ne00, ne01, ne11)
    args = lm.kargs("ggml_metal_kargs_mul_mm", ne00=ne00, ne02=1, nb01=c["nb01"], nb02=c["nb02"], nb03=c["nb03"],
                    ne12=1, nb10=4, nb11=c["nb11"], nb12=c["nb12"], nb13=c["nb13"], ne0=ne01, ne1=ne11, r2=1, r3=1)
    nsg = lm.impl_define("N_MM_SIMD_GROUP_X") * lm.impl_define("N_MM_SIMD_GROUP_Y")
    return Plan("mul_mm", f"kernel_mul_mm_{t}_f32", constants, args, 8192 if bc_out else 4096 + 2048,
                (_cdiv(ne11, 32), _cdiv(ne01, 64), 1), (32, nsg, 1))


def _halve_to_limit(n: int, limit: int) -> int:
    while n > 1 and n > limit:
        n //= 2
    return n


def mma_plan(t: str, ne00: int, ne01: int, ne11: int) -> Plan:
    """ggml_metal_op_mul_mat_mma: ggml_metal_op_mul_mat_mma_tiling and get_pipeline_mul_mv_mma
    (constants from ggml-metal-device.cpp and ggml-metal-common.cpp), nothing fused."""
    rt = 2 if ne11 > 8 else 1                                   # ggml_metal_mul_mv_mma_rt
    kind = "blk" if t == "q4_0" or (t == "q8_0" and rt == 1) else "q5_K" if t == "q5_K" else "gen"
    k_step = BLOCK[t] if kind == "blk" else 64                  # GGML_METAL_MMA_K_CHUNK
    nsg = 32 if ne01 <= 64 else 16 if ne01 <= 6144 else 8       # GGML_METAL_MMA_NSG_*
    nsg = _halve_to_limit(nsg, ne00 // k_step)
    smem_tile = 8 * 8 * 4
    nt = _halve_to_limit(4, min(16384 // (nsg * rt * smem_tile), ne01 // (128 * 8)))
    fc = lm.impl_define("FC_MUL_MV_MMA")
    constants = {fc + 4: ne00 if kind != "gen" else 0, fc + 0: nsg, fc + 1: 1, fc + 2: 1, fc + 3: 1, fc + 5: False}
    args = lm.kargs("ggml_metal_kargs_mul_mv_ext", **_common(t, ne00, ne01, ne11), r2=1, r3=1)
    return Plan("mul_mv_mma", f"kernel_mul_mv_mma_{t}_f32_nt{nt}_rt{rt}", constants, args, nsg * nt * rt * smem_tile,
                (_cdiv(ne01, 8 * nt), _cdiv(ne11, 8 * rt), 1), (32, nsg, 1), with_src2=True)


PLANS = {"mv": mv_plan, "ext": ext_plan, "mm": mm_plan, "mma": mma_plan}


def run_metal(plan: Plan, w: torch.Tensor, x: torch.Tensor, ne01: int, kernels=None) -> torch.Tensor:
    """Dispatch ``plan`` through the emulator on src0 bytes ``w`` and f32 src1 ``x``; the library is
    built with ``kernels`` (default: the plan's kernel alone)."""
    from muser_torch_metal_emulator import emulator
    lib = emulator.new_library_with_source(lm.library_source(plan.library), macros=lm.MACROS,
                                           kernels=list(kernels or [plan.kernel]))
    args = torch.frombuffer(bytearray(plan.kargs), dtype=torch.uint8)
    dst = torch.full((x.shape[0], ne01), float("nan"), dtype=torch.float32)
    bufs = [args, w.contiguous(), x.contiguous(), dst] + ([dst] if plan.with_src2 else [])
    threads = [g * s for g, s in zip(plan.groups, plan.group)]
    getattr(lib, plan.kernel)(*bufs, threads=threads, group_size=list(plan.group),
                              threadgroup_memory={0: plan.smem},
                              function_constants=plan.constants)
    return dst


def ggml_mul_mat(t: str, w: torch.Tensor, x: torch.Tensor, ne00: int, ne01: int) -> torch.Tensor:
    """ggml's CPU mul_mat of src0 bytes ``w`` ([ne01, row bytes], type ``t``) and f32 ``x`` [ne11, ne00]."""
    dll = ggml_cpu()
    P = ctypes.c_void_p
    dll.ggml_new_tensor_2d.restype = P
    dll.ggml_new_tensor_2d.argtypes = [P, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    dll.ggml_mul_mat.restype, dll.ggml_mul_mat.argtypes = P, [P, P, P]
    ne11 = x.shape[0]
    wb = np.ascontiguousarray(w.numpy())
    xb = np.ascontiguousarray(x.numpy(), dtype=np.float32)
    ctx = dll.ggml_init(_InitParams(wb.nbytes + 8 * xb.nbytes + 8 * ne01 * ne11 + (1 << 20), None, False))
    if not ctx:
        raise RuntimeError("ggml_init failed")
    try:
        a = dll.ggml_new_tensor_2d(ctx, GGML_TYPES[t], ne00, ne01)
        b = dll.ggml_new_tensor_2d(ctx, 0, ne00, ne11)
        ctypes.memmove(dll.ggml_get_data(a), wb.ctypes.data, wb.nbytes)
        ctypes.memmove(dll.ggml_get_data(b), xb.ctypes.data, xb.nbytes)
        out = dll.ggml_mul_mat(ctx, a, b)
        graph = dll.ggml_new_graph(ctx)
        dll.ggml_build_forward_expand(graph, out)
        if dll.ggml_graph_compute_with_ctx(ctx, graph, 1) != 0:
            raise RuntimeError("ggml_graph_compute_with_ctx failed")
        res = np.empty((ne11, ne01), dtype=np.float32)
        ctypes.memmove(res.ctypes.data, dll.ggml_get_data(out), res.nbytes)
    finally:
        dll.ggml_free(ctx)
    return torch.from_numpy(res)


def case(t: str, ne00: int, ne01: int, ne11: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ggml-quantized random weights as bytes, random f32 activations)."""
    g = torch.Generator().manual_seed(seed)
    w = quantize_chunk(torch.randn(ne01, ne00, generator=g), GGML_TYPES[t])
    x = torch.randn(ne11, ne00, generator=g)
    return w, x


def float64_error(t: str, w: torch.Tensor, x: torch.Tensor, got: torch.Tensor) -> float:
    """max |got - x W^T| / (|x| |W|^T) with W dequantized in float64 by gguf-py."""
    from gguf.quants import dequantize
    W = torch.from_numpy(dequantize(w.numpy(), GGML_TYPES[t]).astype(np.float64)).reshape(w.shape[0], -1)
    ref = x.double() @ W.T
    return float(((got.double() - ref).abs() / (x.double().abs() @ W.abs().T)).max())

