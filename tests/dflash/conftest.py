"""Fixtures: a random Muse Glimmer target and a random DFlash draft for it,
both written as llama.cpp's converter writes them, drawn fresh each session
(``SEED``, reported in every assertion; MUSER_TEST_SEED replays a run)."""
from __future__ import annotations

import pytest
import torch

import muser_torch

from ..formats.ggml_ref import lib
from ..glimmer.conftest import SEED
from ..glimmer.muse_files import write_muse_gguf
from .draft_files import assistant_config, write_draft_gguf

pytest.importorskip("transformers.models.muse_glimmer_assistant")
VOCAB = 320
__all__ = ["SEED", "VOCAB"]


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def pair_files(tmp_path_factory):
    """(target path, its transformers text config, draft path, the assistant config)."""
    lib()
    root = tmp_path_factory.mktemp("dflash")
    target, text_cfg = write_muse_gguf(root / "target.gguf", seed=SEED, vocab=VOCAB)
    acfg = assistant_config()
    draft = write_draft_gguf(root / "draft.gguf", acfg, seed=SEED + 7, vocab=VOCAB)
    return target, text_cfg, draft, acfg


@pytest.fixture(scope="module")
def pair(pair_files):
    """(target model, draft model) loaded by muser_torch."""
    target_path, _, draft_path, _ = pair_files
    target = muser_torch.from_gguf(target_path, dtype=torch.float32)
    return target, muser_torch.from_gguf(draft_path, target=target)
