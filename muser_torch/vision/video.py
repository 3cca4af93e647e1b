"""A video and its times: which frames of a clip the tower sees, and the
time printed before each temporal group of its prompt block, as
transformers' ``MuseGlimmerVideoProcessor`` (``sample_frames``) and
``MuseGlimmerProcessor`` (``replace_video_token``) decide them.

A video comes as ``Video(frames, fps=...)``, every frame of a clip played at
``fps``, or ``Video(frames, timestamps=...)``, frames already chosen, each at
its second:

- with ``fps``, frames are sampled as the video processor samples by default:
  ``SAMPLE_FPS`` per second of the clip, at most ``MAX_FRAMES``, rounded down
  to whole temporal groups (at least one), at evenly spaced indices
  (``sample_indices``); frame ``i``'s time is ``i / fps``;
- with ``timestamps``, every frame is kept at its given time (the processor
  called with ``do_sample_frames=False``).

Each temporal group (``TEMPORAL_PATCH`` frames) is stamped with its first
frame's time, ``STAMP`` (one decimal), before its placeholders
(``prompt.video_block``). llama.cpp's ``mtmd`` has no block of this kind: its
video helper feeds frames as separate images, with a ``[XmY.YYs]`` text every
5 s, and it merges no frames for this projector (``clip_model_n_temporal_merge``
is 1), so its prompts are not transformers'; we follow transformers."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from ..errors import ImageError
from .preprocess import TEMPORAL_PATCH, ImageLike

__all__ = ["Video", "SAMPLE_FPS", "MAX_FRAMES", "STAMP", "sample_indices", "sampled_times", "group_times"]

SAMPLE_FPS = 2.0                 # MuseGlimmerVideoProcessor.fps: frames kept per second of a clip
MAX_FRAMES = 96                  # MuseGlimmerVideoProcessor.num_frames: frames kept at most
STAMP = "Time: {timestamp:.1f}s"   # MuseGlimmerVideoProcessor.frame_timestamp_format


@dataclass(frozen=True)
class Video:
    """A video's frames (paths, bytes or PIL images, all of one size) and
    their times: ``fps`` (the clip's frame rate: its frames are sampled) or
    ``timestamps`` (seconds, one per frame: all are kept). Exactly one of the two."""
    frames: Sequence[ImageLike]
    fps: float | None = None
    timestamps: Sequence[float] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.frames, (str, bytes)) or len(self.frames) == 0:
            raise ImageError("Video: frames must be a non-empty list of frames")
        if (self.fps is None) == (self.timestamps is None):
            raise ImageError("Video: give the frames' times as fps= (the clip's frame rate) or as "
                             "timestamps= (seconds, one per frame), exactly one of the two")
        if self.fps is not None and not (isinstance(self.fps, (int, float)) and math.isfinite(self.fps)
                                         and self.fps > 0):
            raise ImageError(f"Video: fps must be a finite number > 0, got {self.fps!r}")
        if self.timestamps is not None:
            ts = list(self.timestamps)
            if len(ts) != len(self.frames):
                raise ImageError(f"Video: {len(ts)} timestamps for {len(self.frames)} frames; give one per frame")
            bad = [t for t in ts if not (isinstance(t, (int, float)) and math.isfinite(t) and t >= 0)]
            if bad:
                raise ImageError(f"Video: timestamps must be finite seconds >= 0, got {bad[0]!r}")

    def sampled(self) -> tuple[list[ImageLike], list[float]]:
        """The frames the tower sees and each one's time in seconds."""
        if self.timestamps is not None:
            return list(self.frames), [float(t) for t in self.timestamps]
        idx, times = sampled_times(len(self.frames), float(self.fps))
        return [self.frames[i] for i in idx], times


def sampled_times(total: int, fps: float) -> tuple[list[int], list[float]]:
    """The indices kept from ``total`` frames at ``fps`` (``sample_indices``) and
    each kept frame's time in seconds."""
    idx = sample_indices(total, fps)
    # The processor divides its index tensor by the rate: a float32 quotient, whose
    # rounding to one decimal can differ from float64's at a tie, so we divide the same way.
    return idx, (torch.tensor(idx) / fps).tolist()


def sample_indices(total: int, fps: float, sample_fps: float = SAMPLE_FPS, max_frames: int = MAX_FRAMES,
                   temporal: int = TEMPORAL_PATCH) -> list[int]:
    """Indices of the frames kept from ``total`` frames at ``fps``: ``sample_fps``
    a second, at most ``max_frames``, a multiple of ``temporal`` (at least one
    group, at most ``total``), evenly spaced from the first frame to the last
    (``torch.linspace`` truncated, as the processor takes them)."""
    n = min(int(total * sample_fps / fps), max_frames, total)
    n = min(max(temporal, n // temporal * temporal), total)
    return torch.linspace(0, total - 1, n).long().tolist()


def group_times(times: Sequence[float], groups: int, temporal: int = TEMPORAL_PATCH) -> list[float]:
    """Each temporal group's time: its first frame's, the last repeated for a
    group past the frames (the processor pads the same way)."""
    out = list(times[::temporal])[:groups]
    while len(out) < groups:
        out.append(out[-1] if out else 0.0)
    return out
