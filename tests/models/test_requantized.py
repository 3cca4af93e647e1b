"""Q2_K and Q3_K in a file llama.cpp wrote: the Gemma 3 270M Q4_K_M file
requantized by the peer ``llama-quantize --allow-requantize --pure`` (pure:
every tensor whose rows hold whole 256-blocks takes the type; Gemma's 640-wide
rows fall back to Q4_0 / Q5_0 either way), against transformers'
Gemma3ForCausalLM in float64 over the same tensors (gguf-py dequantizes them).
"""
from __future__ import annotations

import pytest
import torch

import muser_torch

from .. import slow
from ..convert.peers import need_llama_quantize, run_llama_quantize
from .conftest import SEED, hf_gemma3, rel_err
from .test_gemma3 import BOS, _prompt


# The default suite holds a llama.cpp-written real file to transformers once
# (tests/models/test_gemma3.py, Q4_K_M); these requantized files repeat it per type.
@pytest.fixture(scope="module", params=[slow.param("Q2_K"), slow.param("Q3_K")])
def requantized(request, gemma_path, tmp_path_factory):
    need_llama_quantize()
    work = tmp_path_factory.mktemp(request.param)
    out = work / f"gemma-3-270m-{request.param.lower()}.gguf"
    run_llama_quantize(gemma_path, out, request.param, options=("--allow-requantize", "--pure"))
    return request.param, out, hf_gemma3(out, work, torch.float64)


def test_requantized_file_matches_float64(requantized):
    qtype, path, hf = requantized
    model = muser_torch.from_gguf(path, dtype=torch.float32)
    types = {m.qtype.name for m in model.modules() if hasattr(m, "qtype")}
    assert qtype in types, f"llama-quantize wrote {types}"
    ids = _prompt(17, salt=7)[None]
    with torch.no_grad():
        want = hf(ids).logits[0]
        got = model(ids)[0]
    err = rel_err(got, want)
    assert err < 1e-5, f"{qtype}: logits {err:.2e} from float64 (seed {SEED})"
    assert float(want.std()) > 1.0, f"{qtype}: degenerate reference logits (seed {SEED})"
    # greedy decoding through the cache: every token is the reference's argmax
    prompt = torch.tensor([BOS, 818, 5279, 529, 7001, 563])   # "The capital of France is"
    seq = model.generate(prompt, 8, temperature=0, stop=[])
    with torch.no_grad():
        steps = hf(seq[None]).logits[0, len(prompt) - 1:-1]
    chosen = steps.gather(1, seq[len(prompt):, None].long())[:, 0]
    gap = steps.max(-1).values - chosen
    assert bool((gap <= 1e-4 * steps.std(-1)).all()), f"{qtype}: greedy tokens off by {gap.tolist()}"
