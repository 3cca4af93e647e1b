"""QLinear and QEmbedding: forward against the float64 reference, buffers and
state_dict, device/dtype moves, construction paths, and torch.compile."""
from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from muser_torch import QEmbedding, QLinear
from muser_torch.formats import dequantize_reference as ref_dequantize
from muser_torch.formats.types import GGMLType

from .conftest import Case, rel_err


def qlinear(case: Case, bias: torch.Tensor | None = None) -> QLinear:
    return QLinear(case.packed, case.qtype, case.n_out, case.n_in, case.scales, case.scale_2,
                   bias=bias)


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.NVFP4_E2M1],
                         ids=lambda t: t.name)
def test_qlinear_forward(qtype):
    case = Case(qtype, 19, blocks=2)
    bias = case.randn(19)
    m = qlinear(case, bias)
    x = case.randn(2, 5, case.n_in)
    ref = x.double() @ case.weight64().T + bias.double()
    err = rel_err(m(x), ref)
    assert err < 1e-5, f"{case}: relative error {err:.3g}"
    assert m(x.half()).dtype == torch.float16
    assert torch.equal(m.dequantize().double(), case.weight64())


def test_buffers_repr_and_state_dict_round_trip():
    case = Case(GGMLType.NVFP4_E2M1, 11, blocks=4)
    m = qlinear(case)
    sd = m.state_dict()
    assert set(sd) == {"packed", "scales", "scale_2", "_extra_state"}, sorted(sd)
    assert sd["_extra_state"] == {"qtype": "NVFP4_E2M1", "n_out": 11, "n_in": 64}
    r = repr(m)
    assert "NVFP4_E2M1" in r and "in_features=64" in r and "out_features=11" in r, r

    other = Case(GGMLType.NVFP4_E2M1, 11, blocks=4)
    m2 = qlinear(other)
    m2.load_state_dict(sd)
    x = case.randn(3, 64)
    assert torch.equal(m2(x), m(x)), f"{case}: state_dict round trip changed the output"
    assert (m2.qtype, m2.n_out, m2.n_in) == (GGMLType.NVFP4_E2M1, 11, 64)


def test_state_dict_mismatch_raises():
    case = Case(GGMLType.Q4_K, 4, blocks=1)
    sd = qlinear(case).state_dict()
    sd["_extra_state"] = {"qtype": "Q6_K", "n_out": 4, "n_in": 256}
    with pytest.raises(ValueError, match=r"QLinear\.load_state_dict: packed: a Q6_K row"):
        qlinear(Case(GGMLType.Q4_K, 4, blocks=1)).load_state_dict(sd)


def test_to_moves_bytes_and_keeps_dtypes():
    case = Case(GGMLType.NVFP4_E2M1, 5, blocks=2)
    m = qlinear(case).half()
    assert m.packed.dtype == torch.uint8 and m.scales.dtype == torch.uint8
    assert m.scale_2.dtype == torch.float32 and torch.equal(m.scale_2, case.scale_2)
    m = m.to("meta")
    assert m.packed.device.type == "meta" and m.scales.device.type == "meta"
    assert m.scale_2.device.type == "meta" and m.scale_2.dtype == torch.float32
    e = QEmbedding(*Case(GGMLType.Q4_K, 5, blocks=1).args[:4]).to("meta")
    assert e.packed.device.type == "meta"


def test_constructor_checks():
    case = Case(GGMLType.Q4_K, 4, blocks=1)
    with pytest.raises(ValueError, match=r"QLinear: packed: expected 5 rows, got 4"):
        QLinear(case.packed, "Q4_K", 5, 256)
    with pytest.raises(ValueError, match=r"QLinear: bias must be a tensor of shape \(4,\)"):
        QLinear(case.packed, "Q4_K", 4, 256, bias=torch.zeros(3))


@pytest.mark.parametrize("qtype", ["F16", "Q8_0", "Q4_K", "Q6_K", "NVFP4_E2M1"])
def test_from_linear(qtype):
    qtype = GGMLType.parse(qtype)
    case = Case(qtype, 9, blocks=1)
    lin = nn.Linear(256, 9, bias=True)
    with torch.no_grad():
        lin.weight.copy_(case.randn(9, 256) * 0.1)
        lin.bias.copy_(case.randn(9))
    m = QLinear.from_linear(lin, qtype)
    assert (m.qtype, m.n_out, m.n_in) == (qtype, 9, 256)
    w = ref_dequantize(m.packed, qtype, 256, scales=m.scales,
                       scale_2=m.scale_2).double()         # what was stored, exactly
    x = case.randn(4, 256)
    err = rel_err(m(x), x.double() @ w.T + lin.bias.detach().double())
    assert err < 1e-5, f"{case}: relative error {err:.3g}"
    # and the stored weight is the linear's weight to the format's precision
    werr = rel_err(w, lin.weight.detach().double())
    bound = {GGMLType.F16: 1e-3, GGMLType.Q8_0: 1e-2, GGMLType.NVFP4_E2M1: 0.2}.get(qtype, 0.1)
    assert werr < bound, f"{case}: weight relative error {werr:.3g}"


