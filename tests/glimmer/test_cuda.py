"""Muse Glimmer on CUDA gives the CPU's numbers: both lanes, float32 activations
(the Triton float rungs, held to the 1e-5 contract like the CPU kernels), the
full forward and a cached greedy continuation past the window. Skips without a
GPU (run on the H200 of docs/muse-glimmer.md)."""
from __future__ import annotations

import pytest
import torch

import muser_torch

from .conftest import LANES, SEED, TINY, rel_err

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("lane", LANES)
def test_cuda_matches_cpu(tiny_files, lane):
    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, TINY.vocab_size, (2, 3 * TINY.sliding_window), generator=gen)
    logits, greedy = {}, {}
    for device in ("cpu", "cuda"):
        model = muser_torch.from_gguf(tiny_files[lane], device=device, dtype=torch.float32)
        with torch.no_grad():
            logits[device] = model(ids.to(device)).float().cpu()
        model.setup_cache(1, TINY.context_length)
        greedy[device] = model.generate(ids[0].to(device), max_new_tokens=16).cpu()
    assert rel_err(logits["cuda"], logits["cpu"]) < 1e-5, f"SEED={SEED}"
    assert torch.equal(greedy["cuda"], greedy["cpu"]), f"SEED={SEED}"
