"""A video's frames, times and prompt block against transformers' own code:
``sample_frames`` of its MuseGlimmerVideoProcessor (which frames of a clip at
a given fps are kept), and ``replace_video_token`` of its
MuseGlimmerProcessor (``<|vid_start|>``, per temporal group ``Time: x.xs``
and the group's ``<|video|>`` rows, ``<|vid_frame_separator|>`` between
groups, ``<|vid_end|>``), tokenized by transformers' tokenizer of the
checkpoint; then the logits and greedy tokens of such a prompt against
transformers' MuseGlimmerForConditionalGeneration.

Videos in the logit test have their frames pairwise equal after sampling:
the mmproj's summed patch kernel is then exact (``docs/muse-glimmer.md``)."""
from __future__ import annotations

import math

import pytest
import torch

import muser_torch
from muser_torch.errors import ImageError
from muser_torch.vision import Video
from muser_torch.vision.preprocess import MAX_FRAME_TOKENS
from muser_torch.vision.video import sample_indices

from ..bounds import check_bound, check_floor
from .checkpoints import reference_model
from .conftest import SEED
from .transformers_source import functions, processor, video_processor

BOUND = 1e-3


@pytest.fixture(scope="module")
def model(vision_files):
    text, mmproj = vision_files["f16"]
    return muser_torch.from_gguf(text, dtype=torch.float32, mmproj=mmproj)


@pytest.fixture(scope="module")
def hf_processor(vision_files):
    from transformers import AutoTokenizer
    return processor(AutoTokenizer.from_pretrained(str(vision_files["checkpoint"])))


def _their_sampling(total: int, fps: float):
    """transformers' metadata of a ``total``-frame clip at ``fps`` after its
    sampling (``_decode_and_sample_videos`` sets ``frames_indices`` so)."""
    from transformers.video_utils import VideoMetadata
    meta = VideoMetadata(total_num_frames=total, fps=fps)
    meta.frames_indices = video_processor().sample_frames(metadata=meta, temporal_patch_size=2)
    return meta


def test_frames_kept_are_transformers_sample_frames():
    gen = torch.Generator().manual_seed(SEED)
    cases = [(1, 30.0), (2, 0.5), (3, 2.0), (4, 2.0), (5, 1.0), (7, 24.0), (400, 1.0), (10_000, 25.0)]
    cases += [(int(n), float(f)) for n, f in zip(torch.randint(1, 600, (300,), generator=gen),
                                                 torch.rand(300, generator=gen) * 60 + 0.05)]
    for total, fps in cases:
        want = _their_sampling(total, fps).frames_indices.tolist()
        assert sample_indices(total, fps) == want, f"{total} frames at {fps} fps (SEED={SEED})"


def _frames(gen: torch.Generator, pattern: str, h: int, w: int):
    """PIL frames, one random picture per distinct letter of ``pattern``."""
    from PIL import Image
    pics = {c: Image.fromarray(torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=gen).numpy())
            for c in sorted(set(pattern))}
    return [pics[c] for c in pattern]


