"""Images and video frames into the tower's input, on the CPU with Pillow and
torch, as transformers' ``MuseGlimmerImageProcessor`` and
``MuseGlimmerVideoProcessor`` prepare them:

1. RGB (``convert("RGB")``);
2. resized with Lanczos to the patch grid closest to the image's aspect
   ratio whose merged tokens (28 x 28-pixel blocks: patch 14 times merge 2)
   stay under the cap, 4096 per image and 144 per video frame (``grid_size``);
3. scaled by 1/255 and normalised per channel with the mmproj's
   ``image_mean`` / ``image_std`` (0.5 each in the release: transformers'
   ``IMAGENET_STANDARD_MEAN`` / ``_STD``);
4. cut into ``p x p`` patches in raster order, each flattened (channel, y, x).

transformers' processors repeat an image over the temporal patch (2) and lay a
patch out (temporal, channel, y, x); the mmproj's patch kernel is the sum of
the two temporal slabs, so one slab per temporal group is what the tower
takes. A video's frames are padded to an even count by repeating the last,
and each pair becomes one group: the tower sees the pair's mean, which is
exact when the two frames are equal and an approximation otherwise (the file
keeps no separate temporal slabs; ``docs/muse-glimmer.md``).

Bounds, checked before any pixel is decoded: ``MAX_PIXELS`` per image or
frame (an ``ImageTooLargeError``); a file Pillow cannot identify is an
``ImageError``."""
from __future__ import annotations

import io
import itertools
import math
import os
import warnings
from dataclasses import dataclass
from typing import Any, Sequence, Union

import torch
from torch import Tensor

from ..errors import ImageError, ImageTooLargeError
from .tower import Grid

__all__ = ["MAX_PIXELS", "MAX_IMAGE_TOKENS", "MAX_FRAME_TOKENS", "VisualInput", "grid_size", "load_image",
           "preprocess_image", "preprocess_video"]

# 64 Mi pixels (e.g. 8192 x 8192) per image: far past what the tower keeps (4096
# merged tokens, about 3.2 megapixels) and under Pillow's own decompression-bomb
# error (2 x 89,478,485), so a hostile header is refused before Pillow decodes it.
MAX_PIXELS = 64 * 1024 * 1024
MAX_IMAGE_TOKENS = 4096     # MuseGlimmerImageProcessor.max_image_tokens; clip.cpp's image token limit
MAX_FRAME_TOKENS = 144      # MuseGlimmerVideoProcessor.max_video_frame_tokens
TEMPORAL_PATCH = 2

ImageLike = Union[str, "os.PathLike[str]", bytes, Any]   # Any: a PIL.Image (Pillow is imported on use)


@dataclass(frozen=True)
class VisualInput:
    """One image or video for the tower: ``pixels`` ``[t, h*w, 3*p*p]``;
    a video's ``times``, the seconds of each temporal group when known
    (``video.Video``), stamp its prompt block."""
    pixels: Tensor
    grid: Grid
    kind: str            # "image" | "video"
    times: tuple[float, ...] = ()


def grid_size(height: int, width: int, block: int, max_tokens: int) -> tuple[int, int]:
    """``(rows, cols)`` of ``block``-pixel cells for an image of ``height x width``:
    the floor/ceil candidates of its size in cells (scaled down to
    ``max_tokens`` cells when larger, keeping the aspect ratio), those within
    the cap, the one whose aspect ratio is closest to the image's.
    transformers' ``smart_resize``, ties included: the reference collects the
    candidates in a ``set`` and keeps the first closest in its iteration
    order, which for tuples of small ints is fixed (their hashes are), so we
    go through a set too (a size such as 8694 x 280 ties exactly)."""
    ih, iw = height / block, width / block
    ratio = iw / ih if ih > 0 else 1.0
    if ih * iw > max_tokens:
        ih = math.sqrt(max_tokens / ratio)
        iw = ih * ratio
    cands = list(set(itertools.product((math.floor(ih), math.ceil(ih)), (math.floor(iw), math.ceil(iw)))))
    ok = [(a, b) for a, b in cands if a >= 1 and b >= 1 and a * b <= max_tokens]
    if not ok:
        ok = [(max(1, round(ih)), max(1, round(iw)))]
    return min(ok, key=lambda g: abs(g[0] / g[1] - height / width))


