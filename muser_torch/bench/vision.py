"""``muser-torch bench model MODEL --mmproj MMPROJ --image A.png [--image ...]``:
the vision forward per image on the device, printed, never asserted.

Per image: its preprocessing (Pillow: decode, resize, normalise, patchify;
on the CPU whatever the device), then the tower, adapter and projection
(``Glimmer.visual_rows``: what llama.cpp's ``mtmd_encode_chunk`` computes,
which ``llama-mtmd-cli`` prints as "image slice encoded in N ms"), a first
call (any compile or first touch of the weights in it) and the best of
``reps`` warm calls, on the vision engine (``models/vision_engine.py``: on
CUDA the second call of a grid records a CUDA graph and later calls replay
it, so ``reps`` >= 2 times a replay); where it records, the best of ``reps``
eager calls is printed beside. A random projector of the released geometry comes
from ``make-tiny --mmproj`` (``tiny/mmproj.py``), so both programs can be
timed on the same files:

    muser-torch make-tiny text.gguf --hidden 1024 --mmproj mmproj.gguf
    muser-torch bench model text.gguf --mmproj mmproj.gguf --image cat.png --device cuda
    llama-mtmd-cli -m text.gguf --mmproj mmproj.gguf --image cat.png -p "hi" -n 1
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import NamedTuple, Sequence

import torch

from ..run import synchronize

__all__ = ["ImageTiming", "time_images", "print_images"]


class ImageTiming(NamedTuple):
    path: Path
    size: tuple[int, int]          # width, height in pixels, as read
    patches: tuple[int, int, int]  # the tower's grid: t, h, w patches
    rows: int                      # embedding rows (placeholders in a prompt)
    preprocess_s: float
    cold_s: float                  # the first forward
    warm_s: float                  # the best of the warm forwards
    eager_s: float | None = None   # the best eager forward, where the engine records
    gap: float | None = None       # there: the recorded rows' relative distance to the eager ones


def _forwards(model, x, n: int, device: torch.device, engine: str) -> tuple[list[float], torch.Tensor]:
    """The seconds of ``n`` forwards, and the last one's rows."""
    times = []
    for _ in range(n):
        synchronize(device)
        t0 = time.perf_counter()
        (rows,) = model.visual_rows([x], engine)
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return times, rows


def time_images(model, images: Sequence[Path], reps: int, device: torch.device,
                engine: str = "auto") -> list[ImageTiming]:
    """Each image's preprocessing and vision forward on ``model`` (loaded with
    a projector), on the vision engine ``engine`` (and eagerly beside, where it records)."""
    from ..models.vision_engine import vision_engine
    from ..vision.preprocess import load_image
    out = []
    merge = model.vision.config.merge
    records = vision_engine(model.vision, engine).records
    with torch.no_grad():
        for path in images:
            w, h = load_image(path).size
            t0 = time.perf_counter()
            (x,) = model.prepare_visual([path])
            pre_s = time.perf_counter() - t0
            times, rows = _forwards(model, x, 1 + reps, device, engine)
            eager = gap = None
            if records and reps:     # the same image eagerly: its time, and how far the replayed rows are
                eager_times, want = _forwards(model, x, reps, device, "eager")
                eager = min(eager_times)
                gap = float((rows.double() - want.double()).norm() / want.double().norm())
            g = x.grid
            out.append(ImageTiming(Path(path), (w, h), (g.t, g.h, g.w), g.rows(merge), pre_s, times[0],
                                   min(times[1:]) if reps else times[0], eager, gap))
    return out


def _eager(t: ImageTiming) -> str:
    if t.eager_s is None:
        return ""
    return (f"; recorded (CUDA graph); eager {t.eager_s * 1e3:.1f} ms ({t.eager_s / t.warm_s:.2f}x; "
            f"rows {t.gap:.1e} from the graph's)")


def print_images(timings: Sequence[ImageTiming], reps: int) -> None:
    for t in timings:
        n = t.patches[0] * t.patches[1] * t.patches[2]
        print(f"  {t.path.name}: {t.size[0]}x{t.size[1]} pixels -> {t.patches[1]}x{t.patches[2]} patches "
              f"({n}), {t.rows} rows; preprocess {t.preprocess_s * 1e3:.1f} ms; vision forward: first "
              f"{t.cold_s * 1e3:.1f} ms, warm {t.warm_s * 1e3:.1f} ms (best of {reps}; "
              f"{n / t.warm_s:.0f} patches/s)" + _eager(t))
    if len(timings) > 1:
        total = sum(t.warm_s for t in timings)
        print(f"  {len(timings)} images: warm vision forward {total * 1e3:.1f} ms in all, "
              f"{total * 1e3 / len(timings):.1f} ms per image")
