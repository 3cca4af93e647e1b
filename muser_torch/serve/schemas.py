"""The request bodies of ``/v1/chat/completions`` and ``/v1/completions``,
checked field by field into ``ChatRequest`` / ``CompletionRequest``.

Each field's rule lives once, in ``COMMON`` (both endpoints), ``CHAT`` or
``COMPLETION``. A field sent as null means its default. A field of the
wrong type or out of its range is a ``RequestError`` (400) naming it. A
field the server does not implement is accepted only at its neutral value
(``n`` 1, penalties 0, no tools, ...), so no request is silently answered
as something it did not ask for; any other unknown field is ignored, as
OpenAI clients send extras (``user``, ``metadata``, ...).
"""
from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass, replace
from typing import Any, Callable

from ..vision.prompt import IMAGE_MARK
from .sampling import SamplingParams

# The seeds torch.Generator.manual_seed takes.
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)
MAX_STOP_STRINGS = 16
MAX_TOP_LOGPROBS = 20            # chat: OpenAI's bound
MAX_COMPLETION_LOGPROBS = 5      # completions: OpenAI's bound


class RequestError(ValueError):
    """A bad request (400 unless ``status`` says otherwise); ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


Rule = Callable[[Any, str], Any]


def _kind(value: Any, name: str, kinds: tuple[type, ...], what: str) -> Any:
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise RequestError(f"{name} must be {what}, got {_json_type(value)}", param=name)
    return value


def integer(low: int | None = None, high: int | None = None) -> Rule:
    def check(v: Any, name: str) -> int:
        _kind(v, name, (int,), "an integer")
        if (low is not None and v < low) or (high is not None and v > high):
            # an open side is left unsaid: ">= 1", never "[1, None]"
            span = (f"in [{low}, {high}]" if low is not None and high is not None
                    else f">= {low}" if low is not None else f"<= {high}")
            raise RequestError(f"{name} must be {span}, got {v}", param=name)
        return v
    return check


def number(low: float, high: float, low_open: bool = False) -> Rule:
    def check(v: Any, name: str) -> float:
        _kind(v, name, (int, float), "a number")
        if not math.isfinite(v) or v < low or v > high or (low_open and v == low):
            span = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
            raise RequestError(f"{name} must be in {span}, got {v}", param=name)
        return float(v)
    return check


def boolean(v: Any, name: str) -> bool:
    return _kind(v, name, (bool,), "true or false")


def string(v: Any, name: str) -> str:
    return _kind(v, name, (str,), "a string")


def stop_strings(v: Any, name: str) -> tuple[str, ...]:
    items = [v] if isinstance(v, str) else _kind(v, name, (list,), "a string or a list of strings")
    if len(items) > MAX_STOP_STRINGS:
        raise RequestError(f"{name} takes at most {MAX_STOP_STRINGS} strings, got {len(items)}",
                           param=name)
    for i, s in enumerate(items):
        if not string(s, f"{name}[{i}]"):
            raise RequestError(f"{name}[{i}] is empty", param=f"{name}[{i}]")
    return tuple(items)


def stream_options(v: Any, name: str) -> bool:
    """``{"include_usage": bool}`` -> include_usage."""
    _kind(v, name, (dict,), "an object")
    return bool(boolean(v.get("include_usage", False), f"{name}.include_usage"))


def only(*neutral: Any, what: str) -> Rule:
    """A feature not implemented: accepted only at one of its neutral values."""
    def check(v: Any, name: str) -> Any:
        if not any(_same(v, n) for n in neutral):
            raise RequestError(f"{name}: {what} is not supported", param=name)
        return v
    return check


def _same(v: Any, n: Any) -> bool:
    if isinstance(v, bool) or isinstance(n, bool):
        return v is n
    return type(v) is type(n) and v == n or (isinstance(v, (int, float)) and
                                             isinstance(n, (int, float)) and v == n)


class Messages(list):
    """Checked messages, and the bytes of their images in order (``images``):
    each image part's place in its message's text holds ``IMAGE_MARK``."""
    images: tuple[bytes, ...] = ()




def chat_messages(v: Any, name: str) -> list[dict]:
    """Messages as the template reads them: role, text content (a string, or
    text and image parts joined, an image as ``IMAGE_MARK``), and name /
    tool_call_id when given; the images' bytes in ``Messages.images``."""
    _kind(v, name, (list,), "a list of messages")
    if not v:
        raise RequestError(f"{name} is empty: a chat needs at least one message", param=name)
    out, images = Messages(), []
    for i, m in enumerate(v):
        where = f"{name}[{i}]"
        _kind(m, where, (dict,), "an object with 'role' and 'content'")
        if "role" not in m:
            raise RequestError(f"{where} has no role", param=where)
        text, mine = _content(m.get("content"), f"{where}.content")
        images += mine
        plain = {"role": string(m["role"], f"{where}.role"), "content": text}
        for key in ("name", "tool_call_id"):
            if m.get(key) is not None:
                plain[key] = string(m[key], f"{where}.{key}")
        out.append(plain)
    out.images = tuple(images)
    return out


