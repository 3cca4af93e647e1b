"""Prompt token ids of a request.

A chat renders its messages through the file's ``tokenizer.chat_template``
(bounded, ``ChatLimits``). A file without one gets ChatML, the format
llama.cpp's server falls back to:

    <|im_start|>{role}\\n{content}<|im_end|>\\n   (each message)
    <|im_start|>assistant\\n                      (the generation prompt)

encoded with the tokenizer's own BOS rule, and ``<|im_end|>`` then stops
generation as a stop string (the file has no token for it). A completion's
prompt is text (encoded with the tokenizer's BOS rule) or token ids.
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
    if getattr(tok, "chat_template", None) is None:
        return _encode(tok, render_chatml(messages), bos=None), (CHATML_END,)
    try:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, limits=limits)
    except ChatTemplateError as e:
        raise RequestError(f"the model's chat template refused these messages: {e}",
                           param="messages") from None
    except ValueError as e:   # messages the renderer cannot take
        raise RequestError(str(e), param="messages") from None
    # the template writes BOS itself where the model wants one
    return _encode(tok, text, bos=False), ()


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
    ids = tok.encode(text) if bos is None else tok.encode(text, bos=bos, eos=False)
    if not ids:
        raise RequestError("the prompt encodes to no tokens", param="prompt")
    return ids


def image_prompt(model: Any, ids: list[int], images: Sequence[bytes]) -> tuple[list[int], Any]:
    """The prompt with each image's stand-in (``vision.prompt.IMAGE_MARK``, in
    order) widened to the image's rows, and ``Decoder.forward``'s ``embeds`` for
    them. A 400 for a model without a projector, an image that is not one or too
    large, or stand-ins that do not pair with the images one to one."""
    import torch

    from ..errors import ImageError, PlaceholderError
    from ..vision.prompt import widen_marks
    if getattr(model, "vision", None) is None:
        raise RequestError("image_url parts need a model with a vision projector (serve --mmproj)",
                           param="messages")
    try:
        inputs = model.prepare_visual(list(images))
        merge = model.vision.config.merge
        out = widen_marks(model.tokenizer, ids, [x.grid.rows(merge) for x in inputs])
        t = torch.tensor([out], device=model.lengths.device)
        return out, model.vision_embeds(t, images=inputs)
    except (ImageError, PlaceholderError) as e:
        raise RequestError(f"messages: {e}", param="messages") from None
