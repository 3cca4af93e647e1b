"""Loading a DFlash draft: the file llama.cpp's converter writes is admitted
through the ``dflash`` row of the architecture table, its projections stay
packed and it shares its target's packed embedding and lm_head; a draft with
no target, or one whose vocabulary, hidden size or taps do not fit, is
refused with one line naming the mismatch."""
from __future__ import annotations

import pytest
import torch

import muser_torch
from muser_torch.errors import DraftMismatchError, MetadataError
from muser_torch.nn import QLinear

from ..glimmer.muse_files import write_muse_gguf
from .conftest import SEED, VOCAB
from .draft_files import assistant_config, write_draft_gguf


def test_draft_is_packed_and_shares_the_targets_tables(pair, pair_files):
    target, draft = pair
    assert draft.config.target_layers == (1, 3, 4) and draft.tap_layers == (0, 2, 3)
    assert draft.config.block_size == 16 and draft.config.mask_token_id == 317
    assert isinstance(draft.fc, QLinear) and draft.fc.n_in == 3 * 256
    assert all(isinstance(layer.attention.wq, QLinear) for layer in draft.layers)
    assert draft.target is target
    names = {n for n, _ in draft.named_parameters()} | {n for n, _ in draft.named_buffers()}
    assert not any(n.startswith(("tok_embeddings", "output", "target")) for n in names), names
    assert all(p.data_ptr() != target.output.packed.data_ptr() for p in draft.buffers())


def test_a_draft_without_a_target_is_refused(pair_files):
    with pytest.raises(DraftMismatchError, match=r"draft.gguf is a DFlash draft: load it with its "
                                                 r"target, muser_torch.from_gguf\('draft.gguf', "
                                                 r"target=model\)"):
        muser_torch.from_gguf(pair_files[2])


def test_a_target_for_a_model_file_is_refused(pair, pair_files):
    with pytest.raises(ValueError, match="is a 'muse-glimmer' model, not a draft"):
        muser_torch.from_gguf(pair_files[0], target=pair[0])


@pytest.mark.parametrize("what,make,message", [
    ("vocabulary", dict(vocab=VOCAB + 2), r"the draft's vocabulary has 322 tokens, its target's 320"),
    ("hidden", dict(hidden=512), r"dflash.embedding_length is 512, its target's hidden size is 256"),
    ("taps", dict(tap_ids=(0, 4)), r"dflash.target_layers \[1, 5\] taps layer input 5, but the "
                                    r"target's 5 layers have inputs 1 .. 4"),
])
def test_a_draft_that_does_not_fit_is_refused(pair, tmp_path, what, make, message):
    vocab = make.pop("vocab", VOCAB)
    cfg = assistant_config(**make)
    path = write_draft_gguf(tmp_path / "bad.gguf", cfg, seed=SEED, vocab=vocab,
                            types=("Q8_0", "F16"))
    with pytest.raises(DraftMismatchError, match=message) as e:
        muser_torch.from_gguf(path, target=pair[0])
    assert "\n" not in str(e.value)


def test_a_mask_token_outside_the_vocabulary_is_refused(pair, tmp_path):
    cfg = assistant_config(mask=VOCAB)
    path = write_draft_gguf(tmp_path / "m.gguf", cfg, seed=SEED, vocab=VOCAB, types=("Q8_0",))
    with pytest.raises(MetadataError, match=r"tokenizer.ggml.mask_token_id is 320, outside the "
                                            r"vocabulary of 320 tokens"):
        muser_torch.from_gguf(path, target=pair[0])


def test_a_graph_key_the_draft_does_not_follow_is_refused(pair, tmp_path):
    def edit(md, tensors):
        md["dflash.attention.causal"] = True
    path = write_draft_gguf(tmp_path / "c.gguf", assistant_config(), seed=SEED, vocab=VOCAB,
                            types=("Q8_0",), edit=edit)
    with pytest.raises(MetadataError, match=r"dflash.attention.causal is set, but"):
        muser_torch.from_gguf(path, target=pair[0])
