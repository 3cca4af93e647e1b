"""Whole-model check: the bundled demo Glimmer (and a random NVFP4 one) give
the same logits through the emulated Metal kernels as through the CPU path,
with prompt lengths that take each qmatmul rung (1 -> mv, 5 -> ext, 12 -> mm)."""
from __future__ import annotations

from dataclasses import replace

import torch

from muser_torch.glimmer import Glimmer
from muser_torch import ops
from muser_torch.ops import metal
from muser_torch.run import DEMO as DEMOS

from .helpers import fresh_seed, rel_err

DEMO = DEMOS["q4_k_xl"]


def _compare(model: Glimmer, vocab: int, seed: int, monkeypatch) -> None:
    used = set()
    kernel = metal._kernel

    def spy(device, name, op):
        used.add(name.split("_")[1])
        return kernel(device, name, op)

    monkeypatch.setattr(metal, "_kernel", spy)
    g = torch.Generator().manual_seed(seed)
    for T in (1, 5, 12):
        tokens = torch.randint(0, vocab, (1, T), generator=g)
        want = model(tokens)
        with ops.use_backend("metal-emulator"):
            got = model(tokens)
        err = rel_err(got, want)
        assert err < 1e-5, f"T={T}: logits rel err {err:.3g} (seed {seed})"
        assert torch.equal(got.argmax(-1), want.argmax(-1)), f"T={T}: argmax differs (seed {seed})"
    assert used == {"mv", "ext", "mm", "embed"}, f"the emulated path ran {sorted(used)}"


def test_demo_logits_match_cpu(monkeypatch, model_lane_schedule):
    assert DEMO.exists(), f"the bundled demo model is missing: {DEMO}"
    model = Glimmer.from_gguf(DEMO, dtype=torch.float32)
    _compare(model, model.config.vocab_size, fresh_seed(), monkeypatch)


def test_nvfp4_lane_logits_match_cpu(monkeypatch, model_lane_schedule):
    seed = fresh_seed()
    demo = Glimmer.from_gguf(DEMO, dtype=torch.float32).config
    cfg = replace(demo, weight_precision="nvfp4")
    model = Glimmer.random(cfg, dtype=torch.float32, seed=seed)
    _compare(model, cfg.vocab_size, seed, monkeypatch)
