"""``serve --mmproj``: a chat message's ``video_url`` parts in vLLM's form, the
frames as ``data:video/jpeg;base64,<frame>,<frame>,...`` at ``media_io_kwargs``'
``{"video": {"fps": F}}`` (default 1): every frame kept, frame ``i`` at
``i / F`` seconds.

- the video's block in the prompt is transformers' ``replace_video_token``
  for those frames (metadata of a frame list: indices 0..n-1 at F), tokenized
  by transformers' tokenizer of the checkpoint;
- the served answer (the official openai client) is ``generate(videos=)``'s
  greedy one on the same prompt, alone and beside an image part;
- the forms not taken, and bad frames, are 400s naming what is wrong."""
from __future__ import annotations

import base64
import io
import math

import pytest
import torch

from muser_torch.serve.prompts import chat_prompt, visual_prompt
from muser_torch.serve.schemas import chat_messages
from muser_torch.text.chat_limits import ChatLimits
from muser_torch.vision import Video
from muser_torch.vision.preprocess import MAX_FRAME_TOKENS
from muser_torch.vision.video import MAX_FRAMES

from .conftest import SEED
from .test_video import hf_processor, model  # noqa: F401 (fixtures)
from .transformers_source import functions

for _module in ("fastapi", "uvicorn", "sse_starlette", "openai", "httpx"):
    pytest.importorskip(_module, reason=f'{_module} is missing: pip install -e ".[test]"')

from ..serve.harness import MODEL_ID, serving  # noqa: E402


def _encoded(gen: torch.Generator, h: int, w: int, kind: str = "PNG") -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=gen).numpy()).save(buf, kind)
    return buf.getvalue()


def _video_part(frames: list[bytes]) -> dict:
    url = "data:video/jpeg;base64," + ",".join(base64.b64encode(f).decode() for f in frames)
    return {"type": "video_url", "video_url": {"url": url}}


def _image_part(png: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}


def _messages(*parts: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "watch: "}, *parts,
                                         {"type": "text", "text": "what happens?"}]}]


def _expected(model, messages: list[dict], fps: float, n: int) -> tuple[str, list[int]]:
    """(generate's greedy answer, cut at the first stop token; the prompt ids):
    the prompt as the server builds it, the rows from generate's own arguments."""
    msgs = chat_messages(messages, "messages")
    ids, _ = chat_prompt(model.tokenizer, msgs, ChatLimits())
    ids, _ = visual_prompt(model, ids, msgs.visuals, fps)
    images = [v for v in msgs.visuals if isinstance(v, bytes)]
    videos = [Video(v.frames, timestamps=[i / fps for i in range(len(v.frames))])
              for v in msgs.visuals if not isinstance(v, bytes)]
    stops = model.tokenizer.stop_ids
    new = model.generate(torch.tensor(ids), n, images=images, videos=videos, temperature=0.0,
                         stop=sorted(stops))[len(ids):].tolist()
    new = new[:next((i for i, t in enumerate(new) if t in stops), len(new))]
    return model.tokenizer.decode(new), ids


