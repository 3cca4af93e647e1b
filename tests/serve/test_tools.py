"""Tool calls through the server with the official ``openai`` client: a
ChatML (Qwen 2.5) template file and a Llama 3 template file (tiny random
models, ``tool_files.py``), and the bundled demo on the default ChatML.

Random weights write garbage, so the calls come from the grammar
(``tool_choice`` "required" or a named function); every call's arguments
are validated against its function's ``parameters`` with ``jsonschema``,
streamed answers are put together by the client's own
``ChatCompletionStreamState``, and a conversation carrying calls and their
results renders as transformers' own renderer renders it. Bad tool specs
are 400s naming the field."""
from __future__ import annotations

import copy
import json

import openai
import pytest

from muser_torch.serve.grammar import Grammars
from muser_torch.serve.schemas import ToolRequest
from muser_torch.serve.tools import HERMES, tool_grammar

from ..random_seed import fresh_seed
from .harness import MODEL_ID, chatml, greedy, serving, text_of
from .tool_files import (CONTEXT, chatml_default_model, chatml_tools_model,  # noqa: F401
                         llama3_tools_model)

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

SEED = fresh_seed()
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather at a place, a few days ahead.",
    "parameters": {"type": "object", "properties": {
        "city": {"enum": ["Paris", "Rome", "Zürich"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {
    "name": "clock", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "maxLength": 5}}, "required": ["zone"],
        "additionalProperties": False}}}
