"""Prompt token ids of a request.

A chat renders its messages through the file's ``tokenizer.chat_template``
(bounded, ``ChatLimits``). A file without one gets ChatML, the format
llama.cpp's server falls back to:

    <|im_start|>{role}\\n{content}<|im_end|>\\n   (each message)
    <|im_start|>assistant\\n                      (the generation prompt)

encoded with the tokenizer's own BOS rule, and ``<|im_end|>`` then stops
generation as a stop string (the file has no token for it).

Either way the markup becomes the file's control tokens where it has them and
each message's text stays text, even where it spells a control token
(``text/special.py``): a client cannot close its own turn and open the
model's. A completion's prompt is text, where a control token's text is text
too (encoded with the tokenizer's BOS rule), or token ids, which may be any.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..errors import ChatTemplateError
from ..text.chat_limits import ChatLimits
from .schemas import RequestError

CHATML_END = "<|im_end|>"


def render_chatml(messages: Sequence[dict]) -> str:
    turns = [f"<|im_start|>{m['role']}\n{m.get('content') or ''}{CHATML_END}\n" for m in messages]
    return "".join(turns) + "<|im_start|>assistant\n"


def chat_prompt(tok: Any, messages: Sequence[dict],
                limits: ChatLimits) -> tuple[list[int], tuple[str, ...]]:
    """The prompt ids of ``messages`` (checked dicts, ``schemas``) and the stop
    strings the template implies (ChatML's end of turn; none for the file's own
    template, whose end-of-turn token is among the tokenizer's stop ids)."""
    try:
        if getattr(tok, "chat_template", None) is not None:
            # the template writes BOS itself where the model wants one
            ids, stops = tok.encode_chat(messages, add_generation_prompt=True, limits=limits), ()
        elif hasattr(tok, "marker"):   # a file's tokenizer: ChatML's markup may be its tokens
            text = render_chatml(tok.marker().mark_messages(messages))
            ids, stops = tok.encode_marked(text, bos=None, eos=False), (CHATML_END,)
        else:   # the byte tokenizer: no token has special text
            ids, stops = tok.encode(render_chatml(messages)), (CHATML_END,)
    except ChatTemplateError as e:
        raise RequestError(f"the model's chat template refused these messages: {e}",
                           param="messages") from None
    except ValueError as e:   # messages the renderer cannot take
        raise RequestError(str(e), param="messages") from None
    return _nonempty(ids), stops


def completion_prompt(tok: Any, prompt: str | list[int], vocab_size: int) -> list[int]:
    """The ids of a completion's prompt: its text encoded, or its ids checked."""
    if isinstance(prompt, str):
        return _encode(tok, prompt, bos=None)
    bad = next((i for i in prompt if not 0 <= i < vocab_size), None)
    if bad is not None:
        raise RequestError(f"prompt: token id {bad} is outside the vocabulary [0, {vocab_size})",
                           param="prompt")
    if not prompt:
        raise RequestError("prompt: no tokens", param="prompt")
    return list(prompt)


def _encode(tok: Any, text: str, bos: bool | None) -> list[int]:
    # bos None: the tokenizer's own rule (the file's add_bos; the byte tokenizer adds BOS)
    return _nonempty(tok.encode(text) if bos is None else tok.encode(text, bos=bos, eos=False))


def _nonempty(ids: list[int]) -> list[int]:
    if not ids:
        raise RequestError("the prompt encodes to no tokens", param="prompt")
    return ids
