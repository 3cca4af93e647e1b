"""Fixtures: a tiny random MuseGlimmerForConditionalGeneration checkpoint
(``checkpoints.py``), drawn fresh each session (``SEED``, reported in every
assertion; MUSER_TEST_SEED replays a run), and the text file and mmproj that
llama.cpp's own release converter writes from it: the text file in F16 (whose
values the checkpoint holds exactly, so transformers reading the checkpoint
holds the file's text weights) and the mmproj in F16, Q8_0 and BF16, and the F16
mmproj's matrices re-quantized by ggml into a Q4_K/Q5_K/Q6_K mix (the
reference reads those weights from the mmproj itself)."""
from __future__ import annotations

import pytest
import torch

from ..convert.peers import need_release_converter
from ..glimmer.conftest import SEED
from .checkpoints import convert_with_llama_cpp, requantize_mmproj, write_vision_checkpoint

pytest.importorskip("transformers.models.muse_glimmer")
pytest.importorskip("PIL")
__all__ = ["SEED"]
KINDS = ("f16", "q8_0", "kquant")


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def vision_files(tmp_path_factory) -> dict:
    """{"checkpoint": dir, "config": MuseGlimmerConfig, kind: (text path, mmproj path) for KINDS
    and "bf16"}, kind naming the mmproj's type; one F16 text file for all of them."""
    need_release_converter()
    root = tmp_path_factory.mktemp("vision")
    ckpt, cfg = write_vision_checkpoint(root / "checkpoint", SEED)
    text = root / "text-f16.gguf"
    mmprojs = {kind: root / f"mmproj-{kind}.gguf" for kind in ("f16", "q8_0", "bf16")}
    convert_with_llama_cpp(ckpt, text, mmprojs, "f16")     # one converter process for all four
    out = {"checkpoint": ckpt, "config": cfg, **{kind: (text, path) for kind, path in mmprojs.items()}}
    out["kquant"] = (text, requantize_mmproj(mmprojs["f16"], root / "mmproj-kquant.gguf"))
    return out
