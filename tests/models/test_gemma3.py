"""Gemma 3 270M (llama.cpp's Q4_K_M file: Q5_0, Q4_K, Q8_0 with the tied
262,144 x 640 embedding, Q6_K, F32) against transformers' Gemma3ForCausalLM
on the same tensors in float32, and our own cache paths against each other."""
from __future__ import annotations

import pytest
import torch

import muser_torch
from muser_torch.gguf_io import load_gguf
from muser_torch.loader import check
from muser_torch.models import Gemma3

from .. import slow
from ..bounds import check_bound, check_floor
from .conftest import SEED, rel_err

# The real file and transformers' model of it are the same for every seed; only
# the prompts (_prompt) read SEED, when a test runs: the sweep re-seeds in one process.
pytestmark = pytest.mark.seed_at_run_time

VOCAB = 262144
BOS = 2


def _prompt(n: int, salt: int = 0, batch: int | None = None) -> torch.Tensor:
    """BOS, then ids drawn from the vocabulary's first 20,000 (common
    SentencePiece pieces, so the text is word-like rather than rare symbols)."""
    g = torch.Generator().manual_seed(SEED * 31 + salt)
    shape = (batch or 1, n - 1)
    ids = torch.cat((torch.full((shape[0], 1), BOS), torch.randint(0, 20000, shape, generator=g)), 1)
    return ids if batch else ids[0]


def test_file_is_admitted_as_gemma3(gemma_path, gemma):
    admitted = check(load_gguf(gemma_path))
    assert admitted.arch.name == "gemma3" and "output" not in admitted.groups   # tied lm_head
    c = gemma.config
    assert isinstance(gemma, Gemma3) and (c.n_layers, c.hidden, c.sliding_window) == (18, 640, 512)
    # llama.cpp's defaults for keys the file lacks: every 6th layer global, local base 1e4
    assert [il for il in range(18) if gemma.layers[il].attention.window is None] == [5, 11, 17]
    assert (c.rope_base, c.rope_base_local, c.final_softcap) == (1e6, 1e4, 0.0)
    # the tied lm_head multiplies by the embedding's own bytes
    assert gemma.output.packed.data_ptr() == gemma.tok_embeddings.packed.data_ptr()
    types = {m.qtype.name for m in gemma.modules() if hasattr(m, "qtype")}
    assert {"Q5_0", "Q4_K", "Q8_0", "Q6_K"} <= types


@pytest.mark.parametrize("n", [6, 17, 33])
def test_logits_match_transformers(gemma, hf_gemma, n):
    ids = _prompt(n, salt=n)[None]
    with torch.no_grad():
        want = hf_gemma(ids).logits[0]
        got = gemma(ids)[0]
    err = rel_err(got, want)
    check_bound("logits: rel err to transformers", err, 1e-3, f"{n} tokens: relative error {err:.2e} vs transformers (seed {SEED})")
    assert float(want.std()) > 1.0, f"degenerate reference logits (seed {SEED})"


def test_greedy_continuation_matches_transformers(gemma, hf_gemma):
    """Our 16 greedy tokens are transformers' argmax at every step: with the
    same prompt that is exactly transformers' own greedy continuation."""
    prompt = torch.tensor([BOS, 818, 5279, 529, 7001, 563])   # "The capital of France is"
    out = gemma.generate(prompt, 16, temperature=0, stop=[])
    with torch.no_grad():
        want = hf_gemma(out[None]).logits[0, prompt.numel() - 1:-1].argmax(-1)
    assert torch.equal(out[prompt.numel():], want), \
        f"ours {out[prompt.numel():].tolist()} vs transformers' {want.tolist()}"


def test_decode_past_the_window_matches_transformers(gemma, hf_gemma):
    """A prefill of 500, a 30-token chunk across the 512 window (the SWA
    prefill path), then single-token decode steps with the rings wrapped:
    each step's logits are transformers' full forward at that position."""
    W = gemma.config.sliding_window
    n_steps = 6
    ids = _prompt(530 + n_steps, salt=3)[None]
    assert ids.shape[1] > W + 8
    gemma.setup_cache(slots=2, max_seq_len=ids.shape[1])
    slot = torch.tensor([1])
    with torch.no_grad():
        gemma(ids[:, :500], slot, last_only=True)
        got = [gemma(ids[:, 500:530], slot)[0, -1:]]
        got += [gemma(ids[:, t:t + 1], slot)[0] for t in range(530, ids.shape[1])]
        want = hf_gemma(ids, logits_to_keep=n_steps + 1).logits[0]
    assert int(gemma.lengths[1]) == ids.shape[1] and int(gemma.lengths[0]) == 0
    err = rel_err(torch.cat(got), want)
    check_bound("past the window: rel err to transformers", err, 1e-3, f"past the window: relative error {err:.2e} (seed {SEED})")


