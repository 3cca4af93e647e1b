"""CUDA implementations of the ``muser`` ops, through Triton kernels.

``muser_torch.ops`` imports this module only where CUDA is available and
Triton imports; Triton is an optional dependency (``pip install
muser-torch[cuda]``), so a CPU install never pulls it.

Dispatch ladder of ``qmatmul`` (activation rows M = prod(x.shape[:-1])):

=========  ==============================  =====================================
M          kernel                          arithmetic
=========  ==============================  =====================================
1          Q4_K/Q5_K ``_mv_q45k_v4``,      float32 FFMA, rel. error ~1e-6
           Q6_K ``_mv_q6k_v3``; other      (the K-quant kernels sum 128 + q,
           types ``_mv_generic_kernel``    see triton_kquant.py)
2          Q4_K/Q5_K ``_mm_q45k_mt``:      float32 FFMA, as above
           one decode for all tokens
2 .. 16    other types / more tokens:      tensor cores: tiles rounded to x's
           ``_qmm_kernel`` BM=16, one      dtype, float32 accumulation, rel.
           decode per tile for all tokens  error ~1e-3 (float32 x: IEEE
                                           float32 products, ~3e-7)
> 16       ``_qmm_kernel`` BM=64 tiles     as above
=========  ==============================  =====================================

Small matrices split the K dimension across programs; the partial sums are
added by ``torch.sum`` (deterministic, no atomics). ``dequantize`` and
``embedding`` are bit-exact with ``muser_torch.formats.dequantize_reference``
(and ``muser_torch.dequantize`` runs this ``dequantize`` for CUDA tensors).

Arguments arrive validated by ``muser_torch.ops``; nothing here synchronizes
with the host, so every op can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch
import triton

from ..formats.types import GGMLType
from . import triton_kquant as tk

# The kernels spell out each block's byte layout (triton_kquant.py); make sure it is
# the registry's geometry.
_KERNEL_GEOMETRY = {GGMLType.Q4_K: (256, 144), GGMLType.Q5_K: (256, 176), GGMLType.Q6_K: (256, 210),
                    GGMLType.Q8_0: (32, 34), GGMLType.F16: (1, 2), GGMLType.NVFP4_E2M1: (16, 8)}
for _t, _g in _KERNEL_GEOMETRY.items():
    if (_t.block_elems, _t.block_bytes) != _g or int(_t) != getattr(tk, _t.name).value:
        raise RuntimeError(f"triton_kquant's layout of {_t.name} disagrees with GGMLType")

SUPPORTED = frozenset({GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.NVFP4_E2M1,
                       GGMLType.Q8_0, GGMLType.F16})
KQUANT = frozenset({GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K})

# Launch parameters; the benchmark (``muser_torch.ops.triton_bench``) sweeps them.
# One-token K-quant kernels: (BN, warps, split target per SM, version).
# Picked by ``triton_bench --what sweep`` on the H200 (docs/performance.md).
MV_KQUANT = {GGMLType.Q4_K: (64, 8, 4, 4), GGMLType.Q5_K: (64, 8, 8, 4),
             GGMLType.Q6_K: (32, 4, 8, 3)}
# The one-token kernel versions each type has (triton_kquant.py): the sweep
# compares them; the default is the last.
MV_VERSIONS = {GGMLType.Q4_K: (3, 4), GGMLType.Q5_K: (3, 4), GGMLType.Q6_K: (2, 3)}
QMM_SMALL = (16, 32, 4)        # (BM, BN, warps) for 2..16 tokens
QMM_LARGE = (64, 64, 8)

_SM_COUNT: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":      # TRITON_INTERPRET=1 on CPU tensors
        return 132
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def _qtype(qtype: int) -> GGMLType:
    qt = GGMLType(int(qtype))
    if qt not in SUPPORTED:
        raise ValueError(f"the CUDA kernels do not support {qt.name}; "
                         f"supported: {sorted(t.name for t in SUPPORTED)}")
    return qt


def _companions(qt, packed, scales, scale_2):
    """Pointers for NVFP4's companions; a dummy (never read) for other types."""
    if qt is GGMLType.NVFP4_E2M1:
        if scales is None or scale_2 is None:
            raise ValueError("NVFP4_E2M1 needs both companions: scales and scale_2")
        if scales.dtype != torch.uint8:
            scales = scales.view(torch.uint8)
        s2 = scale_2.reshape(1)
        if s2.dtype != torch.float32:
            s2 = s2.to(torch.float32)
        return scales.contiguous(), s2
    return packed, packed


