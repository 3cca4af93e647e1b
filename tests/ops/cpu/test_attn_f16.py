"""The ggml block's f16 flash attention (ops/cpu/attn_f16.c), at every level
this CPU runs (AVX-512, AVX2 + F16C, plain C: forced in one build).

- f16 rounding: the software rounding (what a build without F16C runs) equals
  F16C's vcvtps2ph (round to nearest even) on float32 bit patterns of every
  kind: random ones, every exact tie of the normal range and the subnormal
  range and their neighbours, the overflow and underflow edges, infinities,
  NaNs with payloads. Each level's rounding also equals numpy's float16 cast
  on finite values (an independent reference).
- One query row (q rounded to f16, each key's f16 dot in the emulated build's
  lane order, the online softmax with its V sum in f16): each vector level
  gives the plain C result bit for bit, for each emulated width (16, 8, 0),
  with head sizes that leave tails past the 4-width chunks and the vector
  registers, and odd row strides.
- Teeth: the bit comparison sees a change of summation order (widths 16 and 8
  differ somewhere on the same rows), and the row is near float64 attention.
Fresh seeds each run (MUSER_TEST_SEED replays one); each failure names it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from muser_torch.ops import cpu
from muser_torch.ops.cpu.block import ATTN_ISA_NAMES, attn_isa, f16_round_mismatches, fa_row

from ..conftest import OTHER_MARCHES, native_build_for, x86_only
from ..metal.helpers import fresh_seed

WIDTHS = (16, 8, 0)
HEAD_DIMS = (1, 7, 31, 63, 64, 65, 127, 129, 256, 257)   # tails past 8, 16, 32 and 64 elements
KEYS = (1, 2, 5, 33)
# |o - float64 attention| / max |o|: q, K, V and the V sum in f16 (2^-11 relative each);
# measured about 1e-3 on these shapes
FLOAT64_BOUND = 1e-2


@pytest.fixture
def lib():
    """The library, its attention level restored to the CPU's best after the test."""
    assert cpu.native_available(), "the native CPU kernels failed to build"
    lib = cpu._native_lib()
    best = attn_isa(lib)
    try:
        yield lib
    finally:
        attn_isa(lib, best)


def _levels(lib) -> list[int]:
    return list(range(attn_isa(lib), -1, -1))


def _bits(x: torch.Tensor) -> np.ndarray:
    return x.numpy().view(np.int32)


def _f16(x: torch.Tensor) -> torch.Tensor:
    return x.half().float()


def test_f16_round_soft_equals_f16c(lib):
    seed = fresh_seed()
    gen = np.random.default_rng(seed)
    hi = np.arange(1 << 19, dtype=np.uint32) << 13            # every sign, exponent and f16 mantissa
    ties = np.concatenate([hi | 0x1000, hi | 0x0FFF, hi | 0x1001])
    # subnormal f16 results: float32 values k * 2^-25 (odd k: ties), their neighbours
    k = np.arange(1, 1 << 12, dtype=np.float32)
    sub = (k * np.float32(2.0 ** -25)).view(np.uint32)
    subs = np.concatenate([sub, sub - 1, sub + 1, sub | 0x80000000])
    edges = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
                      0x7FBFFFFF, 0xFFA12345, 0x7FFFFFFF, 0x477FEFFF, 0x477FF000, 0x477FE000,
                      0x38800000, 0x387FFFFF, 0x33000000, 0x33000001, 0x32FFFFFF, 0x7F7FFFFF, 1],
                     dtype=np.uint32)
    rand = gen.integers(0, 1 << 32, size=1 << 22, dtype=np.uint64).astype(np.uint32)
    bits = torch.from_numpy(np.concatenate([ties, subs, edges, rand]).view(np.int32))
    bad = f16_round_mismatches(lib, bits)
    if bad < 0:
        pytest.skip("this CPU has no F16C")
    assert bad == 0, f"seed {seed}: {bad} of {bits.numel()} float32 patterns round otherwise than F16C"

    # each level's rounding (q through fa_row, times 1) against numpy's float16 cast
    x = torch.from_numpy(np.concatenate([ties, subs, rand[:1 << 16]]).view(np.float32).copy())
    x = x[torch.isfinite(x) & (x.abs() < 65504.0)]
    want = torch.from_numpy(x.numpy().astype(np.float16).astype(np.float32))
    for level in _levels(lib):
        attn_isa(lib, level)
        kv = torch.zeros(1, x.numel())
        got, _ = fa_row(lib, x, kv, kv, 1.0, 1.0, 0)
        diff = np.flatnonzero(_bits(got) != _bits(want))
        assert diff.size == 0, (f"seed {seed}, {ATTN_ISA_NAMES[level]}: f16({x[diff[0]].item()!r}) = "
                                f"{got[diff[0]].item()!r}, numpy {want[diff[0]].item()!r}")


