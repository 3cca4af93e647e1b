"""DFlash speculative decoding on a prompt with images and a video: the
tiny random Muse Glimmer of ``conftest`` (llama.cpp's F16 text file and
mmproj) and a random DFlash draft for its text model, written as llama.cpp's
converter writes one (``tests/dflash/draft_files.py``).

- Against transformers (its ``MuseGlimmerForConditionalGeneration`` with
  ``pixel_values``, its ``MuseGlimmerAssistantModel``, generating with
  ``speculation_type="dflash"``): the first round's draft logits within 1e-4
  (their context is the target's tapped layers, which at the placeholders
  derive from the image's rows), and every round's block and accepted count
  over 48 tokens. The twin drops the image's rows from the prefill (the
  placeholders' own embeddings instead) and must part from transformers.
- Greedy with a draft is greedy without one, token for token, on prompts
  with an image, and with an image and a video: with the random draft and
  with ``Oracle`` (the true continuation, one token per block changed), so
  that every accepted length and its rewind occur after the visual rows.
- ``run --image --draft`` prints that continuation; ``serve --mmproj
  --draft`` answers an image chat with it.
- On CUDA (skipped elsewhere), the recorded rounds after an image prompt.
"""
from __future__ import annotations

import pytest
import torch

import muser_torch
from muser_torch.cli import main as cli
from muser_torch.models.dflash import DraftContext
from muser_torch.models.taps import Taps

from ..bounds import check_bound, check_floor
from ..dflash.draft_files import assistant_config, reference_draft, transformers_rounds, write_draft_gguf
from ..dflash.test_greedy import Oracle
from ..formats.ggml_ref import lib
from ..glimmer.conftest import rel_err
from .checkpoints import reference_model
from .conftest import SEED

pytest.importorskip("transformers.models.muse_glimmer_assistant")

N_NEW = 48
BOUND = 1e-4
# float types whose blocks fit the text model's 128-wide rows
DRAFT_TYPES = ("Q8_0", "F16", "BF16", "Q5_0")


@pytest.fixture(scope="module")
def draft_file(vision_files, tmp_path_factory):
    """(the draft's path, its transformers config): 2 layers, a 5-token window,
    tapping target layers 0, 1 and 2 of 4, the video separator as its mask token."""
    lib()
    text, _ = vision_files["f16"]
    target = muser_torch.from_gguf(text, dtype=torch.float32)
    c = target.config
    mask = target.tokenizer.vocab.tokens.index("<|vid_frame_separator|>")
    cfg = assistant_config(hidden=c.hidden, ffn=2 * c.hidden, head_dim=32, tap_ids=(0, 1, 2), mask=mask,
                           context=c.context_length)
    path = write_draft_gguf(tmp_path_factory.mktemp("vision-draft") / "draft.gguf", cfg, seed=SEED + 11,
                            vocab=c.vocab_size, types=DRAFT_TYPES)
    return path, cfg


@pytest.fixture(scope="module")
def pair(vision_files, draft_file):
    text, mmproj = vision_files["f16"]
    target = muser_torch.from_gguf(text, dtype=torch.float32, mmproj=mmproj)
    return target, muser_torch.from_gguf(draft_file[0], target=target)


def _image(gen: torch.Generator, h: int, w: int):
    from PIL import Image
    return Image.fromarray(torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=gen).numpy())


def _image_prompt(model, salt: int):
    """(ids [1, T] with an image's block inside random text, the image)."""
    gen = torch.Generator().manual_seed(SEED * 13 + salt)
    img = _image(gen, int(torch.randint(40, 120, (1,), generator=gen)),
                 int(torch.randint(40, 120, (1,), generator=gen)))
    text = torch.randint(0, 380, (14,), generator=gen).tolist()   # ids below the marker tokens
    block = model.image_prompt(model.prepare_visual([img]))
    return torch.tensor([text[:5] + block + text[5:]]), img


def _slabs(pixels: torch.Tensor) -> torch.Tensor:
    """Our one slab per temporal group -> transformers' (temporal, channel, y, x) rows."""
    return torch.cat([torch.cat((f, f), dim=1) for f in pixels])


@pytest.fixture(scope="module")
def transformers_run(vision_files, draft_file, pair):
    """transformers' DFlash run on ``_image_prompt(.., 0)``: (tokens, rounds)."""
    target, _ = pair
    path, cfg = draft_file
    ids, img = _image_prompt(target, 0)
    x = target.prepare_visual([img])[0]
    ref = reference_model(vision_files["checkpoint"], vision_files["f16"][1])
    ref.config._attn_implementation = ref.config.text_config._attn_implementation = "eager"
    return transformers_rounds(ref, reference_draft(path, cfg), ids, N_NEW, pixel_values=_slabs(x.pixels),
                               image_grid_thw=torch.tensor([[1, x.grid.h, x.grid.w]]))