def _their_ids(hf_processor, prefix: str, suffix: str, total: int, fps: float, h: int, w: int) -> list[int]:
    """transformers' prompt ids for ``prefix <|video|> suffix`` and a ``total``-frame
    clip of ``h x w`` pixels at ``fps``: the processor's block for its sampled
    frames and its grid (``smart_resize`` under the per-frame cap)."""
    smart_resize = functions("video_processing_muse_glimmer", ["smart_resize"])["smart_resize"]
    meta = _their_sampling(total, fps)
    rh, rw = smart_resize(h, w, 28, MAX_FRAME_TOKENS)
    thw = torch.tensor([[math.ceil(len(meta.frames_indices) / 2), rh // 14, rw // 14]])
    block = hf_processor.replace_video_token({"video_grid_thw": thw, "video_metadata": [meta]}, 0)
    text = prefix + hf_processor.video_token + suffix
    return hf_processor.tokenizer(text.replace(hf_processor.video_token, block))["input_ids"]


def _our_ids(model, prefix: str, suffix: str, video: Video) -> list[int]:
    tok = model.tokenizer
    inputs = model.prepare_visual(videos=[video])
    return tok.encode(prefix, bos=False) + model.video_prompt(inputs) + tok.encode(suffix, bos=False)


def test_video_block_ids_are_transformers(model, hf_processor):
    gen = torch.Generator().manual_seed(SEED + 1)
    for total, fps, (h, w) in [(4, 2.0, (60, 90)), (8, 4.0, (90, 60)), (5, 0.8, (40, 40)), (1, 30.0, (50, 70)),
                               (37, 7.5, (200, 120))] + \
            [(int(torch.randint(2, 40, (1,), generator=gen)), float(torch.rand(1, generator=gen) * 10 + 0.3),
              (56, 84)) for _ in range(4)]:
        frames = _frames(gen, "ab" * (total // 2) + "c" * (total % 2), h, w)
        want = _their_ids(hf_processor, "look: ", " and say", total, fps, h, w)
        got = _our_ids(model, "look: ", " and say", Video(frames, fps=fps))
        assert got == want, f"{total} frames at {fps} fps: {model.tokenizer.decode(got)!r} (SEED={SEED})"


def test_timestamps_given_keep_every_frame(model, hf_processor):
    """``Video(frames, timestamps=)``: every frame kept, each group stamped with
    its first frame's time, as the processor does with sampling off."""
    from transformers.video_utils import VideoMetadata
    gen = torch.Generator().manual_seed(SEED + 2)
    frames = _frames(gen, "abcde", 60, 90)
    times = sorted((torch.rand(5, generator=gen) * 100).tolist())
    # the processor's times are frame index / fps: a rate of 1 with the times as indices
    meta = VideoMetadata(total_num_frames=5, fps=1.0, frames_indices=times)
    x = model.prepare_visual(videos=[Video(frames, timestamps=times)])[0]
    thw = torch.tensor([[x.grid.t, x.grid.h, x.grid.w]])
    block = hf_processor.replace_video_token({"video_grid_thw": thw, "video_metadata": [meta]}, 0)
    assert x.grid.t == 3 and x.times == (times[0], times[2], times[4]), f"SEED={SEED}"
    assert model.video_prompt([x]) == hf_processor.tokenizer(block)["input_ids"], f"SEED={SEED}"


@pytest.mark.parametrize("total,low,high", [(4, 0.5, 2.0), (8, 3.25, 4.0)])
def test_video_prompt_logits_and_greedy_match_transformers(model, hf_processor, vision_files, total, low, high):
    """4 frames at a rate that keeps all, and 8 frames at one that keeps 4
    (indices 0, 2, 4, 7): two temporal groups, stamped from the rate."""
    gen = torch.Generator().manual_seed(SEED + total)
    fps = float(low + (high - low) * torch.rand(1, generator=gen))
    frames = _frames(gen, "a" * (total // 2) + "b" * (total // 2), 60, 90)
    video = Video(frames, fps=fps)
    ids = torch.tensor([_their_ids(hf_processor, "what happens here? ", " tell me", total, fps, 60, 90)])
    x = model.prepare_visual(videos=[video])[0]
    assert x.grid.t == 2, f"SEED={SEED}"
    assert ids[0].tolist() == _our_ids(model, "what happens here? ", " tell me", video), f"SEED={SEED}"
    ref = reference_model(vision_files["checkpoint"], vision_files["f16"][1])
    pv = torch.cat([torch.cat((f, f), dim=1) for f in x.pixels])   # one slab -> (temporal, channel, y, x)
    thw = torch.tensor([[2, x.grid.h, x.grid.w]])
    with torch.no_grad():
        want = ref(input_ids=ids, pixel_values_videos=pv, video_grid_thw=thw).logits
        embeds = model.vision_embeds(ids, videos=[video])
        got = model(ids, embeds=embeds)
        # the twin: the two groups' rows swapped
        mask, rows = embeds
        swapped = torch.cat(rows.chunk(2)[::-1])
        blind = model(ids, embeds=(mask, swapped))
    check_bound("video prompt logits relative difference", (got - want).norm() / want.norm(), BOUND,
                f"({total} frames at {fps} fps, SEED={SEED})")
    check_floor("video prompt logits with the groups swapped, relative difference",
                (blind - want).norm() / want.norm(), 2 * BOUND, f"(SEED={SEED})")
    theirs = ref.generate(input_ids=ids, pixel_values_videos=pv, video_grid_thw=thw, max_new_tokens=12,
                          do_sample=False)[0, ids.shape[1]:]
    mine = model.generate(ids[0], 12, videos=[video], temperature=0.0, stop=[])[ids.shape[1]:]
    assert mine.tolist() == theirs.tolist(), f"greedy {mine.tolist()} vs {theirs.tolist()} (SEED={SEED})"


def test_bad_videos_are_refused(model):
    gen = torch.Generator().manual_seed(SEED + 3)
    frames = _frames(gen, "ab", 30, 30)
    for kw, words in [(dict(), "exactly one of the two"), (dict(fps=2.0, timestamps=[0, 1]), "exactly one"),
                      (dict(fps=0.0), "fps must be a finite number > 0"),
                      (dict(fps=float("nan")), "fps must be a finite number > 0"),
                      (dict(timestamps=[0.0]), "1 timestamps for 2 frames"),
                      (dict(timestamps=[0.0, -1.0]), "finite seconds >= 0")]:
        with pytest.raises(ImageError, match=words):
            Video(frames, **kw)
    with pytest.raises(ImageError, match="non-empty list of frames"):
        Video([], fps=1.0)
    plain = model.prepare_visual(videos=[frames])
    with pytest.raises(ImageError, match=r"Video\(frames, fps=\.\.\.\)"):
        model.video_prompt(plain)
    with pytest.raises(ImageError, match="expected a video"):
        model.video_prompt(model.prepare_visual(images=frames[:1]))
