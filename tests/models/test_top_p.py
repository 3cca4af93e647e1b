"""Top-p (``models/sampling.py``): the CPU's candidate search gives the
distribution of the whole float64 sort, ties and edge ``top_p`` values
included, and on a peaked distribution of Gemma 3's vocabulary it never sorts
or draws over the whole vocabulary (its cost, counted as work, not timed)."""
from __future__ import annotations

import pytest
import torch

from muser_torch.models import sampling
from muser_torch.models.sampling import distribution, sample

from .conftest import SEED

GEMMA_VOCAB = 262_144
TOP_PS = (1e-9, 0.1, 0.5, 0.9, 0.95, 0.999, 1 - 2 ** -20)


def reference(logits: torch.Tensor, temperature: float, top_p: float):
    """float64 distribution of one row by the whole sort, and the smallest
    distance of a running mass to ``top_p`` at the cut (how close the float32
    decision may come to going the other way)."""
    p = (logits.double() / temperature).softmax(-1)
    ranked = p.sort(descending=True).values
    before = ranked.cumsum(-1) - ranked
    n = max(int((before < top_p).sum()), 1)
    margin = abs(top_p - float(before[n - 1])) if n > 1 else 1.0
    if n < p.numel():
        margin = min(margin, abs(float(before[n]) - top_p))
    keep = p >= ranked[n - 1]        # ties with the last kept token stay (module doc)
    q = torch.where(keep, p, 0.0)
    return q / q.sum(), margin


def cases(g: torch.Generator):
    """(name, logits [V]): peaked, flat, heavy ties, all equal."""
    for v in (7, 300, 5000):
        yield f"normal-{v}", torch.randn(v, generator=g) * 3
        yield f"ties-{v}", torch.randint(0, 4, (v,), generator=g).float()
    peaked = torch.randn(GEMMA_VOCAB, generator=g)
    peaked[torch.randint(0, GEMMA_VOCAB, (12,), generator=g)] += 14
    yield "gemma-peaked", peaked
    yield "gemma-flat", torch.randn(GEMMA_VOCAB, generator=g) * 0.5
    yield "equal-8", torch.zeros(8)


def whole_sort_float32(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The kept tokens of one row as the whole sort finds them, on the same float32 probabilities."""
    p = ((logits - logits.max()) / temperature).softmax(-1)
    ranked = p.sort(descending=True).values
    before = ranked.cumsum(-1) - ranked
    return p >= ranked[max(int((before < top_p).sum()), 1) - 1]


def test_top_p_is_the_whole_sorts_distribution():
    """Exactly the whole float32 sort's kept tokens; the float64 sort's (and
    its probabilities within a total variation of 1e-4) where its running
    mass is not within float32's reach of top_p."""
    g = torch.Generator().manual_seed(SEED)
    decided = 0
    for name, logits in cases(g):
        large = logits.numel() == GEMMA_VOCAB     # fewer settings: each sorts 262,144 three times
        for t in (0.8,) if large else (0.8, 1.0):
            for top_p in (0.5, 0.95, 0.999) if large else TOP_PS:
                where = f"{name} t={t} top_p={top_p} (seed {SEED})"
                got = distribution(logits[None], t, top_p=top_p)[0]
                assert torch.equal(got > 0, whole_sort_float32(logits, t, top_p)), where
                want, margin = reference(logits, t, top_p)
                # float32's softmax over 262,144 scores is off float64's by up to ~5e-5 of
                # a probability; nearer the cut than 2e-4, the decision may go either way
                if margin >= 2e-4:
                    decided += 1
                    assert torch.equal(got > 0, want > 0), f"kept tokens differ: {where}"
                    assert float((got.double() - want).abs().sum()) / 2 < 1e-4, where
    assert decided >= 50, decided


def test_ties_and_edges_by_hand():
    # all tied: the cut falls inside the tie, and the whole tie stays
    assert torch.equal(distribution(torch.zeros(1, 8), 1.0, top_p=0.5), torch.full((1, 8), 0.125))
    # a tiny top_p keeps the argmax and only the tokens tied with it
    got = distribution(torch.tensor([[1.0, 3.0, 3.0, 2.0]]), 1.0, top_p=1e-9)
    assert torch.equal(got, torch.tensor([[0.0, 0.5, 0.5, 0.0]]))
    # top_p 1 keeps everything
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    assert torch.allclose(distribution(logits, 1.0, top_p=1.0), logits.softmax(-1))


def test_a_draw_keeps_to_the_distribution():
    """sample() draws over the kept tokens only: its support is the kept set
    and its frequencies those of ``distribution`` (within 6 sigma)."""
    logits = torch.full((1, 20_000), -20.0)
    logits[0, [7, 10_000, 19_000, 3]] = torch.tensor([4.0, 3.6, 3.3, 0.0])
    want = distribution(logits, 1.0, top_p=0.9)[0]
    kept = want.nonzero().squeeze(1)
    assert kept.tolist() == [7, 10_000, 19_000]
    g = torch.Generator().manual_seed(SEED)
    n = 3000
    draws = torch.cat([sample(logits, 1.0, top_p=0.9, generator=g) for _ in range(n)])
    assert set(draws.tolist()) == set(kept.tolist()), f"seed {SEED}"
    for token in kept.tolist():
        p = float(want[token])
        freq = float((draws == token).float().mean())
        assert abs(freq - p) < 6 * (p * (1 - p) / n) ** 0.5, f"token {token}: {freq} vs {p} (seed {SEED})"


def test_a_peaked_step_sorts_and_draws_over_candidates_only(monkeypatch):
    """Gemma's default sampling (temperature 0.8, top_p 0.95) on a peaked
    distribution sorts at most 1/TOP_P_FLOORS[0] candidates and draws over the
    kept ones; a flat one falls back to the whole sort, and still agrees."""
    sizes = {"sort": [], "multinomial": []}
    real_sort, real_multinomial = torch.Tensor.sort, torch.multinomial

    def sort(self, *a, **kw):
        sizes["sort"].append(self.shape[-1])
        return real_sort(self, *a, **kw)

    def multinomial(probs, *a, **kw):
        sizes["multinomial"].append(probs.shape[-1])
        return real_multinomial(probs, *a, **kw)

    monkeypatch.setattr(torch.Tensor, "sort", sort)
    monkeypatch.setattr(torch, "multinomial", multinomial)
    g = torch.Generator().manual_seed(SEED)
    peaked = torch.randn(2, GEMMA_VOCAB, generator=g)
    peaked[:, :40] += 12
    sample(peaked, 0.8, top_p=0.95, generator=g)
    assert sizes["sort"] and max(sizes["sort"]) <= 1 / sampling.TOP_P_FLOORS[0], sizes
    assert max(sizes["multinomial"]) <= 40, sizes

    sizes["sort"].clear()
    flat = torch.randn(1, GEMMA_VOCAB, generator=g) * 0.1
    token = sample(flat, 0.8, top_p=0.95, generator=g)
    assert GEMMA_VOCAB in sizes["sort"], sizes            # the whole sort, as the fallback
    assert distribution(flat, 0.8, top_p=0.95)[0, token] > 0


@pytest.mark.parametrize("top_p", [0.5, 0.95])
def test_batched_rows_are_cut_each_on_its_own(top_p):
    g = torch.Generator().manual_seed(SEED)
    logits = torch.randn(3, 2000, generator=g) * torch.tensor([[0.5], [3.0], [8.0]])
    got = distribution(logits, 0.9, top_p=top_p)
    for row in range(3):
        assert torch.equal(got[row], distribution(logits[row:row + 1], 0.9, top_p=top_p)[0])
