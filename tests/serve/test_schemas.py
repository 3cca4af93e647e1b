"""Request bodies: each field's rule, the defaults, and the one-line errors
naming the field (the server answers them with 400)."""
from __future__ import annotations

import pytest

from muser_torch.serve.sampling import SamplingParams
from muser_torch.serve.schemas import CHAT as CHAT_RULES
from muser_torch.serve.schemas import (COMMON, COMPLETION, RequestError, chat_request,
                                       completion_request, parse_json)

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
TEXT = {"prompt": "def "}


def test_defaults_and_nulls():
    for body in (CHAT, {**CHAT, "temperature": None, "stop": None, "max_tokens": None}):
        req = chat_request(body)
        assert req.params == SamplingParams() and not req.stream and not req.include_usage
    assert completion_request(TEXT).params == SamplingParams()


def test_fields_are_read():
    req = chat_request({**CHAT, "max_tokens": 7, "temperature": 0, "top_p": 0.5, "top_k": 3,
                        "seed": -5, "stop": "x", "logprobs": True, "top_logprobs": 2,
                        "stream": True, "stream_options": {"include_usage": True},
                        "n": 1, "presence_penalty": 0.0, "user": "someone", "metadata": {}})
    assert req.params == SamplingParams(7, 0.0, 0.5, 3, -5, ("x",), True, 2)
    assert req.stream and req.include_usage
    assert chat_request({**CHAT, "max_completion_tokens": 3, "max_tokens": 9}).params.max_tokens == 3
    assert chat_request({**CHAT, "top_k": 0}).params.top_k is None      # 0: off
    req = completion_request({"prompt": [5, 6], "logprobs": 0})
    assert req.prompt == [5, 6] and req.params.logprobs and req.params.top_logprobs == 0
    assert completion_request({"prompt": ["abc"]}).prompt == "abc"


def test_tool_calls_and_tools_are_read():
    call = {"id": "call_1", "type": "function",
            "function": {"name": "f", "arguments": '{"a": [1, "é"]}'}}
    req = chat_request({"messages": [{"role": "user", "content": "hi"},
                                     {"role": "assistant", "content": None, "tool_calls": [call]},
                                     {"role": "tool", "tool_call_id": "call_1", "content": "ok"}],
                        "tools": [{"type": "function", "function": {"name": "f"}}]})
    # the template gets the arguments as a mapping; the tool's parameters default to no properties
    assert req.messages[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"a": [1, "é"]}}}]}
    assert req.tools.choice == "auto" and req.tools.names == ("f",) and req.tools.parallel
    assert req.tools.tools[0]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert chat_request({**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}],
                         "tool_choice": "none"}).tools is None
    assert chat_request(CHAT).tools is None


def test_content_parts_are_joined():
    req = chat_request({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "name": "bot"}]})
    assert req.messages == [{"role": "user", "content": "ab"},
                            {"role": "assistant", "content": "", "name": "bot"}]


