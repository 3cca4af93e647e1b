"""Muse Glimmer against llama.cpp itself on the same files: its own
last-position logits and greedy continuation, from ``lcpp_logits``
(built by ``tools/peers.sh``), for random files written as
its converter writes them (``muse_files.py``) and for ``make-tiny`` files.

Without the binary (tools/peers.sh, or MUSER_LCPP_LOGITS naming one) these tests skip.

llama.cpp's CPU matmuls round activations (F16 weights: to f16; K-quants: to
Q8_K), so the logits differ from ours by about 4e-3 relative with F16
weights and by several percent with K-quants (docs/muse-glimmer.md records
the numbers). The bounds below hold the worst of 120 seeds with a margin of
2.6 or more (docs/testing.md: the F16 file reached 6.3e-3, the K-quant mix 0.155,
the greedy tie ratio 0.85); a wrong weight or layer is off by order 1."""
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


def compare(path: Path, vocab: int) -> tuple[float, int, int, list[int], list[int], list[int], float]:
    """(relative difference, our argmax, llama.cpp's, llama.cpp's top 5, our greedy, its greedy,
    the tie ratio where the two greedy runs part: 0 if they never do).

    llama.cpp's logits sit up to ``delta`` (their largest difference from ours at
    the prompt's last position) from ours, so where the two greedy runs part,
    our logit for our token and for llama.cpp's may differ by about 2 * delta
    and still be the same arithmetic rounded otherwise: a near tie. The tie
    ratio is that gap in our logits, after the tokens both picked, over delta."""
    g = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, vocab, (20,), generator=g).tolist()   # past the 6-token window
    want, their_greedy = llama_cpp(path, ids)
    model = muser_torch.from_gguf(path, dtype=torch.float32)
    got = model(torch.tensor([ids]))[0, -1].double()
    ours_greedy = model.generate(torch.tensor(ids), N_GREEDY, temperature=0.0)[-N_GREEDY:].tolist()
    rel = float((got - want).norm() / want.norm())
    tie = 0.0
    parted = lcpp.first_parting(ours_greedy, their_greedy)
    if parted is not None:
        delta = float((got - want).abs().max())
        at = model(torch.tensor([ids + their_greedy[:parted]]))[0, -1].double()
        tie = float(at[ours_greedy[parted]] - at[their_greedy[parted]]) / delta
    print(f"{path.name}: relative difference {rel:.2e}, argmax {int(got.argmax())} / "
          f"{int(want.argmax())}, greedy {ours_greedy} / {their_greedy}, tie ratio {tie:.3g}")
    return (rel, int(got.argmax()), int(want.argmax()), want.topk(5).indices.tolist(),
            ours_greedy, their_greedy, tie)


def test_f16_file_agrees_with_llama_cpp(tmp_path):
    lib()
    path, _ = write_muse_gguf(tmp_path / "f16.gguf", seed=SEED, types=("F16",))
    rel, _, _, _, ours_g, their_g, tie = compare(path, 320)
    check_bound("logits: rel difference to llama.cpp", rel, 2e-2, f"(seed {SEED})")
    # The greedy runs may part only at a near tie (compare's docstring): a gap of
    # 2 * delta, twice that since delta is measured at another position.
    check_bound("greedy: our logit gap where the runs part, over the logits' largest difference", tie, 4.0,
                f"ours {ours_g}, llama.cpp's {their_g} (seed {SEED})")


@pytest.mark.parametrize("types", [("Q4_K", "Q5_K", "Q6_K"), ("Q8_0", "Q4_0", "Q5_1", "BF16")])
def test_quantized_file_agrees_with_llama_cpp(tmp_path, types):
    lib()
    path, _ = write_muse_gguf(tmp_path / "q.gguf", seed=SEED, types=types)
    rel, ours, _, top5, ours_g, their_g, _ = compare(path, 320)
    check_bound("logits: rel difference to llama.cpp", rel, 0.4, f"{types} (seed {SEED})")
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
    rel, ours, _, top5, _, _, _ = compare(path, 320)
    check_bound("logits: rel difference to llama.cpp", rel, 0.3, f"(seed {SEED})")
    assert ours in top5, f"our top token {ours} is not in llama.cpp's top 5 {top5} (seed {SEED})"
