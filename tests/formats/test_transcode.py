"""Q5_0 as Q8_0 (``formats.legacy.q5_0_as_q8_0``, ``from_gguf(q5_0_as_q8_0=True)``):
the seed's load-time transcode. Every element keeps its value exactly (gguf's
numpy dequantize of the Q5_0 rows against that of the Q8_0 rows, fresh random
weights), and a model loaded so runs no Q5_0 weight
and gives the logits of the plain load; a planted defect (the codes not
centred) breaks the equality."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants as gguf_quants

import muser_torch
from muser_torch.formats import GGMLType, random_weight
from muser_torch.formats.legacy import q5_0_as_q8_0
from muser_torch.nn import QLinear

from ..random_seed import fresh_seed
from ..bounds import check_bound

SEED = fresh_seed()


def _weights(rows: int, cols: int) -> torch.Tensor:
    return random_weight(GGMLType.Q5_0, rows, cols, generator=torch.Generator().manual_seed(SEED)).packed


@pytest.mark.parametrize("shape", [(1, 32), (9, 640), (33, 4096)])
def test_every_element_keeps_its_value(shape):
    rows = _weights(*shape)
    q8 = q5_0_as_q8_0(rows)
    assert q8.shape == (shape[0], GGMLType.Q8_0.row_bytes(shape[1]))
    want = gguf_quants.dequantize(rows.numpy(), Q.Q5_0)
    got = gguf_quants.dequantize(q8.numpy(), Q.Q8_0)
    assert np.array_equal(got, want), f"seed {SEED}"
    codes = q8.reshape(-1, 34)[:, 2:].view(torch.int8)
    assert int(codes.min()) >= -16 and int(codes.max()) <= 15


def test_codes_left_uncentred_break_the_equality():
    rows = _weights(4, 256)
    q8 = q5_0_as_q8_0(rows).reshape(-1, 34).clone()
    q8[:, 2:] = (q8[:, 2:].view(torch.int8) + 16).view(torch.uint8)   # the planted defect
    got = gguf_quants.dequantize(q8.reshape(4, -1).numpy(), Q.Q8_0)
    assert not np.array_equal(got, gguf_quants.dequantize(rows.numpy(), Q.Q5_0))


def test_a_model_loaded_with_the_transcode(gemma_path):
    plain = muser_torch.from_gguf(gemma_path)
    wide = muser_torch.from_gguf(gemma_path, q5_0_as_q8_0=True)
    types = {m.qtype for m in plain.modules() if isinstance(m, QLinear)}
    assert GGMLType.Q5_0 in types, "the real Gemma file has Q5_0 rows (640 wide)"
    assert GGMLType.Q5_0 not in {m.qtype for m in wide.modules() if isinstance(m, QLinear)}
    ids = torch.randint(0, plain.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(SEED))
    with torch.no_grad():
        want, got = plain(ids)[0], wide(ids)[0]
    err = float((got - want).norm() / want.norm())
    check_bound("transcoded: rel err", err, 1e-5, f"rel err {err:.2e} (seed {SEED})")


def test_a_draft_refuses_the_transcode(tmp_path):
    from ..dflash.draft_files import assistant_config, write_draft_gguf
    pytest.importorskip("transformers.models.muse_glimmer_assistant")
    path = write_draft_gguf(tmp_path / "d.gguf", assistant_config(), seed=SEED % 1000, vocab=320)
    with pytest.raises(ValueError, match="q5_0_as_q8_0 is for a model's own file"):
        muser_torch.from_gguf(path, target=None, q5_0_as_q8_0=True)
