"""The request bodies of ``/v1/chat/completions`` and ``/v1/completions``,
checked field by field into ``ChatRequest`` / ``CompletionRequest``.

Each field's rule lives once, in ``COMMON`` (both endpoints), ``CHAT`` or
``COMPLETION``. A field sent as null means its default. A field of the
wrong type or out of its range is a ``RequestError`` (400) naming it. A
field the server does not implement is accepted only at its neutral value
(``n`` 1, penalties 0, ...), so no request is silently answered
as something it did not ask for; any other unknown field is ignored, as
OpenAI clients send extras (``user``, ``metadata``, ...). Tools are checked
here as OpenAI describes them (``tool_specs``, ``tool_choice``); what the
model makes of them is ``tools.py``'s.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass, replace
from typing import Any, Callable

from ..text.special import SLOT
from ..vision.prompt import IMAGE_MARK
from ..vision.video import MAX_FRAMES
from ..vision.video_files import FRAME_RATE
from .sampling import SamplingParams

# The seeds torch.Generator.manual_seed takes.
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)
MAX_STOP_STRINGS = 16
VIDEO_FRAMES_TYPE = "video/jpeg"   # vLLM's media type of a data URL holding a video's frames
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


@dataclass(frozen=True)
class VideoFrames:
    """A ``video_url`` part's frames, each an image's bytes, in order."""
    frames: tuple[bytes, ...]


class Messages(list):
    """Checked messages, and their image and video parts in order (``visuals``:
    an image's bytes, a video's ``VideoFrames``): each part's place in its
    message's text holds ``special.SLOT``, which the prompt fills with
    ``IMAGE_MARK`` as markup, later replaced by the part's block."""
    visuals: "tuple[bytes | VideoFrames, ...]" = ()


def chat_messages(v: Any, name: str) -> list[dict]:
    """Messages as the template reads them: role, text content (a string, or
    text, image and video parts joined, an image or video as ``special.SLOT``),
    name / tool_call_id when given, and an assistant's ``tool_calls``
    (``_tool_calls``); the images and videos in ``Messages.visuals``."""
    _kind(v, name, (list,), "a list of messages")
    if not v:
        raise RequestError(f"{name} is empty: a chat needs at least one message", param=name)
    out, visuals = Messages(), []
    for i, m in enumerate(v):
        where = f"{name}[{i}]"
        _kind(m, where, (dict,), "an object with 'role' and 'content'")
        if "role" not in m:
            raise RequestError(f"{where} has no role", param=where)
        text, mine = _content(m.get("content"), f"{where}.content")
        visuals += mine
        plain = {"role": string(m["role"], f"{where}.role"), "content": text}
        for key in ("name", "tool_call_id"):
            if m.get(key) is not None:
                plain[key] = string(m[key], f"{where}.{key}")
        if m.get("tool_calls") is not None:
            plain["tool_calls"] = _tool_calls(m["tool_calls"], f"{where}.tool_calls")
        out.append(plain)
    out.visuals = tuple(visuals)
    return out


def _tool_calls(v: Any, name: str) -> list[dict]:
    """An assistant message's calls, for the template: OpenAI sends each
    call's arguments as JSON text; templates written for transformers read
    them as a mapping (``arguments | tojson``, ``arguments.items()``), so they
    go in parsed, as llama.cpp's and vLLM's servers pass them too."""
    _kind(v, name, (list,), "a list of tool calls")
    out = []
    for i, call in enumerate(v):
        where = f"{name}[{i}]"
        _kind(call, where, (dict,), "an object with 'id', 'type' and 'function'")
        if call.get("type", "function") != "function":
            raise RequestError(f"{where}.type must be 'function'", param=f"{where}.type")
        fn = _kind(call.get("function"), f"{where}.function", (dict,),
                   "an object with 'name' and 'arguments'")
        text = string(fn.get("arguments", "{}"), f"{where}.function.arguments")
        try:
            arguments = json.loads(text)
        except (ValueError, RecursionError):
            arguments = None
        if not isinstance(arguments, dict):
            raise RequestError(f"{where}.function.arguments must be a JSON object as text, got "
                               f"{json.dumps(text)[:60]}", param=f"{where}.function.arguments")
        plain = {"type": "function", "function": {
            "name": _function_name(fn.get("name"), f"{where}.function.name"),
            "arguments": arguments}}
        if call.get("id") is not None:
            plain["id"] = string(call["id"], f"{where}.id")
        out.append(plain)
    return out


