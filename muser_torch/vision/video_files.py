"""A video from disk, without a video codec: a folder of frame images, or one
animated image (GIF, WebP, APNG: whatever Pillow plays). An mp4, mkv or webm
needs its frames extracted first (``ffmpeg -i clip.mp4 -vf fps=1
frames/%05d.png``, then the folder at that rate).

- A folder: its files, sorted by name (so number them with zero padding,
  as ``%05d`` does), are the clip's frames at ``fps``; hidden files (a name
  starting with ``.``) are skipped. Every other entry must be an image of one
  size, checked from the headers before a pixel is decoded.
- An animated image: its frames and each frame's duration. Equal durations
  are a clip at ``1000 / duration`` frames per second; unequal ones are sampled
  as a clip at their mean rate would be, each kept frame stamped with its own
  start (the sum of the durations before it). An animation whose frames carry
  no duration plays at ``fps``.

Either way the result is a ``Video`` (``video.py``), sampled and stamped as
transformers' processors do. Every refusal is an ``ImageError`` naming the path."""
from __future__ import annotations

import itertools
import os
import warnings
from pathlib import Path
from typing import Sequence

from ..errors import ImageError, ImageTooLargeError
from .preprocess import MAX_PIXELS
from .video import Video, sample_indices, sampled_times

__all__ = ["FRAME_RATE", "video_from_path", "folder_video", "animation_video"]

# The rate of a folder's frames when none is given: vLLM's for a list of frames
# (its ``video/jpeg`` data URLs), so the two forms stamp a frame list alike.
FRAME_RATE = 1.0


def video_from_path(path: str | os.PathLike, fps: float = FRAME_RATE) -> Video:
    """``path``'s video: a folder of frames at ``fps``, or an animated image."""
    p = Path(path)
    if p.is_dir():
        return folder_video(p, fps)
    if p.is_file():
        return animation_video(p, fps)
    raise ImageError(f"{p}: no such file or folder (a video is a folder of frame images or an "
                     f"animated image)")


def _open(path: Path, what: str):
    """``path`` opened by Pillow (its header only); ImageError when it is no image."""
    from PIL import Image, UnidentifiedImageError
    try:
        with warnings.catch_warnings():   # our own bound below is lower than Pillow's warning
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(path)
    except Image.DecompressionBombError:
        raise ImageTooLargeError(f"{what}: more pixels than Pillow opens, and than the bound of "
                                 f"{MAX_PIXELS:,} (vision.preprocess.MAX_PIXELS)") from None
    except (UnidentifiedImageError, OSError) as e:
        raise ImageError(f"{what}: not an image Pillow can read ({type(e).__name__}); a video is "
                         f"a folder of frame images or an animated image") from None
    w, h = img.size
    if w * h > MAX_PIXELS:
        img.close()
        raise ImageTooLargeError(f"{what}: {w} x {h} = {w * h:,} pixels, more than the bound of "
                                 f"{MAX_PIXELS:,} (vision.preprocess.MAX_PIXELS)")
    return img


def folder_video(folder: Path, fps: float = FRAME_RATE) -> Video:
    """The frames in ``folder`` (sorted by name) as a clip at ``fps``."""
    entries = sorted(e for e in folder.iterdir() if not e.name.startswith("."))
    if not entries:
        raise ImageError(f"{folder}: an empty folder; a video folder holds its frames as images")
    size, first = None, None
    for e in entries:
        if not e.is_file():
            raise ImageError(f"{e}: a folder inside the video folder; it holds only frame images")
        with _open(e, str(e)) as img:
            if size is None:
                size, first = img.size, e
            elif img.size != size:
                raise ImageError(f"{e}: {img.size[0]} x {img.size[1]} pixels, but {first.name} has "
                                 f"{size[0]} x {size[1]}; a video's frames share one size")
    return Video(entries, fps=fps)


def animation_video(path: Path, fps: float = FRAME_RATE) -> Video:
    """The frames of the animated image at ``path``, timed by their durations;
    only the frames kept are decoded to RGB."""
    with _open(path, str(path)) as img:
        n = getattr(img, "n_frames", 1)
        if n < 2:
            raise ImageError(f"{path}: a still image (one frame), not a video; give it with --image, "
                             f"or give a video as a folder of frames or an animated image")
        durations = []
        for i in range(n):
            img.seek(i)
            durations.append(img.info.get("duration") or 0)
        if min(durations) <= 0 or len(set(durations)) == 1:
            # a clip at one rate: the frames Video(all frames, fps=rate) keeps, at its times
            rate = fps if min(durations) <= 0 else 1000.0 / durations[0]
            keep, times = sampled_times(n, rate)
        else:
            # sums of whole milliseconds, then one division: the start nearest each true
            # time (adding d / 1000 frame by frame drifts, and a prompt that prints the
            # time to 0.1 s then rounds a start such as 0.45 s the wrong way)
            starts = [ms / 1000.0 for ms in itertools.accumulate([0, *durations[:-1]])]
            keep = sample_indices(n, n / (sum(durations) / 1000.0))
            times = [starts[i] for i in keep]
        return Video(_frames(img, keep), timestamps=times)


def _frames(img, indices: Sequence[int]) -> list:
    """Copies of the animation's frames at ``indices``, each composed as shown (RGB)."""
    out = []
    for i in indices:
        img.seek(i)
        out.append(img.convert("RGB"))
    return out
