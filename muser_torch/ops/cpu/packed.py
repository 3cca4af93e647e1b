"""Weights repacked at load for the ggml-numerics kernels (``qdot_packed.c``,
``qdot_packed_k.c``).

``repack`` interleaves ``PACKED_ROWS`` rows block by block, each field of
the block in struct order (``formats/layout.py``), chunk by chunk (4 bytes; a
2-byte ``d`` is one chunk), row by row; rows past the last whole group stay
as they are, after the groups. The result is the file's bytes moved, none
changed: the same size, ``unpack`` gives the file's bytes back (``rows``:
any of them), and tests/ops/cpu/test_packed.py checks it against an
independent index walk.
``qdot_packed.c`` reads this layout (its header draws it) and computes what
``muser_matmul_q8`` computes on the file's layout, bit for bit.
``QLinear.repacked()`` makes and keeps one per weight (docs/cpu.md).
"""
from __future__ import annotations

import functools
import os
from typing import Callable

import torch

from ...formats.types import GGMLType
from .build import _native_lib

PACKED_ROWS = 16        # rows per group; qdot_packed.c's PACKED_ROWS (checked at first use)
CHUNK = 4               # bytes of a field per row before the next row's
_REPACK_STEP = 1024     # groups repacked at a time
_UNPACK_ROWS = 4096     # rows gathered at a time by unpack (an int64 index per byte)
PACKED_TYPES = frozenset({GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q6_K})
# Types whose packed kernel has no AVX2 version: on a CPU without AVX-512 VNNI
# they stay on the row kernels (the plain C packed kernel is the reference).
# Q4_K has one (qdot_packed_k.c's panel_q4k_256).
_AVX512_ONLY = frozenset({GGMLType.Q6_K})
ISA_NAMES = ("plain C", "AVX2", "AVX-512 VNNI")


_enabled = os.environ.get("MUSER_CPU_REPACK", "1") != "0"


def enabled() -> bool:
    """Whether ggml-numerics ``QLinear`` modules run on a repack of their weight."""
    return _enabled


def set_enabled(flag: bool) -> None:
    """Turn the repack on or off for every ``QLinear`` from the next call on.
    Call ``nn.set_repack``, which also counts it as a change (the layer
    runners' cached plans hold the repack)."""
    global _enabled
    _enabled = bool(flag)


def serves(qtype: GGMLType) -> bool:
    """Whether the models run ``qtype`` on a repack here (``repack`` and
    ``matmul`` take every ``PACKED_TYPES`` type on any CPU)."""
    qtype = GGMLType(qtype)
    return qtype in PACKED_TYPES and (qtype not in _AVX512_ONLY or isa() == len(ISA_NAMES) - 1)


def _check_args(op: str, packed: torch.Tensor, qtype: GGMLType) -> None:
    if qtype not in PACKED_TYPES:
        raise ValueError(f"{op}: no packed layout for {qtype.name} "
                         f"(serves {', '.join(sorted(t.name for t in PACKED_TYPES))})")
    if packed.dtype != torch.uint8 or packed.dim() != 2 or packed.shape[1] % qtype.block_bytes:
        raise ValueError(f"{op}: packed must be uint8 [n_out, row_bytes] with whole "
                         f"{qtype.name} blocks of {qtype.block_bytes} bytes, got "
                         f"{packed.dtype} {tuple(packed.shape)}")


def _groups(packed: torch.Tensor, qtype: GGMLType) -> tuple[int, int, int]:
    """(groups, blocks per row, block bytes)."""
    return packed.shape[0] // PACKED_ROWS, packed.shape[1] // qtype.block_bytes, qtype.block_bytes


