"""Muse Glimmer against llama.cpp itself on the same files: its own
last-position logits and greedy continuation, from ``lcpp_logits``
(built by ``tools/peers.sh``), for random files written as
its converter writes them (``muse_files.py``) and for ``make-tiny`` files.

Without the binary (tools/peers.sh, or MUSER_LCPP_LOGITS naming one) these tests skip.

llama.cpp's CPU matmuls round activations (F16 weights: to f16; K-quants: to
Q8_K), so the logits differ from ours by about 4e-3 relative with F16
weights and by several percent with K-quants (docs/muse-glimmer.md records
the numbers); the bounds below are a few times those."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

import muser_torch

from .. import lcpp
from ..formats.ggml_ref import lib
from .conftest import SEED
from .muse_files import write_muse_gguf
from ..bounds import check_bound

pytestmark = pytest.mark.skipif(not lcpp.available, reason=lcpp.SKIP_REASON)
N_GREEDY = 8


def llama_cpp(path: Path, ids: list[int]) -> tuple[torch.Tensor, list[int]]:
    return lcpp.llama_cpp_logits(path, ids, N_GREEDY)


def compare(path: Path, vocab: int) -> tuple[float, int, int, list[int], list[int], list[int]]:
    """(relative difference, our argmax, llama.cpp's, llama.cpp's top 5, our greedy, its greedy)."""
    g = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, vocab, (20,), generator=g).tolist()   # past the 6-token window
    want, their_greedy = llama_cpp(path, ids)
    model = muser_torch.from_gguf(path, dtype=torch.float32)
    got = model(torch.tensor([ids]))[0, -1].double()
    ours_greedy = model.generate(torch.tensor(ids), N_GREEDY, temperature=0.0)[-N_GREEDY:].tolist()
    rel = float((got - want).norm() / want.norm())
    print(f"{path.name}: relative difference {rel:.2e}, argmax {int(got.argmax())} / "
          f"{int(want.argmax())}, greedy {ours_greedy} / {their_greedy}")
    return (rel, int(got.argmax()), int(want.argmax()), want.topk(5).indices.tolist(),
            ours_greedy, their_greedy)


def test_f16_file_agrees_with_llama_cpp(tmp_path):
    lib()
    path, _ = write_muse_gguf(tmp_path / "f16.gguf", seed=SEED, types=("F16",))
    rel, ours, theirs, _, ours_g, their_g = compare(path, 320)
    check_bound("logits: rel difference to llama.cpp", rel, 1.5e-2, f"relative difference {rel:.2e} (seed {SEED})")
    assert ours == theirs and ours_g == their_g, f"seed {SEED}"


@pytest.mark.parametrize("types", [("Q4_K", "Q5_K", "Q6_K"), ("Q8_0", "Q4_0", "Q5_1", "BF16")])
def test_quantized_file_agrees_with_llama_cpp(tmp_path, types):
    lib()
    path, _ = write_muse_gguf(tmp_path / "q.gguf", seed=SEED, types=types)
    rel, ours, _, top5, ours_g, their_g = compare(path, 320)
    check_bound("logits: rel difference to llama.cpp", rel, 0.3, f"{types}: relative difference {rel:.2e} (seed {SEED})")
    assert ours in top5 and ours_g[0] in top5, f"{types}: seed {SEED}"


@pytest.mark.parametrize("lane", ["q4_k_xl", "nvfp4"])
def test_make_tiny_file_runs_in_llama_cpp(tmp_path, lane):
    """make-tiny's files (pattern array, "none" tokenizer) load in llama.cpp;
    the kquant lane agrees with it (llama.cpp has no NVFP4_E2M1: it refuses
    the other lane's file, which is the Muser-native format)."""
    from muser_torch.cli import main as cli
    path = tmp_path / f"tiny-{lane}.gguf"
    assert cli(["make-tiny", str(path), "--layers", "5", "--vocab", "320", "--window", "6",
                "--lane", lane, "--seed", str(SEED)]) == 0
    if lane == "nvfp4":
        with pytest.raises(subprocess.CalledProcessError):
            llama_cpp(path, [1, 2, 3])
        return
    rel, ours, _, top5, _, _ = compare(path, 320)
    check_bound("logits: rel difference to llama.cpp", rel, 0.3, f"(seed {SEED})")
    assert ours in top5, f"our top token {ours} is not in llama.cpp's top 5 {top5} (seed {SEED})"