# Incremental against full forward, float32: the two paths round differently
# (one-token steps take the fused matvec, the full forward the tiled GEMM), and
# over 18 layers their difference has a heavy tail: median 6e-6, worst 1.04e-4
# at MUSER_TEST_SEED=5027308, once the whole bound (issue 41). INCREMENTAL_BOUND
# holds the worst of 500 seeds with a 2x margin (docs/testing.md); a cache that
# keeps one key too few (the twin below) is orders of magnitude past it.
INCREMENTAL_BOUND = 5e-4


def _incremental_and_full(gemma_path, window: int, cache_window: int):
    """Logits of 20 tokens: the cache-free forward with ``window``, and the same
    prompt prefilled in uneven chunks then decoded with ``cache_window``."""
    model = muser_torch.from_gguf(gemma_path, dtype=torch.float32)
    windowed = [layer.attention for layer in model.layers if layer.attention.window is not None]
    T = 20
    ids = _prompt(T, salt=4)[None]
    with torch.no_grad():
        for att in windowed:
            att.window = window
        full = model(ids)[0]
        for att in windowed:
            att.window = cache_window
        model.setup_cache(slots=1, max_seq_len=T)
        slot = torch.tensor([0])
        cuts = [0, 3, 9] + list(range(10, T + 1))
        inc = torch.cat([model(ids[:, a:b], slot)[0] for a, b in zip(cuts, cuts[1:])])
    return inc, full


def test_incremental_decode_equals_full_forward_with_small_window(gemma_path):
    """The same weights with a 4-token window: prefill in uneven chunks
    (one longer than the window), then decode to 5x the window; every
    position equals the cache-free forward within ``INCREMENTAL_BOUND``."""
    inc, full = _incremental_and_full(gemma_path, 4, 4)
    worst = max(range(len(inc)), key=lambda t: rel_err(inc[t], full[t]))
    check_bound("incremental against full forward: worst position's rel err",
                rel_err(inc[worst], full[worst]), INCREMENTAL_BOUND, f"position {worst} (seed {SEED})")


def test_a_ring_one_key_short_breaks_the_incremental_bound(gemma_path):
    """The twin: the cache's windowed layers keep 3 keys where the full
    forward sees 4; positions past the window then differ far beyond the bound."""
    inc, full = _incremental_and_full(gemma_path, 4, 3)
    worst = max(rel_err(inc[t], full[t]) for t in range(len(inc)))
    check_floor("a ring one key short: worst position's rel err", worst, 10 * INCREMENTAL_BOUND,
                f"(seed {SEED})")


def test_slots_decode_together_as_alone(gemma):
    """Three prompts prefilled into slots 2, 0, 1 of a cache, then decoded
    together: each row equals its sequence's own cache-free forward."""
    lengths, steps = [5, 11, 8], 4
    seqs = [_prompt(n + steps, salt=10 + i) for i, n in enumerate(lengths)]
    slots = [2, 0, 1]
    with torch.no_grad():
        gemma.setup_cache(slots=3, max_seq_len=32)
        for s, seq, n in zip(slots, seqs, lengths):
            gemma(seq[None, :n], torch.tensor([s]))
        together = torch.stack([gemma(torch.stack([q[n + t] for q, n in zip(seqs, lengths)])[:, None],
                                      torch.tensor(slots))[:, 0] for t in range(steps)], 1)
        for i, (seq, n) in enumerate(zip(seqs, lengths)):
            full = gemma(seq[None])[0, n:]
            err = rel_err(together[i], full)
            check_bound("a slot against its full forward: rel err", err, 1e-4, f"slot {slots[i]}: {err:.2e} vs its own full forward (seed {SEED})")


# The traced graph (aot_eager) every run; Inductor's code generation for it (tens
# of seconds on 2 cores) is checked on the llama family and the demo every run.
@pytest.mark.parametrize("backend", ["aot_eager", slow.param("inductor")])
def test_compiled_decode_step_matches_eager(gemma_path, backend):
    """``torch.compile(fullgraph=True)`` of the decode step, on the model cut
    to one sliding-window and one global layer (both RoPE tables, both mask
    kinds; compiling all 18 identical blocks takes minutes on 2 cores)."""
    model = muser_torch.from_gguf(gemma_path, dtype=torch.float32)
    model.layers = torch.nn.ModuleList([model.layers[0], model.layers[5]])
    assert [l.attention.window for l in model.layers] == [512, None]
    ids = _prompt(12, salt=5, batch=2)
    slots = torch.tensor([0, 1])
    step = torch.compile(model.forward, fullgraph=True, backend=backend)
    results = []
    with torch.no_grad():
        for fn in (model.forward, step):
            model.setup_cache(2, 16)
            out = [model(ids[:, :8], slots)[:, -1]]
            out += [fn(ids[:, t:t + 1], slots)[:, 0] for t in range(8, 12)]
            results.append(torch.stack(out, 1))
    err = rel_err(results[1], results[0])
    check_bound("compiled against eager: rel err", err, 1e-5, f"compiled decode differs from eager by {err:.2e} (seed {SEED})")