def _their_block(hf_processor, n: int, fps: float, h: int, w: int) -> list[int]:
    """transformers' ids of the block of an ``n``-frame list of ``h x w`` frames at
    ``fps``, every frame kept (``do_sample_frames`` off: indices 0..n-1)."""
    from transformers.video_utils import VideoMetadata
    smart_resize = functions("video_processing_muse_glimmer", ["smart_resize"])["smart_resize"]
    rh, rw = smart_resize(h, w, 28, MAX_FRAME_TOKENS)
    meta = VideoMetadata(total_num_frames=n, fps=fps, frames_indices=list(range(n)))
    thw = torch.tensor([[math.ceil(n / 2), rh // 14, rw // 14]])
    block = hf_processor.replace_video_token({"video_grid_thw": thw, "video_metadata": [meta]}, 0)
    return hf_processor.tokenizer(block, add_special_tokens=False)["input_ids"]


def _holds(ids: list[int], block: list[int]) -> bool:
    return any(ids[i:i + len(block)] == block for i in range(len(ids) - len(block) + 1))


def test_video_block_is_transformers(model, hf_processor):
    gen = torch.Generator().manual_seed(SEED + 20)
    for _ in range(4):
        n = int(torch.randint(1, 12, (1,), generator=gen))
        fps = float(torch.rand(1, generator=gen) * 6 + 0.1)
        h, w = (int(x) for x in torch.randint(20, 120, (2,), generator=gen))
        frames = [_encoded(gen, h, w, "JPEG")] * n
        msgs = chat_messages(_messages(_video_part(frames)), "messages")
        ids, _ = chat_prompt(model.tokenizer, msgs, ChatLimits())
        ids, _ = visual_prompt(model, ids, msgs.visuals, fps)
        want = _their_block(hf_processor, n, fps, h, w)
        assert _holds(ids, want), f"{n} frames of {h} x {w} at {fps} fps: {model.tokenizer.decode(ids)!r} " \
                                  f"(SEED={SEED})"
        # the twin: the same frames at another rate stamp other times, so the block differs
        ids2, _ = visual_prompt(model, chat_prompt(model.tokenizer, msgs, ChatLimits())[0], msgs.visuals, fps * 3)
        assert n < 3 or not _holds(ids2, want), f"the rate changed no stamp (SEED={SEED})"


def test_video_chat_answers_as_generate(model):
    gen = torch.Generator().manual_seed(SEED + 21)
    frames = [_encoded(gen, 56, 84) for _ in range(5)]
    png = _encoded(gen, 40, 60)
    fps = float(torch.rand(1, generator=gen) * 4 + 0.5)
    with serving(model, slots=1) as live:
        client = live.client()
        for messages, rate in ((_messages(_video_part(frames)), fps),
                               (_messages(_image_part(png), _video_part(frames[:3])), fps),
                               (_messages(_video_part(frames[1:])), None)):     # the default rate, 1
            extra = {} if rate is None else {"media_io_kwargs": {"video": {"fps": rate}}}
            r = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=6,
                                               temperature=0, extra_body=extra)
            text, ids = _expected(model, messages, 1.0 if rate is None else rate, 6)
            assert r.usage.prompt_tokens == len(ids), f"SEED={SEED}"
            assert r.choices[0].message.content == text, (r.choices[0].message.content, text, SEED)


def test_bad_videos_are_400(model, vision_files):
    import openai

    import muser_torch
    gen = torch.Generator().manual_seed(SEED + 22)
    frame = base64.b64encode(_encoded(gen, 30, 30)).decode()
    other = base64.b64encode(_encoded(gen, 30, 40)).decode()
    junk = base64.b64encode(b"hello").decode()

    def part(url: str) -> list[dict]:
        return _messages({"type": "video_url", "video_url": {"url": url}})

    bad = [
        (part("https://example.com/clip.mp4"), {}, "only data: URLs"),
        (part("data:video/mp4;base64," + frame), {}, "a video/mp4 video needs a video codec"),
        (part("data:video/jpeg;base64," + frame + ",@@@"), {}, "frame 1: the data is not valid base64"),
        (part("data:video/jpeg;base64," + frame + ","), {}, "frame 1 is empty"),
        (part("data:video/jpeg;base64," + ",".join([frame] * (MAX_FRAMES + 1))), {}, f"more than the {MAX_FRAMES}"),
        (part("data:video/jpeg;base64," + frame + "," + junk), {}, "video frame 1"),
        (part("data:video/jpeg;base64," + frame + "," + other), {}, "frames of different sizes"),
        (part("data:video/jpeg;base64," + frame), {"media_io_kwargs": {"video": {"fps": 0}}},
         "video.fps must be a finite number > 0"),
        (part("data:video/jpeg;base64," + frame), {"media_io_kwargs": {"video": {"num_frames": 8}}},
         "only video.fps is taken, got video.num_frames"),
    ]
    plain = muser_torch.from_gguf(vision_files["f16"][0], dtype=torch.float32)
    with serving(model, slots=1) as live, serving(plain, slots=1) as bare:
        for messages, extra, words in bad:
            with pytest.raises(openai.BadRequestError) as e:
                live.client().chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=2,
                                                      extra_body=extra)
            assert words in str(e.value), (words, str(e.value))
        with pytest.raises(openai.BadRequestError) as e:
            bare.client().chat.completions.create(model=MODEL_ID, messages=part("data:video/jpeg;base64," + frame),
                                                  max_tokens=2)
        assert "--mmproj" in str(e.value)
