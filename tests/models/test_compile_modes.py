"""torch.compile of the decode step matches eager: every mode's logits within
the numerics contract (float32 on CPU: 1e-5 relative), no graph break, no
recompile across decode positions (``bench compile`` prints the same numbers).

The default suite compiles the bundled demo in ``default`` mode only (Inductor's
C++ backend takes tens of seconds per mode on a small machine); MUSER_SLOW_TESTS=1
adds reduce-overhead, max-autotune-no-cudagraphs and max-autotune.
"""
from __future__ import annotations

import pytest
import torch

from muser_torch.bench.compile import MODES, run_mode
from muser_torch.models import from_gguf
from muser_torch.run import DEMO

from .. import slow
from ..random_seed import fresh_seed

SELECTED = [mode if mode == "default" else slow.param(mode) for mode in MODES]


@pytest.fixture(scope="module")
def demo():
    return from_gguf(DEMO["q4_k_xl"])


@pytest.mark.parametrize("mode", SELECTED)
def test_compiled_decode_matches_eager(demo, mode):
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, demo.config.vocab_size, (1, 7), generator=gen)
    r = run_mode(demo, mode, prompt, decode=2, device=torch.device("cpu"))
    assert r["graph_breaks"] == 0, r["break_reasons"]
    assert r["recompiles_positions"] == 0, r
    assert r["logits_rel_diff"] < 1e-5, f"seed={seed} {r}"


@pytest.mark.parametrize("argv, message", [
    (["--prompt-len", "0"], "--prompt-len must be >= 1"),
    (["--decode", "0"], "--decode must be >= 1"),
    (["--backend", "metal-emulator", "--device", "cuda"], "metal-emulator runs on --device cpu"),
])
def test_bench_compile_refuses_bad_arguments(argv, message, capsys):
    from muser_torch.cli import main as cli
    assert cli(["bench", "compile", *argv]) == 2
    assert message in capsys.readouterr().err