def _row(gen: torch.Generator, n: int, D: int) -> tuple[torch.Tensor, ...]:
    """q [D] and f16 K, V [n, D] in rows of stride D + 3 (odd)."""
    q = torch.randn(D, generator=gen) * 2
    kv = _f16(torch.randn(2, n, D + 3, generator=gen))
    return q, kv[0], kv[1]


def _check_levels(lib, width: int, seed: int, build: str) -> None:
    """Every level's rows against plain C's, bit for bit, at the emulated ``width``."""
    gen = torch.Generator().manual_seed(seed)
    levels = _levels(lib)
    for D in HEAD_DIMS:
        for n in KEYS:
            q, k, v = _row(gen, n, D)
            # Gemma's form (q scaled before its rounding, scores by 1) and the plain one
            for q_scale, scale in ((D ** -0.5, 1.0), (1.0, D ** -0.5)):
                runs = {}
                for level in levels:
                    attn_isa(lib, level)
                    runs[level] = fa_row(lib, q, k, v, q_scale, scale, width)
                ref_q, ref_o = runs[0]
                for level, (qh, o) in runs.items():
                    where = (f"seed {seed}, {build} build, {ATTN_ISA_NAMES[level]}, width {width}, "
                             f"D {D}, {n} keys")
                    assert np.array_equal(_bits(qh), _bits(ref_q)), f"{where}: q as f16 differs from plain C"
                    bad = np.flatnonzero(_bits(o) != _bits(ref_o))
                    assert bad.size == 0, (f"{where}: o[{bad[0]}] = {o[bad[0]].item()!r}, plain C "
                                           f"{ref_o[bad[0]].item()!r} ({bad.size} of {D} differ)")


@pytest.mark.parametrize("width", WIDTHS)
def test_row_levels_bit_identical(lib, width):
    _check_levels(lib, width, fresh_seed(), "default")


@x86_only
@pytest.mark.parametrize("march, needs", OTHER_MARCHES)
def test_row_levels_bit_identical_other_builds(march, needs, monkeypatch):
    """The same in the AVX2 and plain x86-64 builds: one build serves any x86-64,
    its vector kernels chosen at run time (the x86-64 build's plain C level rounds
    to f16 in software, its vector levels with F16C)."""
    seed = fresh_seed()
    with native_build_for(march, needs, monkeypatch):
        lib = cpu._native_lib()
        best = attn_isa(lib)
        try:
            for width in WIDTHS:
                _check_levels(lib, width, seed, march)
        finally:
            attn_isa(lib, best)


def test_row_order_seen_and_near_float64(lib):
    """The comparison above has teeth: the same rows summed in 16 lanes and in 8
    differ somewhere; and a row is attention (within FLOAT64_BOUND of float64)."""
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    differ = False
    for _ in range(8):
        q, k, v = _row(gen, 33, 256)
        _, o16 = fa_row(lib, q, k, v, 1.0, 256 ** -0.5, 16)
        _, o8 = fa_row(lib, q, k, v, 1.0, 256 ** -0.5, 8)
        differ |= not np.array_equal(_bits(o16), _bits(o8))
        qh = _f16(q).double()
        p = torch.softmax((k[:, :256].double() @ qh) * 256 ** -0.5, 0)
        want = p @ v[:, :256].double()
        err = ((o16.double() - want).abs().max() / want.abs().max()).item()
        assert err <= FLOAT64_BOUND, f"seed {seed}: {err:.2e} from float64 attention (bound {FLOAT64_BOUND})"
    assert differ, f"seed {seed}: widths 16 and 8 gave the same bits on 8 rows: the order is not seen"
