"""The repacked ggml-numerics kernels (ops/cpu/packed.py, qdot_packed.c).

- The repack is a permutation of the file's bytes: an index walk written
  here from the layout's description (not from packed.py's torch views) says
  where each byte must land, and every byte is where it says, once.
- On every instruction set this CPU has (AVX-512 VNNI, AVX2, plain C, forced
  in one build), the packed kernel equals muser_matmul_q8 on the file's
  layout bit for bit: same integer lanes, same float order (ggml's x86
  vec_dot; this build's row kernels are x86 ones).
- Both it and ggml's own ``mul_mat`` (libggml-python) are within float32's
  1e-5 of float64 ``W @ Q8(x)`` (Q8_0 or Q8_K), x rounded by ggml's own
  quantizer, on ggml-quantized weights whose rows differ in scale, and ours
  is near ggml's output (GGML_BOUND). Measured (`python -m tests.seeds
  --seeds 40`, twice): rel err to float64 <= 3.0e-7 (legacy) and 9.7e-7
  (K-quants), margins >= 10x; the legacy types equal libggml-python's output
  bit for bit, the K-quants differ by <= 2.0e-6 of max |ggml| (bound 5e-6).
- The planted-defect twins: each row's first two blocks swapped, or two rows'
  scales swapped inside a panel, break the float64 bound (worst of 40 seeds:
  0.37 and 0.014, 1,400x above it).
Fresh seeds each run (MUSER_TEST_SEED replays one); each failure names it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from muser_torch.formats.types import GGMLType
from muser_torch.ops import cpu
from muser_torch.nn import set_repack
from muser_torch.ops.cpu import packed as P

from ...bounds import check_bound, check_floor
from ...formats.ggml_ref import quantize_chunk
from ..ggml_matmul import ggml_activations, ggml_mul_mat
from ..metal.helpers import fresh_seed, rel_err, swap_first_two_blocks

TYPES = sorted(P.PACKED_TYPES)
LEGACY = [t for t in TYPES if t.block_elems == 32]
FLOAT32_BOUND = 1e-5     # relative L2 error of a float32 sum against float64 (the numerics contract)
# max |ours - ggml| / max |ggml|: the legacy types sum in libggml-python's order (measured: 0,
# bit for bit; tests/ops/cpu/test_ggml_numerics.py's 1e-6), the K-quants in ggml's current
# source's, which libggml-python 0.20.2's differs from in the last bits (worst of 80 seeds
# 2.0e-6, Q4_K at 20 blocks a row, exp-scaled rows; both stay within FLOAT32_BOUND of float64)
GGML_BOUND = {32: 1e-6, 256: 5e-6}
# (n_out, blocks per row): whole panels, a tail, Gemma's widest legacy row (640), no panel
SHAPES = ((16, 2), (37, 3), (69, 20), (5, 1))
TOKENS = (1, 2, 3, 5, 8, 9, 33)


pytestmark = pytest.mark.usefixtures("repack_on")     # tests/conftest.py


@pytest.fixture
def every_isa():
    """Yields each instruction set this CPU runs, lowest last; restores the best."""
    assert cpu.native_available()
    best = P.isa()
    try:
        yield list(range(best, -1, -1))
    finally:
        P.isa(best)


def _walk(qtype: GGMLType, n_out: int, n_in: int) -> np.ndarray:
    """src[i]: the flat index in the file's rows of the byte at flat index i of
    the repack, from the layout as qdot_packed.c's header draws it."""
    B, nb = qtype.block_bytes, n_in // qtype.block_elems
    row_bytes, groups = nb * B, n_out // 16
    src = []
    for g in range(groups):
        for b in range(nb):
            for f in qtype.layout.fields:
                c = min(4, f.nbytes)
                for k in range(f.nbytes // c):
                    for r in range(16):
                        for j in range(c):
                            src.append((16 * g + r) * row_bytes + b * B + f.offset + k * c + j)
    src.extend(range(groups * 16 * row_bytes, n_out * row_bytes))   # the tail, in place
    return np.array(src)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_repack_is_a_permutation_of_the_files_bytes(qtype):
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    for n_out, blocks in SHAPES:
        n_in = blocks * qtype.block_elems
        rows = torch.randint(0, 256, (n_out, qtype.row_bytes(n_in)), dtype=torch.uint8, generator=g)
        rep = P.repack(rows, qtype)
        src = _walk(qtype, n_out, n_in)
        where = f"{qtype.name} {n_in}->{n_out} (seed {seed})"
        assert np.array_equal(np.sort(src), np.arange(rows.numel())), f"the walk is a bijection {where}"
        assert torch.equal(rep.flatten(), rows.flatten()[torch.from_numpy(src)]), where
        assert torch.equal(P.unpack(rep, qtype), rows), where
        ids = torch.randint(0, n_out, (2 * n_out,), generator=g)    # repeats, tail rows, any order
        assert torch.equal(P.rows(rep, qtype, ids), rows[ids]), f"rows of the repack {where}"


def _x(g: torch.Generator, tokens: int, n_in: int) -> torch.Tensor:
    """Rows at their own scales; row 0 holds a zero block, row 1 exact rounding ties."""
    x = torch.randn(tokens, n_in, generator=g) * torch.exp(torch.randn(tokens, 1, generator=g))
    x[0, :32] = 0.0
    if tokens > 1:
        x[1] = (torch.arange(n_in) % 40 - 20).float() + 0.5
        x[1, ::32] = 127.0
    return x


def _random_rows(qtype: GGMLType, n_out: int, n_in: int, g: torch.Generator) -> torch.Tensor:
    """Every byte random but d, a finite f16 in [2^-10, 2^-2)."""
    rows = torch.randint(0, 256, (n_out, qtype.row_bytes(n_in)), dtype=torch.uint8, generator=g)
    nb, at = n_in // qtype.block_elems, qtype.layout.field("d").offset
    d = (torch.rand(n_out, nb, generator=g) * 0.25 + 2 ** -10).half()
    rows.view(n_out, nb, qtype.block_bytes)[..., at:at + 2] = d.view(torch.uint8).view(n_out, nb, 2)
    return rows


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_equals_the_row_kernel_bit_for_bit_on_every_isa(qtype, every_isa):
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    for n_out, blocks in SHAPES:
        n_in = blocks * qtype.block_elems
        rows = _random_rows(qtype, n_out, n_in, g)
        rep = P.repack(rows, qtype)
        for tokens in TOKENS:
            x = _x(g, tokens, n_in)
            want = torch.ops.muser.qmatmul_ggml(x, rows, int(qtype), n_out, n_in)
            for isa in every_isa:
                P.isa(isa)
                got = P.matmul(x, rep, qtype, n_out, n_in, threads=2)
                assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (
                    f"{qtype.name} {n_in}->{n_out} tokens={tokens} on {P.ISA_NAMES[isa]}: "
                    f"max diff {float((got - want).abs().max()):.3g} (seed {seed})")


@pytest.mark.parametrize("qtype", [t for t in TYPES if t not in LEGACY], ids=lambda t: t.name)
def test_k_quants_agree_bit_for_bit_on_every_isa(qtype, every_isa):
    """The K-quants' packed kernels (qdot_packed_k.c: AVX-512 VNNI, Q4_K's AVX2
    and plain C; Q6_K on a forced AVX2 runs the C): every ISA's panels, and the
    rows past the last panel, equal the plain C kernel bit for bit."""
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    for n_out, blocks in SHAPES[:2] + ((33, 8),):
        n_in = blocks * qtype.block_elems
        rows = _random_rows(qtype, n_out, n_in, g)
        rep = P.repack(rows, qtype)
        for tokens in TOKENS:
            x = _x(g, tokens, n_in)
            P.isa(0)
            want = P.matmul(x, rep, qtype, n_out, n_in)
            for isa in every_isa:
                P.isa(isa)
                got = P.matmul(x, rep, qtype, n_out, n_in, threads=2)
                assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (
                    f"{qtype.name} {n_in}->{n_out} tokens={tokens}: {P.ISA_NAMES[isa]} differs from "
                    f"plain C by {float((got - want).abs().max()):.3g} (seed {seed})")


def _ggml_weight(qtype: GGMLType, n_out: int, n_in: int, g: torch.Generator):
    """ggml's bytes of a weight whose rows differ in scale, and their float64 values."""
    w = torch.randn(n_out, n_in, generator=g) * torch.exp(torch.randn(n_out, 1, generator=g))
    rows = quantize_chunk(w, int(qtype))
    W = torch.ops.muser.dequantize(rows, int(qtype), n_out, n_in).double()
    return rows, W


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_against_float64_and_ggml_mul_mat(qtype, every_isa):
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    for n_out, blocks in SHAPES[1:3]:
        n_in = blocks * qtype.block_elems
        rows, W = _ggml_weight(qtype, n_out, n_in, g)
        rep = P.repack(rows, qtype)
        for tokens in (1, 8):
            x = torch.randn(tokens, n_in, generator=g)
            ref = ggml_activations(int(qtype), x) @ W.T
            theirs = ggml_mul_mat(rows, int(qtype), n_out, n_in, x)
            where = f"{qtype.name} {n_in}->{n_out} tokens={tokens} (seed {seed})"
            check_bound("ggml: rel err to float64 on its rounded x", rel_err(theirs, ref), FLOAT32_BOUND, where)
            for isa in every_isa:
                P.isa(isa)
                ours = P.matmul(x, rep, qtype, n_out, n_in)
                at = f"{where} on {P.ISA_NAMES[isa]}"
                check_bound("packed: rel err to float64 on ggml's rounded x", rel_err(ours, ref),
                            FLOAT32_BOUND, at)
                check_bound("packed: max |ours - ggml| / max |ggml|",
                            (ours - theirs).abs().max() / theirs.abs().max(),
                            GGML_BOUND[qtype.block_elems], at)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_planted_defects_break_the_bound(qtype, every_isa):
    """Each row's first two blocks swapped (a wrong block stride), and rows 0
    and 1 of every panel given each other's scales (a wrong row order inside
    the interleave), both on one token: the float64 bound above must fail."""
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    n_out, n_in = 37, 3 * qtype.block_elems
    rows, W = _ggml_weight(qtype, n_out, n_in, g)
    x = torch.randn(1, n_in, generator=g)
    ref = ggml_activations(int(qtype), x) @ W.T
    swapped = P.repack(swap_first_two_blocks(rows, 3), qtype)
    scales = P.repack(rows, qtype)
    at = P.PACKED_ROWS * qtype.layout.field("d").offset   # the 16 d's of a panel's block
    for gr in range(n_out // 16):                      # every panel's block 0: d of rows 0 and 1
        panel = scales.view(-1)[gr * 16 * rows.shape[1] + at:]
        panel[0:2], panel[2:4] = panel[2:4].clone(), panel[0:2].clone()
    for isa in every_isa:
        P.isa(isa)
        where = f"{qtype.name} on {P.ISA_NAMES[isa]} (seed {seed})"
        check_floor("packed on swapped blocks: rel err to float64",
                    rel_err(P.matmul(x, swapped, qtype, n_out, n_in), ref), FLOAT32_BOUND, where)
        check_floor("packed with two rows' scales swapped: rel err to float64",
                    rel_err(P.matmul(x, scales, qtype, n_out, n_in), ref), FLOAT32_BOUND, where)


def test_bad_arguments_are_refused():
    rows = torch.zeros(16, 34, dtype=torch.uint8)
    with pytest.raises(ValueError, match="repack: no packed layout for Q5_K"):
        P.repack(torch.zeros(16, 176, dtype=torch.uint8), GGMLType.Q5_K)
    with pytest.raises(ValueError, match="whole Q8_0 blocks"):
        P.repack(torch.zeros(16, 35, dtype=torch.uint8), GGMLType.Q8_0)
    with pytest.raises(ValueError, match="whole Q8_0 blocks"):
        P.repack(rows.float(), GGMLType.Q8_0)
    with pytest.raises(ValueError, match=r"expected \(16, 68\)"):
        P.matmul(torch.zeros(1, 32), rows, GGMLType.Q8_0, 16, 64)
    with pytest.raises(ValueError, match=r"x must be \[tokens >= 1, 32\]"):
        P.matmul(torch.zeros(1, 31), rows, GGMLType.Q8_0, 16, 32)
    with pytest.raises(ValueError, match="isa must be one of"):
        P.isa(7)
    with pytest.raises(IndexError, match=r"ids must be in \[0, 16\), got 0..16"):
        P.rows(rows, GGMLType.Q8_0, torch.tensor([0, 16]))


def test_a_tied_embedding_reads_its_rows_from_the_linears_repack():
    """Linked to a ggml-numerics QLinear over the same bytes (``read_rows_from``),
    a QEmbedding decodes the rows of the repack: the values of the file's rows,
    bit for bit, every packed type, tail rows included; a QLinear over other
    bytes is refused by name."""
    from muser_torch import QEmbedding, QLinear
    from muser_torch.formats import random_weight

    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    for qtype in TYPES:
        if not P.serves(qtype):
            continue
        w = random_weight(qtype, 37, 2 * qtype.block_elems, generator=g)
        lm_head, table = QLinear.from_weight(w), QEmbedding.from_weight(w)
        lm_head.numerics = "ggml"
        ids = torch.randint(0, 37, (3, 11), generator=g)
        ids[0, :4] = torch.tensor([36, 32, 0, 36])       # tail rows, a repeat
        expect = table(ids)
        table.read_rows_from(lm_head)
        assert table._repacked_rows(ids) is not None, f"{qtype.name}: the repack was not read"
        assert torch.equal(table(ids), expect), f"{qtype.name} (seed {seed})"
        other = QLinear.from_weight(random_weight(qtype, 37, 2 * qtype.block_elems, generator=g))
        with pytest.raises(ValueError, match="read_rows_from: the QLinear holds other bytes"):
            table.read_rows_from(other)


def test_qlinear_runs_on_the_repack_in_the_ggml_numerics_only():
    """A ggml-numerics QLinear of a packed type keeps a repack beside its
    weight (made once, kept while the weight is the same tensor) and gives
    the op's values bit for bit (tests/ops/cpu/test_eager.py checks every
    type); exact numerics, other types and repacking off keep none."""
    from muser_torch import QLinear
    from muser_torch.formats import random_weight

    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    w = random_weight(GGMLType.Q5_0, 37, 96, generator=g)
    m = QLinear.from_weight(w)
    assert m.repacked() is None, "exact numerics"
    m.numerics = "ggml"
    rep = m.repacked()
    assert rep is not None and rep is m.repacked(), "made once"
    assert torch.equal(P.unpack(rep, GGMLType.Q5_0), m.packed)
    x = torch.randn(3, 96, generator=g)
    with torch.no_grad():
        assert torch.equal(m(x), torch.ops.muser.qmatmul_ggml(x, *w.op_args())), f"seed {seed}"
        set_repack(False)
        try:
            assert m.repacked() is None
            assert torch.equal(m(x), torch.ops.muser.qmatmul_ggml(x, *w.op_args())), f"seed {seed}"
        finally:
            set_repack(True)
    k = QLinear.from_weight(random_weight(GGMLType.Q5_K, 16, 256, generator=g))
    k.numerics = "ggml"
    assert k.repacked() is None, "Q5_K has no packed kernel yet"
    for qtype, lowest in ((GGMLType.Q4_K, 1), (GGMLType.Q6_K, 2)):
        kq = QLinear.from_weight(random_weight(qtype, 16, 256, generator=g))
        kq.numerics = "ggml"
        assert (kq.repacked() is not None) == (P.isa() >= lowest), f"{qtype.name}: from {P.ISA_NAMES[lowest]}"