def load_image(image: ImageLike, what: str = "image"):
    """An RGB ``PIL.Image`` from a path, bytes or an image; ImageError /
    ImageTooLargeError (one line) for anything else."""
    from PIL import Image, UnidentifiedImageError
    if isinstance(image, Image.Image):
        img = image
    else:
        if isinstance(image, (bytes, bytearray)):
            src, name = io.BytesIO(image), f"{what} ({len(image)} bytes)"
        elif isinstance(image, (str, os.PathLike)):
            src, name = os.fspath(image), os.fspath(image)
        else:
            raise ImageError(f"{what}: expected a path, bytes or a PIL image, got {type(image).__name__}")
        try:
            with warnings.catch_warnings():   # our own bound below is lower than Pillow's warning
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                img = Image.open(src)
        except Image.DecompressionBombError:  # Pillow refuses twice its limit before we see the size
            raise ImageTooLargeError(f"{name}: more pixels than Pillow opens, and than the bound of "
                                     f"{MAX_PIXELS:,} (vision.preprocess.MAX_PIXELS)") from None
        except FileNotFoundError:
            raise ImageError(f"{name}: no such file") from None
        except (UnidentifiedImageError, OSError) as e:
            raise ImageError(f"{name}: not an image Pillow can read ({type(e).__name__})") from None
        what = name
    w, h = img.size
    if w * h > MAX_PIXELS:
        raise ImageTooLargeError(f"{what}: {w} x {h} = {w * h:,} pixels, more than the bound of "
                                 f"{MAX_PIXELS:,} (vision.preprocess.MAX_PIXELS)")
    if w < 1 or h < 1:
        raise ImageError(f"{what}: {w} x {h} pixels, expected at least 1 x 1")
    try:
        return img.convert("RGB")
    except OSError as e:   # a truncated or corrupt body shows only when decoded
        raise ImageError(f"{what}: the image data cannot be decoded ({e})") from None


def _normalised(img, size: tuple[int, int], mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """``[3, H, W]`` float32: resized to ``size`` (rows, cols) with Lanczos, scaled, normalised."""
    from PIL import Image
    h, w = size
    if img.size != (w, h):
        img = img.resize((w, h), Image.Resampling.LANCZOS)
    x = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(h, w, 3).permute(2, 0, 1)
    x = x.float() * (1 / 255)
    m = torch.tensor(mean, dtype=torch.float32)[:, None, None]
    s = torch.tensor(std, dtype=torch.float32)[:, None, None]
    return (x - m) / s


def _patches(x: Tensor, p: int) -> Tensor:
    """``[3, H, W]`` -> ``[(H/p) * (W/p), 3*p*p]``: raster order, each (channel, y, x)."""
    c, H, W = x.shape
    return x.view(c, H // p, p, W // p, p).permute(1, 3, 0, 2, 4).reshape(-1, c * p * p)


def preprocess_image(image: ImageLike, patch: int, merge: int, mean: Sequence[float], std: Sequence[float],
                     max_tokens: int = MAX_IMAGE_TOKENS) -> VisualInput:
    img = load_image(image)
    rows, cols = grid_size(img.height, img.width, patch * merge, max_tokens)
    x = _normalised(img, (rows * patch * merge, cols * patch * merge), mean, std)
    return VisualInput(_patches(x, patch)[None], Grid(1, rows * merge, cols * merge), "image")


def preprocess_video(frames: Sequence[ImageLike], patch: int, merge: int, mean: Sequence[float],
                     std: Sequence[float], max_tokens: int = MAX_FRAME_TOKENS) -> VisualInput:
    """A video as its frames (already sampled; all of one size)."""
    if isinstance(frames, (str, bytes, os.PathLike)) or len(frames) == 0:
        raise ImageError("video: expected a non-empty list of frames")
    imgs = [load_image(f, f"video frame {i}") for i, f in enumerate(frames)]
    sizes = {im.size for im in imgs}
    if len(sizes) > 1:
        raise ImageError(f"video: frames of different sizes {sorted(sizes)}; a video's frames share one size")
    rows, cols = grid_size(imgs[0].height, imgs[0].width, patch * merge, max_tokens)
    px = (rows * patch * merge, cols * patch * merge)
    xs = [_normalised(im, px, mean, std) for im in imgs]
    xs += [xs[-1]] * (-len(xs) % TEMPORAL_PATCH)
    groups = [torch.stack(xs[i:i + TEMPORAL_PATCH]).mean(0) for i in range(0, len(xs), TEMPORAL_PATCH)]
    pixels = torch.stack([_patches(g, patch) for g in groups])
    return VisualInput(pixels, Grid(len(groups), rows * merge, cols * merge), "video")
