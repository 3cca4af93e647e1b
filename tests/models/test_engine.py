"""The decode engine (``models/engine.py``) and the windowed hand-over of an
accelerator's stream (``models/generation.py``).

On the CPU the engine runs with a recorder whose "recording" is the eager
step itself, counted: the buckets, the padding of a batch with spare slots,
the static buffers and the invalidation of recordings all run here, and the
tokens and logits are held to the plain eager forward. Where CUDA exists,
the same checks run with real CUDA graphs against the eager engine (float32:
logits within 1e-5, greedy tokens equal)."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

import muser_torch
from muser_torch.gguf_io import save_gguf
from muser_torch.models.engine import DecodeEngine, bucket, decode_engine
from muser_torch.models.generation import _Picker, _windowed
from muser_torch.nn import set_numerics
from muser_torch.run import model_path

from .conftest import SEED, rel_err
from .test_gemma3_admission import SMALL, metadata, tensors
from ..bounds import check_bound

CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


class CountingRecorder:
    """A recorder for the CPU: recording returns the step itself, counted."""

    def __init__(self):
        self.recorded = 0

    def new_pool(self):
        return None

    def capture(self, fn, pool):
        self.recorded += 1
        return fn


def engine_for(model) -> DecodeEngine:
    """An engine that records: CUDA graphs on CUDA, the counting recorder on the CPU."""
    if model.lengths.device.type == "cuda":
        return decode_engine(model, "graph")
    return DecodeEngine(model, CountingRecorder())


@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory):
    """A small random Gemma 3: two layers with an 8-token window, two global."""
    cfg = replace(SMALL, context_length=256, n_layers=4, sliding_window=8, sliding_window_pattern=2)
    path = tmp_path_factory.mktemp("engine") / "gemma3-window8.gguf"
    save_gguf(path, metadata(cfg), tensors(cfg), progress=False)
    return path


def load(which: str, gemma_file, device: str):
    path = gemma_file if which == "gemma3" else model_path(None, "q4_k_xl")
    return muser_torch.from_gguf(path, device=device, dtype=torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["gemma3", "glimmer-demo"])
def test_engine_gives_the_eager_tokens(which, gemma_file, device):
    """Three prompts in a 4-slot cache (bucket 4, one padding row), greedy and
    seeded top-p sampling, 24 tokens (three wraps of the 8-token window)."""
    model = load(which, gemma_file, device)
    g = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, model.config.vocab_size, (3, 9), generator=g).to(device)
    engine = engine_for(model)
    with torch.no_grad():
        for kw in ({}, {"temperature": 0.9, "top_p": 0.9, "seed": SEED}):
            model.setup_cache(4, 64)
            want = model.generate(ids, 24, stop=[], engine="eager", **kw)
            model.setup_cache(4, 64)
            got = model.generate(ids, 24, stop=[], engine=engine, **kw)
            assert torch.equal(got, want), f"{which} {kw}: the engine's tokens differ (seed {SEED})"
    # one bucket (4), recorded once per cache set-up; every other step replayed
    assert engine.captures == 2


class FailingRecorder(CountingRecorder):
    """A recorder whose recording fails, as a capture can on a device."""

    def capture(self, fn, pool):
        super().capture(fn, pool)
        raise RuntimeError("operation not permitted when stream is capturing")


def test_a_failed_recording_is_said_and_runs_eagerly(gemma_file):
    """The step whose recording fails runs eagerly, with a warning naming the
    error, and so does every later one: the eager engine's tokens."""
    model = load("gemma3", gemma_file, "cpu")
    ids = torch.randint(0, model.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(SEED))
    recorder = FailingRecorder()
    engine = DecodeEngine(model, recorder)
    with torch.no_grad():
        model.setup_cache(4, 64)
        want = model.generate(ids, 12, stop=[], engine="eager")
        model.setup_cache(4, 64)
        with pytest.warns(RuntimeWarning, match="could not be recorded.*stream is capturing"):
            got = model.generate(ids, 12, stop=[], engine=engine)
    assert torch.equal(got, want), f"the tokens after a failed recording differ (seed {SEED})"
    assert recorder.recorded == 1 and not engine.records and engine.captures == 0


@pytest.mark.parametrize("device", DEVICES)
def test_padded_steps_give_each_rows_logits(gemma_file, device):
    """Rows in any slot order, fewer than the bucket: each row's logits are the
    eager forward's for its slot, the slots grow by one, the spare slot used
    as padding stays empty."""
    model = load("gemma3", gemma_file, device)
    reference = load("gemma3", gemma_file, device)
    g = torch.Generator().manual_seed(SEED)
    engine = engine_for(model)
    with torch.no_grad():
        for m in (model, reference):
            m.setup_cache(8, 64)
        prompts = {s: torch.randint(0, model.config.vocab_size, (1, 3 + s), generator=g).to(device)
                   for s in (0, 2, 5)}
        for m in (model, reference):
            for s, p in prompts.items():
                m(p, torch.tensor([s], device=device))
        slots = [5, 0, 2]               # 3 rows: bucket 4, padded with a copy of the first
        assert bucket(3, 8) == 4
        for step in range(12):
            tokens = torch.randint(0, model.config.vocab_size, (3,), generator=g).to(device)
            got = engine.step(tokens, slots)[:, -1].clone()
            want = reference(tokens[:, None], torch.tensor(slots, device=device))[:, -1]
            err = rel_err(got, want)
            check_bound("engine step: rel err to the reference", err, 1e-5, f"step {step}: relative error {err:.2e} (seed {SEED})")
        assert model.lengths.tolist() == reference.lengths.tolist() == \
            [15, 0, 17, 0, 0, 20, 0, 0], "the padding moved a slot"
        for layer, ref in zip(model.layers, reference.layers):   # and wrote what the rows wrote
            for name in ("k", "v"):
                got, want = getattr(layer.attention.kv_cache, name), getattr(ref.attention.kv_cache, name)
                check_bound("cache rows: rel err to the reference", rel_err(got, want), 1e-5,
                            f"{name} cache (seed {SEED})")
    assert [bucket(r, 8) for r in range(1, 9)] == [1, 2, 4, 4, 5, 6, 7, 8]
    assert engine.captures == 1