# OpenAI's rule for a function's name
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _function_name(v: Any, name: str) -> str:
    if v is None:
        raise RequestError(f"{name} is required", param=name)
    if not FUNCTION_NAME.fullmatch(string(v, name)):
        raise RequestError(f"{name} must be 1 to 64 letters, digits, '_' or '-', got "
                           f"{json.dumps(v)[:70]}", param=name)
    return v


def tool_specs(v: Any, name: str) -> tuple[dict, ...]:
    """``tools``: functions, each ``{"type": "function", "function": {"name",
    "description", "parameters", "strict"}}``, returned in that shape with
    ``parameters`` (default: an object of no properties) checked as a JSON
    schema of an object."""
    _kind(v, name, (list,), "a list of tools")
    out, seen = [], set()
    for i, tool in enumerate(v):
        where = f"{name}[{i}]"
        _kind(tool, where, (dict,), "an object with 'type' and 'function'")
        if tool.get("type") != "function":
            got = "it has none" if tool.get("type") is None else \
                f"got {json.dumps(tool.get('type'))[:40]}"
            raise RequestError(f"{where}.type must be 'function' (the only kind of tool); {got}",
                               param=f"{where}.type")
        fn = _kind(tool.get("function"), f"{where}.function", (dict,),
                   "an object with 'name' and 'parameters'")
        fname = _function_name(fn.get("name"), f"{where}.function.name")
        if fname in seen:
            raise RequestError(f"{where}.function.name: {fname!r} names two tools",
                               param=f"{where}.function.name")
        seen.add(fname)
        spec: dict[str, Any] = {"name": fname}
        if fn.get("description") is not None:
            spec["description"] = string(fn["description"], f"{where}.function.description")
        spec["parameters"] = _object_schema(fn.get("parameters", {"type": "object", "properties": {}}),
                                            f"{where}.function.parameters")
        if fn.get("strict") is not None:
            spec["strict"] = boolean(fn["strict"], f"{where}.function.strict")
        out.append({"type": "function", "function": spec})
    return tuple(out)


def _object_schema(v: Any, name: str) -> dict:
    """A JSON schema of an object, as far as its shape tells: an object whose
    ``type`` (when given) is "object", ``properties`` an object of schemas,
    ``required`` a list of names. What llguidance cannot compile is refused
    where a grammar is built (``tool_choice`` "required" or a function)."""
    _kind(v, name, (dict,), "a JSON schema (an object)")
    if v.get("type", "object") != "object":
        raise RequestError(f"{name} must be a JSON schema of type 'object', got type "
                           f"{json.dumps(v.get('type'))[:40]}", param=name)
    props = v.get("properties", {})
    _kind(props, f"{name}.properties", (dict,), "an object of JSON schemas")
    for key, sub in props.items():
        _kind(sub, f"{name}.properties.{key}", (dict, bool), "a JSON schema")
    required = _kind(v.get("required", []), f"{name}.required", (list,), "a list of names")
    for i, key in enumerate(required):
        string(key, f"{name}.required[{i}]")
    return v


@dataclass(frozen=True)
class ToolChoice:
    """``mode``: "none", "auto", "required" or "function" (then ``name``)."""
    mode: str
    name: str | None = None


TOOL_MODES = ("none", "auto", "required")


