"""``muser-torch run --mmproj MMPROJ --video PATH``: a folder of frame images
at ``--video-fps``, or an animated image timed by its frames' durations.

- the video a path gives (``vision.video_files``) is the clip transformers'
  processors see: its block's ids are ``replace_video_token``'s for those
  frames and times (tokenized by transformers' tokenizer of the checkpoint),
  and its frames are the folder's files in name order, or the animation's
  frames as Pillow shows them;
- the printed text, plain and ``--chat``, is the greedy continuation
  ``generate(videos=[Video(frames, fps=...)])`` gives for the same prompt;
- bad input is one line and exit status 2."""
from __future__ import annotations

import pytest
import torch

from muser_torch.cli import main as cli
from muser_torch.text.chat_limits import ChatLimits
from muser_torch.text.special import SLOT
from muser_torch.vision import Video
from muser_torch.vision.prompt import IMAGE_MARK, fill_marks, visual_block
from muser_torch.vision.video_files import video_from_path

from .conftest import SEED
from .test_video import _their_ids, _their_sampling, hf_processor, model  # noqa: F401 (fixtures)


def _picture(gen: torch.Generator, h: int, w: int, colours: int = 256):
    """A random RGB picture; ``colours`` < 256 draws its pixels from that many
    colours (a GIF's palette holds them exactly)."""
    from PIL import Image
    if colours >= 256:
        return Image.fromarray(torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=gen).numpy())
    palette = torch.randint(0, 256, (colours, 3), dtype=torch.uint8, generator=gen)
    return Image.fromarray(palette[torch.randint(0, colours, (h, w), generator=gen)].numpy())


def _folder(tmp_path, gen: torch.Generator, n: int, h: int = 56, w: int = 84):
    """``n`` PNG frames named ``00000.png`` ..., written in a shuffled order (the
    name, not the writing, orders them); their paths in order."""
    folder = tmp_path / "frames"
    folder.mkdir()
    paths = [folder / f"{i:05d}.png" for i in range(n)]
    for i in torch.randperm(n, generator=gen).tolist():
        _picture(gen, h, w).save(paths[i])
    (folder / ".DS_Store").write_bytes(b"not a frame")   # hidden: skipped
    return paths


def _gif(path, frames, durations) -> None:
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=durations, loop=0,
                   optimize=False, disposal=1)


def _their_block(hf_processor, x, meta) -> list[int]:
    """transformers' ids of the block of video ``x`` (our grid) whose frames'
    metadata is ``meta``."""
    thw = torch.tensor([[x.grid.t, x.grid.h, x.grid.w]])
    block = hf_processor.replace_video_token({"video_grid_thw": thw, "video_metadata": [meta]}, 0)
    return hf_processor.tokenizer(block)["input_ids"]


def _greedy_text(model, ids: list[int], n: int, **visuals) -> str:
    tok = model.tokenizer
    new = model.generate(torch.tensor(ids), n, temperature=0.0, stop=sorted(tok.stop_ids),
                         **visuals)[len(ids):].tolist()
    return tok.decode(new[:next((i for i, t in enumerate(new) if t in tok.stop_ids), len(new))])


def _plain_prompt(model, text: str, images=(), videos=()) -> list[int]:
    """The text's ids with the images' then the videos' blocks after a leading BOS."""
    tok = model.tokenizer
    ids = tok.encode(text)
    head = ids[:1] if tok.bos_id is not None and ids and ids[0] == tok.bos_id else []
    inputs = model.prepare_visual(images, videos)
    return head + model.image_prompt(inputs[:len(images)]) + model.video_prompt(inputs[len(images):]) + \
        ids[len(head):]


def test_a_folder_is_the_clip_transformers_sees(model, hf_processor, tmp_path):
    gen = torch.Generator().manual_seed(SEED + 10)
    n = int(torch.randint(3, 30, (1,), generator=gen))
    fps = float(torch.rand(1, generator=gen) * 8 + 0.2)
    paths = _folder(tmp_path, gen, n)
    video = video_from_path(paths[0].parent, fps)
    frames, _ = video.sampled()
    want = [paths[i] for i in _their_sampling(n, fps).frames_indices.tolist()]
    assert frames == want, f"{n} frames at {fps} fps (SEED={SEED})"
    got = model.tokenizer.encode("look: ", bos=False) + model.video_prompt(model.prepare_visual(videos=[video])) \
        + model.tokenizer.encode(" and say", bos=False)
    assert got == _their_ids(hf_processor, "look: ", " and say", n, fps, 56, 84), f"SEED={SEED}"


