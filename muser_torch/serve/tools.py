"""Tool calls: which form a model writes them in, and the grammar that makes
it write one.

A chat template shows the model its tools and its past calls in the form
the model was trained on; the answer then writes new calls in that same
form. A ``Family`` is one such form:

- ``HERMES`` (ChatML models: Qwen 2.5 and 3, Hermes, the default template):
  each call is ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  any number of them, text around them allowed;
- ``LLAMA3`` (Llama 3.1 to 3.3's JSON form): the whole answer is one
  ``{"name": ..., "parameters": {...}}``.

The family is read off the template's source by the text it writes for a
call (``family_of``): what a template writes is what its model was trained
to write back. A template that writes neither form is refused for tools
(``None``); a file with no template gets the default ChatML, whose tools
the server itself writes in Hermes' form (``chatml_tools``).

``tool_grammar`` is the Lark grammar (llguidance's dialect, with ``%json``
for the call objects) that ``tool_choice: "required"`` or a named function
imposes: the answer is then only valid calls of the allowed functions, with
arguments following each one's ``parameters`` schema.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Sequence

from .grammar import COMPACT
from .schemas import ToolRequest


@dataclass(frozen=True)
class Family:
    """One form of tool calls. ``open`` / ``close``: the text around each
    call (None: the whole answer is the call); ``keys``: the names a call's
    arguments object may go by, the first the one the grammar writes."""
    name: str
    open: str | None
    close: str | None
    keys: tuple[str, ...]
    parallel: bool      # whether the form holds more than one call per answer


HERMES = Family("hermes", "<tool_call>", "</tool_call>", ("arguments",), True)
# Meta's documents of Llama 3.1 name the arguments "parameters"; the models
# also write "arguments" at times, so the parser takes both
LLAMA3 = Family("llama3", None, None, ("parameters", "arguments"), False)
FAMILIES = (HERMES, LLAMA3)


def family_of(template: str | None) -> Family | None:
    """The form of calls a chat template writes; None for a template that
    writes none of the known ones (its tools cannot be offered)."""
    if template is None:                # the default ChatML: the server writes Hermes' form
        return HERMES
    if HERMES.open in template and HERMES.close in template:
        return HERMES
    # Llama 3's header markup, and a call written as JSON with "parameters"
    if "<|start_header_id|>" in template and '"parameters"' in template:
        return LLAMA3
    return None


def call_schema(family: Family, tools: Sequence[dict]) -> dict:
    """The JSON schema of one call object of any of ``tools``: its name, then
    its arguments following the function's ``parameters``."""
    key = family.keys[0]
    alternatives = [{"type": "object",
                     "properties": {"name": {"const": t["function"]["name"]},
                                    key: t["function"]["parameters"]},
                     "required": ["name", key], "additionalProperties": False}
                    for t in tools]
    return alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}


def tool_grammar(family: Family, req: ToolRequest, is_special: Callable[[str], bool]) -> str:
    """The Lark grammar of an answer that is only calls (``req.constrained``):
    one call of ``req.name`` for a named function; for "required", one call,
    or several where both the request (``parallel_tool_calls``) and the form
    allow it. ``is_special(text)``: whether the vocabulary has ``text`` as one
    special token (Qwen's ``<tool_call>``), which the grammar then names as a
    token; elsewhere the marks are plain text."""
    tools = [t for t in req.tools if req.choice != "function" or t["function"]["name"] == req.name]
    schema = {**call_schema(family, tools), "x-guidance": COMPACT}
    rules = [f"body: %json {json.dumps(schema)}"]
    if family.open is None:
        rules.insert(0, "start: body")
        return "\n".join(rules) + "\n"
    many = req.choice == "required" and req.parallel and family.parallel

    def mark(text: str) -> str:
        return text if is_special(text) else json.dumps(text)
    rules.insert(0, f'call: {mark(family.open)} "\\n" body "\\n" {mark(family.close)}')
    rules.insert(0, 'start: call ("\\n" call)*' if many else "start: call")
    return "\n".join(rules) + "\n"


def chatml_tools(tools: Sequence[dict]) -> str:
    """What the default ChatML template's system turn says of ``tools``, in
    Hermes' form (our words; the form is the one Qwen's templates teach)."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (f"# Tools\n\nFunctions you may call, one signature a line:\n<tools>\n{lines}\n</tools>"
            "\n\nTo call one, write its name and arguments as JSON in a block:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def chatml_call(call: dict) -> str:
    """A past call (``schemas._tool_calls``'s shape) as the default ChatML writes it."""
    fn = call["function"]
    body = json.dumps({"name": fn["name"], "arguments": fn["arguments"]}, ensure_ascii=False)
    return f"{HERMES.open}\n{body}\n{HERMES.close}"
