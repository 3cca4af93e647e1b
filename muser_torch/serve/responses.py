"""The OpenAI response bodies: errors, chat completions and text completions,
whole and as stream chunks, with usage and logprobs.

``Reply`` gathers one request's ``Piece`` / ``Finish`` events (the
scheduler's) for a whole response; a stream turns each event into chunks.
A chat offered tools reads its answer through a ``tool_calls.CallParser``:
calls become ``tool_calls`` (streamed as OpenAI's deltas: one chunk with the
call's index, id and name, then one with its arguments), and a finished
answer with calls ends in ``finish_reason`` "tool_calls".
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from .sampling import TokenLogprob
from .scheduler import Finish, Piece
from .tool_calls import CallParser, ToolCall

ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 413: "invalid_request_error",
               503: "unavailable_error", 500: "server_error"}


def error_body(message: str, status: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": status}}


def _call_json(call: ToolCall) -> dict:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def _reason(reason: str) -> str:
    """An answer that made calls: "tool_calls", unless it was cut short
    ("length": its calls are what came whole before the cut)."""
    return "tool_calls" if reason == "stop" else reason


def usage(finish: Finish) -> dict:
    return {"prompt_tokens": finish.prompt_tokens, "completion_tokens": finish.completion_tokens,
            "total_tokens": finish.prompt_tokens + finish.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": finish.cached_tokens}}


class TokenText:
    """A token id's text and bytes for logprobs. Bytes are exact for the
    byte tokenizer and for byte-fallback tokens (``<0xNN>``); otherwise the
    UTF-8 of the token's text, or null when that text is not whole
    (a piece of a character)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer

    def text(self, token: int) -> str:
        return self.tok.decode([token])

    def bytes(self, token: int) -> list[int] | None:
        if hasattr(self.tok, "decode_bytes"):
            return list(self.tok.decode_bytes([token]))
        spelled = self.tok.token(token)
        if len(spelled) == 6 and spelled.startswith("<0x") and spelled.endswith(">"):
            return [int(spelled[3:5], 16)]
        text = self.text(token)
        return None if "\ufffd" in text else list(text.encode("utf-8"))

    def chat_entry(self, lp: TokenLogprob) -> dict:
        return {"token": self.text(lp.token), "logprob": lp.logprob, "bytes": self.bytes(lp.token),
                "top_logprobs": [{"token": self.text(i), "logprob": v, "bytes": self.bytes(i)}
                                 for i, v in lp.top]}

    def chat_logprobs(self, lps: tuple[TokenLogprob, ...] | list[TokenLogprob]) -> dict:
        return {"content": [self.chat_entry(lp) for lp in lps]}

    def completion_logprobs(self, lps: list[TokenLogprob], offset: int) -> dict:
        """The legacy completions shape; ``offset``: characters of text before
        the first of these tokens."""
        tokens, offsets = [], []
        for lp in lps:
            offsets.append(offset)
            tokens.append(self.text(lp.token))
            offset += len(tokens[-1])
        return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in lps],
                "top_logprobs": [{self.text(i): v for i, v in lp.top} for lp in lps],
                "text_offset": offsets}


