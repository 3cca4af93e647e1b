"""``response_format``: every sampled answer follows its JSON schema
(jsonschema validates each), ``json_object`` answers parse as an object, a
schema llguidance cannot follow is a 400 naming why, and the token bytes the
mask is built from are the tokenizer's own (``serve/grammar.py``)."""
from __future__ import annotations

import json
import os

import pytest

from muser_torch.serve.grammar import Grammars, token_bytes

from ..random_seed import fresh_seed
from .harness import MODEL_ID, serving

jsonschema = pytest.importorskip("jsonschema")     # the test extra installs both
pytest.importorskip("llguidance")

SEED = fresh_seed()
NESTED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9,
                                                         "maximum": 99}},
                  "required": ["x"], "additionalProperties": False},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "tags", "point", "ok"],
    "additionalProperties": False,
}
USER = [{"role": "user", "content": "Describe a point."}]


def _format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "point", "schema": schema}}


def test_sampled_answers_follow_a_nested_schema(demo_model):
    with serving(demo_model, slots=4) as live:
        client = live.client()
        for i in range(int(os.environ.get("MUSER_SCHEMA_SAMPLES", "24"))):
            res = client.chat.completions.create(model=MODEL_ID, messages=USER, temperature=1.0,
                                                 max_tokens=200, seed=SEED + i,
                                                 response_format=_format(NESTED))
            text = res.choices[0].message.content
            assert res.choices[0].finish_reason == "stop", f"seed {SEED + i}: {text!r}"
            jsonschema.validate(json.loads(text), NESTED)


def test_json_object_answers_are_objects(demo_model):
    with serving(demo_model) as live:
        res = live.client().chat.completions.create(
            model=MODEL_ID, messages=USER, temperature=0, max_tokens=200,
            response_format={"type": "json_object"})
    assert isinstance(json.loads(res.choices[0].message.content), dict)


@pytest.mark.parametrize("fmt,message", [
    (_format({"type": "nonsense"}), "response_format"),
    ({"type": "xml"}, "response_format.type must be 'text', 'json_object' or 'json_schema'; "
                      "got a string \"xml\""),
    ({}, "response_format.type must be .*; it has none"),
    ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema.name"),
])
def test_a_bad_format_is_a_400(demo_model, fmt, message):
    import openai
    with serving(demo_model) as live:
        with pytest.raises(openai.BadRequestError, match=message):
            live.client().chat.completions.create(model=MODEL_ID, messages=USER, max_tokens=4,
                                                  response_format=fmt)
        # and the server serves on
        # greedy: a sampled answer may draw the end token first and count one token
        ok = live.client().chat.completions.create(model=MODEL_ID, messages=USER, max_tokens=2,
                                                   temperature=0)
        assert ok.usage.completion_tokens == 2


def test_token_bytes_of_each_vocabulary_family():
    # SentencePiece: the space mark, byte fallback, a control token
    assert token_bytes("llama", ["\u2581the", "<0x0A>", "<start_of_turn>", "\u00e9"], [1, 6, 3, 1]) == \
        [b" the", b"\n", b"\xff<start_of_turn>", "\u00e9".encode()]
    # GPT-2 byte level: 'Ġ' is the space, 'Ċ' the newline, 'Ã©' the two bytes of é
    assert token_bytes("gpt2", ["\u0120the", "\u010a", "\u00c3\u00a9", "<|im_end|>"], [1, 1, 1, 3]) == \
        [b" the", b"\n", "\u00e9".encode(), b"\xff<|im_end|>"]


def test_the_mask_allows_what_the_grammar_allows(demo_model):
    """A schema of one fixed object: at each step exactly the next byte (the
    demo's tokens are bytes), then only the stop token."""
    grammars = Grammars(demo_model.tokenizer, demo_model.config.vocab_size)
    c = grammars.constraint(json.dumps({"const": {"k": 7}}))
    for ch in '{"k": 7}':
        allowed = c.allowed().nonzero().flatten().tolist()
        assert allowed == [ord(ch)], (ch, allowed)
        c.take(ord(ch))
    assert c.allowed().nonzero().flatten().tolist() == list(demo_model.tokenizer.stop_ids)
