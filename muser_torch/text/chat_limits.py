"""The bounds of one chat-template render (``ChatLimits``) and the measures
they use (``text_size``, ``chars``). No third-party import: the CLI builds a
``ChatLimits`` before it knows whether the file has a template; the sandbox
that enforces them is ``chat_bounds.py``.

A chat prompt is rendered with its messages' text between two marks
(``special.py``); they are ours, not the template's or the client's text, so
no measure counts them: a bound and the size it names are those of the same
render of the unmarked messages, to within the marks' own characters."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from .special import CLOSE, OPEN

DEFAULT_SECONDS = 2.0
DEFAULT_MAX_CHARS = 1_000_000
MESSAGES_FACTOR = 16    # the size bound is at least this many times the messages' own text
WORK_FACTOR = 64        # all text, items and loop steps made in one render, in size bounds
DEFAULT_MAX_DEPTH = 100


@dataclass(frozen=True)
class ChatLimits:
    """How far one render may go. ``seconds``: CPU time of the rendering
    thread. ``max_chars``: characters of the output and of any one value
    (items for a list), raised to ``messages_factor`` times the size of the
    messages and tools when that is larger. ``max_depth``: calls (macros,
    ``caller``, recursive loops) nested inside one another."""
    seconds: float = DEFAULT_SECONDS
    max_chars: int = DEFAULT_MAX_CHARS
    messages_factor: int = MESSAGES_FACTOR
    max_depth: int = DEFAULT_MAX_DEPTH

    def __post_init__(self) -> None:
        if not (isinstance(self.seconds, (int, float)) and 0 < self.seconds < float("inf")):
            raise ValueError(f"chat template seconds must be a finite number > 0, got {self.seconds!r}")
        for name in ("max_chars", "messages_factor", "max_depth"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"chat template {name} must be an integer >= 1, got {v!r}")

    def chars_for(self, inputs: Any) -> int:
        """The size bound of a render of ``inputs`` (messages, tools, ...)."""
        own = text_size(inputs, stop=None)
        return max(self.max_chars, self.messages_factor * own)


def chars(s: str | bytes) -> int:
    """The length of ``s`` in characters (bytes), ``special``'s marks left out."""
    if isinstance(s, str):
        return len(s) - s.count(OPEN) - s.count(CLOSE)
    return len(s)


def text_size(v: Any, stop: int | None) -> int:
    """About how many characters ``str(v)`` or its JSON takes (the strings'
    own lengths, plus a little per item); counting ends once past ``stop``,
    so a huge or self-containing value costs ``stop`` steps at most."""
    utils = sys.modules.get("jinja2.utils")     # a Namespace exists only once jinja2 is in use
    namespace = utils.Namespace if utils is not None else ()
    total, todo = 0, [v]
    while todo:
        x = todo.pop()
        if isinstance(x, (str, bytes)):
            total += chars(x) + 2
        elif isinstance(x, dict):
            total += 2 + 4 * len(x)
            todo.extend(x.keys())
            todo.extend(x.values())
        elif isinstance(x, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(x)
            todo.extend(x)
        elif isinstance(x, namespace):
            attrs = object.__getattribute__(x, "_Namespace__attrs")
            total += 12 + 4 * len(attrs)
            todo.extend(attrs.values())
        elif isinstance(x, int):
            total += 1 + x.bit_length() * 3 // 10
        else:
            total += 8
        if stop is not None and total > stop:
            return total
    return total


