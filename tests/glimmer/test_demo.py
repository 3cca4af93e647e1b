"""The bundled demo: both lanes load and still model held-out Python source
(models/README.md records the full measurement)."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from muser_torch import Glimmer
from muser_torch.run import DEMO

from .conftest import SEED

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))


@pytest.mark.parametrize("lane", sorted(DEMO))
def test_demo_predicts_held_out_python(lane):
    if not DEMO[lane].exists():
        pytest.skip(f"{DEMO[lane]} not built")
    from train_demo import stdlib_files, token_stream
    from muser_torch.tokenizer import ByteTokenizer
    held = token_stream(stdlib_files()[1], ByteTokenizer())
    model = Glimmer.from_gguf(DEMO[lane], dtype=torch.float32)
    g = torch.Generator().manual_seed(SEED)
    starts = torch.randint(0, held.numel() - 257, (4,), generator=g)
    batch = torch.stack([held[s:s + 257] for s in starts.tolist()])
    with torch.no_grad():
        logits = model(batch[:, :-1])
    ppl = math.exp(float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))))
    # README: 2.78 (q4_k_xl) / 2.79 (nvfp4) over 65,536 bytes; a uniform guess is 258.
    assert ppl < 5.0, f"{lane}: held-out perplexity {ppl:.2f} (seed {SEED})"
