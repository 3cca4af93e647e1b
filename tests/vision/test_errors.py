"""Bad input to the vision path: one typed error each, whose message is one
line naming what is wrong; ``run`` prints it as one line, exit status 2."""
from __future__ import annotations

import struct
import zlib

import pytest
import torch

import muser_torch
from muser_torch.cli import main as cli
from muser_torch.errors import (DtypeFenceError, ImageError, ImageTooLargeError, PlaceholderError,
                                ShapeMismatchError, VisionMismatchError)
from muser_torch.gguf_io import load_gguf, save_gguf
from muser_torch.vision.preprocess import MAX_PIXELS, preprocess_image

from ..glimmer.muse_files import write_muse_gguf
from .conftest import SEED


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert msg and "\n" not in msg, msg
    return msg


@pytest.fixture(scope="module")
def model(vision_files):
    text, mmproj = vision_files["f16"]
    return muser_torch.from_gguf(text, dtype=torch.float32, mmproj=mmproj)


def _png(width: int, height: int) -> bytes:
    """A PNG whose header says ``width x height`` (its one row of data is all it holds:
    the bound is checked on the header, before anything is decoded)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 4))
            + chunk(b"IEND", b""))


def test_not_an_image(tmp_path):
    p = tmp_path / "notes.png"
    p.write_text("not pixels")
    for bad in (p, p.read_bytes(), tmp_path / "missing.png", 42):
        with pytest.raises(ImageError) as e:
            preprocess_image(bad, 14, 2, (0.5,) * 3, (0.5,) * 3)
        _one_line(e)


def test_too_many_pixels_is_refused_from_the_header():
    side = int(MAX_PIXELS ** 0.5) + 1
    with pytest.raises(ImageTooLargeError) as e:
        preprocess_image(_png(side, side), 14, 2, (0.5,) * 3, (0.5,) * 3)
    assert f"{MAX_PIXELS:,}" in _one_line(e)
    from PIL import Image
    assert Image.open(__import__("io").BytesIO(_png(64, 64))).size == (64, 64)   # the file is a real PNG


def test_mmproj_of_another_model_is_refused(vision_files, tmp_path):
    _, mmproj = vision_files["f16"]
    other, _ = write_muse_gguf(tmp_path / "other.gguf", seed=SEED, types=("F16",), hidden=256)
    with pytest.raises(VisionMismatchError) as e:
        muser_torch.from_gguf(other, mmproj=mmproj)
    assert "256" in _one_line(e) and "projection_dim" in str(e.value)
    text, _ = vision_files["f16"]
    with pytest.raises(VisionMismatchError) as e:          # a text file given as the projector
        muser_torch.from_gguf(text, mmproj=text)
    assert "clip.projector_type" in _one_line(e)


def _edited(src, dst, md=None, tensors=None):
    g = load_gguf(src)
    meta = {**g.metadata, **(md or {})}
    ts = {n: t for n, t in g.tensors.items()}
    ts.update(tensors or {})
    save_gguf(dst, meta, ts, types={k: v for k, v in g.metadata_types.items() if k in meta})
    return dst


def test_other_projector_type_and_bad_tensors_are_refused(vision_files, tmp_path):
    text, mmproj = vision_files["f16"]
    qwen = _edited(mmproj, tmp_path / "qwen.gguf", {"clip.projector_type": "qwen2vl"})
    with pytest.raises(VisionMismatchError) as e:
        muser_torch.from_gguf(text, mmproj=qwen)
    assert "'qwen2vl'" in _one_line(e)
    g = load_gguf(mmproj)
    q = g["v.blk.0.attn_q.weight"]
    narrow = _edited(mmproj, tmp_path / "narrow.gguf",
                     tensors={"v.blk.0.attn_q.weight": ("F16", torch.zeros(q.n_out - 2, q.n_in).half().view(torch.uint8),
                                                        (q.n_in, q.n_out - 2))})
    with pytest.raises(ShapeMismatchError) as e:
        muser_torch.from_gguf(text, mmproj=narrow)
    assert "v.blk.0.attn_q.weight" in _one_line(e)
    ln = g["v.pre_ln.weight"]
    quant = _edited(mmproj, tmp_path / "quant.gguf",
                    tensors={"v.pre_ln.weight": ("Q8_0", torch.zeros(1, 34 * ln.n_in // 32, dtype=torch.uint8),
                                                 (ln.n_in,))})
    with pytest.raises(DtypeFenceError) as e:
        muser_torch.from_gguf(text, mmproj=quant)
    assert "v.pre_ln.weight" in _one_line(e)


def test_more_images_than_placeholders(model):
    from PIL import Image
    img = Image.new("RGB", (56, 56), (10, 200, 30))
    block = model.image_prompt(model.prepare_visual([img]))
    ids = torch.tensor([[1, 2, 3] + block + [4, 5]])
    with pytest.raises(PlaceholderError) as e:
        model.vision_embeds(ids, images=[img, img])
    assert "more images than placeholders" in _one_line(e)
    with pytest.raises(PlaceholderError):
        model.generate(torch.tensor([1, 2, 3]), 2, images=[img])


def test_images_without_a_projector(vision_files):
    text, _ = vision_files["f16"]
    plain = muser_torch.from_gguf(text, dtype=torch.float32)
    with pytest.raises(ImageError) as e:
        plain.generate(torch.tensor([1, 2]), 2, images=[b"x"])
    assert "mmproj" in _one_line(e)


def test_run_prints_one_line(vision_files, tmp_path, capsys):
    text, mmproj = vision_files["f16"]
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8 not really")
    big = tmp_path / "big.png"
    big.write_bytes(_png(20000, 20000))
    for args, words in (([str(text), "--image", str(bad), "--mmproj", str(mmproj)], "not an image"),
                        ([str(text), "--image", str(big), "--mmproj", str(mmproj)], "pixels"),
                        ([str(text), "--image", str(bad)], "--mmproj")):
        assert cli(["run", *args, "--prompt", "hi", "--max-new-tokens", "2"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
