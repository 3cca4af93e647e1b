"""Sampling with a draft keeps the target's distribution: the standard
speculative-sampling rule (accept candidate x with probability
min(1, p(x)/q(x)), else draw from max(p - q, 0) normalized; after the last
accepted candidate draw from p) checked by a chi-square test of the emitted
tokens against p, on a 6-token vocabulary with fresh random p and q.

The verdict is not left to chance more than ``ALPHA`` = 1e-6 per test: the
sample size is fixed (``N``), the generator is seeded from ``SEED``
(printed in every message), and a wrong rule (emitting the draft's own
tokens) is shown to fail the same test at that size."""
from __future__ import annotations

import pytest
import torch

from muser_torch.models.speculative import _accept_sampled

from .conftest import SEED

scipy_stats = pytest.importorskip("scipy.stats")
V, K, N, ALPHA = 6, 3, 20000, 1e-6


def _rows(gen, n):
    return (torch.randn(n, V, generator=gen) * 1.5).softmax(-1)


def _p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.double() / probs.double().sum() * counts.sum()
    return float(scipy_stats.chisquare(counts.double().numpy(), expected.numpy()).pvalue)


def _run(p, q, gen, rule=_accept_sampled):
    first, second = torch.zeros(V), torch.zeros(V)
    for _ in range(N):
        cands = torch.multinomial(q, 1, generator=gen).squeeze(-1)
        out = rule(cands, q, p, gen)
        first[out[0]] += 1
        if len(out) > 1:
            second[out[1]] += 1
    return first, second


def test_emitted_tokens_follow_the_target():
    gen = torch.Generator().manual_seed(SEED)
    p = _rows(gen, K + 1)
    # q >= p / 2 everywhere, so the first candidate is accepted with probability >= 1/2
    # and the second token is drawn about N/2 times or more, whatever the seed
    q = 0.5 * p[:K] + 0.5 * _rows(gen, K)
    first, second = _run(p, q, gen)
    for name, counts, row in (("first", first, p[0]), ("second", second, p[1])):
        pv = _p_value(counts, row)
        assert pv > ALPHA, f"{name} token: chi-square p-value {pv:.2e} against p (seed {SEED})"
    assert second.sum() > N / 10, f"too few second tokens to test (seed {SEED})"


def test_the_test_rejects_the_drafts_own_distribution():
    """Power at this size: emitting the candidates unchecked (q's distribution) fails."""
    gen = torch.Generator().manual_seed(SEED + 1)
    p, q = _rows(gen, K + 1), _rows(gen, K)

    def accept_all(cands, q, p, gen):
        return cands.tolist()

    first, _ = _run(p, q, gen, accept_all)
    assert _p_value(first, p[0]) < ALPHA, f"seed {SEED}"


def test_a_cold_sampled_run_is_the_greedy_run(pair):
    """At a temperature near 0 both distributions are one-hot: the rule
    accepts exactly the greedy prefix, so the output is greedy's."""
    target, draft = pair
    g = torch.Generator().manual_seed(SEED)
    prompt = torch.randint(0, 300, (10,), generator=g)
    plain = target.generate(prompt, 24)
    cold = target.generate(prompt, 24, draft=draft, temperature=1e-6, seed=SEED)
    assert cold.tolist() == plain.tolist(), f"seed {SEED}"