def test_from_gguf_record():
    case = Case(GGMLType.Q5_K, 6, blocks=1)
    rec = types.SimpleNamespace(name="blk.0.attn_q.weight", qtype=case.qtype, n_out=6, n_in=256,
                                packed=case.packed)
    m = QLinear.from_gguf(rec)
    x = case.randn(2, 256)
    assert rel_err(m(x), x.double() @ case.weight64().T) < 1e-5, str(case)
    e = QEmbedding.from_gguf(rec, dtype=torch.bfloat16)
    assert e(torch.tensor([5])).dtype == torch.bfloat16


def test_from_gguf_file(tmp_path):
    from muser_torch import load_gguf, save_gguf
    case = Case(GGMLType.Q4_K, 7, blocks=2)
    nv = Case(GGMLType.NVFP4_E2M1, 7, blocks=4)
    path = tmp_path / "t.gguf"
    save_gguf(path, {"general.architecture": "test"},
              {"w": (case.qtype, case.packed), "v.weight": (nv.qtype, nv.packed),
               "v.weight_scale": (GGMLType.F8_E4M3FN, nv.scales.view(torch.float8_e4m3fn)),
               "v.weight_scale_2": (GGMLType.F32, nv.scale_2)})
    f = load_gguf(path)
    m = QLinear.from_gguf(f["w"])
    x = case.randn(3, case.n_in)
    assert rel_err(m(x), x.double() @ case.weight64().T) < 1e-5, str(case)
    try:
        scales, scale_2 = f.companions("v.weight")
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"GGUFFile.companions failed: {e!r}")
    mv = QLinear.from_gguf(f["v.weight"], scales, scale_2)
    xv = nv.randn(3, nv.n_in)
    assert rel_err(mv(xv), xv.double() @ nv.weight64().T) < 1e-5, str(nv)


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.NVFP4_E2M1], ids=lambda t: t.name)
def test_qembedding(qtype):
    case = Case(qtype, 23, blocks=2)
    e = QEmbedding(*case.args[:4], case.scales, case.scale_2, dtype=torch.float16)
    ids = torch.randint(0, 23, (2, 7), generator=case.gen)
    out = e(ids)
    assert out.dtype == torch.float16 and out.shape == (2, 7, case.n_in)
    assert torch.equal(out, case.weight64()[ids].half()), str(case)
    assert f"{qtype.name}, num_embeddings=23, embedding_dim={case.n_in}" in repr(e), repr(e)


class _MLP(nn.Module):
    def __init__(self, a: Case, b: Case):
        super().__init__()
        self.up, self.down = qlinear(a, a.randn(a.n_out)), qlinear(b)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.up(x)))


def _mlp_cases():
    a = Case(GGMLType.Q4_K, 64, blocks=1)            # 256 -> 64
    b = Case(GGMLType.NVFP4_E2M1, 256, blocks=4)     # 64 -> 256
    return a, b


def test_compile_fullgraph_mlp_matches_eager():
    torch._dynamo.reset()
    a, b = _mlp_cases()
    model = _MLP(a, b)
    compiled = torch.compile(model, fullgraph=True)
    for tokens in (1, 5):
        x = a.randn(tokens, 256)
        y, ref = compiled(x), model(x)
        assert torch.allclose(y, ref, rtol=1e-5, atol=1e-6), \
            f"{a}, {b}: compiled differs by {(y - ref).abs().max():.3g}"


def test_compile_fullgraph_backward_trains_adapter():
    """A LoRA-style adapter on a frozen packed layer: gradients flow through
    the compiled graph to the adapter and to x, none to the packed bytes."""
    torch._dynamo.reset()
    a, b = _mlp_cases()
    model = _MLP(a, b)
    lora = nn.Linear(256, 64, bias=False)

    def f(x):
        return model.down(torch.nn.functional.silu(model.up(x) + lora(x)))

    x = a.randn(3, 256).requires_grad_(True)
    eager = f(x).square().sum()
    gx, gl = torch.autograd.grad(eager, (x, lora.weight))
    xc = x.detach().clone().requires_grad_(True)
    out = torch.compile(f, fullgraph=True, backend="aot_eager")(xc).square().sum()
    gxc, glc = torch.autograd.grad(out, (xc, lora.weight))
    assert torch.allclose(gxc, gx, rtol=1e-5, atol=1e-6)
    assert torch.allclose(glc, gl, rtol=1e-5, atol=1e-6)
