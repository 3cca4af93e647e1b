"""Greedy DFlash rounds in their recorded form (``models/draft_rounds.py``):
static buffers, the whole block verified, the acceptance, the cache's rewind
and the draft's ring all on the device, so that a round is one CUDA graph.

On the CPU the rounds run with the engine tests' counting recorder (its
"recording" is the round itself), so every static-shape step runs here and
is held to the target's own greedy tokens and to the eager rounds' statistics.
The target has 16-token sliding windows (the draft's block fits its rings;
the prompts and 64 new tokens wrap them). An oracle in place of the draft's
block (``propose_ring``) proposes the target's own continuation with one token
changed at a random place or none, so every accepted length from 0 to 15
occurs. Where CUDA exists, real graphs give the eager rounds' tokens."""
from __future__ import annotations

import pytest
import torch

import muser_torch
from muser_torch.models.draft_rounds import DraftRounds, draft_rounds
from muser_torch.models.engine import DecodeEngine

from ..bounds import check_bound
from ..glimmer.muse_files import write_muse_gguf
from ..models.test_engine import CountingRecorder
from .conftest import SEED, VOCAB
from .draft_files import assistant_config, write_draft_gguf

N_NEW = 64
WINDOW = 16


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("recorded")
    target, _ = write_muse_gguf(root / "target16.gguf", seed=SEED + 3, vocab=VOCAB, window=WINDOW)
    draft = write_draft_gguf(root / "draft.gguf", assistant_config(), seed=SEED + 11, vocab=VOCAB)
    return target, draft


def _load(files, device: str = "cpu"):
    target = muser_torch.from_gguf(files[0], device=device, dtype=torch.float32)
    return target, muser_torch.from_gguf(files[1], target=target)


