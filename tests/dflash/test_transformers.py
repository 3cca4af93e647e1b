"""A random DFlash draft and its random Muse Glimmer target, both written as
llama.cpp's converter writes them (``draft_files.py``, ``muse_files.py``),
against transformers' own ``MuseGlimmerAssistantModel`` and
``MuseGlimmerForConditionalGeneration`` holding the dequantized weights,
generating with ``speculation_type="dflash"`` (its
``DFlashTokenCandidateGenerator``): the first round's draft logits, and
every round's proposed block and accepted count over 64 tokens.

The draft has 2 layers with a 5-token bidirectional window (narrower than
the 16-token block), reads target layers 0, 2 and 3 of 5, and its
projections mix ggml types. ``SEED`` (conftest) replays a run."""
from __future__ import annotations

import pytest
import torch


from .conftest import SEED, VOCAB
from .draft_files import (assert_draft_logits_match, first_round, reference_draft, reference_target,
                          transformers_rounds)

N_NEW = 64


def _prompt(n: int = 11) -> torch.Tensor:
    g = torch.Generator().manual_seed(SEED * 31 + 5)
    return torch.randint(0, VOCAB, (1, n), generator=g)


@pytest.fixture(scope="module")
def references(pair_files):
    target_path, text_cfg, draft_path, acfg = pair_files
    return reference_target(target_path, text_cfg), reference_draft(draft_path, acfg)


@pytest.fixture(scope="module")
def transformers_run(references):
    return transformers_rounds(*references, _prompt(), N_NEW)


def test_first_round_draft_logits_match_transformers(pair, transformers_run):
    target, draft = pair
    _, rounds = transformers_run
    ids = _prompt()
    got, _, _ = first_round(target, draft, ids)
    assert_draft_logits_match(got, rounds[0][1][0], (15, VOCAB), SEED)


def test_blocks_and_acceptance_match_transformers(pair, transformers_run):
    target, draft = pair
    want_tokens, rounds = transformers_run
    out, stats = target.generate(_prompt()[0], N_NEW, draft=draft, return_stats=True)
    assert out[-N_NEW:].tolist() == want_tokens, f"seed {SEED}"
    assert stats.proposed == [r[0] for r in rounds], f"seed {SEED}"
    assert stats.accepted == [r[2] for r in rounds], f"seed {SEED}"
    assert len(stats.proposed) >= 4 and all(len(p) == 15 for p in stats.proposed), f"seed {SEED}"
