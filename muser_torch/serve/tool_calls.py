"""The model's answer text split into content and OpenAI ``tool_calls``, as
it streams (``CallParser``) or whole (``parse``), per ``tools.Family``.

A call counts only when it is whole and valid: a JSON object whose
``name`` is one of the request's functions and whose arguments (under one
of the family's keys; absent means none) are an object, or JSON text of
one. Anything else the model wrote, a malformed or unfinished call
included, stays in the content as it was written, so nothing is lost.

Content is released as soon as it cannot be part of a call:

- Hermes: text outside ``<tool_call>`` ... ``</tool_call>``; a tail that may
  begin the opening mark waits, and each call is released when its block
  closes;
- Llama 3: an answer whose first non-blank character is ``{`` waits for its
  end and is a call if it parses as one (or several, separated by ``;``);
  any other answer is content as it streams.

Blank text next to a call (the newline between two blocks, the one before
the first) is not content; an answer with calls and no other text has
content null, as OpenAI's have.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

from .tools import Family

__all__ = ["ToolCall", "CallParser", "parse"]


@dataclass(frozen=True)
class ToolCall:
    """One call: ``arguments`` is JSON text of an object (OpenAI's shape)."""
    id: str
    name: str
    arguments: str


Out = str | ToolCall      # what the parser releases: content text, or a call


def _new_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class CallParser:
    """One answer's parser: ``feed`` each piece of text as it settles, then
    ``finish``; each returns what became certain, in order."""

    def __init__(self, family: Family, names: Sequence[str]) -> None:
        self.family = family
        self.names = frozenset(names)
        self.calls = 0
        self._buf = ""            # text not yet released
        self._in_call = False     # Hermes: inside an open block
        self._blank = ""          # blank text held back (it may touch a call)
        self._after_call = False  # the last thing released was a call
        self._whole: bool | None = None   # Llama 3: the answer is JSON (decided at its first mark)

    def feed(self, text: str) -> list[Out]:
        self._buf += text
        out: list[Out] = []
        if self.family.open is None:
            self._feed_whole(out)
        else:
            self._feed_marked(out)
        return out

    def finish(self) -> list[Out]:
        out: list[Out] = []
        if self.family.open is None:
            if self._whole:
                calls = self._json_calls(self._buf)
                if calls is None:
                    self._content(out, self._buf)
                else:
                    self._calls(out, calls)
            else:
                self._content(out, self._buf)
        else:
            self._content(out, (self.family.open if self._in_call else "") + self._buf)
        self._buf, self._in_call = "", False
        if self._blank and not self.calls:     # blank text at the end of a plain answer stays
            out.append(self._blank)
        self._blank = ""
        return out

    # -- Llama 3: the whole answer ---------------------------------------------------------

    def _feed_whole(self, out: list[Out]) -> None:
        if self._whole is None:
            stripped = self._buf.lstrip()
            if not stripped:
                return
            self._whole = stripped.startswith("{")
        if not self._whole:
            self._content(out, self._buf)
            self._buf = ""

    def _json_calls(self, text: str) -> list[ToolCall] | None:
        """The calls ``text`` holds as JSON objects separated by blanks or ``;``,
        or None when it is anything else."""
        decoder = json.JSONDecoder()
        calls, i = [], 0
        while True:
            while i < len(text) and (text[i].isspace() or (text[i] == ";" and calls)):
                i += 1
            if i == len(text):
                return calls or None
            try:
                obj, i = decoder.raw_decode(text, i)
            except (ValueError, RecursionError):   # deep nesting is not a call
                return None
            call = self._call(obj)
            if call is None:
                return None
            calls.append(call)

    # -- Hermes: marked blocks ---------------------------------------------------------------

    def _feed_marked(self, out: list[Out]) -> None:
        opening, closing = self.family.open, self.family.close
        while True:
            if not self._in_call:
                i = self._buf.find(opening)
                if i < 0:
                    keep = _partial_suffix(self._buf, opening)
                    self._content(out, self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    return
                self._content(out, self._buf[:i])
                self._buf, self._in_call = self._buf[i + len(opening):], True
            j = self._buf.find(closing)
            if j < 0:
                return
            body, self._buf, self._in_call = self._buf[:j], self._buf[j + len(closing):], False
            call = self._body_call(body)
            if call is None:
                self._content(out, opening + body + closing)
            else:
                self._calls(out, [call])

    def _body_call(self, body: str) -> ToolCall | None:
        try:
            return self._call(json.loads(body))
        except (ValueError, RecursionError):
            return None

    # -- both ---------------------------------------------------------------------------------

    def _call(self, obj: Any) -> ToolCall | None:
        """A call of one of the request's functions, or None."""
        if not isinstance(obj, dict) or obj.get("name") not in self.names:
            return None
        key = next((k for k in self.family.keys if k in obj), None)
        args = {} if key is None else obj[key]
        if isinstance(args, str):       # arguments written as JSON text
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                return None
        if not isinstance(args, dict):
            return None
        return ToolCall(_new_id(), obj["name"], json.dumps(args, ensure_ascii=False))

    def _content(self, out: list[Out], text: str) -> None:
        """Release ``text`` as content: a blank tail waits (a call may follow
        it), and blank text right after a call is dropped."""
        text = self._blank + text
        if self._after_call:
            text = text.lstrip()
        body = text.rstrip()
        self._blank = text[len(body):]
        if body:
            out.append(body)
            self._after_call = False

    def _calls(self, out: list[Out], calls: list[ToolCall]) -> None:
        self._blank = ""            # blank text before a call is not content
        self._after_call = True
        out.extend(calls)
        self.calls += len(calls)


def _partial_suffix(text: str, mark: str) -> int:
    """The length of the longest end of ``text`` that begins ``mark``."""
    for n in range(min(len(text), len(mark) - 1), 0, -1):
        if mark.startswith(text[-n:]):
            return n
    return 0


def parse(family: Family, names: Sequence[str], text: str) -> tuple[str | None, list[ToolCall]]:
    """A whole answer's content (None when it is only calls) and calls."""
    parser = CallParser(family, names)
    pieces = parser.feed(text) + parser.finish()
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    content = "".join(p for p in pieces if isinstance(p, str))
    return (content if content or not calls else None), calls
