"""Block types in files llama.cpp wrote: the Gemma 3 270M Q4_K_M file
requantized by the peer ``llama-quantize --allow-requantize --pure`` (pure:
every tensor whose rows hold whole blocks takes the type; Gemma's 640-wide
rows hold no 256-block, so they fall back to Q4_0 / Q5_0 under the K types
and to IQ4_NL under IQ4_XS and the IQ3 types), against transformers'
Gemma3ForCausalLM in float64 over the same tensors (gguf-py dequantizes them).
IQ3_XXS needs an importance matrix: ``tools/readme_perplexity.py`` records
one from our float32 model over the source file on the README's text.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import muser_torch

from .. import slow
from ..convert.peers import need_llama_quantize, run_llama_quantize
from .conftest import SEED, hf_gemma3, rel_err
from .test_gemma3 import BOS, _prompt


# block type the file must hold -> (llama-quantize's ftype, whether it needs an
# importance matrix). MXFP4_MOE with --pure puts MXFP4 on every projection and
# the tied embedding, not only on experts; IQ3_XXS is refused without a matrix.
FILES = {
    "Q2_K": ("Q2_K", False), "Q3_K": ("Q3_K", False),
    "IQ4_NL": ("IQ4_NL", False), "IQ4_XS": ("IQ4_XS", False), "MXFP4": ("MXFP4_MOE", False),
    "IQ3_S": ("IQ3_S", False), "IQ3_XXS": ("IQ3_XXS", True),
}
REPO = Path(__file__).resolve().parents[2]


def _imatrix(src: Path, out: Path) -> Path:
    spec = importlib.util.spec_from_file_location("readme_perplexity", REPO / "tools" / "readme_perplexity.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool.make_imatrix(src, out)


# The default suite holds a llama.cpp-written real file to transformers once
# (tests/models/test_gemma3.py, Q4_K_M); these requantized files repeat it per type.
@pytest.fixture(scope="module", params=[slow.param(t) for t in FILES])
def requantized(request, gemma_path, tmp_path_factory):
    need_llama_quantize()
    qtype = request.param
    ftype, needs_imatrix = FILES[qtype]
    work = tmp_path_factory.mktemp(qtype)
    imatrix = _imatrix(gemma_path, work / "gemma-3-270m.imatrix.gguf") if needs_imatrix else None
    out = work / f"gemma-3-270m-{qtype.lower()}.gguf"
    run_llama_quantize(gemma_path, out, ftype, imatrix=imatrix, options=("--allow-requantize", "--pure"))
    return qtype, out, hf_gemma3(out, work, torch.float64)


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
