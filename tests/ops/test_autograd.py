"""The autograd formula of qmatmul for x, against float64 finite differences
of the reference function L(x) = <v, x @ W.T>."""
from __future__ import annotations

import pytest
import torch

import muser_torch.ops as ops
from muser_torch.formats.types import GGMLType

from .conftest import Case, rel_err


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
                                   GGMLType.NVFP4_E2M1, GGMLType.Q4_0], ids=lambda t: t.name)
@pytest.mark.parametrize("tokens", [1, 3, 20])
def test_grad_x_against_finite_differences(qtype, tokens, cpu_path):
    case = Case(qtype, 37, blocks=2)
    x = case.randn(2, tokens, case.n_in).requires_grad_(True)
    v = case.randn(2, tokens, case.n_out)
    (ops.qmatmul(x, *case.args) * v).sum().backward()
    grad = x.grad.double()

    w64 = case.weight64()
    x64, v64 = x.detach().double(), v.double()

    def loss(xx):
        return float(((xx @ w64.T) * v64).sum())

    # central differences in float64 along random directions and unit vectors;
    # float32 sums of grad = v @ W err by at most a few eps of |v| @ |W| per
    # element, which bounds the error of each directional derivative
    scale = v64.abs() @ w64.abs()
    h = 1e-3
    dirs = [case.randn(*x.shape).double() for _ in range(4)]
    for i in torch.randint(0, x.numel(), (4,), generator=case.gen).tolist():
        e = torch.zeros(x.numel(), dtype=torch.float64)
        e[i] = 1.0
        dirs.append(e.view(x.shape))
    for u in dirs:
        fd = (loss(x64 + h * u) - loss(x64 - h * u)) / (2 * h)
        an = float((grad * u).sum())
        tol = 1e-5 * float((u.abs() * scale).sum())
        assert abs(fd - an) <= tol, \
            f"{case} tokens={tokens} ({cpu_path}): finite difference {fd!r}, autograd {an!r}"
    err = rel_err(grad, v64 @ w64)
    assert err < 1e-5, f"{case} tokens={tokens} ({cpu_path}): grad relative error {err:.3g}"


def test_grad_half_x_and_no_weight_grad():
    case = Case(GGMLType.Q4_K, 21, blocks=1)
    x = case.randn(4, case.n_in, dtype=torch.bfloat16).requires_grad_(True)
    scale_free = ops.qmatmul(x, *case.args)
    scale_free.float().pow(2).sum().backward()
    assert x.grad.dtype == torch.bfloat16 and x.grad.shape == x.shape
    ref = (2 * (x.detach().double() @ case.weight64().T)) @ case.weight64()
    assert rel_err(x.grad, ref) < 2e-2, f"{case}: bf16 grad off"
    assert case.packed.grad is None


def test_nvfp4_scale_2_gets_no_grad():
    case = Case(GGMLType.NVFP4_E2M1, 9, blocks=2)
    s2 = case.scale_2.clone().requires_grad_(True)
    x = case.randn(3, case.n_in).requires_grad_(True)
    ops.qmatmul(x, case.packed, int(case.qtype), case.n_out, case.n_in, case.scales, s2).sum().backward()
    assert s2.grad is None and x.grad is not None
