"""torch.library.opcheck for every op and type (schema, fake kernel, autograd
registration, AOT dispatch with dynamic shapes), on small shapes."""
from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

from .conftest import ALL_TYPES, Case


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_opcheck_every_op(qtype):
    case = Case(qtype, 7, blocks=1)
    x = case.randn(3, case.n_in).requires_grad_(True)
    g = case.randn(2, 1, case.n_out).requires_grad_(True)
    ids = torch.tensor([[0, 6], [3, 3]])
    for op, args in ((torch.ops.muser.qmatmul, (x, *case.args)),
                     (torch.ops.muser.qmatmul, (x.detach().half(), *case.args)),
                     (torch.ops.muser.qmatmul_ggml, (x, *case.args)),
                     (torch.ops.muser.qmatmul_t, (g, *case.args)),
                     (torch.ops.muser.dequantize, case.args),
                     (torch.ops.muser.embedding, (ids, *case.args))):
        result = opcheck(op, args)
        bad = {k: v for k, v in result.items() if v != "SUCCESS"}
        assert not bad, f"{op} {case}: {bad}"


def test_fake_shapes_and_dtypes():
    case = Case(ALL_TYPES[0], 5, blocks=16)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fx = mode.from_tensor(torch.empty(2, 3, case.n_in, dtype=torch.bfloat16))
        fp = mode.from_tensor(case.packed)
        y = torch.ops.muser.qmatmul(fx, fp, int(case.qtype), 5, case.n_in)
        assert y.shape == (2, 3, 5) and y.dtype == torch.bfloat16
        w = torch.ops.muser.dequantize(fp, int(case.qtype), 5, case.n_in)
        assert w.shape == (5, case.n_in) and w.dtype == torch.float32
        e = torch.ops.muser.embedding(mode.from_tensor(torch.zeros(4, 2, dtype=torch.long)), fp,
                                      int(case.qtype), 5, case.n_in)
        assert e.shape == (4, 2, case.n_in) and e.dtype == torch.float32