def repack(packed: torch.Tensor, qtype: GGMLType,
           done: Callable[[torch.Tensor], object] | None = None) -> torch.Tensor:
    """The file's rows ``packed`` (uint8 ``[n_out, row_bytes]``) in the packed
    layout, a new tensor of the same shape (its rows no longer rows). Made
    ``_REPACK_STEP`` groups at a time, so the temporaries stay small beside a
    large weight (a tied lm_head: 178 MB); ``done`` is called with each span
    of ``packed``'s rows once it is copied (``QLinear`` releases their file
    pages, so the original is never resident whole beside its copy)."""
    qtype = GGMLType(qtype)
    _check_args("repack", packed, qtype)
    G, nb, B = _groups(packed, qtype)
    out = torch.empty_like(packed)
    for g0 in range(0, G, _REPACK_STEP):
        g1 = min(G, g0 + _REPACK_STEP)
        head = packed[g0 * PACKED_ROWS:g1 * PACKED_ROWS].reshape(g1 - g0, PACKED_ROWS, nb, B)
        dst = out[g0 * PACKED_ROWS:g1 * PACKED_ROWS].view(g1 - g0, nb, PACKED_ROWS * B)
        at = 0
        for f in qtype.layout.fields:
            c = min(CHUNK, f.nbytes)
            v = head[..., f.offset:f.offset + f.nbytes].reshape(g1 - g0, PACKED_ROWS, nb, f.nbytes // c, c)
            dst[..., at:at + PACKED_ROWS * f.nbytes].view(g1 - g0, nb, f.nbytes // c, PACKED_ROWS, c).copy_(
                v.permute(0, 2, 3, 1, 4))
            at += PACKED_ROWS * f.nbytes
        if done is not None:
            done(packed[g0 * PACKED_ROWS:g1 * PACKED_ROWS])
    out[G * PACKED_ROWS:] = packed[G * PACKED_ROWS:]
    if done is not None:
        done(packed[G * PACKED_ROWS:])
    return out


def unpack(repacked: torch.Tensor, qtype: GGMLType) -> torch.Tensor:
    """The inverse of ``repack``: the file's rows back (``rows`` of every row)."""
    qtype = GGMLType(qtype)
    _check_args("unpack", repacked, qtype)
    ids = torch.arange(repacked.shape[0])
    return torch.cat([rows(repacked, qtype, ids[i:i + _UNPACK_ROWS])
                      for i in range(0, len(ids), _UNPACK_ROWS)])


@functools.lru_cache(maxsize=64)
def _lane_bytes(qtype: GGMLType, blocks: int) -> torch.Tensor:
    """int64 ``[PACKED_ROWS, row_bytes]``: where byte j of row r of a group lies
    among the group's repacked bytes. The layout of the module docstring
    written as an index, apart from ``repack``'s views: the tests hold each
    to the other and both to an index walk of their own."""
    B = qtype.block_bytes
    r = torch.arange(PACKED_ROWS).view(-1, 1, 1)
    block = torch.arange(blocks).view(1, -1, 1) * (PACKED_ROWS * B)
    out = torch.empty(PACKED_ROWS, blocks, B, dtype=torch.int64)
    at = 0
    for f in qtype.layout.fields:
        c = min(CHUNK, f.nbytes)
        o = torch.arange(f.nbytes).view(1, 1, -1)
        out[..., f.offset:f.offset + f.nbytes] = block + at + o // c * (PACKED_ROWS * c) + r * c + o % c
        at += PACKED_ROWS * f.nbytes
    return out.view(PACKED_ROWS, blocks * B)


def rows(repacked: torch.Tensor, qtype: GGMLType, ids: torch.Tensor) -> torch.Tensor:
    """The file's rows ``ids`` (integers, flattened) of a repack, uint8
    ``[len(ids), row_bytes]``, gathered from it: a tied embedding reads its
    rows from the lm_head's repack, so the file's pages of the table stay
    released (``QEmbedding``)."""
    qtype = GGMLType(qtype)
    _check_args("rows", repacked, qtype)
    n_out, row_bytes = repacked.shape
    ids = ids.reshape(-1).long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n_out):
        raise IndexError(f"packed rows: ids must be in [0, {n_out}), got {int(ids.min())}..{int(ids.max())}")
    G, nb, _ = _groups(repacked, qtype)
    lane = _lane_bytes(qtype, nb)
    grouped = (ids < G * PACKED_ROWS).view(-1, 1)
    in_group = (ids // PACKED_ROWS * (PACKED_ROWS * row_bytes)).view(-1, 1) + lane[ids % PACKED_ROWS]
    in_place = (ids * row_bytes).view(-1, 1) + torch.arange(row_bytes)   # the rows after the groups
    return repacked.reshape(-1)[torch.where(grouped, in_group, in_place)]


def _lib():
    lib = _native_lib()
    if lib is None:
        raise RuntimeError("muser packed kernels: the native CPU library is unavailable")
    if lib.muser_packed_rows() != PACKED_ROWS:
        raise RuntimeError("qdot_packed.c's PACKED_ROWS does not match ops/cpu/packed.py's")
    return lib


def isa(force: int | None = None) -> int:
    """The kernels in use (an index into ``ISA_NAMES``); ``force`` selects a
    lower one (the tests run every one the CPU has), ValueError if it lacks it."""
    if force is not None and force not in range(len(ISA_NAMES)):
        raise ValueError(f"packed kernels: isa must be one of 0..{len(ISA_NAMES) - 1} "
                         f"({', '.join(ISA_NAMES)}), got {force!r}")
    got = _lib().muser_packed_isa(-1 if force is None else int(force))
    if got < 0:
        raise ValueError(f"packed kernels: this CPU cannot run {ISA_NAMES[force]}")
    return got


def isa_name() -> str:
    return ISA_NAMES[isa()]


def matmul(x: torch.Tensor, repacked: torch.Tensor, qtype: GGMLType, n_out: int, n_in: int,
           threads: int = 1) -> torch.Tensor:
    """``x[T, n_in] @ W.T`` in ggml's numerics on W's ``repack``: float32 ``[T, n_out]``."""
    qtype = GGMLType(qtype)
    _check_args("packed matmul", repacked, qtype)
    if repacked.shape != (n_out, qtype.row_bytes(n_in)):
        raise ValueError(f"packed matmul: weight is {tuple(repacked.shape)}, expected "
                         f"({n_out}, {qtype.row_bytes(n_in)}) for {qtype.name} {n_in}->{n_out}")
    if x.dim() != 2 or x.shape[1] != n_in or x.shape[0] < 1:
        raise ValueError(f"packed matmul: x must be [tokens >= 1, {n_in}], got {tuple(x.shape)}")
    x = x.to(torch.float32).contiguous()
    y = torch.empty(x.shape[0], n_out, dtype=torch.float32)
    rc = _lib().muser_matmul_q8p(int(qtype), repacked.data_ptr(), n_out, n_in, x.data_ptr(),
                                 x.shape[0], y.data_ptr(), threads)
    if rc:
        raise RuntimeError(f"muser_matmul_q8p failed ({rc}) for {qtype.name} {n_in}->{n_out}")
    return y
