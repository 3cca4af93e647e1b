"""Long runs: a greedy ``generate`` far past the sliding window, its SWA rings
wrapped many times, gives at 16 checkpoints the logits a cache-free forward
of the same tokens gives (relative error in the norm within 1e-4, float32).
The default suite runs a small random Gemma 3 file with an 8-token window for
300 tokens (37 wraps); ``MUSER_SLOW_TESTS=1`` runs the real Gemma 3 270M
for 8,192 tokens (16 wraps of its 512 window) on CPU, and on CUDA where
there is one (the command is in docs/fuzz.md)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import muser_torch
from muser_torch.gguf_io import save_gguf

from .. import slow
from .conftest import SEED, rel_err
from .test_gemma3_admission import SMALL, metadata, tensors

CHECKPOINTS = 16
TOL = 1e-4


def check_long_run(model, prompt_len: int, n_new: int, min_wraps: int = 16) -> None:
    """Generate ``n_new`` greedy tokens after a random prompt through
    ``generate`` (its decode steps record their logits at 16 evenly spaced
    steps, the last included), then recompute each checkpoint's logits
    without a cache."""
    window = min(layer.attention.window for layer in model.layers if layer.attention.window)
    assert (prompt_len + n_new) // window >= min_wraps, "too short to wrap the rings many times"
    device = model.lengths.device
    g = torch.Generator().manual_seed(SEED)
    prompt = torch.randint(0, model.config.vocab_size, (prompt_len,), generator=g).to(device)
    steps = torch.linspace(1, n_new - 1, CHECKPOINTS).round().long().tolist()   # step k: token k's logits
    assert len(set(steps)) == CHECKPOINTS
    cached, calls = {}, [0]

    def step(tok, slots):
        logits = model(tok, slots)
        calls[0] += 1
        if calls[0] in steps:
            cached[calls[0]] = logits[0, -1].clone()
        return logits

    with torch.no_grad():
        seq = model.generate(prompt, n_new, stop=[], decode_step=step)
        assert seq.shape == (prompt_len + n_new,) and len(cached) == CHECKPOINTS
        for k in steps:
            want = model(seq[None, :prompt_len + k], last_only=True)[0, -1]
            err = rel_err(cached[k], want)
            assert err < TOL, f"step {k} (position {prompt_len + k}): relative error {err:.2e} " \
                              f"vs the cache-free forward (seed {SEED})"
            assert int(seq[prompt_len + k]) == int(cached[k].argmax()), f"step {k}: not greedy"


def test_generate_across_many_window_wraps_matches_recompute(tmp_path):
    """4 layers (pattern 2: two SWA, two global), an 8-token window, 300 tokens."""
    cfg = replace(SMALL, context_length=512, n_layers=4, sliding_window=8, sliding_window_pattern=2)
    path = tmp_path / "gemma3-window8.gguf"
    save_gguf(path, metadata(cfg), tensors(cfg), progress=False)
    model = muser_torch.from_gguf(path, dtype=torch.float32)
    windows = [layer.attention.window for layer in model.layers]
    assert 8 in windows and None in windows, windows
    check_long_run(model, 12, 288)


@pytest.mark.parametrize("device", [slow.param("cpu"), slow.param("cuda")])
def test_gemma_8192_greedy_tokens_match_recompute(gemma_path, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    model = muser_torch.from_gguf(gemma_path, device=device, dtype=torch.float32)
    check_long_run(model, 16, 8192 - 16)
