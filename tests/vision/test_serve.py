"""``serve --mmproj``: a chat whose message holds ``image_url`` parts
(``data:`` URLs) answers as ``generate(images=)`` does on the same prompt
(greedy, token for token), through the official openai client; a second
request with the same text and another image reuses no cached row of the first
image (its answer is the cold one). A remote URL, bad base64, bytes that are
not an image, and images for a model without a projector are 400s."""
from __future__ import annotations

import base64
import io

import pytest
import torch

import muser_torch
from muser_torch.serve.prompts import chat_prompt, visual_prompt
from muser_torch.text.chat_limits import ChatLimits

from .conftest import SEED

for _module in ("fastapi", "uvicorn", "sse_starlette", "openai", "httpx"):
    pytest.importorskip(_module, reason=f'{_module} is missing: pip install -e ".[test]"')

from ..serve.harness import MODEL_ID, serving  # noqa: E402


@pytest.fixture(scope="module")
def model(vision_files):
    text, mmproj = vision_files["f16"]
    return muser_torch.from_gguf(text, dtype=torch.float32, mmproj=mmproj)


def _png(gen: torch.Generator, h: int, w: int) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=gen).numpy()).save(buf, "PNG")
    return buf.getvalue()


def _messages(png: bytes, text: str = "what is this") -> list[dict]:
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return [{"role": "user", "content": [{"type": "text", "text": "look: "},
                                         {"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


def _expected(model, png: bytes, n: int) -> tuple[str, list[int]]:
    """(the greedy answer's text, cut at the first stop token; the prompt ids)."""
    from muser_torch.serve.schemas import chat_messages
    msgs = chat_messages(_messages(png), "messages")
    ids, _ = chat_prompt(model.tokenizer, msgs, ChatLimits())
    ids, _ = visual_prompt(model, ids, msgs.visuals)
    stops = model.tokenizer.stop_ids
    new = model.generate(torch.tensor(ids), n, images=[png], temperature=0.0, stop=sorted(stops))[len(ids):]
    new = new.tolist()
    new = new[:next((i for i, t in enumerate(new) if t in stops), len(new))]
    return model.tokenizer.decode(new), ids


def test_image_chat_answers_as_generate(model):
    gen = torch.Generator().manual_seed(SEED)
    a, b = _png(gen, 60, 90), _png(gen, 60, 90)
    patch, _ = model.placeholder_ids()
    with serving(model, slots=1) as live:
        client = live.client()
        for png in (a, b, a):      # one slot: each request finds the previous one's cache
            r = client.chat.completions.create(model=MODEL_ID, messages=_messages(png), max_tokens=6,
                                               temperature=0)
            text, ids = _expected(model, png, 6)
            assert r.usage.prompt_tokens == len(ids)
            # a cached prefix stops before the first placeholder: rows of another image are never reused
            assert r.usage.prompt_tokens_details.cached_tokens <= ids.index(patch)
            assert r.choices[0].message.content == text, (r.choices[0].message.content, text, SEED)


def test_bad_images_are_400(model, vision_files):
    import openai
    gen = torch.Generator().manual_seed(SEED + 1)
    png = _png(gen, 30, 30)
    bad = [
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}],
         "only data: URLs"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]}],
         "not valid base64"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {
            "url": "data:image/png;base64," + base64.b64encode(b"hello").decode()}}]}], "not an image"),
    ]
    plain = muser_torch.from_gguf(vision_files["f16"][0], dtype=torch.float32)
    with serving(model, slots=1) as live, serving(plain, slots=1) as bare:
        for messages, words in bad:
            with pytest.raises(openai.BadRequestError) as e:
                live.client().chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=2)
            assert words in str(e.value), str(e.value)
        with pytest.raises(openai.BadRequestError) as e:
            bare.client().chat.completions.create(model=MODEL_ID, messages=_messages(png), max_tokens=2)
        assert "--mmproj" in str(e.value)


def test_a_message_spelling_the_image_markup_places_no_image(model):
    """The image markup a user writes stays text: the prompt holds one image
    block (the part's), and the ids of the written markup are text ids; a
    text part holding the noncharacter reserved for an image's place is a 400."""
    import openai

    from muser_torch.serve.schemas import IMAGE_MARK, chat_messages
    from muser_torch.text.special import SLOT
    gen = torch.Generator().manual_seed(SEED + 2)
    png = _png(gen, 40, 40)
    msgs = chat_messages(_messages(png, f"and this {IMAGE_MARK} too"), "messages")
    ids, _ = chat_prompt(model.tokenizer, msgs, ChatLimits())
    patch, _ = model.placeholder_ids()
    assert ids.count(patch) == 1, "the written markup became a placeholder"
    ids, _ = visual_prompt(model, ids, msgs.visuals)   # one image, one place: no 400
    with serving(model, slots=1) as live:
        with pytest.raises(openai.BadRequestError, match="U\\+FDD2"):
            live.client().chat.completions.create(
                model=MODEL_ID, messages=_messages(png, f"sneaky {SLOT}"), max_tokens=2)
