"""The ``ggml`` numerics (``muser.qmatmul_ggml``) against ggml's own
``mul_mat`` on the same bytes (libggml-python), on every build this machine
can run: -march=native (AVX-512 VNNI here), haswell (AVX2, no AVX-512) and
x86-64 (plain C). Bound: max |ours - ggml| <= 1e-6 * max |ggml| per call."""
from __future__ import annotations

import pytest
import torch

from muser_torch import ops
from muser_torch.formats.types import GGMLType
from muser_torch.ops import cpu

from ..conftest import OTHER_MARCHES, Case, native_build_for, x86_only
from ..ggml_matmul import ggml_mul_mat, lib

GGML_TYPES = sorted(cpu.GGML_NUMERICS_TYPES)
BOUND = 1e-6
TOKENS = (1, 2, 5, 8, 9, 33)


def _x(case: Case, tokens: int) -> torch.Tensor:
    """Fresh activations, each row at its own scale; row 0 also holds a zero
    block (amax = 0) and, when there is a second row, row 1 is built of exact
    rounding ties (x * 127 / amax = k + 0.5) that ggml rounds half to even."""
    x = case.randn(tokens, case.n_in) * torch.exp(case.randn(tokens, 1))
    x[0, :case.qtype.block_elems] = 0.0
    if tokens > 1:
        ties = (torch.arange(case.n_in) % 40 - 20).float() + 0.5
        ties[::case.qtype.block_elems] = 127.0               # amax 127: id = 1, iscale = -1
        x[1] = ties
    return x


def _check_all_types(label: str) -> None:
    for qtype in GGML_TYPES:
        blocks = 3 if qtype.block_elems >= 256 else 5 * max(1, 32 // qtype.block_elems)
        case = Case(qtype, 37, blocks=blocks)
        for tokens in TOKENS:
            x = _x(case, tokens)
            ref = ggml_mul_mat(case.packed, qtype, case.n_out, case.n_in, x)
            y = ops.qmatmul_ggml(x, *case.args)
            err = float((y - ref).abs().max() / ref.abs().max())
            assert err <= BOUND, f"{label} {case} tokens={tokens}: {err:.3g} of max |ggml|"


def test_matches_ggml_mul_mat():
    lib()
    assert cpu.native_available()
    _check_all_types("native")


@x86_only
@pytest.mark.parametrize("march, needs", OTHER_MARCHES)
def test_other_instruction_sets_match_ggml(march, needs, monkeypatch):
    """The AVX2 (maddubs) and plain-C integer dots, rebuilt on this machine."""
    lib()
    with native_build_for(march, needs, monkeypatch):
        _check_all_types(f"-march={march}")


def test_ggml_mode_is_not_exact_mode():
    """The two modes differ by the activations' 8-bit rounding (so the test
    above cannot pass by computing the exact product)."""
    case = Case(GGMLType.Q4_K, 64, blocks=2)
    x = case.randn(2, case.n_in)
    exact, ggml = ops.qmatmul(x, *case.args), ops.qmatmul_ggml(x, *case.args)
    assert float((exact - ggml).abs().max() / exact.abs().max()) > 1e-4, str(case)


def test_types_without_a_ggml_mode_compute_exactly():
    for qtype in (GGMLType.F32, GGMLType.NVFP4_E2M1):
        case = Case(qtype, 16, blocks=2)
        x = case.randn(3, case.n_in)
        assert torch.equal(ops.qmatmul_ggml(x, *case.args), ops.qmatmul(x, *case.args)), str(case)


def test_without_the_native_library_it_says_so():
    case = Case(GGMLType.Q4_K, 8, blocks=1)
    with cpu.use_native(False), pytest.raises(RuntimeError, match="native CPU library"):
        ops.qmatmul_ggml(case.randn(1, case.n_in), *case.args)


def test_bad_arguments_are_refused_like_qmatmul():
    case = Case(GGMLType.Q8_0, 8, blocks=2)
    with pytest.raises(ValueError, match="qmatmul_ggml"):
        ops.qmatmul_ggml(case.randn(1, case.n_in + 1), *case.args)
