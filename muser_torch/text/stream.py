"""``TextStream``: the text of a growing sequence of generated token ids,
released piece by piece as it settles.

The ids are decoded together and only the grown part released: a
sentencepiece decode of one token alone drops its leading space, and a
character split over byte tokens decodes to U+FFFD until its last byte
arrives, after which the text before it may read differently. So text up to
the first replacement character is released; the rest waits for more ids or
for ``finish``. Used by ``muser-torch run`` and the server.
"""
from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"


class TextStream:
    """Feed ids with ``push``; each call returns the text newly settled.
    ``finish`` returns what is left (replacement characters included), so the
    pieces joined equal ``tokenizer.decode(ids)`` whenever the decode of a
    longer sequence only grows the decode of a shorter one."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.shown = ""

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        ready = self.tokenizer.decode(self.ids).split(REPLACEMENT, 1)[0]
        if ready.startswith(self.shown) and len(ready) > len(self.shown):
            piece, self.shown = ready[len(self.shown):], ready
            return piece
        return ""

    def finish(self) -> str:
        text = self.tokenizer.decode(self.ids)
        piece = text[len(self.shown):] if text.startswith(self.shown) else ""
        self.shown += piece
        return piece
