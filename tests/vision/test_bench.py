"""The random projector (``tiny/mmproj.py``, ``make-tiny --mmproj``) and
``bench model --mmproj --image``.

The random file is held to the one llama.cpp's release converter wrote
from the tiny checkpoint (``conftest``): of the same geometry, it has the
same keys in the same order with the same value types (the size label
aside), and the same tensors with the same types and shapes (in the
table's order; the converter's is the checkpoint's), in F16 and Q8_0. ``make-tiny --mmproj`` writes one of the released geometry that
loads beside its text file. The benchmark prints each image's grid and
rows (what it timed; no time is checked)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import muser_torch
from muser_torch.arch.glimmer_vision import admit_mmproj, release_config
from muser_torch.cli import main as cli
from muser_torch.gguf_io import load_gguf
from muser_torch.tiny.mmproj import mmproj_bytes, write_random_mmproj
from muser_torch.tiny.vocab import MARKERS, vocab_size

from .conftest import SEED


@pytest.mark.parametrize("kind", ["f16", "q8_0"])
def test_random_projector_is_laid_out_as_the_converters(vision_files, tmp_path, kind):
    theirs = load_gguf(vision_files[kind][1])
    cfg = admit_mmproj(theirs)
    ours = load_gguf(write_random_mmproj(tmp_path / "random.gguf", cfg, kind, seed=SEED))
    keys = [k for k in theirs.metadata if k != "general.size_label"]
    assert list(ours.metadata) == keys
    for k in keys:
        assert ours.metadata_types[k] == theirs.metadata_types[k], k
        if k != "general.name":
            assert ours.metadata[k] == theirs.metadata[k], (k, ours.metadata[k], theirs.metadata[k])
    assert set(ours.tensors) == set(theirs.tensors)   # (the converter's order is the checkpoint's)
    for name, t in theirs.tensors.items():
        assert (ours.tensors[name].type_name, tuple(ours.tensors[name].ne)) == (t.type_name, tuple(t.ne)), name
    assert sum(t.nbytes for t in ours.tensors.values()) == mmproj_bytes(cfg, kind)


def test_make_tiny_writes_a_projector_of_the_release_geometry(tmp_path, capsys):
    text, mmproj = tmp_path / "text.gguf", tmp_path / "mmproj.gguf"
    assert cli(["make-tiny", str(text), "--mmproj", str(mmproj), "--mmproj-layers", "1",
                "--seed", str(SEED % 1000)]) == 0
    assert f"wrote {mmproj}: a 1-layer random vision projector" in capsys.readouterr().out
    model = muser_torch.from_gguf(text, dtype=torch.float32, mmproj=mmproj)
    want = release_config(model.config.hidden, 1)
    assert replace(model.vision.config, eps=want.eps) == want
    assert model.vision.config.eps == pytest.approx(1e-5, rel=1e-6)   # float32 in the file
    (x,) = model.prepare_visual([_png(tmp_path, 60, 90)])     # 2 x 3 blocks of 28 pixels
    rows = model.visual_rows([x])[0]
    assert rows.shape == (6, model.config.hidden) and bool(torch.isfinite(rows).all()), f"SEED={SEED}"
    assert cli(["make-tiny", str(tmp_path / "t2.gguf"), "--mmproj", str(tmp_path / "m2.gguf"),
                "--mmproj-layers", "0"]) == 2
    assert "--mmproj-layers=0 must be >= 1" in capsys.readouterr().err
    # the text file's vocabulary (tiny/vocab.py), which llama-mtmd-cli tokenizes too: the
    # markers are one token each, text falls back to bytes and decodes back, ChatML renders
    tok = model.tokenizer
    assert tok.vocab_size == model.config.vocab_size == vocab_size()
    assert None not in model.placeholder_ids()
    for marker in MARKERS:
        assert tok.encode(marker, bos=False, parse_special=True) == [tok.vocab.tokens.index(marker)], marker
    text = "a photo, 12 cats \u00e9"
    assert tok.decode(tok.encode(text)) == text
    ids = tok.encode_chat([{"role": "user", "content": "describe"}])
    start, end = (tok.vocab.tokens.index(m) for m in ("<|im_start|>", "<|im_end|>"))
    assert [i for i in ids if i in (start, end)] == [start, end, start], ids
    assert "describe" in tok.decode(ids) and "<|im" not in tok.decode(ids)
    assert cli(["make-tiny", str(tmp_path / "t3.gguf"), "--mmproj", str(tmp_path / "m3.gguf"),
                "--vocab", "300"]) == 2
    assert "--vocab with --mmproj" in capsys.readouterr().err


def _png(tmp_path, h: int, w: int, name: str = "im.png"):
    from PIL import Image
    gen = torch.Generator().manual_seed(SEED + h)
    path = tmp_path / name
    Image.fromarray(torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=gen).numpy()).save(path)
    return path


def test_bench_model_image_prints_each_images_grid(vision_files, tmp_path, capsys):
    text, mmproj = vision_files["f16"]
    paths = [_png(tmp_path, 60, 90, "a.png"), _png(tmp_path, 150, 40, "b.png")]
    assert cli(["bench", "model", str(text), "--mmproj", str(mmproj), "--image", str(paths[0]),
                "--image", str(paths[1]), "--image-reps", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    model = muser_torch.from_gguf(text, dtype=torch.float32, mmproj=mmproj)
    for p in paths:
        (x,) = model.prepare_visual([p])
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(p.name))
        assert f"{x.grid.h}x{x.grid.w} patches ({x.grid.patches}), {x.grid.rows(2)} rows" in line, line
    assert "2 images: warm vision forward" in out
    for args, words in [([str(text), "--image", str(paths[0])], "--image and --mmproj go together"),
                        (["demo", "--mmproj", str(mmproj), "--image", str(paths[0])], "needs the GGUF file"),
                        ([str(text), "--mmproj", str(mmproj), "--image", str(tmp_path / "none.png")],
                         "no such file")]:
        assert cli(["bench", "model", *args]) == 2
        assert words in capsys.readouterr().err
