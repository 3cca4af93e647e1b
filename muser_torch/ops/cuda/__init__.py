"""CUDA implementations of the ``muser`` ops, through Triton kernels.

``muser_torch.ops`` imports this module only where CUDA is available and
Triton imports; Triton is an optional dependency (``pip install
muser-torch[cuda]``), so a CPU install never pulls it.

``SUPPORTED`` is the one set of types the CUDA ops take (the tests
parametrize over it); ``LADDER`` is the one table ``qmatmul`` dispatches by
(activation rows M = prod(x.shape[:-1])): the first rung whose token bound
holds M, which serves the type and whose ``dtypes`` (None: any) hold x's dtype
runs. float32 activations never leave the float32 rungs (the 1e-5 contract).

===========  ======  =====================================  ================================
rung         M       kernel                                 arithmetic
===========  ======  =====================================  ================================
cuda_mv      1       half x only: Q4_K, Q6_K, hand-written  as i8_dot (the same activation),
                     CUDA (``mv.cu``, built by              dp4a per 16 columns; absent
                     ``compiled.py``)                       without nvcc
i8_dot       1       half x only: Q4_K, Q5_K                x in two int8 levels per 32 columns
                     (``int8dot.py``)                       (~15 bits), dp4a on the packed
                                                            codes, scales in float32; rel.
                                                            error ~2e-5 before the output's
                                                            rounding
mv_kquant    1       Q4_K/Q5_K ``_mv_q45k_kernel``,         float32 FFMA, rel. error ~1e-6
                     Q6_K ``_mv_q6k_kernel``                (128 + q, see kquant.py)
mv_tile      1       ``_mv_tile_kernel``: the other types   float32 FFMA
                     (the IQ4 types and MXFP4 included)
cuda_mm      <= 16   half x: the K-quants, Q8_0, Q5_0,    as i8_dot; int8 mma.sync per
                     Q4_0, hand-written CUDA (``mv.cu``):   scale block, exact in int32
                     16 weight rows a warp, up to 16
                     tokens, each weight read once;
                     absent without nvcc
i8_dot_mt    <= 8    half x only: Q4_K, Q5_K, Q5_0, Q4_0    as i8_dot
token_axis   2       Q4_K/Q5_K ``_mm_q45k_mt_kernel``:      float32 FFMA, as mv_kquant
                     one decode for all tokens
mv_tile_mt   <= 16   IQ3_XXS, IQ3_S:                        float32 FFMA, as mv_tile
                     ``_mv_tile_mt_kernel``, one decode
                     for all tokens
qmm_small    <= 16   ``_qmm_kernel`` BM=16: one decode per  tensor cores: tiles rounded to x's
                     tile for all tokens                    dtype, float32 accumulation, rel.
                                                            error ~1e-3 (float32 x: IEEE
                                                            float32 products, ~3e-7)
qmm_tiled    <= 64   ``_qmm_kernel`` BM=64 tiles            as qmm_small
qmm_wide     < 256   half x: ``_qmm_kernel`` 128 x 128      as qmm_small
dense        any     half x: the weight decoded to x's      the weight rounded to x's dtype
                     dtype, then cuBLAS (``torch.mm``)      (as the tiles), cuBLAS's float32
                                                            accumulation
qmm_tall     any     float32 x: BM=64 tiles                 as qmm_small
===========  ======  =====================================  ================================

Small matrices split the K dimension across programs; the partial sums are
added by ``torch.sum`` (the tensor-core rungs), or, in the one-token and
int8-dot kernels, by the last program of each row block in split order
(``tile._store``): deterministic either way, no atomic sums. ``dequantize`` and
``embedding`` are bit-exact with gguf's numpy ``dequantize`` (and
``muser_torch.dequantize`` runs this ``dequantize`` for CUDA tensors).

Arguments arrive validated, types outside ``SUPPORTED`` refused and companions
normalised, by ``ops.checks.register_kernels``; nothing here synchronizes
with the host, so every op can be captured in a CUDA graph.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
import triton

from ...formats.types import GGMLType
from ..checks import register_kernels, register_layer_kernels
from ..ladder import no_rung, takes
from . import compiled
from . import graphs  # noqa: F401  (ops.graph_capture asks for it)
from . import int8dot as i8
from . import layer
from . import kquant as tk
from . import tile as tt
from .layout import GRID_WORDS, TILE
from .warm import warm_up  # noqa: F401  (ops.warm_up asks for it)

T = GGMLType
SUPPORTED = frozenset({T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
                       T.Q4_K, T.Q5_K, T.Q6_K, T.NVFP4_E2M1,
                       T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS, T.MXFP4, T.IQ3_XXS, T.IQ3_S})
_COLS = TILE.value           # columns of one kernel tile (and of a K-quant super-block)
_PERMUTE_BLOCK = 1024


@dataclass(frozen=True)
class Launch:
    """Launch parameters of one rung for one type: ``bn`` weight rows and ``bm``
    activation rows per program, ``warps``, and the split-K target in programs
    per SM (``target``, when set, is the absolute number instead)."""
    bn: int
    warps: int
    per_sm: int
    bm: int = 1
    target: int | None = None


@dataclass(frozen=True)
class Rung:
    """One rung of the ladder (``ops.ladder.Rung``'s shape): it takes up to ``max_tokens`` activation rows
    (None: any number), serves the types ``launch`` names with their launch
    parameters, and runs ``run(x2, packed, qt, n_out, n_in, scales, scale_2,
    launch)`` on ``x2[M, n_in]``, returning ``[M, n_out]`` in x's dtype, for
    activations of the ``dtypes`` (None: every float dtype)."""
    name: str
    max_tokens: int | None
    launch: Mapping[GGMLType, Launch]
    run: Callable[..., torch.Tensor]
    dtypes: frozenset[torch.dtype] | None = None
    built: Callable[[], bool] | None = None      # kernels that may be absent (compiled.py)

    def serves(self, qtype: GGMLType, tokens: int, dtype: torch.dtype) -> bool:
        return (qtype in self.launch and takes(self.max_tokens, tokens)
                and (self.dtypes is None or dtype in self.dtypes)
                and (self.built is None or self.built()))

    @property
    def types(self) -> frozenset[GGMLType]:
        return frozenset(self.launch)


_SM_COUNT: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":      # TRITON_INTERPRET=1 on CPU tensors
        return 132
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def _target(launch: Launch, device: torch.device) -> int:
    return launch.target if launch.target is not None else launch.per_sm * _sm_count(device)


def _qtype(qtype: int) -> GGMLType:
    return GGMLType.parse(qtype)      # the boundary (checks) refused types outside SUPPORTED


def _companions(qt, packed, scales, scale_2):
    """The tile's side tensors: the companions as the boundary hands them
    (``checks.checked``: uint8 scales, float32 [1] scale_2), an IQ3 type's grid
    in the scales' place, or stand-ins (never read) for a format without."""
    if qt in GRID_WORDS:
        return _grid_table(qt, packed.device), packed
    return (scales.contiguous(), scale_2) if scales is not None else (packed, packed)


@functools.lru_cache(maxsize=None)
def _grid_table(qt: GGMLType, device: torch.device) -> torch.Tensor:
    """int32 ``[entries]``: ``qt``'s grid words on ``device`` (read it, never write it)."""
    return torch.tensor(GRID_WORDS[qt], dtype=torch.int32, device=device)


def _split(n_row_blocks: int, n_kb: int, target: int) -> tuple[int, int]:
    """(split, kb_per): split the K tiles until about ``target`` programs run.

    ``split`` divides ``n_kb`` (every program gets the same number of tiles)."""
    want = max(1, min(n_kb, -(-target // max(1, n_row_blocks))))
    split = max(d for d in range(1, want + 1) if n_kb % d == 0)
    return split, n_kb // split


def _partials(split: int, M: int, n_out: int, x: torch.Tensor) -> torch.Tensor:
    return torch.empty((split, M, n_out), dtype=x.dtype if split == 1 else torch.float32,
                       device=x.device)


def _split_outputs(x2: torch.Tensor, n_out: int, row_blocks: int, split: int,
                   dtype: torch.dtype | None = None):
    """``y [M, n_out]`` (x's dtype unless ``dtype``), the float32 partials of a split K
    and the arrival counters with which the kernels sum them in-kernel (``tile._store``)."""
    M = x2.shape[0]
    y = torch.empty((M, n_out), dtype=dtype or x2.dtype, device=x2.device)
    part = torch.empty((split, M, n_out) if split > 1 else (1,), dtype=torch.float32,
                       device=x2.device)
    return y, part, _split_counters(x2.device, row_blocks if split > 1 else 1)


def _finish(part: torch.Tensor, split: int, dtype: torch.dtype) -> torch.Tensor:
    out = part[0] if split == 1 else part.sum(0)
    return out if out.dtype == dtype else out.to(dtype)


def _permuted(x2: torch.Tensor, qt: GGMLType, n_in: int) -> torch.Tensor:
    """float32 activations in the K-quant words' nibble order (kquant.py)."""
    M = x2.shape[0]
    xp = torch.empty((M, n_in), dtype=torch.float32, device=x2.device)
    tk._permute_x_kernel[(triton.cdiv(n_in, _PERMUTE_BLOCK), M)](
        x2, xp, n_in, x2.stride(0), QTYPE=int(qt), BLOCK=_PERMUTE_BLOCK)
    return xp


# ---- the rungs' launchers ------------------------------------------------------------

def _mv_kquant(x2, packed, qt, n_out, n_in, scales, scale_2, launch: Launch) -> torch.Tensor:
    """One activation row of Q4_K / Q5_K / Q6_K: words in storage order."""
    n_kb = n_in // _COLS
    xp = _permuted(x2, qt, n_in)
    rb = triton.cdiv(n_out, launch.bn)
    split, kb_per = _split(rb, n_kb, _target(launch, x2.device))
    y, part, counters = _split_outputs(x2, n_out, rb, split)
    kw = dict(KB_PER=kb_per, NB=n_kb, BN=launch.bn, num_warps=launch.warps)
    if qt is GGMLType.Q6_K:
        tk._mv_q6k_kernel[(rb, split)](xp, packed, y, part, counters, split, n_out, **kw)
    else:
        tk._mv_q45k_kernel[(rb, split)](xp, packed, y, part, counters, split, n_out,
                                        QTYPE=int(qt), **kw)
    return y


def _mv_tile(x2, packed, qt, n_out, n_in, scales, scale_2, launch: Launch) -> torch.Tensor:
    """One activation row of any type: decoded tiles times x."""
    s, s2 = _companions(qt, packed, scales, scale_2)
    rb = triton.cdiv(n_out, launch.bn)
    split, kb_per = _split(rb, triton.cdiv(n_in, _COLS), _target(launch, x2.device))
    y, part, counters = _split_outputs(x2, n_out, rb, split)
    tt._mv_tile_kernel[(rb, split)](x2, packed, s, s2, y, part, counters, split, n_out, n_in,
                                    KB_PER=kb_per, QTYPE=int(qt), ROW_BYTES=packed.shape[1],
                                    BN=launch.bn, num_warps=launch.warps)
    return y


def _mv_tile_mt(x2, packed, qt, n_out, n_in, scales, scale_2, launch: Launch,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """2..16 activation rows of any type: ``_mv_tile_kernel``'s decode once for all
    rows, float32 FMAs (``tile._mv_tile_mt_kernel``)."""
    M = x2.shape[0]
    if not 1 <= M <= 16:
        raise ValueError(f"the decoded-tile matvec takes 1 to 16 activation rows, got {M}")
    s, s2 = _companions(qt, packed, scales, scale_2)
    mt = 2 if M <= 2 else 4 if M <= 4 else 8 if M <= 8 else 16
    rb = triton.cdiv(n_out, launch.bn)
    split, kb_per = _split(rb, triton.cdiv(n_in, _COLS), _target(launch, x2.device))
    y, part, counters = _split_outputs(x2, n_out, rb, split, out_dtype)
    tt._mv_tile_mt_kernel[(rb, split)](x2, packed, s, s2, y, part, counters, split, M, n_out, n_in,
                                       x2.stride(0), packed.shape[1], KB_PER=kb_per, QTYPE=int(qt),
                                       BN=launch.bn, MT=mt, num_warps=launch.warps)
    return y


def _mm_token_axis(x2, packed, qt, n_out, n_in, scales, scale_2, launch: Launch) -> torch.Tensor:
    """2..8 activation rows of Q4_K / Q5_K: one decode of each weight for all rows."""
    M = x2.shape[0]
    if M > 8:
        raise ValueError(f"the token-axis kernel takes at most 8 activation rows, got {M}")
    n_kb = n_in // _COLS
    xp = _permuted(x2, qt, n_in)
    rb = triton.cdiv(n_out, launch.bn)
    split, kb_per = _split(rb, n_kb, _target(launch, x2.device))
    part = _partials(split, M, n_out, x2)
    mt = 2 if M <= 2 else 4 if M <= 4 else 8
    tk._mm_q45k_mt_kernel[(rb, split)](xp, packed, part, M, n_out, KB_PER=kb_per, QTYPE=int(qt),
                                       NB=n_kb, BN=launch.bn, MT=mt, num_warps=launch.warps)
    return _finish(part, split, x2.dtype)


WIDE_ROW_TILES = 4     # row tiles assumed by tiles of more than 64 rows when splitting K


def _qmm(x2, packed, qt, n_out, n_in, scales, scale_2, launch: Launch) -> torch.Tensor:
    """``x2[M, n_in]`` to ``[M, n_out]`` on tensor cores, ``bm`` x ``bn`` output tiles."""
    M = x2.shape[0]
    bm, bn = launch.bm, launch.bn
    stages = 2 if bm * bn <= 16 * 64 and x2.dtype != torch.float32 else 1
    s, s2 = _companions(qt, packed, scales, scale_2)
    tiles = (triton.cdiv(M, bm) if bm <= 64 else WIDE_ROW_TILES) * triton.cdiv(n_out, bn)
    split, kb_per = _split(tiles, triton.cdiv(n_in, _COLS), _target(launch, x2.device))
    part = _partials(split, M, n_out, x2)
    grid = (triton.cdiv(M, bm), triton.cdiv(n_out, bn), split)
    tt._qmm_kernel[grid](x2, packed, s, s2, part, M, n_out, n_in, x2.stride(0), KB_PER=kb_per,
                         QTYPE=int(qt), ROW_BYTES=packed.shape[1], BM=bm, BN=bn,
                         DOT_F32=x2.dtype == torch.float32, num_warps=launch.warps,
                         num_stages=stages)
    return _finish(part, split, x2.dtype)


def _quantize_x(x2: torch.Tensor, n_in: int):
    """x2's rows as int8dot's two int8 levels, block scales and integer block sums,
    padded with zeros to whole 256-column tiles; and the tiles per row."""
    M = x2.shape[0]
    n_pad = triton.cdiv(n_in, _COLS) * _COLS
    dev = x2.device
    a1 = torch.empty((M, n_pad), dtype=torch.int8, device=dev)
    a2 = torch.empty((M, n_pad), dtype=torch.int8, device=dev)
    dxs = torch.empty((M, n_pad // 32), dtype=torch.float32, device=dev)
    s32 = torch.empty((M, n_pad // 32), dtype=torch.int32, device=dev)
    s16 = torch.empty((M, n_pad // 16), dtype=torch.int32, device=dev)
    blocks = 32
    i8._quantize_x_kernel[(triton.cdiv(n_pad // 32, blocks), M)](
        x2, a1, a2, dxs, s16, s32, n_in, x2.stride(0), n_pad, BLOCKS=blocks)
    return a1, a2, dxs, s16, s32, n_pad // _COLS


def _quantize_frag(x2: torch.Tensor, n_in: int, run8: bool):
    """x2's rows (at most 16) in int8dot's two levels, in the order of mv.cu's
    tensor-core fragments (``int8dot._quantize_frag_kernel``): ``a12[tiles, n_pad / 32,
    32, 16]`` int8 and ``sc[tiles, n_pad / 64, 4, 2, 4]`` float32, tiles of 8 tokens."""
    M = x2.shape[0]
    n_pad = triton.cdiv(n_in, _COLS) * _COLS
    tiles = triton.cdiv(M, 8)
    a12 = torch.empty((tiles, n_pad // 32, 32, 16), dtype=torch.int8, device=x2.device)
    sc = torch.empty((tiles, n_pad // 64, 4, 2, 4), dtype=torch.float32, device=x2.device)
    blocks = 32
    i8._quantize_frag_kernel[(triton.cdiv(n_pad // 32, blocks), 8 * tiles)](
        x2, a12, sc, M, n_in, x2.stride(0), n_pad, BLOCKS=blocks, RUN8=run8)
    return a12, sc


def _i8_dot(x2, packed, qt, n_out, n_in, scales, scale_2, launch: Launch,
            out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """1..8 half-precision activation rows: integer dots on the packed codes
    (int8dot.py). ``out_dtype`` (default x's) lets the tests see the kernel's
    own error without the output's rounding."""
    M = x2.shape[0]
    if M > 8:
        raise ValueError(f"the int8-dot kernels take at most 8 activation rows, got {M}")
    out_dtype = out_dtype or x2.dtype
    mt = 1 if M == 1 else 2 if M == 2 else 4 if M <= 4 else 8
    a1, a2, dxs, s16, s32, nb = _quantize_x(x2, n_in)
    rb = triton.cdiv(n_out, launch.bn)
    split, kb_per = _split(rb, nb, _target(launch, x2.device))
    y, part, counters = _split_outputs(x2, n_out, rb, split, out_dtype)   # int32 counters either way
    kw = dict(BN=launch.bn, MT=mt, ASM=x2.device.type == "cuda", num_warps=launch.warps)
    grid = (rb, split)
    args = (a1, a2, dxs, s16 if qt in (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K) else s32,
            packed, y, part, counters, split, M, n_out, nb)
    if qt is GGMLType.Q6_K:
        i8._i8_q6k_kernel[grid](*args, kb_per, **kw)
    elif qt in (GGMLType.Q4_K, GGMLType.Q5_K):
        i8._i8_q45k_kernel[grid](*args, kb_per, QTYPE=int(qt), **kw)
    else:
        i8._i8_legacy_kernel[grid](*args, n_in // 32, kb_per, QTYPE=int(qt), **kw)
    return y


# The largest decoded copy the dense rung makes (bytes); larger weights (Muse Glimmer's
# lm_head would be 2.7 GB) stay on qmm_wide's tiles, at most 10% slower there at 256 rows.
DENSE_MAX_BYTES = 1 << 30


def _dense(x2, packed, qt, n_out, n_in, scales, scale_2, launch: Launch,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Many half-precision rows: the weight decoded once into x's dtype (the
    dequantize kernel, exact in float32 before that rounding; the weight a
    tensor-core rung's tiles hold), then cuBLAS's GEMM with float32 accumulation.
    The decoded copy lives for the call: one weight at a time."""
    if n_out * n_in * x2.element_size() > DENSE_MAX_BYTES:   # a vocabulary-sized weight
        return run_rung("qmm_wide", x2, packed, qt, n_out, n_in, scales, scale_2)
    w = _decode_rows(packed, qt, n_out, n_in, scales, scale_2, dtype=x2.dtype)
    y = torch.mm(x2, w.t())
    return y if out_dtype is None else y.to(out_dtype)


def _cuda_mv(x2, packed, qt, n_out, n_in, scales, scale_2, launch: Launch,
             out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """One half-precision row of Q4_K / Q6_K: mv.cu's kernels on int8dot's
    two-level activation (the same quantization as ``_i8_dot``); ``out_dtype``
    as there."""
    if x2.shape[0] != 1:
        raise ValueError(f"the CUDA C++ matvec takes one activation row, got {x2.shape[0]}")
    if packed.data_ptr() % 16:     # a joined part's view off the vector alignment
        return run_rung("i8_dot" if qt is GGMLType.Q4_K else "mv_kquant", x2, packed, qt,
                        n_out, n_in)
    a1, a2, dxs, s16, _, _ = _quantize_x(x2, n_in)
    y = torch.empty((1, n_out), dtype=out_dtype or x2.dtype, device=x2.device)
    if qt is GGMLType.Q6_K:
        compiled.kernels().q6k_mv(packed, a1, a2, dxs, y, launch.bn)
    else:
        compiled.kernels().q4k_mv(packed, a1, a2, dxs, s16, y, launch.bn)
    return y


def _cuda_mm(x2, packed, qt, n_out, n_in, scales, scale_2, launch: Launch,
             out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """1..16 half-precision rows of the K-quants and Q8_0 / Q5_0 / Q4_0: mv.cu's int8
    tensor-core kernels on int8dot's two-level activation (the quantization of
    ``_i8_dot``); every weight is read once for all rows. ``out_dtype`` as there."""
    M = x2.shape[0]
    if not 1 <= M <= 16:
        raise ValueError(f"the CUDA C++ tensor-core kernels take 1 to 16 activation rows, got {M}")
    kernel, align = _MM_KERNELS[qt]
    if packed.data_ptr() % align:   # a joined part's view off the kernel's word alignment
        return run_rung(_next_rung("cuda_mm", qt, M, x2.dtype), x2, packed, qt, n_out, n_in)
    a12, sc = _quantize_frag(x2, n_in, run8=qt in MM_RUNS_OF_8)
    y = torch.empty((M, n_out), dtype=out_dtype or x2.dtype, device=x2.device)
    rows = launch.bn or (32 if qt in MM_RUNS_OF_8 and n_out >= MM_32_ROWS_FROM else 16)
    getattr(compiled.kernels(), kernel)(packed, a12, sc, y, launch.per_sm, rows)
    return y


# The types whose cuda_mm kernel takes its activation's k-slots in runs of 8 columns
# (``_quantize_frag``'s run8) and can walk 32 weight rows a warp.
MM_RUNS_OF_8 = frozenset({T.Q4_K, T.Q5_K})
# Q4_K / Q5_K weights of at least this many rows take 32 a warp (two m16 tiles share each
# activation fragment): on the H100 at 8 rows Glimmer's ffn_down 101 -> 57 us, its lm_head
# 850 -> 469, attn_output 19.7 -> 14.0; at 16 rows 3-37% faster. Below it (4096-row attn_q,
# 1024-row attn_k) 16 rows a warp measured up to 11% faster.
MM_32_ROWS_FROM = 6144

# mv.cu's tensor-core kernel of each type, and the alignment its word loads need.
_MM_KERNELS = {T.Q4_K: ("q4k_mm", 16), T.Q5_K: ("q5k_mm", 16), T.Q6_K: ("q6k_mm", 4),
               T.Q8_0: ("q8_0_mm", 2), T.Q5_0: ("q5_0_mm", 2), T.Q4_0: ("q4_0_mm", 2)}


def _next_rung(name: str, qt: GGMLType, tokens: int, dtype: torch.dtype) -> Rung:
    """The rung the ladder would run for these arguments if rung ``name`` were absent."""
    after = LADDER[[r.name for r in LADDER].index(name) + 1:]
    return next(r for r in after if r.serves(qt, tokens, dtype))


def _cpp_built() -> bool:
    return compiled.kernels() is not None


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _split_counters(device: torch.device, n: int) -> torch.Tensor:
    """int32 arrival counters, one per row block, for the int8-dot kernels' in-kernel
    split-K sum. All zero between calls: the last program of a row block resets its
    own. Kernels on one stream run in order, so calls never share them at once
    (two streams running these kernels at the same time would need their own)."""
    have = _COUNTERS.get(device)
    if have is None or have.numel() < n:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("int8-dot split counters must exist before CUDA-graph capture; "
                               "run the op once outside the graph first")
        have = torch.zeros(max(n, 1 << 14), dtype=torch.int32, device=device)
        _COUNTERS[device] = have
    return have


# ---- the ladder ----------------------------------------------------------------------

def _each(types, launch: Launch) -> dict[GGMLType, Launch]:
    return {t: launch for t in types}


_KQUANT = (T.Q4_K, T.Q5_K, T.Q6_K)
# mv_kquant's launch parameters were picked by the sweep (``muser_torch.bench.triton_kernels
# --what sweep``) on the H200 (docs/performance.md). token_axis beats the tensor-core tile
# at 2 tokens there (ffn_up 123 vs 166 us) but not at 3-4, hence max_tokens=2.
# The int8-dot rungs serve a type only where they beat the float32 rung (one token)
# or the tensor-core tile (2-8) at 4096 x 14336 on the H200 (``bench triton --what
# peer i8sweep``, docs/performance.md); their launch parameters are that sweep's best.
# Q6_K and the 2-byte-aligned legacy blocks lose at one token (two 2-byte loads per
# word), Q6_K also at 8.
I8_TYPES = (T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0, T.Q4_0, T.Q5_0)     # what int8dot.py decodes
HALF = frozenset({torch.float16, torch.bfloat16})
# From this many half rows the dense rung beats the tensor-core tiles on every shape
# measured (256 rows: 1.1-2.7x qmm_wide on the H100; at 128 each wins on some).
DENSE_FROM = 256
LADDER: tuple[Rung, ...] = (
    # Hand-written CUDA (mv.cu) where nvcc is present: the Triton rungs below are its fallback.
    # Its ``bn`` is the rows each warp walks (1, 2 or 4).
    Rung("cuda_mv", 1, {T.Q4_K: Launch(2, 4, 0), T.Q6_K: Launch(2, 4, 0)}, _cuda_mv, HALF,
         _cpp_built),
    Rung("i8_dot", 1, _each((T.Q4_K, T.Q5_K), Launch(64, 4, 4)), _i8_dot, HALF),
    Rung("mv_kquant", 1, {T.Q4_K: Launch(64, 8, 4), T.Q5_K: Launch(64, 8, 8),
                          T.Q6_K: Launch(32, 4, 8)}, _mv_kquant),
    Rung("mv_tile", 1, _each(SUPPORTED - set(_KQUANT), Launch(16, 4, 4)), _mv_tile),
    # 2..16 rows of the K-quants and the 32-column int8-dot types on int8 tensor cores
    # (mv.cu), the weights read once for all rows: DFlash's 16-row verify and batched
    # serving. Its ``per_sm``: how many warps per SM the K split aims at (0: mv.cu's 32);
    # ``bn``: weight rows a warp, 16 or 32 (0: by the weight, MM_32_ROWS_FROM); ``warps``
    # only says what mv.cu does (at most 8 warps a block).
    Rung("cuda_mm", 16, _each(_MM_KERNELS, Launch(0, 8, 0)), _cuda_mm, HALF, _cpp_built),
    Rung("i8_dot_mt", 8, {T.Q4_K: Launch(32, 2, 4), T.Q5_K: Launch(32, 2, 4),
                          T.Q5_0: Launch(16, 2, 4), T.Q4_0: Launch(16, 2, 4)}, _i8_dot, HALF),
    Rung("token_axis", 2, _each((T.Q4_K, T.Q5_K), Launch(64, 8, 4)), _mm_token_axis),
    # 2..16 rows of the IQ3 types (any dtype): the one-token tile decoder once for all
    # rows, float32 FMAs. Their grid lookups made qmm_small's tensor-core tiles take
    # 600 us at every row count of test-backend-ops' shape on the H100, 8-9x the one-row
    # time; here 79-257 us. IQ4_XS, Q2_K, Q3_K and MXFP4 measured faster on qmm_small
    # past 2-4 rows (``bench triton --what batches``, docs/performance.md).
    Rung("mv_tile_mt", 16, _each((T.IQ3_XXS, T.IQ3_S), Launch(16, 4, 4)), _mv_tile_mt),
    Rung("qmm_small", 16, _each(SUPPORTED, Launch(32, 4, 2, bm=16)), _qmm),
    Rung("qmm_tiled", 64, _each(SUPPORTED, Launch(64, 8, 2, bm=64)), _qmm),
    # 128 x 128 tiles (8 warps) halve the decodes per product against 64 x 64: at 512
    # tokens of 4096 x 14336 on the H200, Q4_K 436 -> 284 us, Q8_0 725 -> 392, Q5_0
    # 1060 -> 566 (``bench triton --what qmmsweep``, docs/performance.md); from DENSE_FROM
    # rows the dense rung below is faster still. Half x only:
    # float32 tiles that size do not fit in shared memory. Its split K is chosen for a
    # nominal 4 row tiles whatever M, so a prompt length never compiles a new variant.
    Rung("qmm_wide", DENSE_FROM - 1, _each(SUPPORTED, Launch(128, 8, 2, bm=128)), _qmm, HALF),
    # From DENSE_FROM half rows (a prompt), the weight decoded once into x's dtype and
    # cuBLAS's GEMM: the decode is paid once, not once per 128-row tile.
    Rung("dense", None, _each(SUPPORTED, Launch(0, 0, 0)), _dense, HALF),
    Rung("qmm_tall", None, _each(SUPPORTED, Launch(64, 8, 2, bm=64)), _qmm),
)
RUNGS: dict[str, Rung] = {r.name: r for r in LADDER}

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
for _t in SUPPORTED:   # every supported type has a kernel at every token count and dtype
    for _m in (1, 2, 9, 17, 65):
        for _dt in DTYPES:
            if not any(r.built is None and r.serves(_t, _m, _dt) for r in LADDER):
                raise RuntimeError(f"the CUDA ladder has no rung for {_t.name} at {_m} tokens "
                                   f"of {_dt}")


def rung_for(qtype: GGMLType, tokens: int, dtype: torch.dtype = torch.float32) -> Rung:
    """The rung ``qmatmul`` runs for ``tokens`` activation rows of ``qtype`` in ``dtype``."""
    return _rung_for(qtype, min(tokens, _LONGEST), dtype)


_LONGEST = 1 + max(r.max_tokens for r in LADDER if r.max_tokens is not None)


@functools.lru_cache(maxsize=None)   # eager calls pay the ladder walk once per key
def _rung_for(qt: GGMLType, tokens: int, dtype: torch.dtype) -> Rung:
    for rung in LADDER:
        if rung.serves(qt, tokens, dtype):
            return rung
    raise ValueError(no_rung("the CUDA ladder", qt, tokens, dtype))


def run_rung(rung: "Rung | str", x2: torch.Tensor, packed: torch.Tensor, qt: GGMLType,
             n_out: int, n_in: int, scales=None, scale_2=None, **launch) -> torch.Tensor:
    """Run one rung on ``x2[M, n_in]`` whatever M, with its launch parameters
    optionally overridden (``bn=``, ``warps=``, ``target=``...): for the tests
    and the benchmark's sweep."""
    rung = RUNGS[rung] if isinstance(rung, str) else rung
    if qt not in rung.types:
        raise ValueError(f"rung {rung.name} does not serve {qt.name}")
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    lp = rung.launch[qt]
    return rung.run(x2, packed, qt, n_out, n_in, scales, scale_2,
                    dataclasses.replace(lp, **launch) if launch else lp)


# ---- the ops' CUDA implementations (signatures of muser_torch.ops) ----------------

def qmatmul(x: torch.Tensor, packed: torch.Tensor, qtype: int, n_out: int, n_in: int,
            scales: torch.Tensor | None = None, scale_2: torch.Tensor | None = None) -> torch.Tensor:
    qt = _qtype(qtype)
    lead = x.shape[:-1]
    M = x.numel() // n_in if n_in else 0
    if M == 0:
        return x.new_empty((*lead, n_out))
    y = run_rung(rung_for(qt, M, x.dtype), x.reshape(M, n_in), packed, qt, n_out, n_in, scales, scale_2)
    return y.reshape(*lead, n_out)


def _decode_rows(packed, qt, n_out, n_in, scales, scale_2, ids=None,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The rows (all, or ``ids``) decoded in float32, stored as ``dtype`` (rounded
    to nearest even: a half tile as the tensor-core rungs round theirs)."""
    s, s2 = _companions(qt, packed, scales, scale_2)
    n_rows = n_out if ids is None else ids.numel()
    out = torch.empty((n_rows, n_in), dtype=dtype, device=packed.device)
    if n_rows == 0:
        return out
    bn = 8
    grid = (triton.cdiv(n_rows, bn), triton.cdiv(n_in, _COLS))
    tt._dequant_kernel[grid](packed, s, s2, packed if ids is None else ids, out, n_rows, n_out,
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
    register_kernels("cuda", {"qmatmul": qmatmul, "dequantize": dequantize, "embedding": embedding},
                     SUPPORTED)
    from .. import layer as _layer_ops   # noqa: F401  (defines the layer ops)
    register_layer_kernels("cuda", layer.KERNELS)
    _registered = True


_registered = False


try:  # muser_torch.ops imports this module after defining the ops
    register()
except (RuntimeError, ValueError, AttributeError) as _e:  # ops not defined (module used standalone)
    import warnings as _w
    _w.warn(f"muser_torch.ops.cuda: kernels not registered ({_e!r})", RuntimeWarning, stacklevel=1)