def tool_choice(v: Any, name: str) -> ToolChoice:
    if isinstance(v, str):
        if v not in TOOL_MODES:
            raise RequestError(f"{name} must be 'none', 'auto', 'required' or "
                               f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got "
                               f"{json.dumps(v)[:40]}", param=name)
        return ToolChoice(v)
    _kind(v, name, (dict, str), "a string or an object naming a function")
    if v.get("type") != "function":
        raise RequestError(f"{name}.type must be 'function'", param=f"{name}.type")
    fn = _kind(v.get("function"), f"{name}.function", (dict,), "an object with 'name'")
    return ToolChoice("function", _function_name(fn.get("name"), f"{name}.function.name"))


@dataclass(frozen=True)
class ToolRequest:
    """The tools a chat offers (OpenAI's shape, checked) and what it asks of
    them: ``choice`` "auto" (calls parsed when the model writes them),
    "required" (at least one call, by grammar) or "function" (one call of
    ``name``); ``parallel``: more than one call allowed."""
    tools: tuple[dict, ...]
    choice: str
    name: str | None = None
    parallel: bool = True

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t["function"]["name"] for t in self.tools)

    @property
    def constrained(self) -> bool:
        return self.choice in ("required", "function")


def _text(v: Any, name: str) -> str:
    text = string(v, name)
    if SLOT in text:
        raise RequestError(f"{name} holds U+{ord(SLOT):04X}, a Unicode noncharacter reserved here "
                           f"for an image's or a video's place", param=name)
    return text


def _content(v: Any, name: str) -> tuple[str, list]:
    """A message's text, an image or video part as ``SLOT`` (the prompt's stand-in
    markup goes there, ``prompts.chat_prompt``), and the parts' media in order."""
    if v is None or isinstance(v, str):
        return _text(v, name) if v else "", []
    _kind(v, name, (list,), "a string, a list of text, image_url and video_url parts or null")
    texts, visuals = [], []
    for i, part in enumerate(v):
        where = f"{name}[{i}]"
        _kind(part, where, (dict,), "a content part object")
        kind = part.get("type")
        if kind == "text":
            texts.append(_text(part.get("text"), f"{where}.text"))
        elif kind == "image_url":
            visuals.append(_image_bytes(part.get("image_url"), f"{where}.image_url"))
            texts.append(SLOT)
        elif kind == "video_url":
            visuals.append(_video_frames(part.get("video_url"), f"{where}.video_url"))
            texts.append(SLOT)
        else:
            raise RequestError(f"{where}: only text, image_url and video_url parts are supported, got "
                               f"type {kind!r}", param=where)
    return "".join(texts), visuals


def _data_url(v: Any, name: str, example: str) -> tuple[str, str]:
    """A part's ``data:<media type>;base64,<data>`` URL as (media type, data)."""
    url = string(v.get("url") if isinstance(v, dict) else v, f"{name}.url")
    if not url.startswith("data:"):
        raise RequestError(f"{name}.url: only data: URLs ({example}) are taken; the server fetches "
                           f"nothing from the network, got {url[:40]!r}", param=f"{name}.url")
    head, sep, data = url.partition(",")
    if not sep or not head.endswith(";base64"):
        raise RequestError(f"{name}.url: expected data:<media type>;base64,<data>", param=f"{name}.url")
    return head[len("data:"):-len(";base64")].split(";")[0].strip().lower(), data


