"""A CPU token's walk (docs/architecture.md, "A token's walk"): during one
decode step of ``generate``, no stack of this package's Python calls is more
than ``MAX_CALLS`` deep, and none enters a module it has left (a call from
``b`` back into ``a`` under ``a -> b``).

The calls are traced with ``sys.setprofile``: every Python frame whose code
lies in ``muser_torch/`` counts, comprehensions and generator resumptions
included; torch's frames (``torch.nn.Module.__call__``, the dispatcher) do not."""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
import torch

import muser_torch

from .conftest import SEED
from .family_files import hf_file  # noqa: F401  (fixture)

MAX_CALLS = 10
PACKAGE = str(Path(muser_torch.__file__).parent) + "/"
DEMO = Path(__file__).resolve().parents[2] / "demo" / "glimmer-demo-q4_k_xl.gguf"

Stack = tuple[tuple[str, str], ...]   # (file under muser_torch/, function) from the outermost


def decode_step_stacks(model, prompt: torch.Tensor) -> set[Stack]:
    """Every stack of package calls seen during the first one-token
    ``Decoder.forward`` of ``model.generate(prompt, 2)``."""
    model.generate(prompt, 2)   # built once: the native plan, the prepared projections
    stack: list = []
    seen: set[Stack] = set()
    step = {"frame": None, "done": False}

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            code = frame.f_code
            if (step["frame"] is None and not step["done"] and code.co_qualname == "Decoder.forward"
                    and frame.f_locals["tokens"].shape[1] == 1):
                step["frame"] = frame
            stack.append(frame)
            if step["frame"] is not None:
                seen.add(tuple((f.f_code.co_filename[len(PACKAGE):], f.f_code.co_qualname)
                               for f in stack))
        elif event == "return" and stack and stack[-1] is frame:
            stack.pop()
            if frame is step["frame"]:
                step["frame"], step["done"] = None, True

    sys.setprofile(profile)
    try:
        model.generate(prompt, 2)   # the prefill, then one decode step
    finally:
        sys.setprofile(None)
    assert step["done"], "no one-token step ran"
    return seen


def doubles_back(stack: Stack) -> bool:
    """Whether the stack enters a module it has left."""
    modules = [m for m, _ in itertools.groupby(m for m, _ in stack)]
    return len(modules) != len(set(modules))


def _show(stack: Stack) -> str:
    return " -> ".join(f"{m}:{f}" for m, f in stack)


def _check(stacks: set[Stack]) -> None:
    deepest = max(stacks, key=len)
    assert len(deepest) <= MAX_CALLS, f"{len(deepest)} calls: {_show(deepest)}"
    back = [s for s in stacks if doubles_back(s)]
    assert not back, "enters a module it left: " + _show(back[0])


def _prompt() -> torch.Tensor:
    return torch.randint(0, 200, (5,), generator=torch.Generator().manual_seed(SEED))


def _model(which: str, hf_file):  # noqa: F811
    path = DEMO if which == "demo" else hf_file("llama")
    return muser_torch.from_gguf(path)


@pytest.mark.parametrize("which", ["demo", "llama"])
def test_a_decode_step_runs_the_native_blocks_within_the_walk(which, hf_file):  # noqa: F811
    model = _model(which, hf_file)
    assert model.activation_dtype == torch.float32            # from_gguf's CPU default
    stacks = decode_step_stacks(model, _prompt())
    _check(stacks)
    # the layers ran as decode.c blocks, straight from Decoder.forward
    assert ("ops/cpu/step.py", "CpuLayers.__call__") in {s[-1] for s in stacks}
    assert not any(f == "Attention.forward" for s in stacks for _, f in s)


@pytest.mark.parametrize("which", ["demo", "llama"])
def test_a_decode_step_through_the_modules_stays_within_the_walk(which, hf_file):  # noqa: F811
    """A forward hook on a layer keeps the step on the torch modules, whose
    projections take the prepared call (``ops/cpu/eager.py``)."""
    model = _model(which, hf_file)
    model.layers[0].register_forward_hook(lambda module, args, out: None)
    stacks = decode_step_stacks(model, _prompt())
    _check(stacks)
    walk = [s for s in stacks if s[-1] == ("ops/cpu/eager.py", "Projection.__call__")
            and any(f == "Attention.forward" for _, f in s)]
    assert walk and len(max(walk, key=len)) == 8, _show(max(walk, key=len)) if walk else stacks


def test_a_decode_step_through_the_dispatcher_reaches_its_kernel_within_the_walk(hf_file):  # noqa: F811
    """bfloat16 activations: the prepared call steps aside and the projections
    take ``muser::qmatmul`` through the dispatcher to the CPU ladder. The
    walk to the kernel is at most ``MAX_CALLS`` (the argument checks below
    the boundary's kernel nest deeper and return first); no stack doubles back."""
    model = muser_torch.from_gguf(hf_file("llama"), dtype=torch.bfloat16)
    stacks = decode_step_stacks(model, _prompt())
    back = [s for s in stacks if doubles_back(s)]
    assert not back, "enters a module it left: " + _show(back[0])
    walks = [s for s in stacks if s[-1] == ("ops/cpu/__init__.py", "_fused")
             and any(f == "Attention.forward" for _, f in s)]
    assert walks, "no projection reached the CPU ladder's fused kernel"
    longest = max(walks, key=len)
    assert len(longest) <= MAX_CALLS, f"{len(longest)} calls: {_show(longest)}"
    assert ("ops/checks.py", "checked.<locals>.kernel") in longest


def test_the_check_sees_a_walk_that_doubles_back_or_runs_long():
    back = (("models/decoder.py", "Decoder.forward"), ("models/glimmer.py", "Glimmer.embed"),
            ("models/decoder.py", "Decoder.activation_dtype"))
    assert doubles_back(back) and not doubles_back(back[:2])
    assert not doubles_back((("ops/cpu/__init__.py", "embedding"), ("ops/cpu/__init__.py", "_ptr")))
    with pytest.raises(AssertionError, match="enters a module it left"):
        _check({back})
    with pytest.raises(AssertionError, match=f"{MAX_CALLS + 1} calls"):
        _check({tuple((f"m{i}.py", "f") for i in range(MAX_CALLS + 1))})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_decode_step_is_one_graph_launch():
    """On CUDA the same generate runs the prefill through ``Decoder.forward``
    and every later step as a replay of the engine's recording: no step
    enters the modules."""
    model = muser_torch.from_gguf(DEMO, device="cuda")
    prompt, n = _prompt().cuda(), 12
    model.generate(prompt, n, stop=[])   # the bucket's first step eagerly, its second recorded
    calls: list[str] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            calls.append(f"{frame.f_code.co_filename[len(PACKAGE):]}:{frame.f_code.co_qualname}")

    sys.setprofile(profile)
    try:
        model.generate(prompt, n, stop=[])
    finally:
        sys.setprofile(None)
    assert calls.count("models/decoder.py:Decoder.forward") == 1, "only the prefill"
    assert calls.count("ops/cuda/graphs.py:capture.<locals>.replay") == n - 1
