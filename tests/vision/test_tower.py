"""The vision tower and adapter on llama.cpp's mmproj (F16 and Q8_0, written by
its converter from a random transformers checkpoint) against transformers'
MuseGlimmerVisionModel and get_image_features / get_video_features holding the
same weights (``checkpoints.reference_model``), float32: square and
non-square grids, grids wider than a window (4 x 4 patches here) and narrower
than the position table, and a video of two temporal groups."""
from __future__ import annotations

import pytest
import torch

import muser_torch
from muser_torch.vision import Grid, VisionTower

from ..bounds import check_bound
from .checkpoints import reference_model
from .conftest import KINDS, SEED

BOUND = 1e-4


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module", params=KINDS)
def pair(request, vision_files):
    _, mmproj = vision_files[request.param]
    return (request.param, VisionTower.from_gguf(muser_torch.load_gguf(mmproj)),
            reference_model(vision_files["checkpoint"], mmproj))


def _grids(gen: torch.Generator) -> list[tuple[int, int]]:
    """Even sides (the 2 x 2 merge): 2 x 2 (under the 4 x 4 table), 4 x 4 (the table),
    and two random ones up to 14 patches a side (crossing windows, non-square)."""
    rand = [tuple(int(x) * 2 for x in torch.randint(1, 8, (2,), generator=gen)) for _ in range(2)]
    return [(2, 2), (4, 4), (6, 10)] + rand


def test_tower_matches_transformers(pair):
    kind, tower, ref = pair
    gen = torch.Generator().manual_seed(SEED)
    eps = ref.config.text_config.rms_norm_eps
    for h, w in _grids(gen):
        pix = torch.randn(1, h * w, tower.config.patch_pixels, generator=gen)
        pv = torch.cat((pix[0], pix[0]), dim=1)          # the processor repeats an image's frame
        thw = torch.tensor([[1, h, w]])
        with torch.no_grad():
            vit = ref.model.vision_tower(pixel_values=pv, grid_thw=thw).last_hidden_state
            feats = ref.model.get_image_features(pv, thw).pooler_output[0]
            ours_vit = tower.encode(pix, Grid(1, h, w))
            ours = tower(pix, Grid(1, h, w))
        ours = ours * torch.rsqrt(ours.pow(2).mean(-1, keepdim=True) + eps)
        assert ours.shape == feats.shape == (h * w // 4, ref.config.text_config.hidden_size)
        for what, a, b in (("ViT", ours_vit, vit), ("adapter rows", ours, feats)):
            check_bound(f"{kind} {what} relative difference", _rel(a, b), BOUND, f"({h}x{w}, SEED={SEED})")


def test_video_groups_match_transformers(pair):
    """Two temporal groups, each of two equal frames (what the mmproj's summed
    kernel computes exactly): transformers' video features."""
    kind, tower, ref = pair
    gen = torch.Generator().manual_seed(SEED + 1)
    h, w = 6, 8
    pix = torch.randn(2, h * w, tower.config.patch_pixels, generator=gen)
    pv = torch.cat([torch.cat((f, f), dim=1) for f in pix])
    thw = torch.tensor([[2, h, w]])
    with torch.no_grad():
        feats = ref.model.get_video_features(pv, thw).pooler_output[0]
        ours = tower(pix, Grid(2, h, w))
    ours = ours * torch.rsqrt(ours.pow(2).mean(-1, keepdim=True) + ref.config.text_config.rms_norm_eps)
    check_bound(f"{kind} video rows relative difference", _rel(ours, feats), BOUND, f"(SEED={SEED})")