def _split(n_row_blocks: int, n_kb: int, target: int) -> tuple[int, int]:
    """(split, kb_per): split the K blocks until about ``target`` programs run.

    ``split`` divides ``n_kb`` (every program gets the same number of blocks)."""
    want = max(1, min(n_kb, -(-target // max(1, n_row_blocks))))
    split = max(d for d in range(1, want + 1) if n_kb % d == 0)
    return split, n_kb // split


def _finish(part: torch.Tensor, split: int, dtype: torch.dtype) -> torch.Tensor:
    out = part[0] if split == 1 else part.sum(0)
    return out if out.dtype == dtype else out.to(dtype)


def matvec(x: torch.Tensor, packed: torch.Tensor, qt: GGMLType, n_out: int, n_in: int,
           scales=None, scale_2=None, *, bn: int | None = None, warps: int | None = None,
           target: int | None = None, version: int | None = None) -> torch.Tensor:
    """One activation row ``x[n_in]`` to ``y[n_out]`` in x's dtype."""
    x = x.reshape(n_in)
    if not x.is_contiguous():
        x = x.contiguous()
    n_kb = triton.cdiv(n_in, 256)
    if qt in KQUANT:
        dbn, dwarps, dper_sm, dversion = MV_KQUANT[qt]
        bn, warps, version = bn or dbn, warps or dwarps, version or dversion
        target = target or _sm_count(x.device) * dper_sm
        xp = torch.empty(n_in, dtype=torch.float32, device=x.device)
        tk._permute_x_kernel[(triton.cdiv(n_in, 1024), 1)](x, xp, n_in, 0, QTYPE=int(qt), BLOCK=1024)
        rb = triton.cdiv(n_out, bn)
        split, kb_per = _split(rb, n_kb, target)
        part = torch.empty((split, n_out), dtype=x.dtype if split == 1 else torch.float32,
                           device=x.device)
        if version not in MV_VERSIONS[qt]:
            raise ValueError(f"matvec: {qt.name} has kernel versions {MV_VERSIONS[qt]}, not {version}")
        if qt is GGMLType.Q6_K:
            kern = tk._mv_q6k_v2_kernel if version == 2 else tk._mv_q6k_v3_kernel
            kern[(rb, split)](xp, packed, part, n_out, KB_PER=kb_per, NB=n_kb, BN=bn,
                              num_warps=warps)
        else:
            kern = tk._mv_q45k_v3_kernel if version == 3 else tk._mv_q45k_v4_kernel
            kern[(rb, split)](xp, packed, part, n_out, KB_PER=kb_per, QTYPE=int(qt), NB=n_kb,
                              BN=bn, num_warps=warps)
        return _finish(part, split, x.dtype)
    bn, warps, target = bn or 16, warps or 4, target or _sm_count(x.device) * 4
    s, s2 = _companions(qt, packed, scales, scale_2)
    rb = triton.cdiv(n_out, bn)
    split, kb_per = _split(rb, n_kb, target)
    part = torch.empty((split, n_out), dtype=x.dtype if split == 1 else torch.float32,
                       device=x.device)
    tk._mv_generic_kernel[(rb, split)](x, packed, s, s2, part, n_out, n_in, n_kb,
                                       KB_PER=kb_per,
                                       QTYPE=int(qt), ROW_BYTES=packed.shape[1], BN=bn,
                                       num_warps=warps)
    return _finish(part, split, x.dtype)


# Q4_K/Q5_K with 2..MT_MAX tokens take _mm_q45k_mt_kernel. Measured on the H200 it
# beats the tensor-core tile at 2 tokens (ffn_up 123 vs 166 us) but not at 3-4.
MT_MAX = 2
MT_KQUANT = (64, 8, 4)         # (BN, warps, split target per SM)


def matmul_mt(x2: torch.Tensor, packed: torch.Tensor, qt: GGMLType, n_out: int, n_in: int, *,
              bn: int | None = None, warps: int | None = None,
              target: int | None = None) -> torch.Tensor:
    """2..8 activation rows of Q4_K / Q5_K: one decode of each weight for all rows."""
    M = x2.shape[0]
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    dbn, dwarps, dper_sm = MT_KQUANT
    bn, warps = bn or dbn, warps or dwarps
    target = target or _sm_count(x2.device) * dper_sm
    n_kb = n_in // 256
    xp = torch.empty((M, n_in), dtype=torch.float32, device=x2.device)
    tk._permute_x_kernel[(triton.cdiv(n_in, 1024), M)](x2, xp, n_in, x2.stride(0), QTYPE=int(qt),
                                                       BLOCK=1024)
    rb = triton.cdiv(n_out, bn)
    split, kb_per = _split(rb, n_kb, target)
    part = torch.empty((split, M, n_out), dtype=x2.dtype if split == 1 else torch.float32,
                       device=x2.device)
    mt = 2 if M <= 2 else 4 if M <= 4 else 8
    tk._mm_q45k_mt_kernel[(rb, split)](xp, packed, part, M, n_out, KB_PER=kb_per, QTYPE=int(qt),
                                       NB=n_kb, BN=bn, MT=mt, num_warps=warps)
    return _finish(part, split, x2.dtype)


def matmul(x2: torch.Tensor, packed: torch.Tensor, qt: GGMLType, n_out: int, n_in: int,
           scales=None, scale_2=None, *, bm: int | None = None, bn: int | None = None,
           warps: int | None = None, target: int | None = None,
           stages: int | None = None) -> torch.Tensor:
    """``x2[M, n_in]`` (M >= 2) to ``[M, n_out]`` on tensor cores."""
    M = x2.shape[0]
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    dbm, dbn, dwarps = QMM_SMALL if M <= 16 else QMM_LARGE
    bm, bn, warps = bm or dbm, bn or dbn, warps or dwarps
    stages = stages or (2 if bm * bn <= 16 * 64 and x2.dtype != torch.float32 else 1)
    s, s2 = _companions(qt, packed, scales, scale_2)
    n_kb = triton.cdiv(n_in, 256)
    tiles = triton.cdiv(M, bm) * triton.cdiv(n_out, bn)
    split, kb_per = _split(tiles, n_kb, target or _sm_count(x2.device) * 2)
    part = torch.empty((split, M, n_out), dtype=x2.dtype if split == 1 else torch.float32,
                       device=x2.device)
    grid = (triton.cdiv(M, bm), triton.cdiv(n_out, bn), split)
    tk._qmm_kernel[grid](x2, packed, s, s2, part, M, n_out, n_in, n_kb, x2.stride(0), KB_PER=kb_per,
                         QTYPE=int(qt), ROW_BYTES=packed.shape[1], BM=bm, BN=bn,
                         DOT_F32=x2.dtype == torch.float32, num_warps=warps, num_stages=stages)
    return _finish(part, split, x2.dtype)


# ---- the ops' CUDA implementations (signatures of muser_torch.ops) ----------------

def qmatmul(x: torch.Tensor, packed: torch.Tensor, qtype: int, n_out: int, n_in: int,
            scales: torch.Tensor | None = None, scale_2: torch.Tensor | None = None) -> torch.Tensor:
    qt = _qtype(qtype)
    lead = x.shape[:-1]
    M = x.numel() // n_in if n_in else 0
    if M == 0:
        return x.new_empty((*lead, n_out))
    if M == 1:
        return matvec(x, packed, qt, n_out, n_in, scales, scale_2).reshape(*lead, n_out)
    if M <= MT_MAX and qt in (GGMLType.Q4_K, GGMLType.Q5_K):
        return matmul_mt(x.reshape(M, n_in), packed, qt, n_out, n_in).reshape(*lead, n_out)
    return matmul(x.reshape(M, n_in), packed, qt, n_out, n_in, scales, scale_2).reshape(*lead, n_out)


def _decode_rows(packed, qt, n_out, n_in, scales, scale_2, ids=None) -> torch.Tensor:
    s, s2 = _companions(qt, packed, scales, scale_2)
    n_rows = n_out if ids is None else ids.numel()
    out = torch.empty((n_rows, n_in), dtype=torch.float32, device=packed.device)
    if n_rows == 0:
        return out
    bn = 8
    grid = (triton.cdiv(n_rows, bn), triton.cdiv(n_in, 256))
    tk._dequant_kernel[grid](packed, s, s2, packed if ids is None else ids, out, n_rows, n_out,
                             n_in, QTYPE=int(qt), ROW_BYTES=packed.shape[1], BN=bn,
                             HAS_IDS=ids is not None, num_warps=4, enable_fp_fusion=False)
    return out


def dequantize(packed: torch.Tensor, qtype: int, n_out: int, n_in: int,
               scales: torch.Tensor | None = None, scale_2: torch.Tensor | None = None) -> torch.Tensor:
    return _decode_rows(packed, _qtype(qtype), n_out, n_in, scales, scale_2)


def embedding(ids: torch.Tensor, packed: torch.Tensor, qtype: int, n_out: int, n_in: int,
              scales: torch.Tensor | None = None, scale_2: torch.Tensor | None = None) -> torch.Tensor:
    flat = ids.reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    out = _decode_rows(packed, _qtype(qtype), n_out, n_in, scales, scale_2, ids=flat)
    return out.reshape(*ids.shape, n_in)


def register() -> None:
    """Register the CUDA kernels for the ``muser`` ops (idempotent)."""
    global _registered
    if _registered:
        return
    torch.library.register_kernel("muser::qmatmul", "cuda", qmatmul)
    torch.library.register_kernel("muser::dequantize", "cuda", dequantize)
    torch.library.register_kernel("muser::embedding", "cuda", embedding)
    _registered = True


_registered = False


try:  # muser_torch.ops imports this module after defining the ops
    register()
except (RuntimeError, ValueError, AttributeError) as _e:  # ops not defined (module used standalone)
    import warnings as _w
    _w.warn(f"muser_torch.ops.cuda: kernels not registered ({_e!r})", RuntimeWarning, stacklevel=1)