def test_first_round_draft_logits_with_an_image_match_transformers(pair, transformers_run):
    target, draft = pair
    ids, img = _image_prompt(target, 0)
    want = transformers_run[1][0][1][0]
    embeds = target.vision_embeds(ids, images=[img])
    with torch.no_grad():
        got = _first_round_with(target, draft, ids, embeds)
        check_bound("first drafted block's logits after an image, relative to transformers",
                    rel_err(got, want), BOUND, f"(SEED={SEED})")
        # the twin: the placeholders' own embeddings in the prefill instead of the image's rows
        blind = _first_round_with(target, draft, ids, None)
    check_floor("first drafted block's logits with the image's rows left out, relative to transformers",
                rel_err(blind, want), 2 * BOUND, f"(SEED={SEED})")


def _first_round_with(target, draft, ids, embeds):
    """The draft's logits after the prefill of ``ids`` given ``embeds`` (as
    ``draft_files.first_round``, which takes no rows)."""
    with Taps(target, draft.tap_layers) as taps:
        anchor = int(target(ids, embeds=embeds)[0, -1].argmax())
        tapped = taps.take()
    ctx = DraftContext()
    draft.extend(ctx, tapped)
    return draft.propose(ctx, anchor)


def test_blocks_and_acceptance_with_an_image_match_transformers(pair, transformers_run):
    target, draft = pair
    want_tokens, rounds = transformers_run
    ids, img = _image_prompt(target, 0)
    out, stats = target.generate(ids[0], N_NEW, draft=draft, images=[img], return_stats=True, stop=[])
    assert out[-N_NEW:].tolist() == want_tokens, f"SEED={SEED}"
    assert stats.proposed == [r[0] for r in rounds], f"SEED={SEED}"
    assert stats.accepted == [r[2] for r in rounds], f"SEED={SEED}"
    assert len(stats.proposed) >= 3, f"SEED={SEED}"


def _video_prompt(model, salt: int):
    """(ids [1, T]: an image's block, then a video's placeholders; the image; the
    video's four frames, pairwise equal: two temporal groups)."""
    gen = torch.Generator().manual_seed(SEED * 13 + salt)
    a, b, img = _image(gen, 60, 90), _image(gen, 60, 90), _image(gen, 50, 70)
    frames = [a, a, b, b]
    inputs = model.prepare_visual([img], [frames])
    _, vid = model.placeholder_ids()
    text = torch.randint(0, 380, (12,), generator=gen).tolist()
    ids = text[:4] + model.image_prompt(inputs[:1]) + text[4:8] + [vid] * inputs[1].grid.rows(2) + text[8:]
    return torch.tensor([ids]), [img], [frames]


@pytest.mark.parametrize("kind", ["image", "image and video"])
def test_greedy_with_a_draft_is_greedy_without(pair, kind):
    target, draft = pair
    for salt in (1, 2):
        if kind == "image":
            ids, img = _image_prompt(target, salt)
            visual = dict(images=[img])
        else:
            ids, images, videos = _video_prompt(target, salt)
            visual = dict(images=images, videos=videos)
        n = ids.shape[1]
        plain = target.generate(ids[0], N_NEW, stop=[], **visual)
        drafted, stats = target.generate(ids[0], N_NEW, draft=draft, return_stats=True, stop=[], **visual)
        assert drafted.tolist() == plain.tolist(), f"{kind}, prompt {salt} (SEED={SEED})"
        assert stats.rounds >= 1, f"SEED={SEED}"

        oracle = Oracle(draft, n, plain[n:].tolist(), SEED + salt + 10 * len(kind))
        drafted, stats = target.generate(ids[0], N_NEW, draft=oracle, return_stats=True, stop=[], **visual)
        assert drafted.tolist() == plain.tolist(), f"oracle, {kind}, prompt {salt} (SEED={SEED})"
        emitted = 1
        for a, j in zip(stats.accepted, oracle.wrong_at):   # the block up to the changed token
            assert a == min(j, 15, N_NEW - emitted - 1), f"SEED={SEED}"
            emitted += a + 1
        assert sum(stats.accepted) > N_NEW // 3, f"SEED={SEED}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_recorded_rounds_after_an_image_on_cuda(vision_files, draft_file):
    """On CUDA greedy rounds run recorded (``draft_rounds.py``), their prefill
    given the rows: greedy with the draft is greedy without it, or parts at a
    near-tie of the 16-row verify's other summation order
    (``tests/dflash/test_greedy.py``'s CUDA_PATH_NOISE)."""
    from ..dflash.test_greedy import CUDA_PATH_NOISE
    text, mmproj = vision_files["f16"]
    target = muser_torch.from_gguf(text, device="cuda", dtype=torch.float32, mmproj=mmproj)
    draft = muser_torch.from_gguf(draft_file[0], target=target)
    for salt in (1, 2):
        ids, img = _image_prompt(target, salt)
        ids = ids.to("cuda")
        want = target.generate(ids[0], N_NEW, images=[img], stop=[]).tolist()
        got = target.generate(ids[0], N_NEW, draft=draft, images=[img], stop=[]).tolist()
        if got == want:
            continue
        i = next(j for j, (a, b) in enumerate(zip(got, want)) if a != b)
        assert i >= ids.shape[1], f"prompt {salt}: the prompt changed (SEED={SEED})"
        prefix = torch.tensor([want[:i]], device="cuda")
        logits = target(prefix, embeds=target.vision_embeds(prefix, images=[img]))[0, -1]
        gaps = [float(logits.max() - logits[t]) for t in (got[i], want[i])]
        assert max(gaps) < CUDA_PATH_NOISE, f"prompt {salt}: parted at {i}, {gaps} (SEED={SEED})"


