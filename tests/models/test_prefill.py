"""The prefill engine (``models/prefill.py``): a prompt padded to its length
bucket, recorded, and the padding taken back.

On the CPU the engine runs with a recorder whose "recording" is the chunk
itself, counted, so the buckets, the chunking, the padding's rewind and the
length bookkeeping all run here against the model's eager prefill: the same
last-position logits (within the float32 kernels' sums), the same cache
entries, and the same greedy continuation. Where CUDA exists, the same
checks run with real CUDA graphs."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from muser_torch.gguf_io import save_gguf
from muser_torch.models.engine import engine_recorder
from muser_torch.models.prefill import MIN_BUCKET, PrefillEngine, prefill_bucket, prefill_engine
from muser_torch.models.taps import caches

from .conftest import SEED, rel_err
from .test_engine import CountingRecorder, load
from .test_gemma3_admission import SMALL, metadata, tensors
from ..bounds import check_bound, check_floor

CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory):
    """A small random Gemma 3: two layers with a 16-token window (so 16-token
    chunks), two global."""
    cfg = replace(SMALL, context_length=256, n_layers=4, sliding_window=16, sliding_window_pattern=2)
    path = tmp_path_factory.mktemp("prefill") / "gemma3-window16.gguf"
    save_gguf(path, metadata(cfg), tensors(cfg), progress=False)
    return path


def engine_for(model) -> PrefillEngine:
    """An engine that records: CUDA graphs on CUDA, the counting recorder on the CPU."""
    if model.lengths.device.type == "cuda":
        return prefill_engine(model, engine_recorder("graph", model.lengths.device, "prefills"))
    return PrefillEngine(model, CountingRecorder())


def cache_state(model) -> list[torch.Tensor]:
    return [t.clone() for c in caches(model) for t in (c.k, c.v)]


def greedy(model, logits: torch.Tensor, slot: torch.Tensor, n: int) -> list[torch.Tensor]:
    """n greedy one-token steps after a prefill's logits: each step's logits."""
    out = []
    for _ in range(n):
        tok = logits[:, -1].argmax(-1, keepdim=True)
        logits = model(tok, slot)
        out.append(logits)
    return out


TOL = 1e-4     # a recorded prefill against the eager one (see the test below)


def test_buckets():
    assert [prefill_bucket(n, 512) for n in (1, 16, 17, 100, 512)] == [16, 16, 32, 128, 512]
    assert prefill_bucket(20, 16) == 16 and MIN_BUCKET == 16


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["gemma3", "glimmer-demo"])
def test_a_recorded_prefill_is_the_eager_prefill(which, gemma_file, device):
    """Prompts inside one bucket, at its edge and over several chunks (Gemma's
    16-token window makes 16-token chunks): the last position's logits, the
    slot's length, every cache entry (the padding's writes taken back, so the
    entries no real token wrote are still zero) and 4 greedy steps after it
    equal the eager prefill's, within 1e-4: the projections see the bucket's rows,
    not the prompt's, so they may run on another rung of the ladder (each within
    1e-5 of float64) and the difference grows through the layers (the Glimmer
    demo: 3.2e-5 at worst over 500 seeds, in the steps after); each bucket
    records once."""
    model = load(which, gemma_file, device)
    g = torch.Generator().manual_seed(SEED)
    engine = engine_for(model)
    slot = torch.tensor([1], device=device)
    lengths = (5, 16, 23, 40, 7) if which == "gemma3" else (5, 16, 23, 40, 100, 7)
    prompts = [torch.randint(0, model.config.vocab_size, (1, n), generator=g).to(device) for n in lengths]
    with torch.no_grad():
        wants = []
        for ids in prompts:            # the eager prefills, each in a fresh cache
            model.setup_cache(2, 128)
            want = model(ids, slot, last_only=True)
            wants.append((want, cache_state(model), model.lengths.clone(), greedy(model, want, slot, 4)))
        model.setup_cache(2, 128)      # one cache for the engine: its recordings hold its tensors
        for rep in range(2):           # the second pass replays every bucket
            for ids, (want, want_cache, want_len, want_steps) in zip(prompts, wants):
                for c in caches(model):    # emptied in place, as a new cache would be
                    c.k.zero_()
                    c.v.zero_()
                model.lengths.zero_()
                got = engine.prefill(ids, slot)
                ctx = f"{which} n={ids.shape[1]} pass {rep} seed={SEED}"
                assert got.shape == want.shape
                check_bound("prefill logits", rel_err(got, want), TOL, ctx)
                assert torch.equal(model.lengths, want_len), ctx
                for have, ref in zip(cache_state(model), want_cache):
                    check_bound("prefill cache", rel_err(have, ref), TOL, ctx)
                    assert torch.equal(have == 0, ref == 0), f"padding left in the cache: {ctx}"
                for have, ref in zip(greedy(model, got, slot, 4), want_steps):
                    check_bound("steps after the prefill", rel_err(have, ref), TOL, ctx)
    largest = engine.largest()
    buckets = {prefill_bucket(min(n - k, largest), largest) for n in lengths for k in range(0, n, largest)}
    if device == "cpu":
        assert engine.recorder.recorded == len(buckets) == engine.captures
    else:
        assert engine.captures == len(buckets)


def test_without_the_rewind_the_padding_would_stay(gemma_file, monkeypatch):
    """The cache check above sees a prefill that keeps its padding: with the
    rewind made a no-op, the padded entries differ from the eager prefill's."""
    from muser_torch.models.parts import KVCache
    model = load("gemma3", gemma_file, "cpu")
    g = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, model.config.vocab_size, (1, 5), generator=g)
    slot = torch.tensor([0])
    with torch.no_grad():
        model.setup_cache(1, 128)
        model(ids, slot, last_only=True)
        want = cache_state(model)
        monkeypatch.setattr(KVCache, "rewind_on_device", lambda self, keep: setattr(self, "journal", None))
        model.setup_cache(1, 128)
        PrefillEngine(model, CountingRecorder()).prefill(ids, slot)
    worst = max(rel_err(have, ref) for have, ref in zip(cache_state(model), want))
    check_floor("unrewound padding", worst, 1e-2, f"seed={SEED}")


def test_what_the_engine_leaves_to_the_eager_forward(gemma_file):
    """A batch of prompts, image rows, or no recorder: the model's own forward."""
    model = load("gemma3", gemma_file, "cpu")
    engine = PrefillEngine(model, CountingRecorder())
    model.setup_cache(2, 64)
    ids = torch.zeros((2, 5), dtype=torch.long)
    assert not engine.takes(ids)
    assert not engine.takes(ids[:1], embeds=(torch.zeros(1, 5, dtype=torch.bool), torch.zeros(0, 8)))
    assert engine.takes(ids[:1])
    assert not PrefillEngine(model, None).takes(ids[:1])
    with torch.no_grad():
        engine.prefill(ids, torch.tensor([0, 1]))
    assert engine.recorder.recorded == 0 and model.lengths.tolist() == [5, 5]
