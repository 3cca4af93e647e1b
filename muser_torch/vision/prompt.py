"""The prompt side of vision: which tokens stand for image and video rows,
the token block an image takes, and the rows that replace those tokens'
embeddings (transformers' ``MuseGlimmerModel``: placeholders replaced in
order by the adapter's rows, each row through the text model's weightless
RMSNorm; llama.cpp gets the same by feeding the rows through the text
graph's embedding norm).

The placeholders are the tokenizer's ``<|patch|>`` (images) and ``<|video|>``
(videos), as transformers' ``MuseGlimmerProcessor`` names them; an image's
block is ``<|image_start|>`` + one ``<|patch|>`` per row + ``<|image_end|>``,
and a video's (``replace_video_token``) is ``<|vid_start|>``, then per
temporal group its time as text (``video.STAMP``: ``Time: 1.5s``) and one
``<|video|>`` per row of the group, the groups apart by
``<|vid_frame_separator|>``, closed by ``<|vid_end|>``."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import torch
from torch import Tensor

from ..errors import ImageError, PlaceholderError
from .preprocess import VisualInput, preprocess_image, preprocess_video
from .video import STAMP, Video, group_times

__all__ = ["IMAGE_TOKEN", "VIDEO_TOKEN", "IMAGE_START", "IMAGE_END", "VIDEO_START", "VIDEO_SEPARATOR",
           "VIDEO_END", "IMAGE_MARK", "token_id", "prepare", "image_block", "video_block", "visual_block",
           "fill_marks", "widen_marks", "placeholder_rows"]

IMAGE_TOKEN, VIDEO_TOKEN = "<|patch|>", "<|video|>"
IMAGE_START, IMAGE_END = "<|image_start|>", "<|image_end|>"
VIDEO_START, VIDEO_SEPARATOR, VIDEO_END = "<|vid_start|>", "<|vid_frame_separator|>", "<|vid_end|>"
# An image's stand-in in a chat message's text: one placeholder between the markers,
# widened to the image's rows once the template has rendered (``widen_marks``).
IMAGE_MARK = IMAGE_START + IMAGE_TOKEN + IMAGE_END


def token_id(tokenizer: Any, text: str) -> int | None:
    """The id of the single token ``text`` in the file's vocabulary, if it has one."""
    tokens = getattr(getattr(tokenizer, "vocab", None), "tokens", None)
    if tokens is None:
        return None
    try:
        return list(tokens).index(text)
    except ValueError:
        return None


def prepare(tower: Any, images: Sequence[Any] = (), videos: Sequence[Any] = ()) -> list[VisualInput]:
    """Images, then videos, preprocessed for ``tower`` (a ``VisualInput`` passes
    as it is). A video is a ``Video`` (sampled, its groups timed) or a plain
    list of frames (all kept, untimed: its rows fill placeholders, but it has
    no block of its own)."""
    cfg = tower.config
    out = []
    for im in images:
        out.append(im if isinstance(im, VisualInput) else
                   preprocess_image(im, cfg.patch_size, cfg.merge, cfg.image_mean, cfg.image_std))
    for v in videos:
        if isinstance(v, VisualInput):
            out.append(v)
            continue
        frames, times = v.sampled() if isinstance(v, Video) else (v, None)
        x = preprocess_video(frames, cfg.patch_size, cfg.merge, cfg.image_mean, cfg.image_std)
        out.append(x if times is None else replace(x, times=tuple(group_times(times, x.grid.t))))
    return out


def image_block(tokenizer: Any, rows: int) -> list[int]:
    """``<|image_start|>``, ``rows`` x ``<|patch|>``, ``<|image_end|>`` as ids."""
    ids = [token_id(tokenizer, t) for t in (IMAGE_START, IMAGE_TOKEN, IMAGE_END)]
    if any(i is None for i in ids):
        raise ImageError(f"the model's tokenizer has no {IMAGE_START} / {IMAGE_TOKEN} / {IMAGE_END} "
                         f"tokens to place an image with")
    return [ids[0]] + [ids[1]] * rows + [ids[2]]