def _content(v: Any, name: str) -> tuple[str, list[bytes]]:
    if v is None or isinstance(v, str):
        return v or "", []
    _kind(v, name, (list,), "a string, a list of text and image_url parts or null")
    texts, images = [], []
    for i, part in enumerate(v):
        where = f"{name}[{i}]"
        _kind(part, where, (dict,), "a content part object")
        kind = part.get("type")
        if kind == "text":
            texts.append(string(part.get("text"), f"{where}.text"))
        elif kind == "image_url":
            images.append(_image_bytes(part.get("image_url"), f"{where}.image_url"))
            texts.append(IMAGE_MARK)
        else:
            raise RequestError(f"{where}: only text and image_url parts are supported, got type "
                               f"{kind!r}", param=where)
    return "".join(texts), images


def _image_bytes(v: Any, name: str) -> bytes:
    """An image_url part's bytes: a ``data:<type>;base64,<data>`` URL only."""
    url = string(v.get("url") if isinstance(v, dict) else v, f"{name}.url")
    if not url.startswith("data:"):
        raise RequestError(f"{name}.url: only data: URLs (data:image/png;base64,...) are taken; the "
                           f"server fetches nothing from the network, got {url[:40]!r}",
                           param=f"{name}.url")
    head, sep, data = url.partition(",")
    if not sep or not head.endswith(";base64"):
        raise RequestError(f"{name}.url: expected data:<media type>;base64,<data>", param=f"{name}.url")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(f"{name}.url: the data is not valid base64", param=f"{name}.url") from None


def response_format(v: Any, name: str) -> str | None:
    """The JSON schema a response must follow, as JSON text (None: free text).
    ``{"type": "json_object"}`` is any JSON object; ``{"type": "json_schema",
    "json_schema": {"name", "schema", "strict"}}`` the schema given."""
    _kind(v, name, (dict,), "an object with a 'type'")
    kind = v.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return json.dumps({"type": "object"})
    if kind != "json_schema":
        got = "it has none" if kind is None else f"got {_json_type(kind)} {json.dumps(kind)[:40]}"
        raise RequestError(f"{name}.type must be 'text', 'json_object' or 'json_schema'; {got}",
                           param=f"{name}.type")
    spec = _kind(v.get("json_schema"), f"{name}.json_schema", (dict,),
                 "an object with 'name' and 'schema'")
    string(spec.get("name"), f"{name}.json_schema.name")
    schema = spec.get("schema", {})
    _kind(schema, f"{name}.json_schema.schema", (dict, bool), "a JSON schema (an object)")
    return json.dumps(schema)


def completion_prompt(v: Any, name: str) -> str | list[int]:
    """A string, a list of token ids, or a list of one string."""
    if isinstance(v, str):
        return v
    _kind(v, name, (list,), "a string or a list of token ids")
    if len(v) == 1 and isinstance(v[0], str):
        return v[0]
    if any(isinstance(x, str) for x in v):
        raise RequestError(f"{name}: one prompt per request (a list of several strings is "
                           f"not supported)", param=name)
    return [integer()(x, f"{name}[{i}]") for i, x in enumerate(v)]


