"""Muse Glimmer's forward, KV cache, batching, generation and compilation, on small
synthetic GGUFs of both lanes."""
from __future__ import annotations

import pytest
import torch

from muser_torch import Glimmer
from muser_torch.gguf_io import load_gguf

from .conftest import LANES, SEED, rel_err
from .. import slow
from ..slots import decode_in_slots
from .reference import reference_logits
from ..bounds import check_bound


def _tokens(n: int, batch: int | None = None, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(SEED * 7 + salt)
    shape = (n,) if batch is None else (batch, n)
    return torch.randint(0, 258, shape, generator=g)


@pytest.mark.parametrize("lane", LANES)
def test_logits_match_float64_reference(tiny_files, lane):
    """The packed model's logits equal an independent float64 forward over the
    dequantized tensors (tests/glimmer/reference.py), past the SWA window."""
    path = tiny_files[lane]
    model = Glimmer.from_gguf(path, dtype=torch.float32)
    gguf = load_gguf(path)
    weights = {n: gguf.dequantize(n).double() for n in gguf.tensors if "_scale" not in n}
    tokens = _tokens(29)
    got = model(tokens[None])[0]
    sliding = gguf.metadata["muse-glimmer.attention.sliding_window_pattern"]   # the file's own bools
    want = reference_logits(weights, model.config, tokens, sliding)
    err = rel_err(got, want)
    check_bound("logits: rel err to float64", err, 1e-4, f"{lane}: relative error {err:.2e} vs float64 reference (seed {SEED})")
    assert float(want.std()) > 0.1, f"degenerate reference logits (seed {SEED})"


@pytest.mark.parametrize("lane", LANES)
def test_incremental_decode_matches_full_forward(tiny_files, lane):
    """Prefill in uneven chunks (one longer than the window), then decode one
    token at a time to 5x the window: every position equals the full forward."""
    model = Glimmer.from_gguf(tiny_files[lane], dtype=torch.float32)
    T = 5 * model.config.sliding_window
    tokens = _tokens(T, batch=1, salt=1)
    full = model(tokens)[0]
    model.setup_cache(slots=2, max_seq_len=T)
    slot = torch.tensor([1])
    cuts = [0, 3, 3 + 11] + list(range(15, T + 1))
    pieces = [model(tokens[:, a:b], slot)[0] for a, b in zip(cuts, cuts[1:])]
    inc = torch.cat(pieces)
    assert int(model.lengths[1]) == T and int(model.lengths[0]) == 0
    # The chunks run other rungs than the full forward (the 1-token matvec, the
    # GEMM), which sum in another float32 order: over 12 seeds the worst position
    # was 1.9e-6 (q4_k_xl) and 1.1e-5 (nvfp4). A wrong cache row, position or mask
    # is 1e-2 or more.
    for t in range(T):
        err = rel_err(inc[t], full[t])
        check_bound("incremental: worst position's rel err", err, 1e-4, f"{lane}: position {t}: relative error {err:.2e} (seed {SEED})")


def test_f16_cache_and_activations_stay_close(tiny_files):
    """A float16 model with its f16 cache tracks the float32 model."""
    path = tiny_files["q4_k_xl"]
    ref = Glimmer.from_gguf(path, dtype=torch.float32)
    half = Glimmer.from_gguf(path, dtype=torch.float16)  # float16 activations, f16 KV cache
    tokens = _tokens(24, batch=1, salt=2)
    want = ref(tokens)[0]
    half.setup_cache(1, 24)
    assert half.layers[0].attention.kv_cache.k.dtype == torch.float16
    slot = torch.tensor([0])
    got = torch.cat([half(tokens[:, :10], slot)[0]] + [half(tokens[:, t:t + 1], slot)[0]
                                                       for t in range(10, 24)])
    err = rel_err(got.float(), want)
    check_bound("f16 decode: rel err", err, 2e-2, f"f16 decode relative error {err:.2e} (seed {SEED})")


@pytest.mark.parametrize("lane", LANES)
def test_batch_of_slots_equals_each_slot_alone(tiny_files, lane):
    model = Glimmer.from_gguf(tiny_files[lane], dtype=torch.float32)
    g = torch.Generator().manual_seed(SEED + 3)
    lengths = torch.randint(1, 20, (3,), generator=g).tolist()
    steps = 12
    seqs = [_tokens(n + steps, salt=10 + i) for i, n in enumerate(lengths)]
    # together: slots 2, 0, 3 of a 5-slot cache, prompts prefilled one by one
    slots = [2, 0, 3]
    together = decode_in_slots(model, seqs, lengths, slots, steps, max_seq_len=64)  # [3, steps, V]
    for i, (seq, n) in enumerate(zip(seqs, lengths)):
        model.setup_cache(slots=1, max_seq_len=64)
        model(seq[None, :n], torch.tensor([0]))
        alone = torch.cat([model(seq[None, n + t:n + t + 1], torch.tensor([0]))[0]
                           for t in range(steps)])
        err = rel_err(together[i], alone)
        check_bound("a slot against alone: rel err", err, 1e-5, f"{lane}: slot {slots[i]} (prompt {n}) differs by {err:.2e} (seed {SEED})")


# Inductor's code generation of this architecture's decode step is checked by
# test_compile_modes; here the traced graph (aot_eager) is what matters.
@pytest.mark.parametrize("compiled", [None, "aot_eager", slow.param("inductor")])
def test_whole_batch_in_any_slot_order_matches_full_forward(tiny_files, compiled):
    """A batch holding every slot, in a shuffled order, runs in slot order over
    the cache buffers as they sit (no gather): a chunk longer than the window,
    then decode steps well past it (eager or compiled) equal each sequence's
    full forward."""
    model = Glimmer.from_gguf(tiny_files["nvfp4"], dtype=torch.float32)
    g = torch.Generator().manual_seed(SEED + 11)
    lengths = torch.randint(1, 20, (3,), generator=g).tolist()
    slots = torch.randperm(3, generator=g)
    if torch.equal(slots, torch.arange(3)):
        slots = slots.flip(0)                                   # a real shuffle
    W = model.config.sliding_window
    chunk, steps = W + 3, 3 * W
    seqs = [_tokens(n + chunk + steps, salt=20 + i) for i, n in enumerate(lengths)]
    step_fn = torch.compile(model.forward, fullgraph=True, backend=compiled) if compiled \
        else model.forward
    model.setup_cache(slots=3, max_seq_len=80)
    for s, seq, n in zip(slots.tolist(), seqs, lengths):
        model(seq[None, :n], torch.tensor([s]))
    together = [model(torch.stack([seq[n:n + chunk] for seq, n in zip(seqs, lengths)]), slots)]
    for t in range(chunk, chunk + steps):
        step = torch.stack([seq[n + t] for seq, n in zip(seqs, lengths)])[:, None]
        together.append(step_fn(step, slots))
    together = torch.cat(together, dim=1)                         # [3, chunk + steps, V]
    assert model.lengths[slots].tolist() == [n + chunk + steps for n in lengths], f"seed {SEED}"
    for i, (seq, n) in enumerate(zip(seqs, lengths)):
        full = model(seq[None])[0, n:]                             # no cache
        err = rel_err(together[i], full)
        check_bound("a slot in any order against its full forward: rel err", err, 1e-5,
                    f"slot {int(slots[i])} of order {slots.tolist()} (prompt {n}, seed {SEED})")


def test_bfloat16_model_attends_over_its_f16_cache(tiny_files):
    """bfloat16 activations keep the default f16 cache: attention runs in the
    cache's dtype over it as it sits, and decode tracks the float32 model."""
    path = tiny_files["q4_k_xl"]
    want = Glimmer.from_gguf(path, dtype=torch.float32)(_tokens(30, batch=1, salt=12))[0]
    model = Glimmer.from_gguf(path, dtype=torch.bfloat16)
    model.setup_cache(2, 30)
    assert model.layers[0].attention.kv_cache.k.dtype == torch.float16
    tokens, slot = _tokens(30, batch=1, salt=12), torch.tensor([1])
    got = torch.cat([model(tokens[:, :12], slot)[0]] + [model(tokens[:, t:t + 1], slot)[0]
                                                       for t in range(12, 30)])
    assert got.dtype == torch.bfloat16
    err = rel_err(got.float(), want)
    check_bound("bfloat16 decode: rel err", err, 3e-2, f"bfloat16 decode relative error {err:.2e} (seed {SEED})")


def test_greedy_generate_is_argmax_of_full_forward(tiny_files):
    model = Glimmer.from_gguf(tiny_files["nvfp4"], dtype=torch.float32)
    prompt = _tokens(6, salt=4)
    out = model.generate(prompt, 14, temperature=0, stop=[])
    assert out.shape == (20,) and torch.equal(out[:6], prompt)
    logits = model(out[None])[0]
    assert torch.equal(out[6:], logits[5:-1].argmax(-1)), f"greedy tokens differ (seed {SEED})"


def test_generate_deterministic_under_seed(tiny_files):
    model = Glimmer.from_gguf(tiny_files["q4_k_xl"], dtype=torch.float32)
    prompt = _tokens(5, batch=2, salt=5)
    kw = dict(temperature=1.5, top_k=100, top_p=0.95, stop=[])
    a = model.generate(prompt, 16, seed=SEED, **kw)
    b = model.generate(prompt, 16, seed=SEED, **kw)
    assert torch.equal(a, b), f"same seed, different tokens (seed {SEED})"
    others = [model.generate(prompt, 16, seed=SEED + k, **kw) for k in range(1, 4)]
    assert any(not torch.equal(a, o) for o in others), f"seed has no effect (seed {SEED})"
    streamed = torch.stack(list(model.stream(prompt, 16, seed=SEED, **kw)), dim=-1)
    assert torch.equal(streamed, a[:, 5:]), f"stream differs from generate (seed {SEED})"


def test_generate_stops_at_stop_token(tiny_files):
    model = Glimmer.from_gguf(tiny_files["q4_k_xl"], dtype=torch.float32)
    prompt = _tokens(4, salt=6)
    free = model.generate(prompt, 10, stop=[])
    stop = int(free[4 + 3])
    first = int((free[4:] == stop).nonzero()[0])
    stopped = model.generate(prompt, 10, stop=[stop])
    assert torch.equal(stopped, free[:4 + first + 1]), f"stop token ignored (seed {SEED})"


def test_stopped_rows_repeat_their_own_stop_token(tiny_files):
    model = Glimmer.from_gguf(tiny_files["q4_k_xl"], dtype=torch.float32)
    prompt = _tokens(4, batch=2, salt=9)
    free = model.generate(prompt, 12, temperature=0, stop=[])[:, 4:]
    stops = [int(free[1, 6]), int(free[0, 3])]
    out = model.generate(prompt, 12, temperature=0, stop=stops)[:, 4:]
    for row in range(2):
        j = int(torch.isin(free[row], torch.tensor(stops)).nonzero()[0])
        assert torch.equal(out[row, :j + 1], free[row, :j + 1]), f"row {row} (seed {SEED})"
        assert (out[row, j:] == free[row, j]).all(), f"row {row}: {out[row].tolist()} (seed {SEED})"


def test_sampling_filters():
    from muser_torch.glimmer import sample
    g = torch.Generator().manual_seed(SEED)
    logits = torch.randn(4, 50, generator=g)
    top3 = logits.topk(3, dim=-1).indices
    draws = torch.stack([sample(logits, 1.0, top_k=3, generator=g) for _ in range(200)], dim=1)
    assert all(set(draws[b].tolist()) <= set(top3[b].tolist()) for b in range(4)), f"seed {SEED}"
    # top_p tiny -> only the argmax survives
    p = sample(logits, 1.0, top_p=1e-6, generator=g)
    assert torch.equal(p, logits.argmax(-1)), f"seed {SEED}"
    # a temperature below float32's range is greedy, not NaN
    for t in (1e-40, 1e-60):
        p = sample(logits, t, top_k=5, top_p=0.9, generator=g)
        assert torch.equal(p, logits.argmax(-1)), f"temperature {t} (seed {SEED})"


@pytest.mark.parametrize("backend", ["aot_eager", slow.param("inductor")])
def test_compiled_decode_step_matches_eager(tiny_files, backend):
    model = Glimmer.from_gguf(tiny_files["q4_k_xl"], dtype=torch.float32)
    tokens = _tokens(20, batch=2, salt=7)
    step = torch.compile(model.forward, fullgraph=True, backend=backend)
    slots = torch.tensor([0, 1])
    results = []
    for fn in (model.forward, step):
        model.setup_cache(2, 32)
        fn_out = [model(tokens[:, :12], slots)[:, -1]]
        for t in range(12, 20):
            fn_out.append(fn(tokens[:, t:t + 1], slots)[:, 0])
        results.append(torch.stack(fn_out, 1))
    err = rel_err(results[1], results[0])
    check_bound("compiled against eager: rel err", err, 1e-5, f"compiled decode differs from eager by {err:.2e} (seed {SEED})")


def test_cache_and_generate_refuse_bad_arguments(tiny_files):
    model = Glimmer.from_gguf(tiny_files["q4_k_xl"], dtype=torch.float32)
    with pytest.raises(ValueError, match="context_length"):
        model.generate(_tokens(90), 10)                  # 100 > context 96
    with pytest.raises(ValueError, match="token ids"):
        model.generate(torch.tensor([1, 258]), 2)
    with pytest.raises(ValueError, match="top_p"):
        model.generate(torch.tensor([1, 2]), 2, temperature=1.0, top_p=1.5)
    model.setup_cache(2, 16)
    with pytest.raises(ValueError, match="distinct"):
        model.check_room(torch.tensor([1, 1]), 1)
    with pytest.raises(ValueError, match="exceeds"):
        model.check_room(torch.tensor([0]), 17)


@pytest.mark.parametrize("lane", LANES)
def test_random_model_has_sane_packed_weights(lane):
    from dataclasses import replace
    from muser_torch import dequantize
    from muser_torch.tiny import recipe_type
    from .conftest import TINY
    from muser_torch.arch.muse_glimmer import reference_pattern
    cfg = replace(TINY, weight_precision=lane, n_layers=2, sliding_window_pattern=reference_pattern(2, 2))
    model = Glimmer.random(cfg, dtype=torch.float32, seed=SEED)
    assert model.layers[1].attention.k_norm is not None
    assert not any(p.is_floating_point() and p.numel() > cfg.hidden * 4
                   for n, p in model.named_parameters()), "random() made float weights"
    wd = model.layers[0].feed_forward.w_down
    assert wd.qtype == recipe_type(cfg, "blk.0.ffn_down.weight")
    w = dequantize(wd.packed, wd.qtype, wd.n_in, scales=getattr(wd, "scales", None),
                   scale_2=getattr(wd, "scale_2", None))
    check_bound("init std: relative distance to 1/sqrt(ffn)", abs(float(w.std()) * cfg.ffn ** 0.5 - 1), 0.2,
                f"std {float(w.std())} (seed {SEED})")
    logits = model(_tokens(10, batch=1, salt=8))
    assert torch.isfinite(logits).all() and float(logits.std()) > 0.1, f"seed {SEED}"
