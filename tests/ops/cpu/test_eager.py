"""The eager CPU path of QLinear and QEmbedding (``ops/cpu/eager.py``): it
gives the op's values bit for bit, is taken for plain CPU calls, and steps
aside whenever torch's machinery must see the op."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from muser_torch import QEmbedding, QLinear
from muser_torch.ops import cpu, use_backend
from muser_torch.ops.cpu import eager

from ..conftest import NATIVE_TYPES, Case, rel_err


@pytest.fixture
def calls(monkeypatch):
    """How many calls the prepared path served (it returns None when it declines)."""
    served = []
    real = eager.Projection.__call__

    def counting(self, x):
        y = real(self, x)
        served.append(y is not None)
        return y
    monkeypatch.setattr(eager.Projection, "__call__", counting)
    return served


def _module(case: Case, numerics: str) -> QLinear:
    m = QLinear(case.packed, case.qtype, case.n_out, case.n_in, case.scales, case.scale_2)
    m.numerics = numerics
    return m


@pytest.mark.parametrize("numerics", ["exact", "ggml"])
@pytest.mark.parametrize("qtype", NATIVE_TYPES, ids=lambda t: t.name)
def test_eager_path_is_the_op_bit_for_bit(qtype, numerics, calls):
    case = Case(qtype, 37, blocks=3)
    m = _module(case, numerics)
    op = torch.ops.muser.qmatmul_ggml if numerics == "ggml" else torch.ops.muser.qmatmul
    for rows in (1, 3, cpu.FUSED_MAX_TOKENS, cpu.FUSED_MAX_TOKENS + 1, 16, 67):
        x = case.randn(rows, case.n_in)
        got = m(x)
        want = op(x, *case.args)
        assert torch.equal(got, want), f"{case} {numerics}, {rows} rows: eager path differs from the op"
        if numerics == "exact":
            err = rel_err(got, x.double() @ case.weight64().T)
            assert err < 1e-5, f"{case}, {rows} rows: relative error {err:.3g} vs float64"
    # the prepared call served every case: the fused rung's rows, and past them the op's
    # own CPU function (exact numerics) or the integer kernels (ggml numerics); only F16
    # and BF16 in the ggml numerics (they round x, then take the fused rung) leave wider
    # calls to the op
    integer = numerics == "ggml" and qtype in cpu.GGML_NUMERICS_TYPES and qtype.name not in ("F16",
                                                                                            "BF16")
    wide = numerics == "exact" or integer
    assert calls == [True] * 3 + [wide] * 3, calls


def test_it_steps_aside_for_what_must_see_the_op(calls):
    case = Case(cpu.GGMLType.Q4_K, 8, blocks=1)
    m = _module(case, "exact")
    x = case.randn(1, case.n_in)
    want = torch.ops.muser.qmatmul(x, *case.args)

    xg = x.clone().requires_grad_()
    y = m(xg)
    assert y.grad_fn is not None and torch.equal(y.detach(), want)
    with torch.no_grad():                       # no gradient to record: the prepared call
        assert torch.equal(m(xg), want)
    assert calls == [True], calls

    class Seen(TorchDispatchMode):
        ops: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))
    with Seen():
        m(x)
    assert any("muser.qmatmul" in o for o in Seen.ops), Seen.ops

    with torch.profiler.profile() as prof:      # the prepared call, recorded as the op
        assert torch.equal(m(x), want)
    assert any(e.key == "muser::qmatmul" for e in prof.key_averages())

    y = torch.vmap(m)(case.randn(2, 1, case.n_in))
    assert y.shape == (2, 1, 8)

    compiled = torch.compile(m, backend="eager", fullgraph=True)
    assert torch.equal(compiled(x), want)
    assert calls == [True, True], f"the prepared call ran under a mode, vmap or compile: {calls}"


def test_metal_emulator_takes_the_op(calls):
    pytest.importorskip("muser_torch.ops.metal")
    case = Case(cpu.GGMLType.Q4_K, 8, blocks=1)
    with use_backend("metal-emulator"):
        _module(case, "exact")(case.randn(1, case.n_in))
    assert calls == [], calls


def test_new_buffers_rebuild_the_prepared_call():
    a, b = Case(cpu.GGMLType.Q5_0, 16, blocks=2), Case(cpu.GGMLType.Q5_0, 16, blocks=2)
    m = _module(a, "exact")
    x = a.randn(1, a.n_in)
    m(x)
    m.packed = b.packed                       # a new tensor: a new data pointer
    assert torch.equal(m(x), torch.ops.muser.qmatmul(x, *b.args))
    m.numerics = "ggml"
    assert torch.equal(m(x), torch.ops.muser.qmatmul_ggml(x, *b.args))
    for clone in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert torch.equal(clone(x), m(x))
        assert clone.projection().key[0] == clone.packed.data_ptr() != m.packed.data_ptr()


def test_embedding_eager_path_checks_ids():
    case = Case(cpu.GGMLType.Q8_0, 50, blocks=2)
    e = QEmbedding(case.packed, case.qtype, case.n_out, case.n_in)
    ids = torch.tensor([[3, 49, 3]])
    assert torch.equal(e(ids), torch.ops.muser.embedding(ids, *case.args))
    with pytest.raises(ValueError, match=r"muser\.embedding: ids must lie in \[0, 50\)"):
        e(torch.tensor([50]))


def test_a_cpu_prefill_never_imports_dynamo():
    """A long prompt's prefill takes the prepared calls too, so a plain CPU run
    never goes through the dispatcher, whose first custom-op call imports
    torch._dynamo and Triton (170 MB resident on a 300-token Gemma prefill).
    In a fresh process: this one has imported them already."""
    import subprocess
    import sys
    child = ("import sys, torch, muser_torch; from muser_torch.run import DEMO; "
             "m = muser_torch.from_gguf(DEMO['q4_k_xl'], dtype=torch.float32); "
             "m.generate(torch.randint(0, 256, (67,)), 3); "
             "print(sorted(n for n in ('torch._dynamo', 'triton') if n in sys.modules))")
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]