# field -> its rule; one table per endpoint, COMMON in both
COMMON: dict[str, Rule] = {
    "model": string,
    "max_tokens": integer(1),
    "temperature": number(0.0, 2.0),
    "top_p": number(0.0, 1.0, low_open=True),
    "top_k": integer(0),                         # 0: off (llama.cpp's convention)
    "seed": integer(*SEED_RANGE),
    "stop": stop_strings,
    "stream": boolean,
    "stream_options": stream_options,
    "n": only(1, what="more than one choice"),
    "best_of": only(1, what="best_of"),
    "presence_penalty": only(0, what="a presence penalty"),
    "frequency_penalty": only(0, what="a frequency penalty"),
    "logit_bias": only({}, what="logit_bias"),
}
CHAT: dict[str, Rule] = {
    "messages": chat_messages,
    "max_completion_tokens": integer(1),
    "logprobs": boolean,
    "top_logprobs": integer(0, MAX_TOP_LOGPROBS),
    "tools": only([], what="tool calling"),
    "tool_choice": only("none", what="tool calling"),
    "response_format": response_format,
}
COMPLETION: dict[str, Rule] = {
    "prompt": completion_prompt,
    "logprobs": integer(0, MAX_COMPLETION_LOGPROBS),
    "echo": only(False, what="echo"),
    "suffix": only("", what="suffix"),
}


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict]
    params: SamplingParams
    stream: bool
    include_usage: bool


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str | list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool


def parse_json(body: bytes) -> dict:
    """The request body as a JSON object."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:   # UnicodeDecodeError included
        raise RequestError(f"the request body is not valid JSON: {_one_line(e)}") from None
    if not isinstance(data, dict):
        raise RequestError(f"the request body must be a JSON object, got {_json_type(data)}")
    return data


def chat_request(data: dict) -> ChatRequest:
    f = _checked(data, COMMON | CHAT, required=("messages",))
    top = f.get("top_logprobs", 0)
    if top and not f.get("logprobs"):
        raise RequestError("top_logprobs needs logprobs: true", param="top_logprobs")
    max_tokens = f.get("max_completion_tokens", f.get("max_tokens"))
    params = replace(_params(f, max_tokens, f.get("logprobs", False), top),
                     json_schema=f.get("response_format"))
    return ChatRequest(f["messages"], params, f.get("stream", False), f.get("stream_options", False))


def completion_request(data: dict) -> CompletionRequest:
    f = _checked(data, COMMON | COMPLETION, required=("prompt",))
    n = f.get("logprobs")
    return CompletionRequest(f["prompt"], _params(f, f.get("max_tokens"), n is not None, n or 0),
                             f.get("stream", False), f.get("stream_options", False))


def _checked(data: dict, rules: dict[str, Rule], required: tuple[str, ...]) -> dict:
    for name in required:
        if data.get(name) is None:
            raise RequestError(f"{name} is required", param=name)
    return {k: rule(data[k], k) for k, rule in rules.items() if data.get(k) is not None}


def _params(f: dict, max_tokens: int | None, logprobs: bool, top: int) -> SamplingParams:
    top_k = f.get("top_k") or None
    return SamplingParams(max_tokens=max_tokens, temperature=f.get("temperature", 1.0),
                          top_p=f.get("top_p", 1.0), top_k=top_k, seed=f.get("seed"),
                          stop=f.get("stop", ()), logprobs=logprobs, top_logprobs=top)


def _json_type(v: Any) -> str:
    for kind, name in ((bool, "a boolean"), (int, "an integer"), (float, "a number"),
                       (str, "a string"), (list, "an array"), (dict, "an object")):
        if isinstance(v, kind):
            return name
    return "null" if v is None else type(v).__name__


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:200]
