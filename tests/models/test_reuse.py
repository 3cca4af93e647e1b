"""Keeping a cached prefix (``Decoder.reusable`` and ``keep``, what ``serve``
uses to reuse a slot's cache across requests): a sequence cut back to a
common prefix and continued gives the logits of a cold run of the same tokens
(float32, within 1e-4), on a Gemma 3 file whose sliding layers have 8-token
rings; once such a ring has wrapped, only the whole cached sequence may be
kept, and keeping less would be wrong (the planted check shows it)."""
from __future__ import annotations

import pytest
import torch

from .conftest import SEED, rel_err
from .test_engine import gemma_file, load  # noqa: F401  (fixture)

TOL = 1e-4


def continued(model, cached: torch.Tensor, keep: int, rest: torch.Tensor) -> torch.Tensor:
    """Logits of ``rest`` after the first ``keep`` of ``cached`` tokens, reusing slot 0."""
    model.setup_cache(1, 128)
    slot = torch.tensor([0])
    model(cached[None], slot)
    model.keep(0, keep)
    return model(rest[None], slot)[0]


def cold(model, tokens: torch.Tensor, n_rest: int) -> torch.Tensor:
    return model(tokens[None])[0, -n_rest:]


@pytest.mark.parametrize("cached_len,common", [(7, 4), (8, 3), (8, 8), (20, 20)])
def test_a_kept_prefix_continues_as_a_cold_run(gemma_file, cached_len, common):  # noqa: F811
    model = load("gemma3", gemma_file, "cpu")
    g = torch.Generator().manual_seed(SEED)
    cached = torch.randint(0, model.config.vocab_size, (cached_len,), generator=g)
    rest = torch.randint(0, model.config.vocab_size, (5,), generator=g)
    assert model.reusable(cached_len, common) == common    # within the rings, or all of it
    with torch.no_grad():
        got = continued(model, cached, common, rest)
        want = cold(model, torch.cat((cached[:common], rest)), len(rest))
    err = rel_err(got, want)
    assert err < TOL, f"kept {common} of {cached_len}: relative error {err:.2e} (seed {SEED})"


def test_a_wrapped_ring_keeps_all_or_nothing(gemma_file):  # noqa: F811
    model = load("gemma3", gemma_file, "cpu")
    model.setup_cache(1, 128)
    assert model.reusable(20, 12) == 0 and model.reusable(20, 20) == 20
    assert model.reusable(8, 5) == 5            # the 8-token ring has not wrapped yet
    # what the rule prevents: cutting a wrapped ring back reads keys it overwrote
    g = torch.Generator().manual_seed(SEED)
    cached = torch.randint(0, model.config.vocab_size, (20,), generator=g)
    rest = torch.randint(0, model.config.vocab_size, (5,), generator=g)
    with torch.no_grad():
        wrong = continued(model, cached, 12, rest)
        want = cold(model, torch.cat((cached[:12], rest)), len(rest))
    assert rel_err(wrong, want) > 100 * TOL, f"seed {SEED}"


def test_keep_refuses_a_length_past_the_cache(gemma_file):  # noqa: F811
    model = load("gemma3", gemma_file, "cpu")
    model.setup_cache(1, 16)
    with pytest.raises(ValueError, match=r"keep: length must be in \[0, 16\], got 17"):
        model.keep(0, 17)
