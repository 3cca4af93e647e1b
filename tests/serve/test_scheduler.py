"""The decode loop without HTTP, on the bundled demo (CPU, float32): batched
greedy and seeded decoding against ``model.generate`` token for token, slot
reuse, the queue bound, cancellation within one step, stop tokens and a
failing forward."""
from __future__ import annotations

import pytest
import torch

from muser_torch.serve.sampling import SamplingParams
from muser_torch.serve.scheduler import Failure, Finish, Job, QueueFull, Scheduler
from muser_torch.text.byte_tokenizer import ByteTokenizer

from ..random_seed import fresh_seed
from .harness import Collect, greedy, run_jobs

SEED = fresh_seed()
PROMPTS = ["def main(", "import os\n", "class Foo:\n    ", "x = [", "    return self._"]


def test_batched_greedy_equals_generate(demo_model):
    tok = demo_model.tokenizer
    ids = [tok.encode(p) for p in PROMPTS]
    want = [greedy(demo_model, i, 24) for i in ids]
    sinks, sched = run_jobs(demo_model, [(i, SamplingParams(max_tokens=24, temperature=0.0))
                                     for i in ids], slots=3)
    assert sched.stats.max_batch == 3       # three decoded in one forward; two waited for a slot
    for p, s, w in zip(PROMPTS, sinks, want):
        assert s.tokens == w, f"prompt {p!r}"
        # the later prompts may reuse a finished one's first token (BOS) from its slot
        assert s.end == Finish("length", len(tok.encode(p)), 24, s.end.cached_tokens)
        assert s.end.cached_tokens in (0, 1)
        assert "".join(piece.text for piece in s.pieces) == tok.decode(w)


def test_seeded_sampling_is_generate_alone_and_batched(demo_model):
    tok = demo_model.tokenizer
    ids = tok.encode("def parse(")
    params = SamplingParams(max_tokens=20, temperature=0.9, top_k=40, top_p=0.95, seed=SEED)
    want = demo_model.generate(torch.tensor(ids), 20, temperature=0.9, top_k=40, top_p=0.95,
                               seed=SEED)[len(ids):].tolist()
    alone, _ = run_jobs(demo_model, [(ids, params)], slots=4)
    others = [(tok.encode(p), SamplingParams(max_tokens=20, temperature=1.0, seed=SEED + k))
              for k, p in enumerate(PROMPTS[:3], 1)]
    batched, sched = run_jobs(demo_model, [*others, (ids, params)], slots=4)
    assert sched.stats.max_batch == 4
    assert alone[0].tokens == want, f"seed {SEED}"
    assert batched[-1].tokens == want, f"seed {SEED}"


def test_a_cancelled_job_frees_its_slot_within_one_step(demo_model):
    tok = demo_model.tokenizer
    sched = Scheduler(demo_model, slots=1, queue=4, context=512)
    seen = {}

    def cancel_third(c: Collect) -> None:
        if len(c.pieces) == 3:
            seen["cancel"] = sched.stats.steps
            jobs[0].cancel()

    def note_first(c: Collect) -> None:
        seen.setdefault("next", sched.stats.steps)

    a, b = Collect(cancel_third), Collect(note_first)
    ids_b = tok.encode("import os\n")
    jobs = [Job(tok.encode("def main("), SamplingParams(temperature=0.0), a),
            Job(ids_b, SamplingParams(max_tokens=6, temperature=0.0), b)]
    for job in jobs:
        sched.submit(job)
    sched.start()
    try:
        b.wait()
    finally:
        sched.stop()
    assert len(a.pieces) == 3 and not isinstance(a.end, Finish)   # the cancel was obeyed at once
    assert seen["next"] == seen["cancel"]    # the next job took the slot before any further step
    assert sched.stats.cancelled == 1
    assert b.tokens == greedy(demo_model, ids_b, 6) and b.end.reason == "length"


def test_the_queue_is_bounded(demo_model):
    tok = demo_model.tokenizer
    sched = Scheduler(demo_model, slots=1, queue=2, context=512)
    sinks = [Collect(), Collect()]
    for s in sinks:
        sched.submit(Job(tok.encode("x"), SamplingParams(max_tokens=2, temperature=0.0), s))
    with pytest.raises(QueueFull, match="1 slots are busy and 2 requests already wait"):
        sched.submit(Job(tok.encode("y"), SamplingParams(max_tokens=2), Collect()))
    assert sched.load() == {"slots_idle": 1, "slots_processing": 0, "queued": 2}
    sched.start()
    try:
        for s in sinks:
            assert s.wait().end.reason == "length"
        extra = Collect()
        sched.submit(Job(tok.encode("z"), SamplingParams(max_tokens=1, temperature=0.0), extra))
        assert extra.wait().end.completion_tokens == 1
    finally:
        sched.stop()


def test_a_prompt_must_leave_room_for_one_token(demo_model):
    sched = Scheduler(demo_model, slots=1, queue=1, context=16)
    with pytest.raises(ValueError, match="a prompt of 16 tokens does not fit a slot's context of 16"):
        sched.submit(Job([65] * 16, SamplingParams(), Collect()))
    with pytest.raises(ValueError, match="a prompt of 0 tokens"):
        sched.submit(Job([], SamplingParams(), Collect()))
    sinks, _ = run_jobs(demo_model, [([65] * 15, SamplingParams(temperature=0.0))], slots=1,
                    context=16)
    assert sinks[0].end == Finish("length", 15, 1)   # the context ends it after one token


class _StopsAt(ByteTokenizer):
    def __init__(self, token: int) -> None:
        self.stop_ids = (self.EOS, token)


def test_a_stop_token_ends_generation_unshown(demo_model, monkeypatch):
    ids = demo_model.tokenizer.encode("class Foo:\n    ")
    ref = greedy(demo_model, ids, 24)
    stop = ref[5]
    k = ref.index(stop)
    monkeypatch.setattr(demo_model, "tokenizer", _StopsAt(stop))
    sinks, _ = run_jobs(demo_model, [(ids, SamplingParams(max_tokens=24, temperature=0.0))], slots=2)
    s = sinks[0]
    assert s.tokens == ref[:k + 1]
    assert s.end == Finish("stop", len(ids), k + 1)
    assert "".join(p.text for p in s.pieces) == demo_model.tokenizer.decode(ref[:k])


class _Poisoned:
    """The model, failing any prefill whose prompt ends in ``POISON``."""
    POISON = 255

    def __init__(self, model) -> None:
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, tokens, slots, last_only=False):
        if tokens.shape[1] > 1 and int(tokens[0, -1]) == self.POISON:
            raise RuntimeError("poisoned prompt")
        return self.model(tokens, slots, last_only=last_only)


def test_a_failing_forward_fails_its_job_and_the_loop_serves_on(demo_model):
    tok = demo_model.tokenizer
    good = tok.encode("x = [")
    sinks, sched = run_jobs(_Poisoned(demo_model), [
        (tok.encode("abc") + [_Poisoned.POISON], SamplingParams(max_tokens=4)),
        (good, SamplingParams(max_tokens=4, temperature=0.0))], slots=1)
    assert sinks[0].end == Failure("decoding failed: RuntimeError: poisoned prompt")
    assert sinks[1].tokens == greedy(demo_model, good, 4)
    assert sched.load()["slots_idle"] == 1
