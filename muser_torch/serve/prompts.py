"""Prompt token ids of a request.

A chat renders its messages through the file's ``tokenizer.chat_template``
(bounded, ``ChatLimits``). A file without one gets ChatML, the format
llama.cpp's server falls back to:

    <|im_start|>{role}\\n{content}<|im_end|>\\n   (each message)
    <|im_start|>assistant\\n                      (the generation prompt)

encoded with the tokenizer's own BOS rule, and ``<|im_end|>`` then stops
generation as a stop string (the file has no token for it). Offered tools go
into its system turn in Hermes' form, and an assistant's past calls into its
turn the same way (``tools.chatml_tools``); a file's own template gets them as
its ``tools`` variable and its messages' ``tool_calls``.

Either way the markup becomes the file's control tokens where it has them and
each message's text stays text, even where it spells a control token
(``text/special.py``): a client cannot close its own turn and open the
model's (nor through a tool's spec or a past call, which may spell none). A
completion's prompt is text, where a control token's text is text too
(encoded with the tokenizer's BOS rule), or token ids, which may be any.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..errors import ChatTemplateError
from ..text.chat_limits import ChatLimits
from ..text.special import SLOT
from ..vision.video_files import FRAME_RATE
from .schemas import IMAGE_MARK, RequestError, VideoFrames
from .tools import chatml_call, chatml_tools

CHATML_END = "<|im_end|>"


def render_chatml(messages: Sequence[dict], tools: Sequence[dict] | None = None) -> str:
    messages = list(messages)
    if tools:
        if messages[0]["role"] == "system":
            first = messages.pop(0)
            system = f"{first.get('content') or ''}\n\n{chatml_tools(tools)}"
        else:
            system = chatml_tools(tools)
        messages.insert(0, {"role": "system", "content": system})
    turns = []
    for m in messages:
        text = m.get("content") or ""
        calls = [chatml_call(c) for c in m.get("tool_calls", ())]
        text = "\n".join(([text] if text else []) + calls)
        turns.append(f"<|im_start|>{m['role']}\n{text}{CHATML_END}\n")
    return "".join(turns) + "<|im_start|>assistant\n"


def chat_prompt(tok: Any, messages: Sequence[dict], limits: ChatLimits,
                tools: Sequence[dict] | None = None) -> tuple[list[int], tuple[str, ...]]:
    """The prompt ids of ``messages`` (checked dicts, ``schemas``) and the stop
    strings the template implies (ChatML's end of turn; none for the file's own
    template, whose end-of-turn token is among the tokenizer's stop ids).
    ``tools``: the functions offered (OpenAI's shape), None for none."""
    # the template sees tools only when some are offered (a tokenizer without
    # the keyword still renders plain chats); an image or video part's SLOT becomes its markup
    slot = IMAGE_MARK if getattr(messages, "visuals", ()) else None
    extra = ({"tools": list(tools)} if tools else {}) | ({"slot": slot} if slot else {})
    try:
        if getattr(tok, "chat_template", None) is not None:
            # the template writes BOS itself where the model wants one
            ids, stops = tok.encode_chat(messages, add_generation_prompt=True, limits=limits,
                                         **extra), ()
        elif hasattr(tok, "marker"):   # a file's tokenizer: ChatML's markup may be its tokens
            marker = tok.marker()
            text = render_chatml(marker.mark_messages(messages, slot), marker.mark_tools(tools))
            ids, stops = tok.encode_marked(text, bos=None, eos=False), (CHATML_END,)
        else:   # the byte tokenizer: no token has special text
            text = render_chatml(messages, tools).replace(SLOT, slot or "")
            ids, stops = tok.encode(text), (CHATML_END,)
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


def visual_prompt(model: Any, ids: list[int], visuals: Sequence[Any],
                  video_fps: float = FRAME_RATE, engine: str = "auto") -> tuple[list[int], Any]:
    """The prompt with each part's stand-in (``vision.prompt.IMAGE_MARK``, in
    order) replaced by its block: an image's (``<|image_start|>``, its rows'
    placeholders, ``<|image_end|>``) or a video's (``<|vid_start|>`` ...
    ``<|vid_end|>``, its frame ``i`` at ``i / video_fps`` seconds, every frame
    kept: vLLM's reading of a frame list); and ``Decoder.forward``'s ``embeds``
    for them. A 400 for a model without a projector, an image or frame that is
    not one or too large, frames of mixed sizes, or stand-ins that do not pair
    with the parts one to one. ``engine`` runs the vision forward
    (``Glimmer.visual_rows``': CUDA graphs per image size by default)."""
    import torch

    from ..errors import ImageError, PlaceholderError
    from ..vision import Video
    from ..vision.prompt import fill_marks, visual_block
    if getattr(model, "vision", None) is None:
        raise RequestError("image_url and video_url parts need a model with a vision projector "
                           "(serve --mmproj)", param="messages")
    try:
        inputs = []
        for v in visuals:
            if isinstance(v, VideoFrames):
                # the processor's times for a frame list (indices 0..n-1 at the rate): i / fps
                video = Video(v.frames, timestamps=[i / video_fps for i in range(len(v.frames))])
                inputs += model.prepare_visual(videos=[video])
            else:
                inputs += model.prepare_visual([v])
        merge = model.vision.config.merge
        out = fill_marks(model.tokenizer, ids, [visual_block(model.tokenizer, x, merge) for x in inputs])
        t = torch.tensor([out], device=model.lengths.device)
        images = [x for x in inputs if x.kind == "image"]
        videos = [x for x in inputs if x.kind == "video"]
        return out, model.vision_embeds(t, images=images, videos=videos, engine=engine)
    except (ImageError, PlaceholderError) as e:
        raise RequestError(f"messages: {e}", param="messages") from None