TOOLS = [WEATHER, CLOCK]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
USER = [{"role": "user", "content": "Weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(params=["chatml", "llama3"])
def tool_model(request):
    return request.getfixturevalue(f"{request.param}_tools_model")


def _check_calls(calls, names=None) -> None:
    assert calls, "no tool calls"
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert names is None or call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_a_named_function_is_called(tool_model):
    with serving(tool_model, context=CONTEXT) as live:
        for i in range(4):
            res = live.client().chat.completions.create(
                model=MODEL_ID, messages=USER, tools=TOOLS, tool_choice=NAMED, max_tokens=80,
                temperature=1.0, seed=SEED + i)
            choice = res.choices[0]
            assert choice.finish_reason == "tool_calls", f"seed {SEED + i}: {choice.message}"
            assert choice.message.content is None and len(choice.message.tool_calls) == 1
            _check_calls(choice.message.tool_calls, {"get_weather"})


def test_required_streamed_equals_whole(tool_model):
    """Greedy, so the stream and the whole answer are the same tokens; the
    client's own stream state puts the deltas together."""
    from openai.lib.streaming.chat import ChatCompletionStreamState
    ask = dict(model=MODEL_ID, messages=USER, tools=TOOLS, tool_choice="required",
               parallel_tool_calls=False, max_tokens=80, temperature=0)
    with serving(tool_model, context=CONTEXT) as live:
        whole = live.client().chat.completions.create(**ask).choices[0]
        state = ChatCompletionStreamState()
        chunks = list(live.client().chat.completions.create(**ask, stream=True))
    for chunk in chunks:
        state.handle_chunk(chunk)
    streamed = state.get_final_completion().choices[0]
    assert whole.finish_reason == streamed.finish_reason == "tool_calls"
    _check_calls(whole.message.tool_calls)
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    # OpenAI's delta shape: the call's id, type and name first, its arguments after
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == \
        whole.message.tool_calls[0].function.name
    assert all(d.id is None and d.function.name is None for d in deltas[1:])
    assert not any(c.choices and c.choices[0].delta.content for c in chunks)


def test_auto_streams_free_text_as_its_whole_answer(tool_model):
    """"auto" on garbage: no calls, the content streamed equals the whole
    answer's, with a logprob for each token."""
    ask = dict(model=MODEL_ID, messages=USER, tools=TOOLS, max_tokens=24, temperature=0,
               logprobs=True)
    with serving(tool_model, context=CONTEXT) as live:
        whole = live.client().chat.completions.create(**ask).choices[0]
        chunks = [c for c in live.client().chat.completions.create(**ask, stream=True) if c.choices]
    assert whole.message.tool_calls is None and whole.finish_reason in ("stop", "length")
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.message.content
    streamed = [e.token for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert streamed == [e.token for e in whole.logprobs.content]
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason


def test_required_may_call_several(chatml_tools_model):
    """Hermes' form holds several calls; each is valid, all in one answer."""
    with serving(chatml_tools_model, context=CONTEXT) as live:
        res = live.client().chat.completions.create(
            model=MODEL_ID, messages=USER, tools=TOOLS, tool_choice="required", max_tokens=300,
            temperature=1.0, seed=SEED)
    _check_calls(res.choices[0].message.tool_calls)


def test_auto_parses_a_call_the_model_writes(llama3_tools_model):
    """"auto" reads a call out of free text: here a JSON schema makes the
    Llama 3 model write one in its form (the grammar is response_format's)."""
    call = {"type": "object", "properties": {"name": {"const": "clock"}, "parameters":
                                             PARAMS["clock"]},
            "required": ["name", "parameters"], "additionalProperties": False}
    with serving(llama3_tools_model, context=CONTEXT) as live:
        res = live.client().chat.completions.create(
            model=MODEL_ID, messages=USER, tools=TOOLS, max_tokens=80, temperature=1.0, seed=SEED,
            response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": call}})
        choice = res.choices[0]
        assert choice.finish_reason == "tool_calls"
        _check_calls(choice.message.tool_calls, {"clock"})
        # the same with tool_choice "none": no tools rendered, the JSON is the content
        res = live.client().chat.completions.create(
            model=MODEL_ID, messages=USER, tools=TOOLS, tool_choice="none", max_tokens=80,
            temperature=1.0, seed=SEED,
            response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": call}})
        assert res.choices[0].message.tool_calls is None
        assert json.loads(res.choices[0].message.content)["name"] == "clock"


def _transformers_prompt(model, messages: list[dict], tools: list[dict]) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template
    tok = model.tokenizer
    rendered, _ = render_jinja_template(conversations=[copy.deepcopy(messages)],
                                        tools=copy.deepcopy(tools), chat_template=tok.chat_template,
                                        add_generation_prompt=True, **tok.special_tokens)
    return rendered[0]


def test_a_tool_round_trip(tool_model):
    """A call, its result as a "tool" message, and the next turn: the prompt
    is what transformers renders of the same conversation (arguments as a
    mapping, as templates read them), and the answer is the model's greedy one."""
    with serving(tool_model, context=CONTEXT) as live:
        client = live.client()
        first = client.chat.completions.create(model=MODEL_ID, messages=USER, tools=TOOLS,
                                               tool_choice=NAMED, max_tokens=80, temperature=0)
        call = first.choices[0].message.tool_calls[0]
        turn = [{"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'}]
        res = client.chat.completions.create(model=MODEL_ID, messages=USER + turn, tools=TOOLS,
                                             max_tokens=8, temperature=0)
    reference = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": call.id, "type": "function", "function": {
            "name": call.function.name, "arguments": json.loads(call.function.arguments)}}]},
        turn[1]]
    prompt = _transformers_prompt(tool_model, USER + reference, TOOLS)
    assert '"temp": 21' in prompt and call.function.name in prompt.split("Weather in Paris?")[-1]
    ids = tool_model.tokenizer.encode(prompt, bos=False, parse_special=True)
    assert res.usage.prompt_tokens == len(ids)
    want = text_of(tool_model, greedy(tool_model, ids, 8))
    assert res.choices[0].message.content == want and res.choices[0].message.tool_calls is None


def test_the_default_chatml_offers_tools_in_hermes_form(chatml_default_model):
    """A file without a template: the server writes the tools into ChatML's
    system turn, in Hermes' form, and reads Hermes' calls back; a round trip
    renders the call and its result as ChatML turns."""
    with serving(chatml_default_model, context=CONTEXT) as live:
        client = live.client()
        res = client.chat.completions.create(
            model=MODEL_ID, messages=USER, tools=TOOLS, tool_choice={
                "type": "function", "function": {"name": "clock"}}, max_tokens=80,
            temperature=1.0, seed=SEED)
        assert res.choices[0].finish_reason == "tool_calls"
        _check_calls(res.choices[0].message.tool_calls, {"clock"})
        call = res.choices[0].message.tool_calls[0]
        turn = [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": "12:00"}]
        again = client.chat.completions.create(model=MODEL_ID, messages=USER + turn,
                                               max_tokens=4, temperature=0)
    tok = chatml_default_model.tokenizer
    body = json.dumps({"name": "clock", "arguments": json.loads(call.function.arguments)},
                      ensure_ascii=False)
    want = chatml(USER) + (f"<tool_call>\n{body}\n</tool_call><|im_end|>\n"
                           "<|im_start|>tool\n12:00<|im_end|>\n<|im_start|>assistant\n")
    assert again.usage.prompt_tokens == len(tok.encode(want, parse_special=True))
    first = tok.encode(chatml(USER), parse_special=True)
    assert res.usage.prompt_tokens > len(first) + len(tok.encode(json.dumps(TOOLS), bos=False))


def test_the_grammar_writes_plain_marks_in_a_byte_vocabulary(demo_model):
    """The demo's vocabulary is bytes: no <tool_call> token, so the marks are
    text, byte by byte, and a call of the named function ends in the stop token."""
    grammars = Grammars(demo_model.tokenizer, demo_model.config.vocab_size)
    req = ToolRequest(tuple(TOOLS), "function", "clock")
    c = grammars.lark_constraint(tool_grammar(HERMES, req, grammars.is_special), "tools")
    text = '<tool_call>\n{"name": "clock", "arguments": {"zone": "UTC"}}\n</tool_call>'
    for byte in text.encode():
        assert c.allowed()[byte], chr(byte)
        c.take(byte)
    assert c.allowed().nonzero().flatten().tolist() == list(demo_model.tokenizer.stop_ids)


def test_the_grammar_takes_qwens_own_tokens(chatml_tools_model):
    """The tokenizer's own ids of a call as Qwen writes it (its <tool_call>
    tokens included) walk the grammar to its end, where only stop tokens remain."""
    tok = chatml_tools_model.tokenizer
    grammars = Grammars(tok, chatml_tools_model.config.vocab_size)
    req = ToolRequest(tuple(TOOLS), "function", "get_weather")
    c = grammars.lark_constraint(tool_grammar(HERMES, req, grammars.is_special), "tools")
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}\n</tool_call>'
    ids = tok.encode(text, bos=False, eos=False)
    assert tok.token(ids[0]) == "<tool_call>" and tok.token(ids[-1]) == "</tool_call>"
    for i in ids:
        assert c.allowed()[i], tok.token(i)
        c.take(i)
    assert set(c.allowed().nonzero().flatten().tolist()) == set(tok.stop_ids)


BAD = [
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type", "must be 'function'"),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]},
     "tools[0].function.name", "is required"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]},
     "tools[0].function.name", "letters, digits"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
     "tools[0].function.parameters", "must be a JSON schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters", "of type 'object'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": 5}}}}]}, "tools[0].function.parameters.properties.a",
     "must be a JSON schema"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "names two tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", "names function 'nope', which is not among the tools (get_weather, clock)"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice", "must be 'none', 'auto', 'required'"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice", "both constrain"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "(?=x)a"}},
        "required": ["a"]}}}], "tool_choice": "required"}, "tools", "cannot be followed"),
    ({"messages": USER + [{"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "clock", "arguments": "zone=UTC"}}]}]},
     "messages[1].tool_calls[0].function.arguments", "a JSON object as text"),
]


@pytest.mark.parametrize("extra,param,message", BAD, ids=[p for _, p, _ in BAD])
def test_bad_tool_specs_are_400s(demo_model, extra, param, message):
    with serving(demo_model) as live:
        with pytest.raises(openai.BadRequestError) as e:
            live.client().chat.completions.create(**{"model": MODEL_ID, "messages": USER,
                                                     "max_tokens": 4, **extra})
        err = e.value.body
        assert err["param"] == param and message in err["message"], err
        assert e.value.status_code == 400 and err["type"] == "invalid_request_error"
        # greedy: an unseeded sample of the demo may stop after one token (CI's red run)
        ok = live.client().chat.completions.create(model=MODEL_ID, messages=USER, max_tokens=2,
                                                   temperature=0)
        assert ok.usage.completion_tokens == 2


def test_a_template_without_a_tool_form_refuses_tools(demo_model, monkeypatch):
    from .test_errors import _Templated
    monkeypatch.setattr(demo_model, "tokenizer", _Templated(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"))
    with serving(demo_model) as live:
        with pytest.raises(openai.BadRequestError) as e:
            live.client().chat.completions.create(model=MODEL_ID, messages=USER, tools=TOOLS,
                                                  max_tokens=4)
        assert e.value.body["param"] == "tools" and "no form" in e.value.body["message"]
        # without tools (or with tool_choice "none") it chats
        res = live.client().chat.completions.create(model=MODEL_ID, messages=USER, tools=TOOLS,
                                                    tool_choice="none", max_tokens=2, temperature=0)
        assert res.usage.completion_tokens == 2