BAD = [
    (CHAT | {"max_tokens": "20"}, "max_tokens", "must be an integer, got a string"),
    (CHAT | {"max_tokens": 2.0}, "max_tokens", "must be an integer, got a number"),
    (CHAT | {"max_tokens": True}, "max_tokens", "must be an integer, got a boolean"),
    (CHAT | {"max_tokens": 0}, "max_tokens", "max_tokens must be >= 1, got 0"),
    (CHAT | {"max_tokens": -1}, "max_tokens", "max_tokens must be >= 1, got -1"),
    (CHAT | {"temperature": "hot"}, "temperature", "must be a number"),
    (CHAT | {"temperature": 2.5}, "temperature", "must be in [0.0, 2.0]"),
    (CHAT | {"temperature": float("nan")}, "temperature", "must be in"),
    (CHAT | {"top_p": 0}, "top_p", "must be in (0.0, 1.0]"),
    (CHAT | {"top_k": -1}, "top_k", "top_k must be >= 0, got -1"),
    (CHAT | {"seed": 1 << 64}, "seed", "must be in"),
    (CHAT | {"stop": 5}, "stop", "a string or a list of strings"),
    (CHAT | {"stop": ["a", 5]}, "stop[1]", "must be a string"),
    (CHAT | {"stop": ["a", ""]}, "stop[1]", "stop[1] is empty"),
    (CHAT | {"stop": ["s"] * 17}, "stop", "at most 16"),
    (CHAT | {"stream": "yes"}, "stream", "true or false"),
    (CHAT | {"stream_options": {"include_usage": 1}}, "stream_options.include_usage", "true or false"),
    (CHAT | {"n": 2}, "n", "more than one choice is not supported"),
    (CHAT | {"presence_penalty": 0.5}, "presence_penalty", "not supported"),
    (CHAT | {"logit_bias": {"5": 1}}, "logit_bias", "not supported"),
    (CHAT | {"tools": [{"type": "function"}]}, "tools[0].function", "must be an object"),
    (CHAT | {"tools": {"type": "function"}}, "tools", "must be a list of tools"),
    (CHAT | {"tool_choice": {"type": "function", "function": {}}}, "tool_choice.function.name",
     "is required"),
    (CHAT | {"parallel_tool_calls": "no"}, "parallel_tool_calls", "true or false"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "["
                                                                     * 100_000}}]}]},
     "messages[0].tool_calls[0].function.arguments", "a JSON object as text"),
    (CHAT | {"top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
    (CHAT | {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "must be in [0, 20]"),
    ({}, "messages", "messages is required"),
    ({"messages": []}, "messages", "messages is empty"),
    ({"messages": "hi"}, "messages", "must be a list of messages"),
    ({"messages": [{"content": "hi"}]}, "messages[0]", "messages[0] has no role"),
    ({"messages": [{"role": 1, "content": "hi"}]}, "messages[0].role", "must be a string"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "a string, a list"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "messages[0].content[0]",
     "only text, image_url and video_url parts"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0].image_url.url", "must be a string"),
    ({"messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "data:video/webm;base64,AA=="}}]}]},
     "messages[0].content[0].video_url.url", "needs a video codec"),
    (CHAT | {"media_io_kwargs": [2]}, "media_io_kwargs", "must be an object"),
    (CHAT | {"media_io_kwargs": {"image": {}}}, "media_io_kwargs", "only video.fps is taken, got image"),
    (CHAT | {"media_io_kwargs": {"video": {"fps": "2"}}}, "media_io_kwargs.video.fps", "must be a number"),
    (CHAT | {"media_io_kwargs": {"video": {"fps": -1}}}, "media_io_kwargs.video.fps", "finite number > 0"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]},
     "messages[0].content[0].image_url.url", "only data: URLs"),
    ({"prompt": 5}, "prompt", "a string or a list of token ids"),
    ({"prompt": ["a", "b"]}, "prompt", "one prompt per request"),
    ({"prompt": [1, "a"]}, "prompt", "one prompt per request"),
    ({"prompt": [1, 2.5]}, "prompt[1]", "must be an integer"),
    (TEXT | {"logprobs": True}, "logprobs", "must be an integer, got a boolean"),
    (TEXT | {"logprobs": 6}, "logprobs", "must be in [0, 5]"),
    (TEXT | {"echo": True}, "echo", "echo is not supported"),
]


@pytest.mark.parametrize("body,param,message", BAD, ids=[f"{p}:{m}" for _, p, m in BAD])
def test_bad_fields_name_themselves(body, param, message):
    parse = chat_request if "prompt" not in body else completion_request
    with pytest.raises(RequestError) as e:
        parse(body)
    assert e.value.status == 400 and message in str(e.value)
    assert e.value.param == param
    assert "\n" not in str(e.value) and "None" not in str(e.value)


def test_no_refusal_names_none():
    """Every rule of every field refuses a wrong value with a RequestError
    whose message never shows an open bound as None."""
    for table in (COMMON, CHAT_RULES, COMPLETION):
        for name, rule in table.items():
            for v in (-10 ** 30, 10 ** 30, -1, -1.5, float("inf"), None, "x", [None], {"a": None}):
                try:
                    rule(v, name)
                except RequestError as e:
                    assert "None" not in str(e), (name, v, str(e))


@pytest.mark.parametrize("body,message", [(b"{", "not valid JSON"), (b"\xff", "not valid JSON"),
                                          (b"[1]", "must be a JSON object, got an array"),
                                          (b"[" * 100000, "not valid JSON")])
def test_bodies_that_are_not_json_objects(body, message):
    with pytest.raises(RequestError, match=message):
        parse_json(body)
