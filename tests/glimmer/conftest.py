"""Fixtures: small synthetic Muse Glimmer GGUFs in the two Muser lanes, drawn fresh each session.

Every test reports ``SEED`` in its assertion messages; set MUSER_TEST_SEED to
replay a failure."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from muser_torch.arch.muse_glimmer import GlimmerConfig, reference_pattern
from muser_torch.tiny import write_tiny

from ..random_seed import fresh_seed

SEED = fresh_seed(1 << 24)

# Four layers, global every 2nd from the last (layers 1 and 3), GQA 4:2, an 8-token
# window so that short tests run well past it; dimensions the K-quant rows need.
TINY = GlimmerConfig(context_length=96, hidden=256, ffn=512, n_layers=4, n_heads=4, n_kv_heads=2,
                     head_dim=64, rms_eps=1e-6, sliding_window=8,
                     sliding_window_pattern=reference_pattern(4, 2), rope_base=10000.0,
                     vocab_size=258, logit_scale=0.5, final_softcap=20.0)
LANES = ("q4_k_xl", "nvfp4")


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_files(tmp_path_factory) -> dict[str, str]:
    """lane -> path."""
    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for i, lane in enumerate(LANES):
        cfg = replace(TINY, weight_precision=lane)
        path = root / f"tiny-{lane}.gguf"
        write_tiny(path, cfg, seed=SEED + i)
        out[lane] = str(path)
    return out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())
