"""The tool-call parser (``serve/tool_calls.py``) on hand-built answers in
the shapes models write: Qwen's Hermes blocks and Llama 3's JSON. Each
answer's calls are held to the JSON the text holds (``json.loads`` of the
block, written out here independently of the parser), and a stream fed in
any split gives exactly what the whole answer gives."""
from __future__ import annotations

import json
import random

import pytest

from muser_torch.serve.tool_calls import CallParser, ToolCall, parse
from muser_torch.serve.tools import HERMES, LLAMA3, family_of

from ..text.chat_templates import TEMPLATES

NAMES = ["get_weather", "search"]
WEATHER = {"city": "Zürich", "unit": "celsius", "days": [{"offset": 1, "hourly": False}]}


def _block(obj: dict) -> str:
    """A call as Qwen 2.5 writes it: the mark, a newline, the JSON, a newline, the mark."""
    return f"<tool_call>\n{json.dumps(obj, ensure_ascii=False)}\n</tool_call>"


def _calls(calls: list[ToolCall]) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


def test_hermes_one_call_is_the_whole_answer():
    content, calls = parse(HERMES, NAMES, _block({"name": "get_weather", "arguments": WEATHER}))
    assert content is None and _calls(calls) == [("get_weather", WEATHER)]
    assert calls[0].id.startswith("call_") and len(calls[0].id) > 12


def test_hermes_text_then_two_calls():
    text = ("Let me look both up.\n" + _block({"name": "get_weather", "arguments": WEATHER}) + "\n"
            + _block({"name": "search", "arguments": {"q": "rain <b>"}}))
    content, calls = parse(HERMES, NAMES, text)
    assert content == "Let me look both up."
    assert _calls(calls) == [("get_weather", WEATHER), ("search", {"q": "rain <b>"})]
    assert len({c.id for c in calls}) == 2


def test_hermes_arguments_as_json_text_and_absent():
    text = (_block({"name": "search", "arguments": json.dumps({"q": "x"})}) + "\n"
            + _block({"name": "search"}))
    assert _calls(parse(HERMES, NAMES, text)[1]) == [("search", {"q": "x"}), ("search", {})]


@pytest.mark.parametrize("bad", [
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \n</tool_call>",   # broken JSON
    _block({"name": "delete_all", "arguments": {}}),                                # not offered
    _block({"name": "search", "arguments": [1, 2]}),                                # not an object
    _block({"name": "search", "arguments": "not json"}),
    "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"cut",              # never closed
    "<tool_call>\n" + "[" * 100_000 + "\n</tool_call>",                             # too deep for json
], ids=["broken", "not-offered", "array", "text", "unclosed", "deep"])
def test_hermes_a_bad_call_stays_content_as_written(bad):
    text = "Before. " + bad
    assert parse(HERMES, NAMES, text) == (text, [])


def test_hermes_keeps_good_calls_beside_a_bad_one():
    good = _block({"name": "search", "arguments": {"q": "a"}})
    bad = _block({"name": "nope", "arguments": {}})
    content, calls = parse(HERMES, NAMES, good + "\n" + bad)
    assert content == bad and _calls(calls) == [("search", {"q": "a"})]


@pytest.mark.parametrize("text", ["plain answer", "  two\n\nlines \n", "a < b and <tool", "<tool_cal",
                                  "</tool_call> alone", ""])
@pytest.mark.parametrize("family", [HERMES, LLAMA3], ids=["hermes", "llama3"])
def test_an_answer_without_calls_is_content_unchanged(family, text):
    assert parse(family, NAMES, text) == (text, [])


def test_llama3_json_form():
    text = json.dumps({"name": "get_weather", "parameters": WEATHER})
    content, calls = parse(LLAMA3, NAMES, "\n " + text + "\n")
    assert content is None and _calls(calls) == [("get_weather", WEATHER)]
    # "arguments" as the key, as the models also write it; two calls joined by ";"
    two = text + "; " + json.dumps({"name": "search", "arguments": {"q": "x"}})
    assert _calls(parse(LLAMA3, NAMES, two)[1]) == [("get_weather", WEATHER), ("search", {"q": "x"})]


@pytest.mark.parametrize("text", [
    '{"name": "get_weather", "parameters": {"city": "Oslo"}} and then some',   # text after it
    '{"name": "unknown", "parameters": {}}',
    '{"name": "search", "parameters": {"q": "x"}',                            # cut
    '{"q": "x"}',
    'Sure: {"name": "search", "parameters": {"q": "x"}}',                      # the form is the whole answer
    "{" + '"a": [' * 100_000,                                                   # too deep for json
], ids=["text-after", "not-offered", "cut", "no-name", "text-before", "deep"])
def test_llama3_anything_but_calls_is_content(text):
    assert parse(LLAMA3, NAMES, text) == (text, [])


def test_llama3_plain_text_streams_at_once():
    parser = CallParser(LLAMA3, NAMES)
    assert parser.feed("  ") == []                # undecided while blank
    assert parser.feed("Hello") == ["  Hello"]
    assert parser.feed(' {"name"') == [' {"name"']


def test_hermes_streams_text_up_to_a_possible_mark():
    parser = CallParser(HERMES, NAMES)
    assert parser.feed("Checking <to") == ["Checking"]          # the blank and the mark's start wait
    assert parser.feed("day>") == [" <today>"]
    out = parser.feed(" <tool_call>\n{\"name\": \"search\", \"arguments\": {}}")
    assert out == []                                          # a call waits for its end
    out = parser.feed("\n</tool_call>")
    assert [type(o) for o in out] == [ToolCall] and out[0].name == "search"
    assert parser.finish() == []


CASES = {
    "hermes": (HERMES, "Let me look.\n" + _block({"name": "get_weather", "arguments": WEATHER})
               + "\n" + _block({"name": "search", "arguments": {"q": "<tool_call> inside"}})
               + "\n<tool_call>\n{broken}\n</tool_call> tail\n"),
    "llama3": (LLAMA3, json.dumps({"name": "get_weather", "parameters": WEATHER})),
    "llama3-text": (LLAMA3, "No call here.\n"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_any_split_of_a_stream_gives_the_whole_answer(name):
    family, text = CASES[name]
    content, calls = parse(family, NAMES, text)
    rng = random.Random(name)
    for trial in range(30):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, min(12, len(text) - 1))))
        if trial == 0:
            cuts = list(range(1, len(text)))        # one character at a time
        parser = CallParser(family, NAMES)
        out = []
        for a, b in zip([0, *cuts], [*cuts, len(text)]):
            out += parser.feed(text[a:b])
        out += parser.finish()
        got = "".join(o for o in out if isinstance(o, str))
        assert (got or None if calls else got) == content
        assert _calls([o for o in out if isinstance(o, ToolCall)]) == _calls(calls)


def test_families_of_the_template_corpus():
    """The form each template of the tests' corpus writes a call in."""
    want = {"chatml-tools-reasoning": HERMES, "qwen2.5-tools": HERMES,
            "qwen3-tools-thinking": HERMES, "llama3-tools": LLAMA3}
    for name, source in TEMPLATES.items():
        assert family_of(source) is want.get(name), name
    assert family_of(None) is HERMES      # the default ChatML
