"""Preprocessing against transformers' own code. Its MuseGlimmer image and
video processors need torchvision to be built (not in the test extra: no
torchvision wheel for torch's CPU build is on the package index), so the
oracle is their parts: ``smart_resize`` and ``patchify`` taken from the
processors' source (``transformers_source.py``), and the resize, rescale and
normalize of transformers' ``image_transforms`` (its PIL path, Lanczos, the
original model's resampling per the processor's own note)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from muser_torch.vision.preprocess import (MAX_FRAME_TOKENS, MAX_IMAGE_TOKENS, grid_size, preprocess_image,
                                           preprocess_video)

from ..bounds import check_bound
from .conftest import SEED
from .transformers_source import functions

MEAN, STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)   # transformers' IMAGENET_STANDARD_MEAN / _STD


@pytest.fixture(scope="module")
def hf():
    return {**functions("image_processing_muse_glimmer", ["smart_resize", "MuseGlimmerImageProcessor.patchify"]),
            **functions("video_processing_muse_glimmer", ["MuseGlimmerVideoProcessor.patchify"])}


def test_grid_size_is_transformers_smart_resize(hf):
    gen = torch.Generator().manual_seed(SEED)
    sizes = torch.randint(1, 9000, (400, 2), generator=gen).tolist() + [[28, 28], [1, 5000], [5000, 1],
                                                                         [1792, 1792], [1793, 1792], [8694, 280]]
    for (h, w), cap in itertools.product(sizes, (MAX_IMAGE_TOKENS, MAX_FRAME_TOKENS)):
        want = hf["smart_resize"](h, w, 28, cap)
        rows, cols = grid_size(h, w, 28, cap)
        assert (rows * 28, cols * 28) == want, f"{h}x{w} cap {cap}: ours {rows}x{cols} cells, theirs {want}"


def _reference_frames(frames, size):
    """transformers' image_transforms: resize (PIL, Lanczos), rescale 1/255, normalize; [n, 3, H, W]."""
    from transformers.image_transforms import normalize, rescale, resize
    from transformers.image_utils import ChannelDimension, PILImageResampling
    out = []
    for f in frames:
        x = resize(f, size, resample=PILImageResampling.LANCZOS, input_data_format=ChannelDimension.LAST,
                   data_format=ChannelDimension.FIRST)
        x = rescale(x, 1 / 255, input_data_format=ChannelDimension.FIRST)
        x = normalize(x, MEAN, STD, input_data_format=ChannelDimension.FIRST)
        out.append(torch.from_numpy(np.ascontiguousarray(x)))
    return torch.stack(out)


def _random_rgb(gen, h, w):
    return torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=gen).numpy()


def test_image_pixels_are_transformers(hf):
    from PIL import Image
    gen = torch.Generator().manual_seed(SEED + 1)
    for h, w in [(50, 70), (28, 28), (300, 41)] + torch.randint(10, 400, (2, 2), generator=gen).tolist():
        rgb = _random_rgb(gen, h, w)
        ours = preprocess_image(Image.fromarray(rgb), 14, 2, MEAN, STD)
        size = tuple(hf["smart_resize"](h, w, 28, MAX_IMAGE_TOKENS))
        x = _reference_frames([rgb], size)
        want, gh, gw = hf["MuseGlimmerImageProcessor.patchify"](None, x, 14, 2)
        assert (ours.grid.t, ours.grid.h, ours.grid.w) == (1, gh, gw)
        half = want.shape[-1] // 2          # (temporal, channel, y, x): the two slabs are equal
        assert torch.equal(want[0, :, :half], want[0, :, half:])
        check_bound("image pixels max difference", (ours.pixels[0] - want[0, :, :half]).abs().max(), 1e-5,
                    f"({h}x{w}, SEED={SEED})")


def test_video_pixels_are_transformers(hf):
    """Frames padded to an even count with the last; each temporal group our
    tower sees is its two slabs' mean (equal frames: either slab)."""
    from PIL import Image
    gen = torch.Generator().manual_seed(SEED + 2)
    a, b, c = (_random_rgb(gen, 90, 160) for _ in range(3))
    frames = [a, a, b, b, c]                # five: the last frame repeated to six
    ours = preprocess_video([Image.fromarray(f) for f in frames], 14, 2, MEAN, STD)
    size = tuple(hf["smart_resize"](90, 160, 28, MAX_FRAME_TOKENS))
    x = _reference_frames(frames, size)
    want, gt, gh, gw = hf["MuseGlimmerVideoProcessor.patchify"](None, x[None], 14, 2)
    assert (ours.grid.t, ours.grid.h, ours.grid.w) == (gt, gh, gw) == (3, gh, gw)
    slabs = want[0].view(gt, gh * gw, 2, -1)
    check_bound("video pixels max difference", (ours.pixels - slabs.mean(2)).abs().max(), 1e-5, f"(SEED={SEED})")
