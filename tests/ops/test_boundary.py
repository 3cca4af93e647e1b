"""Every backend's kernels run the op boundary's checks (``ops/checks.py``):
the CPU default implementations, and the CUDA and Metal kernels, which all
register through ``checks.checked`` / ``checks.register_kernels``.

No GPU is here, so the CUDA and Metal registrations are exercised by
recording what their ``register`` hands to ``torch.library.register_kernel``
(CUDA's module needs Triton: without it, its source is read instead, and the
helper it calls is driven with recording kernels)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from muser_torch.formats.types import GGMLType
from muser_torch.ops import checks

from .conftest import Case

OPS_DIR = Path(checks.__file__).resolve().parent
PACKAGE = OPS_DIR.parent


def _weight():
    return Case(GGMLType.Q4_K, 6, blocks=1)


def _good(op: str, w: Case) -> tuple:
    """Valid arguments of ``muser.<op>`` in schema order (fresh random data)."""
    lead = {"qmatmul": torch.randn(3, w.n_in, generator=w.gen),
            "qmatmul_ggml": torch.randn(3, w.n_in, generator=w.gen),
            "qmatmul_t": torch.randn(3, w.n_out, generator=w.gen),
            "embedding": torch.randint(0, w.n_out, (4,), generator=w.gen),
            "dequantize": None}[op]
    weight = (w.packed, int(w.qtype), w.n_out, w.n_in, None, None)
    return weight if lead is None else (lead, *weight)


def _bad_calls(op: str, w: Case):
    """(what is wrong, the message it must raise, arguments) for ``muser.<op>``."""
    args = list(_good(op, w))
    k = 0 if op == "dequantize" else 1          # where the weight starts
    bad = []
    for i, value, match in ((k + 1, 99, "qtype: unknown GGML type id 99"),
                            (k, w.packed.view(torch.int8), "packed must be uint8 bytes"),
                            (k + 2, w.n_out + 1, f"expected {w.n_out + 1} rows"),
                            (k + 4, torch.zeros(w.n_out, w.n_in // 16, dtype=torch.uint8),
                             "Q4_K takes no scales/scale_2 companions")):
        a = list(args)
        a[i] = value
        bad.append((match, a))
    if op in ("qmatmul", "qmatmul_ggml", "qmatmul_t"):
        bad.append(("must be float32, float16 or bfloat16", [args[0].double(), *args[1:]]))
    if op == "embedding":
        bad.append(("ids must be an integer tensor", [args[0].float(), *args[1:]]))
    return bad


class _Recorder:
    """A backend function that records being called (it must not be, on bad input)."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)
        return "ran"


def _recorded_registrations(monkeypatch) -> dict:
    """Make ``torch.library.register_kernel`` record instead of register."""
    seen = {}
    monkeypatch.setattr(torch.library, "register_kernel",
                        lambda name, device, fn: seen.__setitem__((name, device), fn))
    monkeypatch.setattr(checks, "KERNELS", {})
    return seen


def _assert_refuses(kernel, op: str, w: Case) -> None:
    for match, args in _bad_calls(op, w):
        with pytest.raises(ValueError, match=rf"^muser\.{op}: .*{match}"):
            kernel(*args)


@pytest.mark.parametrize("op", sorted(checks.OPS))
def test_default_kernels_refuse_bad_arguments(op):
    w = _weight()
    assert (op, "default") in checks.KERNELS, f"muser.{op} has no default kernel"
    _assert_refuses(checks.KERNELS[(op, "default")], op, w)
    _assert_refuses(getattr(torch.ops.muser, op), op, w)       # the dispatcher reaches it


def test_every_registered_kernel_refuses_bad_arguments():
    """Whatever this machine registered (the defaults; cuda/mps where present)."""
    w = _weight()
    assert checks.KERNELS
    for (op, _where), kernel in checks.KERNELS.items():
        _assert_refuses(kernel, op, w)


@pytest.mark.parametrize("op", sorted(checks.OPS))
def test_register_kernels_checks_before_the_backend_runs(op, monkeypatch):
    """The helper CUDA and Metal register through: bad arguments never reach
    the backend's function; good ones do, unchanged."""
    seen = _recorded_registrations(monkeypatch)
    backend_fn = _Recorder()
    w = _weight()
    out = checks.register_kernels("cuda", {op: backend_fn}, frozenset({w.qtype}))
    assert seen == {(f"muser::{op}", "cuda"): out[op]}
    assert checks.KERNELS == {(op, "cuda"): out[op]}
    _assert_refuses(out[op], op, w)
    assert backend_fn.calls == []
    good = _good(op, w)
    assert out[op](*good) == "ran"
    assert len(backend_fn.calls) == 1 and all(a is b for a, b in zip(backend_fn.calls[0], good))


