"""``muser-torch run --mmproj MMPROJ --image PATH ...``, plain and ``--chat``:
the printed text is the greedy continuation ``generate(images=)`` gives for the
same prompt (the images' blocks before the text; in a chat, the images open the
first user turn as reserved slots, which the chat's encoding fills with the
image markup as markup, and the chat template renders it)."""
from __future__ import annotations

import torch

import muser_torch
from muser_torch.cli import main as cli
from muser_torch.text.chat_limits import ChatLimits
from muser_torch.text.special import SLOT
from muser_torch.vision.prompt import IMAGE_MARK, widen_marks

from .conftest import SEED


def _images(tmp_path):
    from PIL import Image
    gen = torch.Generator().manual_seed(SEED)
    paths = []
    for i, (h, w) in enumerate(((40, 70), (90, 50))):
        p = tmp_path / f"im{i}.png"
        Image.fromarray(torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=gen).numpy()).save(p)
        paths.append(p)
    return paths


def _greedy_text(model, ids: list[int], images, n: int) -> str:
    tok = model.tokenizer
    new = model.generate(torch.tensor(ids), n, images=images, temperature=0.0,
                         stop=sorted(tok.stop_ids))[len(ids):].tolist()
    return tok.decode(new[:next((i for i, t in enumerate(new) if t in tok.stop_ids), len(new))])


def test_run_with_images_generates(vision_files, tmp_path, capsys):
    """``run --image`` twice: the prompt holds both images' blocks, and the text
    is the greedy continuation that generate(images=) gives."""
    text, mmproj = vision_files["f16"]
    paths = _images(tmp_path)
    assert cli(["run", str(text), "--mmproj", str(mmproj), "--image", str(paths[0]), "--image", str(paths[1]),
                "--prompt", "hello", "--max-new-tokens", "6", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    model = muser_torch.from_gguf(text, dtype=torch.float32, mmproj=mmproj)
    tok = model.tokenizer
    inputs = model.prepare_visual(paths)
    ids = tok.encode("hello")
    head = ids[:1] if tok.bos_id is not None and ids and ids[0] == tok.bos_id else []
    ids = head + model.image_prompt(inputs) + ids[len(head):]
    assert out == "hello" + _greedy_text(model, ids, paths, 6) + "\n", out


def test_run_chat_with_images_generates(vision_files, tmp_path, capsys):
    text, mmproj = vision_files["f16"]
    paths = _images(tmp_path)
    assert cli(["run", str(text), "--mmproj", str(mmproj), "--image", str(paths[0]), "--image", str(paths[1]),
                "--chat", "--prompt", "what is this", "--max-new-tokens", "6", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    model = muser_torch.from_gguf(text, dtype=torch.float32, mmproj=mmproj)
    tok = model.tokenizer
    inputs = model.prepare_visual(paths)
    ids = tok.encode_chat([{"role": "user", "content": SLOT * 2 + "what is this"}], limits=ChatLimits(),
                          slot=IMAGE_MARK)
    ids = widen_marks(tok, ids, [x.grid.rows(2) for x in inputs])
    assert out == _greedy_text(model, ids, paths, 6) + "\n", out