def test_run_with_images_and_a_draft_prints_the_plain_continuation(vision_files, draft_file, pair, tmp_path,
                                                                   capsys):
    """``run --image --draft``: the prompt holds the image's block, and the
    text is the greedy continuation generate(images=) gives without the draft."""
    from .test_run import _greedy_text, _images
    text, mmproj = vision_files["f16"]
    target, _ = pair
    paths = _images(tmp_path)
    assert cli(["run", str(text), "--mmproj", str(mmproj), "--image", str(paths[0]), "--image", str(paths[1]),
                "--draft", str(draft_file[0]), "--prompt", "hello", "--max-new-tokens", "20",
                "--temperature", "0"]) == 0
    captured = capsys.readouterr()
    tok = target.tokenizer
    ids = tok.encode("hello")
    head = ids[:1] if tok.bos_id is not None and ids and ids[0] == tok.bos_id else []
    ids = head + target.image_prompt(target.prepare_visual(paths)) + ids[len(head):]
    # the drafted run prints the whole text when done, after the prompt's
    assert captured.out == "hello" + _greedy_text(target, ids, paths, 20) + "\n", (captured.out, SEED)
    assert f"prompt {len(ids)} tokens" in captured.err and "mean accepted" in captured.err, captured.err


def test_run_with_a_video_and_a_draft_prints_the_plain_continuation(vision_files, draft_file, pair, tmp_path,
                                                                    capsys):
    """``run --video DIR --draft``: the text is the greedy continuation
    generate(videos=[Video(frames, fps=...)]) gives without the draft."""
    from muser_torch.vision import Video

    from .test_video_run import _folder, _greedy_text, _plain_prompt
    text, mmproj = vision_files["f16"]
    target, _ = pair
    paths = _folder(tmp_path, torch.Generator().manual_seed(SEED + 6), 6)
    assert cli(["run", str(text), "--mmproj", str(mmproj), "--video", str(paths[0].parent), "--video-fps", "3",
                "--draft", str(draft_file[0]), "--prompt", "hello", "--max-new-tokens", "20",
                "--temperature", "0"]) == 0
    captured = capsys.readouterr()
    video = Video(paths, fps=3.0)
    ids = _plain_prompt(target, "hello", videos=[video])
    assert captured.out == "hello" + _greedy_text(target, ids, 20, videos=[video]) + "\n", (captured.out, SEED)
    assert f"prompt {len(ids)} tokens" in captured.err and "mean accepted" in captured.err, captured.err


def test_served_image_chat_with_a_draft_answers_as_generate(pair):
    """``serve --mmproj --draft``: an image chat over HTTP (the official
    client) answers with the greedy text generate(images=) gives without the draft."""
    for module in ("fastapi", "uvicorn", "sse_starlette", "openai", "httpx"):
        pytest.importorskip(module, reason=f'{module} is missing: pip install -e ".[test]"')
    from ..serve.harness import MODEL_ID, serving
    from .test_serve import _expected, _messages, _png
    target, draft = pair
    gen = torch.Generator().manual_seed(SEED + 5)
    with serving(target, slots=1, draft=draft) as live:
        for png in (_png(gen, 60, 90), _png(gen, 50, 40)):
            r = live.client().chat.completions.create(model=MODEL_ID, messages=_messages(png), max_tokens=20,
                                                      temperature=0)
            text, ids = _expected(target, png, 20)
            assert r.usage.prompt_tokens == len(ids), SEED
            assert r.choices[0].message.content == text, (r.choices[0].message.content, text, SEED)