def test_companions_reach_the_backend_in_one_form(monkeypatch):
    """float8 scales and a 0-d float64 scale_2 arrive as uint8 and float32 [1]."""
    w = Case(GGMLType.NVFP4_E2M1, 4, blocks=2)
    backend_fn = _Recorder()
    kernel = checks.checked("dequantize", backend_fn)
    scale_2 = w.scale_2.double().reshape(())
    kernel(w.packed, int(w.qtype), w.n_out, w.n_in, w.scales.view(torch.float8_e4m3fn), scale_2)
    (_, _, _, _, scales, s2), = backend_fn.calls
    assert scales.dtype == torch.uint8 and torch.equal(scales, w.scales)
    assert s2.dtype == torch.float32 and s2.shape == (1,) and float(s2) == float(scale_2.float())
    with pytest.raises(ValueError, match=r"muser\.dequantize: NVFP4_E2M1 needs both companions"):
        kernel(w.packed, int(w.qtype), w.n_out, w.n_in, w.scales, None)
    assert len(backend_fn.calls) == 1


@pytest.mark.parametrize("op", sorted(checks.OPS))
def test_register_kernels_refuses_types_outside_the_backend(op, monkeypatch):
    """A type the backend did not declare is refused once, at the boundary, by
    name: the backend's function never sees it."""
    _recorded_registrations(monkeypatch)
    backend_fn = _Recorder()
    w = _weight()
    others = frozenset(t for t in (GGMLType.Q8_0, GGMLType.Q6_K) if t != w.qtype)
    out = checks.register_kernels("mps", {op: backend_fn}, others)
    with pytest.raises(ValueError, match=f"{w.qtype.name} has no Metal kernel"):
        out[op](*_good(op, w))
    assert backend_fn.calls == []


@pytest.mark.parametrize("folder, device", [("metal", "mps"), ("cuda", "cuda")])
def test_backend_registers_checked_kernels(folder, device, monkeypatch):
    """The backend's own ``register`` (ops/cuda needs Triton: skipped without)."""
    backend = pytest.importorskip(f"muser_torch.ops.{folder}", exc_type=ImportError)
    seen = _recorded_registrations(monkeypatch)
    monkeypatch.setattr(backend, "_registered", False, raising=False)   # cuda's is idempotent
    backend.register()
    expected = {"muser::qmatmul", "muser::dequantize", "muser::embedding"}
    if folder == "cuda":   # the layer ops' kernels (ops/layer.py) too
        expected |= {f"muser::{op}" for op in checks.LAYER_OPS}
    assert {name for name, d in seen if d == device} == expected
    w = _weight()
    for (name, _), kernel in seen.items():
        op = name.split("::")[1]
        if op in checks.LAYER_OPS:
            with pytest.raises(ValueError, match=rf"^muser\.{op}: "):
                kernel(*_bad_layer_call(op))
            continue
        assert kernel.unchecked is getattr(backend, op)
        _assert_refuses(kernel, op, w)


def _bad_layer_call(op: str) -> tuple:
    """Arguments the layer op's check refuses (an integer tensor where a float one goes,
    or shapes that disagree); the kernel behind it must never see them."""
    i, f = torch.ones(1, 1, 1, 4, dtype=torch.int32), torch.ones(1, 1, 1, 4)
    cs = torch.ones(1, 1, 1, 2)
    return {"rms_norm": (i, torch.ones(4), 1e-6),
            "add_rms_norm": (f, i, None, 0.0, None, 1e-6),
            "norm_rope": (i, None, 0.0, cs, cs, 1),
            "decode_attention": (i, f, f, torch.ones(1, 1, 1, 1, dtype=torch.bool), 1.0, None),
            "kv_store": (f, f, torch.zeros(1, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long),
                         torch.ones(1, 1, 1, 3), torch.ones(1, 1, 1, 3)),
            "decode_mask": (torch.ones(2), 8, 0),
            "gated_act": (i, i, 0)}[op]


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and getattr(n.func, "attr", getattr(n.func, "id", None)) == name]


def test_no_backend_registers_around_the_helper():
    """Only ops/checks.py calls torch.library.register_kernel, and only
    ops/__init__.py defines ops (its defaults through ``checks.checked``);
    CUDA and Metal register every op they implement through register_kernels."""
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        rel = path.relative_to(PACKAGE).as_posix()
        for name, allowed in (("register_kernel", ("ops/checks.py",)),
                              ("custom_op", ("ops/__init__.py", "ops/layer.py")), ("impl", ())):
            if _calls(tree, name) and rel not in allowed:
                raise AssertionError(f"{rel} calls {name}: register kernels through "
                                     f"ops.checks.register_kernels")
    for backend in ("cuda", "metal"):
        tree = ast.parse((OPS_DIR / backend / "__init__.py").read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)} & set(checks.OPS)
        registered = set()
        for call in _calls(tree, "register_kernels"):
            registered |= {k.value for k in call.args[1].keys}
        assert defined and registered == defined, (backend, defined, registered)