def test_an_animation_is_timed_by_its_durations(model, hf_processor, tmp_path):
    """Equal durations: a clip at 1000 / duration fps (sampled so); unequal:
    sampled at the mean rate, each kept frame at its start. The frames are the
    animation's as drawn (a 16-colour palette, which a GIF holds exactly)."""
    from transformers.video_utils import VideoMetadata
    gen = torch.Generator().manual_seed(SEED + 11)
    n = int(torch.randint(4, 24, (1,), generator=gen))
    pics = [_picture(gen, 40, 60, colours=16) for _ in range(n)]
    step = int(torch.randint(2, 70, (1,), generator=gen)) * 10   # a GIF keeps centiseconds
    _gif(tmp_path / "even.gif", pics, [step] * n)
    video = video_from_path(tmp_path / "even.gif")
    frames, times = video.sampled()
    reference = Video(pics, fps=1000.0 / step).sampled()
    assert [f.tobytes() for f in frames] == [f.tobytes() for f in reference[0]], f"SEED={SEED}"
    assert times == reference[1], f"SEED={SEED}"
    x = model.prepare_visual(videos=[video])[0]
    assert model.video_prompt([x]) == _their_block(hf_processor, x, _their_sampling(n, 1000.0 / step)), \
        f"{n} frames of {step} ms (SEED={SEED})"

    durations = (torch.randint(2, 60, (n,), generator=gen) * 10).tolist()
    _gif(tmp_path / "uneven.gif", pics, durations)
    frames, times = video_from_path(tmp_path / "uneven.gif").sampled()
    total = sum(durations) / 1000
    keep = _their_sampling(n, n / total).frames_indices.tolist()
    starts = [sum(durations[:i]) / 1000 for i in range(n)]
    assert [f.tobytes() for f in frames] == [pics[i].tobytes() for i in keep], f"SEED={SEED}"
    assert times == pytest.approx([starts[i] for i in keep], abs=1e-9), f"SEED={SEED}"
    x = model.prepare_visual(videos=[Video(frames, timestamps=times)])[0]
    # the processor's times are index / fps: a rate of 1 with the times as indices
    meta = VideoMetadata(total_num_frames=n, fps=1.0, frames_indices=[starts[i] for i in keep])
    assert model.video_prompt([x]) == _their_block(hf_processor, x, meta), f"{durations} (SEED={SEED})"


def test_run_with_a_video_generates(vision_files, model, tmp_path, capsys):
    """``run --video DIR --video-fps F`` and an image: the text is generate's
    on the image's block, the video's, then the prompt."""
    text, mmproj = vision_files["f16"]
    gen = torch.Generator().manual_seed(SEED + 12)
    paths = _folder(tmp_path, gen, 7)
    image = tmp_path / "still.png"
    _picture(gen, 50, 30).save(image)
    fps = float(torch.rand(1, generator=gen) * 4 + 0.5)
    assert cli(["run", str(text), "--mmproj", str(mmproj), "--image", str(image), "--video", str(paths[0].parent),
                "--video-fps", str(fps), "--prompt", "hello", "--max-new-tokens", "6", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    video = Video(paths, fps=fps)
    ids = _plain_prompt(model, "hello", [image], [video])
    assert out == "hello" + _greedy_text(model, ids, 6, images=[image], videos=[video]) + "\n", \
        f"{out!r} (SEED={SEED})"


def test_run_chat_with_videos_generates(vision_files, model, tmp_path, capsys):
    """``run --chat --video DIR --video GIF``: both open the first user turn, each
    at its stand-in, as its block."""
    text, mmproj = vision_files["f16"]
    gen = torch.Generator().manual_seed(SEED + 13)
    paths = _folder(tmp_path, gen, 4)
    pics = [_picture(gen, 30, 50, colours=16) for _ in range(3)]
    _gif(tmp_path / "a.gif", pics, [100, 100, 100])
    assert cli(["run", str(text), "--mmproj", str(mmproj), "--video", str(paths[0].parent), "--video",
                str(tmp_path / "a.gif"), "--chat", "--prompt", "what happens", "--max-new-tokens", "6",
                "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    videos = [Video(paths, fps=1.0), Video(pics, fps=10.0)]
    tok = model.tokenizer
    ids = tok.encode_chat([{"role": "user", "content": SLOT * 2 + "what happens"}], limits=ChatLimits(),
                          slot=IMAGE_MARK)
    ids = fill_marks(tok, ids, [visual_block(tok, x, 2) for x in model.prepare_visual(videos=videos)])
    assert out == _greedy_text(model, ids, 6, videos=videos) + "\n", f"{out!r} (SEED={SEED})"


def test_bad_videos_are_one_line(vision_files, tmp_path, capsys):
    text, mmproj = vision_files["f16"]
    gen = torch.Generator().manual_seed(SEED + 14)
    empty = tmp_path / "empty"
    empty.mkdir()
    notes = tmp_path / "notes"
    notes.mkdir()
    _picture(gen, 20, 20).save(notes / "000.png")
    (notes / "001.txt").write_text("not a frame")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    _picture(gen, 20, 20).save(mixed / "000.png")
    _picture(gen, 20, 24).save(mixed / "001.png")
    nested = tmp_path / "nested"
    (nested / "inner").mkdir(parents=True)
    still = tmp_path / "still.png"
    _picture(gen, 20, 20).save(still)
    cases = [
        ([str(empty)], "an empty folder"),
        ([str(notes)], "001.txt: not an image"),
        ([str(mixed)], "001.png: 24 x 20 pixels, but 000.png has 20 x 20"),
        ([str(nested)], "a folder inside the video folder"),
        ([str(still)], "a still image"),
        ([str(tmp_path / "missing")], "no such file or folder"),
        ([str(mixed), "--video-fps", "0"], "--video-fps must be a finite number > 0"),
        ([str(mixed), "--video-fps", "nan"], "--video-fps must be a finite number > 0"),
    ]
    for args, words in cases:
        assert cli(["run", str(text), "--mmproj", str(mmproj), "--video", *args, "--prompt", "hi",
                    "--max-new-tokens", "2"]) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
    assert cli(["run", str(text), "--video", str(mixed), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--video needs --mmproj" in err, err