@pytest.mark.parametrize("device", DEVICES)
def test_recordings_are_dropped_when_the_model_changes(gemma_file, device):
    model = load("gemma3", gemma_file, device)
    engine = engine_for(model)
    tokens = torch.tensor([1, 2], device=device)

    def steps(n):
        for _ in range(n):
            engine.step(tokens, [0, 1])

    with torch.no_grad():
        model.setup_cache(2, 64)
        steps(6)
        assert engine.captures == 1, "a step without a change recorded again"
        model.setup_cache(2, 64)                 # new cache tensors
        steps(3)
        assert engine.captures == 2
        model.setup_cache(4, 64)                 # another slot count: bucket 2 of 4
        steps(3)
        assert engine.captures == 3
        engine.step(tokens[:1], [3])             # bucket 1: recorded on its second call
        engine.step(tokens[:1], [3])
        assert engine.captures == 4
        if device == "cpu":                      # the ggml numerics run on the CPU only
            set_numerics(model, "ggml")
            steps(3)
            assert engine.captures == 5


def test_bad_engine_arguments(gemma_file):
    model = load("gemma3", gemma_file, "cpu")
    other = load("gemma3", gemma_file, "cpu")
    ids = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="engine must be one of auto, graph, eager, got 'fast'"):
        model.generate(ids, 4, engine="fast")
    if not CUDA:
        with pytest.raises(ValueError, match="engine='graph': steps on cpu cannot be recorded"):
            model.generate(ids, 4, engine="graph")
    with pytest.raises(ValueError, match="runs the model it was made for"):
        model.generate(ids, 4, engine=DecodeEngine(other))
    with pytest.raises(ValueError, match="sync_every must be >= 1, got 0"):
        list(model.stream(ids, 4, sync_every=0))
    model.setup_cache(2, 16)
    engine = DecodeEngine(model, CountingRecorder())
    with pytest.raises(ValueError, match="need 1 to 2 slots"):
        engine.step(torch.tensor([1, 2, 3]), [0, 1, 2])


class Script:
    """Logits whose argmax follows a scripted token per row and step, and a
    count of the steps asked for."""

    def __init__(self, tokens: torch.Tensor, vocab: int):
        self.tokens, self.vocab, self.calls = tokens, vocab, 0

    def logits(self, step: int) -> torch.Tensor:
        out = torch.zeros(self.tokens.shape[1], self.vocab)
        out[torch.arange(self.tokens.shape[1]), self.tokens[step]] = 1.0
        return out

    def next(self, tok):
        self.calls += 1
        return self.logits(self.calls)


def per_token(script: Script, n: int, stop: list[int]) -> list[list[int]]:
    """The CPU's loop: look at every token, end when every row has stopped."""
    picker = _Picker(script.tokens.shape[1], stop, torch.device("cpu"), (0.0, None, None, None))
    out, logits = [], script.logits(0)
    for i in range(n):
        out.append(picker.pick(logits).tolist())
        if bool(picker.done.all()) or i + 1 == n:
            return out
        logits = script.next(None)


def test_windows_hand_over_the_per_token_loops_tokens():
    """Scripted rows that stop at random steps (or never), every window size:
    the same tokens as the per-token loop, never more than n - 1 steps, and
    at most two windows of steps past the end."""
    rng = random.Random(SEED)
    vocab, stop = 50, [7, 9]
    for trial in range(200):
        rows, n, sync_every = rng.randint(1, 4), rng.randint(1, 40), rng.randint(1, 10)
        tokens = torch.randint(10, vocab, (n + 1, rows), generator=torch.Generator().manual_seed(trial))
        for b in range(rows):
            if rng.random() < 0.8:
                tokens[rng.randrange(n + 1), b] = rng.choice(stop)
        want = per_token(Script(tokens, vocab), n, stop)
        script = Script(tokens, vocab)
        picker = _Picker(rows, stop, torch.device("cpu"), (0.0, None, None, None))
        got = [t.tolist() for t in _windowed(picker, script.logits(0), script.next, n, sync_every)]
        where = f"trial {trial}: rows {rows}, n {n}, sync_every {sync_every} (seed {SEED})"
        assert got == want, where
        assert script.calls <= n - 1, where
        assert script.calls <= len(want) - 1 + 2 * sync_every, where


def test_a_deleted_model_is_freed_at_once(gemma_file):
    """The model keeps its engine and the engine only a weak reference back: a
    model deleted after generating is gone without waiting for the garbage
    collector (its file's memory map goes with it)."""
    import gc
    import weakref
    model = load("gemma3", gemma_file, "cpu")
    model.generate(torch.tensor([1, 2, 3]), 3)
    engine = decode_engine(model, "auto")
    gone = weakref.ref(model)
    gc.disable()
    try:
        del model
        assert gone() is None, "a reference cycle keeps the model alive"
    finally:
        gc.enable()
    with pytest.raises(ReferenceError, match="its model was deleted"):
        engine.step(torch.tensor([1]), [0])