@dataclass
class Reply:
    """One request's response so far. ``kind`` is "chat" or "text"."""
    kind: str
    model: str
    tokens: TokenText
    want_logprobs: bool
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish: Finish | None = None
    calls: CallParser | None = None      # a chat offered tools: its answer's parser
    n_calls: int = 0                     # calls streamed so far

    def __post_init__(self) -> None:
        prefix = "chatcmpl-" if self.kind == "chat" else "cmpl-"
        self.id = self.id or prefix + uuid.uuid4().hex

    def add(self, piece: Piece) -> None:
        self.text += piece.text
        self.logprobs.extend(piece.logprobs)

    # -- whole responses ---------------------------------------------------------------

    def body(self) -> dict:
        assert self.finish is not None
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": self.text}
            reason = self.finish.reason
            if self.calls is not None:
                outs = self.calls.feed(self.text) + self.calls.finish()
                calls = [o for o in outs if isinstance(o, ToolCall)]
                content = "".join(o for o in outs if isinstance(o, str))
                if calls:
                    message["content"] = content or None
                    message["tool_calls"] = [_call_json(c) for c in calls]
                    reason = _reason(reason)
            choice = {"index": 0, "message": message,
                      "logprobs": self.tokens.chat_logprobs(self.logprobs) if self.want_logprobs
                      else None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": self.text,
                      "logprobs": self.tokens.completion_logprobs(self.logprobs, 0)
                      if self.want_logprobs else None, "finish_reason": self.finish.reason}
        return self._envelope(choices=[choice], usage=usage(self.finish))

    # -- stream chunks -------------------------------------------------------------------

    def first_chunk(self) -> dict | None:
        """A chat stream opens with the assistant's role (a text stream has no opening)."""
        if self.kind != "chat":
            return None
        return self._chunk({"role": "assistant", "content": ""}, None, None)

    def piece_chunks(self, piece: Piece) -> list[dict]:
        """The chunks of one piece (none when it carries nothing to show)."""
        offset = len(self.text)
        self.add(piece)
        if self.kind == "chat" and self.calls is not None:
            chunks = self._call_chunks(self.calls.feed(piece.text))
            if self.want_logprobs and piece.logprobs:   # they ride on the piece's first chunk
                chunks = chunks or [self._chunk({"content": ""}, None, None)]
                chunks[0]["choices"][0]["logprobs"] = self.tokens.chat_logprobs(piece.logprobs)
            return chunks
        if not piece.text and not (self.want_logprobs and piece.logprobs):
            return []
        if self.kind == "chat":
            lps = self.tokens.chat_logprobs(piece.logprobs) if self.want_logprobs else None
            return [self._chunk({"content": piece.text}, lps, None)]
        lps = self.tokens.completion_logprobs(list(piece.logprobs), offset) \
            if self.want_logprobs else None
        return [self._chunk(piece.text, lps, None)]

    def finish_chunks(self, finish: Finish) -> list[dict]:
        """What a parser still held, then the chunk that carries ``finish_reason``."""
        self.finish = finish
        if self.kind != "chat":
            return [self._chunk("", None, finish.reason)]
        chunks = [] if self.calls is None else self._call_chunks(self.calls.finish())
        reason = _reason(finish.reason) if self.n_calls else finish.reason
        return chunks + [self._chunk({}, None, reason)]

    def _call_chunks(self, outs: list) -> list[dict]:
        chunks = []
        for o in outs:
            if isinstance(o, str):
                chunks.append(self._chunk({"content": o}, None, None))
                continue
            head = {"index": self.n_calls, "id": o.id, "type": "function",
                    "function": {"name": o.name, "arguments": ""}}
            chunks.append(self._chunk({"tool_calls": [head]}, None, None))
            chunks.append(self._chunk({"tool_calls": [
                {"index": self.n_calls, "function": {"arguments": o.arguments}}]}, None, None))
            self.n_calls += 1
        return chunks

    def usage_chunk(self) -> dict:
        """``stream_options.include_usage``: a last chunk with no choices."""
        assert self.finish is not None
        return self._envelope(object_suffix=".chunk", choices=[], usage=usage(self.finish))

    def _chunk(self, delta: Any, logprobs: dict | None, reason: str | None) -> dict:
        choice = {"index": 0, "delta" if self.kind == "chat" else "text": delta,
                  "logprobs": logprobs, "finish_reason": reason}
        return self._envelope(object_suffix=".chunk", choices=[choice])

    def _envelope(self, object_suffix: str = "", **rest: Any) -> dict:
        obj = "chat.completion" if self.kind == "chat" else "text_completion"
        if self.kind == "text":
            object_suffix = ""    # OpenAI names text stream chunks "text_completion" too
        return {"id": self.id, "object": obj + object_suffix, "created": self.created,
                "model": self.model, **rest}
