"""The bundled demo: both lanes load and model held-out Python source as well
as demo/README.md publishes. The measurement is the published one: the
first 128 windows of 512 tokens of the held-out stream, float32 activations,
through the packed kernels; the perplexity must be within 2% of the README's."""
from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from muser_torch import Glimmer
from muser_torch.run import DEMO, DEMO_DIR

from .. import slow

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "demo"))

SEQ, WINDOWS, BATCH = 512, 128, 16
TOLERANCE = 0.02
# The held-out stream the README was measured on: 36 standard-library files of
# Python 3.11.7, 550,707 tokens with their BOS/EOS (demo/README.md).
HELD_FILES, HELD_TOKENS = 36, 550_707


def published_perplexity() -> dict[str, float]:
    """lane -> perplexity, read from demo/README.md's held-out table."""
    text = (DEMO_DIR / "README.md").read_text()
    found = dict(re.findall(r"^\| (q4_k_xl|nvfp4) \| ([0-9.]+) ", text, flags=re.M))
    assert set(found) == set(DEMO), f"demo/README.md: no perplexity row for {set(DEMO) - set(found)}"
    return {lane: float(v) for lane, v in found.items()}


@pytest.fixture(scope="module")
def held_out() -> torch.Tensor:
    from train_demo import stdlib_files, token_stream

    from muser_torch.text.byte_tokenizer import ByteTokenizer
    files = stdlib_files()[1]
    held = token_stream(files, ByteTokenizer())
    if (len(files), held.numel()) != (HELD_FILES, HELD_TOKENS):
        pytest.skip(f"this interpreter's held-out standard library ({len(files)} files, "
                    f"{held.numel()} tokens) is not the one the README measured "
                    f"({HELD_FILES} files, {HELD_TOKENS} tokens)")
    return held


# The default lane runs every time; the nvfp4 lane (its kernels and logits are
# checked against float64 and the CPU elsewhere) repeats the measurement.
@pytest.mark.parametrize("lane", [slow.param(lane) if lane != "q4_k_xl" else lane
                                  for lane in sorted(DEMO)])
def test_demo_perplexity_matches_the_published_value(lane, held_out):
    if not DEMO[lane].exists():
        pytest.skip(f"{DEMO[lane]} not built")
    want = published_perplexity()[lane]
    model = Glimmer.from_gguf(DEMO[lane], dtype=torch.float32)
    chunks = torch.stack([held_out[i * SEQ:(i + 1) * SEQ + 1] for i in range(WINDOWS)])
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)   # 65,536 tokens; the suite runs one test at a time
    nll = 0.0
    try:
        with torch.no_grad():
            for b in range(0, WINDOWS, BATCH):
                c = chunks[b:b + BATCH]
                logits = model(c[:, :-1]).float()
                nll += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             c[:, 1:].reshape(-1), reduction="sum"))
    finally:
        torch.set_num_threads(threads)
    ppl = math.exp(nll / (WINDOWS * SEQ))
    # A uniform guess is 258; the float model 5.238. 2% separates the lanes from
    # a model a broken kernel or a mis-packed tensor would give.
    assert abs(ppl / want - 1) <= TOLERANCE, \
        f"{lane}: held-out perplexity {ppl:.4f}, published {want} (tolerance {TOLERANCE:.0%})"
