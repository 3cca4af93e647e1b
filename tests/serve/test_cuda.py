"""``serve`` on CUDA (where there is a GPU): the batched decode steps run as
CUDA graphs (``models/engine.py``), padded to a batch bucket; concurrent greedy
requests answer as ``model.generate`` does on the same device, a second turn
reuses its prefix, and a JSON schema holds. Skips without a GPU."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from muser_torch.models import from_gguf
from muser_torch.run import DEMO

from .harness import MODEL_ID, greedy, serving, text_of

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
PROMPTS = ["def main(", "import os\n", "class Foo:\n    "]


@pytest.fixture(scope="module")
def cuda_model():
    return from_gguf(DEMO["q4_k_xl"], device="cuda", dtype=torch.float32)


def test_batched_requests_on_graphs_answer_as_generate(cuda_model):
    tok = cuda_model.tokenizer
    want = [text_of(cuda_model, greedy(cuda_model, tok.encode(p), 24)) for p in PROMPTS]
    with serving(cuda_model, slots=8) as live:       # 3 rows: the 4-row bucket, padded
        client = live.client()
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            got = list(pool.map(lambda p: client.completions.create(
                model=MODEL_ID, prompt=p, max_tokens=24, temperature=0).choices[0].text, PROMPTS))
        assert live.scheduler.engine.records and live.scheduler.engine.captures >= 1
    assert got == want


def test_reuse_and_schema_on_cuda(cuda_model):
    turn1 = [{"role": "user", "content": "Write a function that adds two numbers."}]
    schema = {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0,
                                                     "maximum": 9}},
              "required": ["x"], "additionalProperties": False}
    with serving(cuda_model, slots=2) as live:
        client = live.client()
        first = client.chat.completions.create(model=MODEL_ID, messages=turn1, max_tokens=16,
                                               temperature=0)
        turn2 = turn1 + [{"role": "assistant", "content": first.choices[0].message.content},
                         {"role": "user", "content": "Again."}]
        second = client.chat.completions.create(model=MODEL_ID, messages=turn2, max_tokens=4,
                                                temperature=0)
        assert second.usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens
        shaped = client.chat.completions.create(
            model=MODEL_ID, messages=turn1, max_tokens=40, temperature=1.0, seed=1,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
        assert set(json.loads(shaped.choices[0].message.content)) == {"x"}