def _prompt(n: int, salt: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(SEED * 31 + salt)
    return torch.randint(0, VOCAB, (n,), generator=g)


def _recording(target) -> DecodeEngine:
    return DecodeEngine(target, CountingRecorder())


class RingOracle:
    """In place of the draft's block: ``truth`` (the target's own tokens after
    the prompt) with one token per block changed at a random place (15, 16:
    none), read from the ring's length (the CPU only: it reads the host)."""

    def __init__(self, draft, prompt_len: int, truth: list[int], seed: int):
        self.draft, self.prompt_len, self.truth = draft, prompt_len, truth
        self.gen = torch.Generator().manual_seed(seed)
        self.wrong_at: list[int] = []

    def __call__(self, ring, anchor):
        emitted = int(ring.length) - self.prompt_len + 1     # the anchor is the last of them
        assert self.truth[emitted - 1] == int(anchor), f"seed {SEED}"
        block = list(self.truth[emitted:emitted + 15])
        block += [0] * (15 - len(block))
        j = int(torch.randint(0, 17, (1,), generator=self.gen))
        if j < 15:
            block[j] = (block[j] + 1 + int(torch.randint(0, VOCAB - 1, (1,), generator=self.gen))) % VOCAB
        self.wrong_at.append(j)
        logits = torch.full((15, VOCAB), -5.0)
        logits[torch.arange(15), torch.tensor(block)] = 5.0
        return logits


@pytest.mark.parametrize("n_prompt", [11, 1, 30])
def test_recorded_rounds_are_the_targets_greedy_tokens(files, n_prompt):
    target, draft = _load(files)
    prompt = _prompt(n_prompt, n_prompt)
    plain = target.generate(prompt, N_NEW).tolist()
    recorder = _recording(target)
    got, stats = target.generate(prompt, N_NEW, draft=draft, return_stats=True, engine=recorder)
    assert got.tolist() == plain, f"random draft (seed {SEED})"
    rounds = draft.__dict__["_draft_rounds"]
    assert rounds.captures == 1 and recorder.recorder.recorded == 1, "one recording, replayed"
    eager, eager_stats = target.generate(prompt, N_NEW, draft=draft, return_stats=True, engine="eager")
    assert eager.tolist() == plain and sum(stats.accepted) + stats.rounds == N_NEW - 1
    assert all(0 <= a <= len(p) for a, p in zip(stats.accepted, stats.proposed)), f"seed {SEED}"

    truth = plain[n_prompt:]
    oracle = draft.propose_ring = RingOracle(draft, n_prompt, truth, SEED + n_prompt)
    try:
        got, stats = target.generate(prompt, N_NEW, draft=draft, return_stats=True, engine=recorder)
    finally:
        del draft.propose_ring
    assert got.tolist() == plain, f"oracle (seed {SEED})"
    # each round keeps the block up to the changed token (all 15 when none), cut to the budget
    emitted = 1
    for a, j in zip(stats.accepted, oracle.wrong_at):
        assert a == min(j, 15, N_NEW - emitted - 1), f"seed {SEED}"
        emitted += a + 1
    assert emitted == N_NEW and sum(stats.accepted) > N_NEW // 3, f"seed {SEED}"
    assert int(target.lengths[0]) == n_prompt + N_NEW - 1, "the cache holds what was emitted"


def test_a_stop_token_ends_recorded_rounds_as_a_plain_run(files):
    target, draft = _load(files)
    prompt = _prompt(9, 7)
    plain = target.generate(prompt, 40).tolist()
    for k in (0, 5, 20):           # the first, sixth and 21st generated token
        stop = plain[9 + k]
        want = target.generate(prompt, 40, stop=[stop]).tolist()
        got = target.generate(prompt, 40, stop=[stop], draft=draft, engine=_recording(target)).tolist()
        assert got == want and got[-1] == stop, f"stop at {k} (seed {SEED})"


def test_small_budgets(files):
    target, draft = _load(files)
    prompt = _prompt(5, 3)
    for n in (0, 1, 2, 3, 17):
        want = target.generate(prompt, n).tolist()
        got = target.generate(prompt, n, draft=draft, engine=_recording(target)).tolist()
        assert got == want, f"max_new_tokens={n} (seed {SEED})"


def test_rounds_fall_back_where_they_cannot_record(files, pair):
    """A target whose rings are shorter than the block (the pair's 6-token
    windows) runs the eager rounds, and says why; so does a full cache."""
    target, draft = pair
    rounds = DraftRounds(draft, CountingRecorder())
    target.setup_cache(1, 64)
    assert rounds.why_not(4, 8) == "a sliding ring of 6 entries is shorter than the draft's block of 16"
    target16, draft16 = _load(files)
    target16.setup_cache(1, 64)
    rounds = draft_rounds(draft16, CountingRecorder())
    assert rounds.why_not(4, 45) is None
    assert rounds.why_not(4, 46) == "the cache has no room for a whole block past the last token"


def test_a_recording_serves_later_calls_until_the_cache_grows(files):
    """A second generate whose prompt fits the cache replays the first one's
    recording; one that needs a longer cache re-sets it up, and the rounds
    record anew (the old recording holds the old cache's tensors)."""
    target, draft = _load(files)
    recorder = _recording(target)
    rounds = []
    for n_prompt in (30, 11, 60):           # 60: past the cache that 30 set up
        prompt = _prompt(n_prompt, n_prompt)
        plain = target.generate(prompt, N_NEW).tolist()
        got = target.generate(prompt, N_NEW, draft=draft, engine=recorder).tolist()
        assert got == plain, f"prompt {n_prompt} (seed {SEED})"
        rounds.append(draft.__dict__["_draft_rounds"].captures)
    assert rounds == [1, 1, 2], f"recordings after each call: {rounds}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_rounds_match_eager_rounds(files):
    target, draft = _load(files, "cuda")
    # the longer prompt first: its cache holds the shorter one's, so one recording
    # serves both (the other order re-sets the cache up and records twice)
    for n_prompt in (30, 11):
        prompt = _prompt(n_prompt, n_prompt).cuda()
        eager = target.generate(prompt, N_NEW, draft=draft, engine="eager").tolist()
        got = target.generate(prompt, N_NEW, draft=draft).tolist()
        assert got == eager, f"prompt {n_prompt} (seed {SEED})"
    assert draft.__dict__["_draft_rounds"].captures == 1


def test_the_ring_gives_the_drafts_own_block(pair):
    """``extend_ring`` and ``propose_ring`` (static rows, a keep count, a ring)
    against ``extend`` and ``propose`` (the kept rows only, a growing
    context): the same logits within float32's 1e-5 over rounds that wrap
    the ring, keeping 0 to 16 rows each."""
    target, draft = pair
    taps, hidden = len(draft.tap_layers), target.config.hidden
    g = torch.Generator().manual_seed(SEED + 5)
    ring = draft.new_ring(draft.config.sliding_window + draft.config.block_size
                          if None not in [draft.config.window(i) for i in range(draft.config.n_layers)]
                          else 256)
    ctx = muser_torch.models.dflash.DraftContext()
    prompt = torch.randn(1, 9, taps * hidden, generator=g)
    draft.extend(ctx, prompt)
    draft.extend_ring(ring, prompt, torch.tensor([9]))
    for r in range(12):
        anchor = int(torch.randint(0, VOCAB, (1,), generator=g))
        want = draft.propose(ctx, anchor)
        got = draft.propose_ring(ring, torch.tensor([anchor]))
        check_bound("ring block: rel err to the growing context's", float((got - want).norm() / want.norm()),
                    1e-5, f"round {r} (seed {SEED})")
        rows = torch.randn(1, 16, taps * hidden, generator=g)
        keep = int(torch.randint(0, 17, (1,), generator=g))
        draft.extend(ctx, rows[:, :keep]) if keep else None
        draft.extend_ring(ring, rows, torch.tensor([keep]))
    assert int(ring.length) == ctx.length


class FailingRecorder(CountingRecorder):
    def capture(self, fn, pool):
        raise RuntimeError("operation not permitted when stream is capturing")


def test_a_round_that_cannot_be_recorded_says_so_and_runs_unrecorded(files):
    target, draft = _load(files)
    prompt = _prompt(7, 1)
    want = target.generate(prompt, 40).tolist()
    with pytest.warns(RuntimeWarning, match=r"DFlash rounds could not be recorded as a CUDA graph "
                                            r"\(RuntimeError: operation not permitted"):
        got = target.generate(prompt, 40, draft=draft, engine=DecodeEngine(target, FailingRecorder()))
    assert got.tolist() == want, f"seed {SEED}"
