"""A prompt with images: muser-torch's Muse Glimmer from llama.cpp's text file
and mmproj (F16 and Q8_0) against transformers' own
MuseGlimmerForConditionalGeneration holding the same weights, float32: the
logits of a prompt with one image (and with a video of two temporal groups)
within 1e-3, and 16 greedy tokens equal. Images go through muser-torch's
preprocessing (Pillow) and the reference gets the same pixels, repeated over
the temporal patch as transformers' processor lays them out."""
from __future__ import annotations

import pytest
import torch

import muser_torch

from ..bounds import check_bound
from .checkpoints import reference_model
from .conftest import KINDS, SEED

BOUND = 1e-3


@pytest.fixture(scope="module", params=KINDS)
def models(request, vision_files):
    text, mmproj = vision_files[request.param]
    ours = muser_torch.from_gguf(text, dtype=torch.float32, mmproj=mmproj)
    return request.param, ours, reference_model(vision_files["checkpoint"], mmproj)


def _image(gen: torch.Generator, h: int, w: int):
    from PIL import Image
    return Image.fromarray(torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=gen).numpy())


def _slabs(pixels: torch.Tensor) -> torch.Tensor:
    """Our one slab per temporal group -> transformers' (temporal, channel, y, x) rows."""
    return torch.cat([torch.cat((f, f), dim=1) for f in pixels])


def _prompt(model, gen, inputs, vocab_text: int) -> torch.Tensor:
    text = torch.randint(0, vocab_text, (24,), generator=gen).tolist()
    return torch.tensor([text[:7] + model.image_prompt(inputs) + text[7:]])


def test_one_image_logits_and_greedy_match_transformers(models):
    kind, ours, ref = models
    gen = torch.Generator().manual_seed(SEED)
    img = _image(gen, int(torch.randint(40, 160, (1,), generator=gen)), int(torch.randint(40, 160, (1,), generator=gen)))
    inputs = ours.prepare_visual([img])
    ids = _prompt(ours, gen, inputs, 380)      # text ids below the marker tokens
    pv, thw = _slabs(inputs[0].pixels), torch.tensor([[1, inputs[0].grid.h, inputs[0].grid.w]])
    with torch.no_grad():
        want = ref(input_ids=ids, pixel_values=pv, image_grid_thw=thw).logits
        got = ours(ids, embeds=ours.vision_embeds(ids, images=[img]))
    check_bound(f"{kind} image prompt logits relative difference", (got - want).norm() / want.norm(), BOUND,
                f"(SEED={SEED})")
    theirs = ref.generate(input_ids=ids, pixel_values=pv, image_grid_thw=thw, max_new_tokens=16,
                          do_sample=False)[0, ids.shape[1]:]
    mine = ours.generate(ids[0], 16, images=[img], temperature=0.0, stop=[])[ids.shape[1]:]
    assert mine.tolist() == theirs.tolist(), f"{kind}: greedy {mine.tolist()} vs {theirs.tolist()} (SEED={SEED})"


def test_video_of_two_groups_logits_match_transformers(models):
    """Four frames, pairwise equal (exact through the mmproj's summed kernel), after
    the image: both kinds of placeholder in one prompt."""
    kind, ours, ref = models
    gen = torch.Generator().manual_seed(SEED + 2)
    a, b, img = _image(gen, 60, 90), _image(gen, 60, 90), _image(gen, 50, 50)
    inputs = ours.prepare_visual([img], [[a, a, b, b]])
    vid = inputs[1]
    assert vid.grid.t == 2
    _, vid_id = ours.placeholder_ids()
    text = torch.randint(0, 380, (12,), generator=gen).tolist()
    ids = torch.tensor([text[:4] + ours.image_prompt(inputs[:1]) + text[4:8]
                        + [vid_id] * vid.grid.rows(2) + text[8:]])
    with torch.no_grad():
        want = ref(input_ids=ids, pixel_values=_slabs(inputs[0].pixels),
                   image_grid_thw=torch.tensor([[1, inputs[0].grid.h, inputs[0].grid.w]]),
                   pixel_values_videos=_slabs(vid.pixels),
                   video_grid_thw=torch.tensor([[2, vid.grid.h, vid.grid.w]])).logits
        got = ours(ids, embeds=ours.vision_embeds(ids, images=[img], videos=[[a, a, b, b]]))
    check_bound(f"{kind} image + video prompt logits relative difference", (got - want).norm() / want.norm(),
                BOUND, f"(SEED={SEED})")
