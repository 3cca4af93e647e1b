"""``serve --draft``: the scheduler decodes a request in DFlash rounds
(``models/speculative.py``) on the bundled demo with a random draft written
as llama.cpp's converter writes one. Greedy answers are ``model.generate``'s
without the draft, token for token, over the scheduler and over HTTP; stop
tokens and ``max_tokens`` end a round's tokens where they fall; a request
for logprobs, a tool_choice that needs a grammar and a second slot are refused."""
from __future__ import annotations

import pytest
import torch

from muser_torch.models import from_gguf
from muser_torch.serve.sampling import SamplingParams
from muser_torch.serve.scheduler import Finish, Scheduler

from ..random_seed import fresh_seed
from .harness import MODEL_ID, greedy, run_jobs, serving, text_of

pytest.importorskip("transformers.models.muse_glimmer_assistant")
from ..dflash.draft_files import assistant_config, write_draft_gguf  # noqa: E402

SEED = fresh_seed()
PROMPTS = ["def main(", "import os\n", "    return self._"]


@pytest.fixture(scope="module")
def demo_draft(demo_model, tmp_path_factory):
    """A random draft for the demo: its hidden size and layers, tapping three of
    them; the demo has no mask token, so BOS stands in (it never follows the
    first position)."""
    c = demo_model.config
    cfg = assistant_config(hidden=c.hidden, ffn=2 * c.hidden, tap_ids=(0, 1, c.n_layers - 2),
                           mask=demo_model.tokenizer.bos_id, context=c.context_length)
    path = write_draft_gguf(tmp_path_factory.mktemp("draft") / "demo-draft.gguf", cfg, seed=SEED,
                            vocab=c.vocab_size)
    return from_gguf(path, target=demo_model)


def test_drafted_greedy_equals_generate(demo_model, demo_draft):
    tok = demo_model.tokenizer
    ids = [tok.encode(p) for p in PROMPTS]
    jobs = [(i, SamplingParams(max_tokens=n, temperature=0.0)) for i, n in zip(ids, (24, 17, 9))]
    sinks, sched = run_jobs(demo_model, jobs, slots=1, draft=demo_draft)
    for p, i, (_, params), s in zip(PROMPTS, ids, jobs, sinks):
        want = greedy(demo_model, i, params.max_tokens)
        assert s.tokens == want, f"prompt {p!r} (seed {SEED})"
        reason = "stop" if want[-1] in tok.stop_ids else "length"
        assert s.end == Finish(reason, len(i), len(want)), f"prompt {p!r} (seed {SEED})"
        assert "".join(piece.text for piece in s.pieces) == text_of(demo_model, want)
    # one round per turn: never more rounds than tokens, one job at a time
    assert sched.stats.max_batch == 1
    assert sched.stats.steps <= sum(len(s.tokens) for s in sinks)


def test_sampled_rounds_end_at_max_tokens(demo_model, demo_draft):
    ids = demo_model.tokenizer.encode("class Foo:\n    ")
    params = SamplingParams(max_tokens=20, temperature=0.8, top_k=40, seed=SEED)
    (s,), _ = run_jobs(demo_model, [(ids, params)], slots=1, draft=demo_draft)
    stops = set(demo_model.tokenizer.stop_ids)
    assert 1 <= len(s.tokens) <= 20 and not stops & set(s.tokens[:-1]), f"seed {SEED}"
    assert s.end.completion_tokens == len(s.tokens), f"seed {SEED}"
    assert s.end.reason == ("stop" if s.tokens[-1] in stops else "length"), f"seed {SEED}"
    assert s.end.reason == "stop" or len(s.tokens) == 20, f"seed {SEED}"


def test_a_draft_takes_one_slot(demo_model, demo_draft):
    with pytest.raises(ValueError, match="need 1 slot, got 2"):
        Scheduler(demo_model, 2, 4, 256, draft=demo_draft)


def test_over_http_greedy_and_no_logprobs(demo_model, demo_draft):
    import openai
    prompt = "def parse("
    want = greedy(demo_model, demo_model.tokenizer.encode(prompt), 16)
    with serving(demo_model, slots=1, draft=demo_draft) as live:
        client = live.client()
        got = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=16, temperature=0)
        assert got.choices[0].text == text_of(demo_model, want), f"seed {SEED}"
        assert got.usage.completion_tokens == len(want)
        with pytest.raises(openai.BadRequestError, match="logprobs are not offered"):
            client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=4, logprobs=2)
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model=MODEL_ID, prompt=prompt, max_tokens=16, temperature=0, stream=True))
        assert streamed == text_of(demo_model, want), f"seed {SEED}"



SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "n": {"type": "integer", "minimum": -99, "maximum": 999},
    "tags": {"type": "array", "items": {"enum": ["a", "bc", "def"]}, "maxItems": 4}},
    "required": ["name", "n", "tags"], "additionalProperties": False}


def _schema_answer(live, temperature: float, seed: int | None = None):
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}
    return live.client().chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "A record, please."}],
        temperature=temperature, seed=seed, max_tokens=120, response_format=fmt).choices[0]


def test_a_schema_masks_every_row_of_a_round(demo_model, demo_draft):
    """Greedy: the masked model's own answer, with and without the draft.
    Sampled: every answer valid (jsonschema)."""
    jsonschema = pytest.importorskip("jsonschema")
    import json
    with serving(demo_model, slots=1) as live:
        want = _schema_answer(live, 0.0)
    with serving(demo_model, slots=1, draft=demo_draft) as live:
        got = _schema_answer(live, 0.0)
        assert got.message.content == want.message.content, f"seed {SEED}"
        for i in range(8):
            answer = _schema_answer(live, 1.0, SEED + i)
            assert answer.finish_reason == "stop", f"seed {SEED + i}: {answer.message.content!r}"
            jsonschema.validate(json.loads(answer.message.content), SCHEMA)