def video_block(tokenizer: Any, video: VisualInput, merge: int) -> list[int]:
    """A timed video's block as ids: ``<|vid_start|>``, each temporal group's
    time (``STAMP``, tokenized as plain text) and its ``<|video|>`` rows, the
    groups apart by ``<|vid_frame_separator|>``, then ``<|vid_end|>``."""
    ids = [token_id(tokenizer, t) for t in (VIDEO_START, VIDEO_TOKEN, VIDEO_SEPARATOR, VIDEO_END)]
    if any(i is None for i in ids):
        raise ImageError(f"the model's tokenizer has no {VIDEO_START} / {VIDEO_TOKEN} / {VIDEO_SEPARATOR} / "
                         f"{VIDEO_END} tokens to place a video with")
    if video.kind != "video":
        raise ImageError(f"video_block: got an input of kind {video.kind!r}, expected a video")
    if len(video.times) != video.grid.t:
        raise ImageError("a video's block stamps each temporal group with its time: give the video as "
                         "Video(frames, fps=...) or Video(frames, timestamps=...), not a plain list of frames")
    start, placeholder, separator, end = ids
    per_group = video.grid.rows(merge) // video.grid.t
    out = [start]
    for g, t in enumerate(video.times):
        out += tokenizer.encode(STAMP.format(timestamp=t), bos=False, eos=False) + [placeholder] * per_group
        out.append(separator if g + 1 < len(video.times) else end)
    return out


def visual_block(tokenizer: Any, x: VisualInput, merge: int) -> list[int]:
    """An image's block (``image_block``) or a timed video's (``video_block``)."""
    return video_block(tokenizer, x, merge) if x.kind == "video" else image_block(tokenizer, x.grid.rows(merge))


def fill_marks(tokenizer: Any, ids: Sequence[int], blocks: Sequence[Sequence[int]]) -> list[int]:
    """``ids`` with its first ``len(blocks)`` stand-ins (``IMAGE_MARK`` as tokens)
    replaced by ``blocks[k]`` each, in order: an image's or a video's block
    (``visual_block``); PlaceholderError when fewer stand-ins are there (a
    chat template that dropped a part)."""
    start, patch, end = (token_id(tokenizer, t) for t in (IMAGE_START, IMAGE_TOKEN, IMAGE_END))
    out: list[int] = []
    k = i = 0
    ids = list(ids)
    while i < len(ids):
        if k < len(blocks) and ids[i:i + 3] == [start, patch, end]:
            out += blocks[k]
            k, i = k + 1, i + 3
        else:
            out.append(ids[i])
            i += 1
    if k != len(blocks):
        raise PlaceholderError(f"the rendered prompt places {k} of the {len(blocks)} images and videos "
                               f"(the chat template dropped an image or video part)")
    return out


def widen_marks(tokenizer: Any, ids: Sequence[int], rows: Sequence[int]) -> list[int]:
    """``ids`` with its first ``len(rows)`` stand-ins widened to image blocks of
    ``rows[k]`` placeholders each (``fill_marks``)."""
    return fill_marks(tokenizer, ids, [image_block(tokenizer, r) for r in rows])


def placeholder_rows(ids: Tensor, inputs: Sequence[VisualInput], rows: Sequence[Tensor], merge: int,
                     image_id: int | None, video_id: int | None) -> tuple[Tensor, Tensor]:
    """``(mask [B, T], rows [N, hidden])`` for ``Decoder.forward``'s ``embeds``:
    image rows at the image placeholders and video rows at the video ones, each
    kind in order. PlaceholderError when a kind's placeholder count is not its
    rows' count."""
    hidden = rows[0].shape[-1]
    mask = torch.zeros_like(ids, dtype=torch.bool)
    # every position's row (zeros where none goes), so the two kinds interleave by position
    full = rows[0].new_zeros(ids.numel(), hidden)
    for kind, tid, token in (("image", image_id, IMAGE_TOKEN), ("video", video_id, VIDEO_TOKEN)):
        mine = [(x, r) for x, r in zip(inputs, rows) if x.kind == kind]
        if not mine:
            continue
        if tid is None:
            raise PlaceholderError(f"{kind}s given, but the model's tokenizer has no {token} token; "
                                   f"pass {kind}_token_id=")
        where = ids == tid
        have, need = int(where.sum()), sum(x.grid.rows(merge) for x, _ in mine)
        if have != need:
            raise PlaceholderError(
                f"the prompt has {have} {kind} placeholder tokens ({token}, id {tid}) but the {len(mine)} "
                f"{kind}{'s' if len(mine) > 1 else ''} given make {need} rows"
                + ("" if have > need else f"; more {kind}s than placeholders"))
        full[where.flatten().to(full.device)] = torch.cat([r for _, r in mine])
        mask |= where
    return mask, full[mask.flatten().to(full.device)]