def _base64(data: str, name: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(f"{name}: the data is not valid base64", param=name) from None


def _image_bytes(v: Any, name: str) -> bytes:
    """An image_url part's bytes: a ``data:<type>;base64,<data>`` URL only."""
    _, data = _data_url(v, name, "data:image/png;base64,...")
    return _base64(data, f"{name}.url")


def _video_frames(v: Any, name: str) -> VideoFrames:
    """A video_url part's frames: vLLM's ``data:video/jpeg;base64,<frame>,<frame>,...``,
    each frame an image's base64 (any format Pillow reads), at most
    ``MAX_FRAMES``. A video file (mp4, webm, ...) needs a codec the server
    does not have: its frames must be extracted first."""
    kind, data = _data_url(v, name, "data:video/jpeg;base64,<frame>,<frame>,...")
    if kind != VIDEO_FRAMES_TYPE:
        raise RequestError(f"{name}.url: a {kind or 'typeless'} video needs a video codec, which the "
                           f"server does not have; send its frames, extracted, as "
                           f"data:{VIDEO_FRAMES_TYPE};base64,<frame>,<frame>,... (each frame an "
                           f"image's base64)", param=f"{name}.url")
    parts = data.split(",")
    if len(parts) > MAX_FRAMES:
        raise RequestError(f"{name}.url: {len(parts)} frames, more than the {MAX_FRAMES} a video "
                           f"takes; send frames sampled from the clip", param=f"{name}.url")
    for i, part in enumerate(parts):
        if not part:
            raise RequestError(f"{name}.url: frame {i} is empty", param=f"{name}.url")
    return VideoFrames(tuple(_base64(p, f"{name}.url frame {i}") for i, p in enumerate(parts)))


def media_io_kwargs(v: Any, name: str) -> float:
    """vLLM's ``{"video": {"fps": F}}``: the rate of every video_url part's frames
    (frame i at i / F seconds); the only setting taken."""
    _kind(v, name, (dict,), 'an object such as {"video": {"fps": 2}}')
    extra = sorted(set(v) - {"video"})
    video = _kind(v.get("video", {}), f"{name}.video", (dict,), 'an object such as {"fps": 2}')
    extra += [f"video.{k}" for k in sorted(set(video) - {"fps"})]
    if extra:
        raise RequestError(f"{name}: only video.fps is taken, got {', '.join(extra)}", param=name)
    fps = video.get("fps", FRAME_RATE)
    _kind(fps, f"{name}.video.fps", (int, float), "a number")
    if not (math.isfinite(fps) and fps > 0):
        raise RequestError(f"{name}.video.fps must be a finite number > 0, got {fps}",
                           param=f"{name}.video.fps")
    return float(fps)


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
    "tools": tool_specs,
    "tool_choice": tool_choice,
    "parallel_tool_calls": boolean,
    "response_format": response_format,
    "media_io_kwargs": media_io_kwargs,
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
    tools: ToolRequest | None = None     # None: no tools offered, or tool_choice "none"
    video_fps: float = FRAME_RATE        # media_io_kwargs' video.fps: the rate of video_url frames


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
    return ChatRequest(f["messages"], params, f.get("stream", False), f.get("stream_options", False),
                       _tool_request(f), f.get("media_io_kwargs", FRAME_RATE))


def _tool_request(f: dict) -> ToolRequest | None:
    """The tools and tool_choice of checked fields, checked against each other
    (OpenAI's defaults: "auto" with tools, "none" without)."""
    tools = f.get("tools", ())
    choice = f.get("tool_choice", ToolChoice("auto" if tools else "none"))
    if choice.mode in ("required", "function") and not tools:
        raise RequestError(f"tool_choice {choice.name or choice.mode!r} needs tools, and none "
                           f"are given", param="tool_choice")
    names = [t["function"]["name"] for t in tools]
    if choice.mode == "function" and choice.name not in names:
        raise RequestError(f"tool_choice names function {choice.name!r}, which is not among "
                           f"the tools ({', '.join(names)})", param="tool_choice")
    if choice.mode in ("required", "function") and f.get("response_format") is not None:
        raise RequestError(f"tool_choice {choice.name or choice.mode!r} and a JSON response_format "
                           f"would both constrain the answer; ask for one", param="tool_choice")
    if choice.mode == "none" or not tools:
        return None
    return ToolRequest(tools, choice.mode, choice.name, f.get("parallel_tool_calls", True))


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
