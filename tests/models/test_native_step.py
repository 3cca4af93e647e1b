"""The decode step on the CPU library (``models/layer_plan.py``, ``ops/cpu/step.py``, ``decode.c``)
against the torch modules it replaces: layer by layer from the same state
(output and the keys and values it caches), and whole decodes; for each
block shape it describes (Gemma 3's sandwich with GELU and q/k norms, the
llama family's RoPE scalings, Qwen2's biases, Qwen3's q/k norms, Muse
Glimmer's gate, NoPE layers and NVFP4 weights) in both numerics; and the
steps it must leave to torch."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import muser_torch
from muser_torch.models import Glimmer, decoder
from muser_torch.models.layer_plan import EXTEND_MAX_TOKENS, describe
from muser_torch.ops.cpu import step as cpu_step
from muser_torch.ops.cpu.step import CpuLayers
from muser_torch.models.parts import KVCache, rope_angles
from muser_torch.formats import random_weight
from muser_torch.nn import QLinear, set_numerics
from muser_torch.ops.cpu import FUSED_MAX_TOKENS, native_available

from ..bounds import check_bound, check_floor
from ..glimmer.conftest import TINY
from .conftest import SEED, rel_err
from .family_files import VARIANTS, hf_file  # noqa: F401 (fixture)
from .hf_files import write_random_gguf

pytestmark = pytest.mark.skipif(not native_available(), reason="no native CPU library")


def _model(which: str, gemma_path, hf_file):
    if which == "gemma3":
        return muser_torch.from_gguf(gemma_path, dtype=torch.float32)
    if which.startswith("glimmer-"):
        cfg = replace(TINY, weight_precision=which.removeprefix("glimmer-"))
        return Glimmer.random(cfg, dtype=torch.float32, seed=SEED)
    return muser_torch.from_gguf(hf_file(which))


# ggml numerics: one-token steps, at least TIP_TOKENS and enough for TIP_PAIRS
# (layer, step) pairs, of which most must be exact (test_each_block_is_its_torch_layer).
TIP_TOKENS, TIP_PAIRS = 4, 24
MODELS = ("gemma3", "llama-yarn", "qwen2", "qwen3", "glimmer-q4_k_xl", "glimmer-nvfp4")


@pytest.fixture
def native_calls(monkeypatch):
    """Steps that ran on the library."""
    ran = []
    real = CpuLayers.__call__

    def counting(self, *args):
        ran.append(True)
        return real(self, *args)
    monkeypatch.setattr(CpuLayers, "__call__", counting)
    return ran


def _row_errors(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Each row's relative error, ``[..., n]`` -> ``[...]``."""
    return (got - want).norm(dim=-1) / want.norm(dim=-1)


def _per_layer_errors(model, prefill: int, steps: int = 1, rows: int = 1,
                      torch_numerics: str | None = None) -> list[float]:
    """Each layer's block against its torch forward on each of ``steps`` runs
    of ``rows`` new tokens, from the same cache (the torch output feeds the
    next layer): per layer and run, the median over the run's rows of the
    larger of the output's and the cached keys' and values' relative errors.
    ``torch_numerics`` runs the torch forward in other numerics than the block
    (the planted defect: a block that ignores the model's numerics)."""
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(SEED)
    model.setup_cache(2, prefill + steps * rows + 4)
    slots = torch.tensor([1])
    tables = [getattr(model, n) for n in model._rope_names]
    errs = []
    with torch.no_grad():
        model(torch.randint(0, V, (1, prefill), generator=g), slots)
        for _ in range(steps):
            ids = torch.randint(0, V, (1, rows), generator=g)
            x = model.embed(ids)
            lengths = model.lengths.index_select(0, slots)
            positions = lengths.unsqueeze(-1) + torch.arange(rows)
            rots = [rope_angles(positions, t) for t in tables]
            for layer in model.layers:
                att, cache = layer.attention, layer.attention.kv_cache
                before = cache.k.clone(), cache.v.clone()
                numerics = {q._numerics for q in layer.modules() if isinstance(q, QLinear)}
                if torch_numerics is not None:
                    set_numerics(layer, torch_numerics)
                want = layer(x, positions, rots[att.rope_slot], att.make_mask(positions, lengths), slots)
                if torch_numerics is not None:
                    (own,) = numerics
                    set_numerics(layer, own)
                entries = positions[0] % cache.capacity
                want_kv = cache.k[1, entries].clone(), cache.v[1, entries].clone()
                cache.k.copy_(before[0]), cache.v.copy_(before[1])
                one = CpuLayers([describe(layer)], tables, EXTEND_MAX_TOKENS)
                assert one.why_not is None, f"{type(layer).__name__}: {one.why_not}"
                got, _ = one(x, slots, lengths, tables)
                per_row = torch.stack([_row_errors(got[0], want[0]),
                                       _row_errors(cache.k[1, entries].flatten(1), want_kv[0].flatten(1)),
                                       _row_errors(cache.v[1, entries].flatten(1), want_kv[1].flatten(1))])
                errs.append(float(per_row.max(0).values.median()))
                x = want
            model(ids, slots)         # the model's own step writes these positions and moves on
    return errs


def _own_file(tmp_path):
    """variant -> path, written from SEED when the test runs (as ``hf_file``
    writes it once a session), so that the seed sweep can vary it per test."""
    def get(variant: str) -> str:
        arch, opts = VARIANTS[variant]
        seed = SEED + sorted(VARIANTS).index(variant)
        return str(write_random_gguf(tmp_path / f"{variant}.gguf", arch, seed=seed, **opts))
    return get


@pytest.mark.seed_at_run_time
@pytest.mark.parametrize("which", MODELS)
def test_each_block_is_its_torch_layer(which, gemma_path, tmp_path, monkeypatch):
    """One token (decode.c's decode step) and runs of several (its extension:
    Glimmer's tiny window is 8, so its runs are 8 and its rings wrap). In ggml
    numerics the blocks' arithmetic between the projections is llama.cpp's (f16
    K/V and attention, GELU table), which the torch modules do not compute:
    tests/models/test_lcpp_logits.py holds that to llama.cpp itself; here the
    blocks run it in float (``step.ggml_layer`` off), so the rule holds their
    projections and the rest of the block to the torch modules."""
    monkeypatch.setattr(cpu_step, "ggml_layer", lambda plan: False)
    model = _model(which, gemma_path, _own_file(tmp_path))
    prefill = 20 if which == "gemma3" else 11
    run = 8 if which.startswith("glimmer") else EXTEND_MAX_TOKENS
    exact = _per_layer_errors(model, prefill) + _per_layer_errors(model, prefill, rows=run)
    check_bound("exact: worst (layer, run) rel err", max(exact), 1e-5, f"{which}: {exact} (seed {SEED})")
    set_numerics(model, "ggml")
    ggml = _ggml_pairs(model, prefill, run)
    check_bound("ggml: share of (layer, run) pairs not exact", _not_exact(ggml), 0.5,
                f"{which}: {ggml} (seed {SEED})")


def _ggml_pairs(model, prefill: int, run: int, torch_numerics: str | None = None) -> list[float]:
    steps = max(TIP_TOKENS, -(-TIP_PAIRS // len(model.layers)))
    return (_per_layer_errors(model, prefill, steps=steps, torch_numerics=torch_numerics)
            + _per_layer_errors(model, prefill, steps=2, rows=run, torch_numerics=torch_numerics))


def _not_exact(errors: list[float]) -> float:
    """The share of (layer, run) pairs more than 1e-5 off.

    A block running the other numerics is 5e-3 or more off in every layer and
    row (measured on the five models whose quantized weights have two numerics;
    the NVFP4 Glimmer computes the same in both): a share of 1. A block running
    these ones is exact to float32 order, unless an activation rounds to the
    other int8 code (a last-bit difference in the attention can tip one), which
    moves that one layer and token by up to 6e-3: the same size. So the rule
    counts, and does not weigh: fewer than half the pairs may be off, a run's
    error being the median over its rows. A pair tips with a chance of about
    1-2% (0.6% llama-yarn, 1.2% qwen2, 1.8% qwen3 over 100-150 seeds); with
    4 one-token steps a two-layer model had 12 pairs and reached 3 off (a
    share of 0.25, a margin of 2) in 150 seeds, so the one-token steps now
    make at least TIP_PAIRS pairs (28 with the runs' 4): the worst share over
    500 seeds is in docs/testing.md."""
    return sum(e >= 1e-5 for e in errors) / len(errors)


@pytest.mark.seed_at_run_time
@pytest.mark.parametrize("which", [m for m in MODELS if m != "glimmer-nvfp4"])
def test_a_block_on_the_other_numerics_breaks_the_rule(which, gemma_path, tmp_path, monkeypatch):
    """The planted-defect twin of the ggml rule above: the torch forward in
    exact numerics against the library's ggml block (as a block that ignored
    the model's numerics would compute) puts every pair off, past the rule's
    0.5. (The NVFP4 Glimmer computes the same in both numerics.)"""
    monkeypatch.setattr(cpu_step, "ggml_layer", lambda plan: False)   # as the rule above
    model = _model(which, gemma_path, _own_file(tmp_path))
    set_numerics(model, "ggml")
    prefill = 20 if which == "gemma3" else 11
    run = 8 if which.startswith("glimmer") else EXTEND_MAX_TOKENS
    ggml = _ggml_pairs(model, prefill, run, torch_numerics="exact")
    check_floor("other numerics: share of (layer, run) pairs not exact", _not_exact(ggml), 0.5,
                f"{which}: {ggml} (seed {SEED})")


def _decode(model, ids, slots, prefill: int, native: bool, monkeypatch) -> torch.Tensor:
    if not native:
        monkeypatch.setattr(decoder, "layer_runner", lambda *a: None)
    model.setup_cache(slots.numel() + 1, ids.shape[1])
    with torch.no_grad():
        model(ids[:, :prefill], slots)
        out = torch.cat([model(ids[:, t:t + 1], slots) for t in range(prefill, ids.shape[1])], 1)
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("which", MODELS)
def test_whole_decode_matches_the_torch_modules(which, gemma_path, hf_file, monkeypatch):
    model = _model(which, gemma_path, hf_file)
    g = torch.Generator().manual_seed(SEED + 1)
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=g)
    slots = torch.tensor([2, 0])                 # not in slot order, one slot left out
    want = _decode(model, ids, slots, 12, False, monkeypatch)
    ran = []
    real = CpuLayers.__call__
    monkeypatch.setattr(CpuLayers, "__call__",
                        lambda self, *a: ran.append(1) or real(self, *a))
    got = _decode(model, ids, slots, 12, True, monkeypatch)
    assert len(ran) == 12, f"{which}: {len(ran)} of 12 steps ran on the library"
    # float32 orders over up to 18 layers; a cache, slot or mask error is 1e-2 or more
    check_bound("12 decode steps: rel err against the torch modules", rel_err(got, want), 1e-4,
                f"{which} (seed {SEED})")


def test_steps_it_leaves_to_torch(gemma_path, native_calls):
    model = muser_torch.from_gguf(gemma_path, dtype=torch.float32)
    V = model.config.vocab_size
    model.setup_cache(FUSED_MAX_TOKENS + 1, EXTEND_MAX_TOKENS + 8)
    many = torch.arange(FUSED_MAX_TOKENS + 1)
    with torch.no_grad():
        model(torch.zeros(1, EXTEND_MAX_TOKENS + 1, dtype=torch.long), many[:1])   # a long prefill
        model(torch.zeros(many.numel(), 1, dtype=torch.long), many)    # more rows than the fused rung
        model(torch.zeros(2, 2, dtype=torch.long), many[1:3])          # two tokens of two sequences
        assert native_calls == []
        model(torch.zeros(1, 1, dtype=torch.long), many[:1])
        assert native_calls == [True]
    model.layers[3].ffn_norm.weight.requires_grad_()   # a gradient to record
    model(torch.zeros(1, 1, dtype=torch.long), many[:1])
    assert native_calls == [True]
    model.layers[3].ffn_norm.weight.requires_grad_(False)
    att = model.layers[4].attention                     # a cache of fewer slots than the model's
    att.kv_cache = KVCache(1, att.kv_cache.capacity, att.n_kv, att.head_dim, torch.float32, "cpu")
    with torch.no_grad():
        model(torch.zeros(1, 1, dtype=torch.long), many[:1])
    assert native_calls == [True]
    model.setup_cache(1, 8, dtype=torch.float16)        # a cache the blocks do not take
    with torch.no_grad():
        model(torch.randint(0, V, (1, 1)), many[:1])
    assert native_calls == [True]
    model.setup_cache(1, 8)
    model.lengths[0] = -1                               # refused, never written below the ring
    with torch.no_grad(), pytest.raises(RuntimeError, match="-3 a negative length"):
        model(torch.zeros(1, 1, dtype=torch.long), many[:1])


def test_a_changed_model_rebuilds_the_description(gemma_path, monkeypatch):
    model = muser_torch.from_gguf(gemma_path, dtype=torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(SEED))
    slots = torch.tensor([0])
    first = _decode(model, ids, slots, 6, True, monkeypatch)
    plan = model._planned_layers
    model.reset()                                       # room for one more step; same buffers
    with torch.no_grad():
        model(ids[:, :1], slots)
    assert model._planned_layers is plan, "a decode step rebuilt the description"
    again = _decode(model, ids, slots, 6, True, monkeypatch)   # setup_cache: new buffers
    assert model._planned_layers is not plan and torch.equal(first, again)
    set_numerics(model, "ggml")
    ggml = _decode(model, ids, slots, 6, True, monkeypatch)
    assert model._planned_layers.runner.blocks[0].wq.mul != 0
    assert rel_err(ggml, first) > 1e-4, "set_numerics('ggml') did not reach the blocks"
    # a projection replaced by another module: the blocks read the new weight
    set_numerics(model, "exact")
    att = model.layers[2].attention
    att.wo = QLinear.from_weight(random_weight(att.wo.qtype, att.wo.n_out, att.wo.n_in,
                                               generator=torch.Generator().manual_seed(SEED)))
    want = _decode(model, ids, slots, 6, False, monkeypatch)
    got = _decode(model, ids, slots, 6, True, monkeypatch)
    assert rel_err(got, want) < 1e-5 and rel_err(got, first) > 1e-3


def _chunked(model, ids, chunks, native: bool, monkeypatch, journal_keep=None):
    """Logits of ``ids`` [1, T] fed in ``chunks`` to slot 1, and the caches
    after; with ``journal_keep`` the last chunk is journaled and rewound to
    keep that many of its positions (a speculative verify)."""
    if not native:
        monkeypatch.setattr(decoder, "layer_runner", lambda *a: None)
    model.setup_cache(3, ids.shape[1])
    slots, out, at = torch.tensor([1]), [], 0
    caches = [layer.attention.kv_cache for layer in model.layers]
    with torch.no_grad():
        for i, n in enumerate(chunks):
            last = i == len(chunks) - 1
            if last and journal_keep is not None:
                for c in caches:
                    c.journal = []
            out.append(model(ids[:, at:at + n], slots))
            at += n
        if journal_keep is not None:
            for c in caches:
                c.rewind(journal_keep)
            model.lengths[1] -= chunks[-1] - journal_keep
    monkeypatch.undo()
    return torch.cat(out, 1), [(c.k.clone(), c.v.clone()) for c in caches]


@pytest.mark.parametrize("which", MODELS)
def test_runs_of_new_tokens_match_the_torch_modules(which, gemma_path, hf_file, monkeypatch):
    """Runs of up to EXTEND_MAX_TOKENS new tokens of one sequence on the
    library, from an empty cache through ring wraps (Glimmer's tiny window is
    8): logits and caches as the torch modules give them. (The ggml numerics
    are held layer by layer above: over a whole model a tipped int8 code
    spreads as far as the other numerics would.)"""
    model = _model(which, gemma_path, hf_file)
    g = torch.Generator().manual_seed(SEED + 2)
    chunks = [5, 3, 1, 7, 2, 8, 6, 4] if which.startswith("glimmer") else [5, 16, 3, 1, 11, 2, 9]
    ids = torch.randint(0, model.config.vocab_size, (1, sum(chunks)), generator=g)
    want, want_kv = _chunked(model, ids, chunks, False, monkeypatch)
    ran = []
    real = CpuLayers.__call__
    monkeypatch.setattr(CpuLayers, "__call__",
                        lambda self, *a: ran.append(a[0].shape[1]) or real(self, *a))
    got, got_kv = _chunked(model, ids, chunks, True, monkeypatch)
    assert sorted(ran) == sorted(chunks), f"{which}: runs {ran} of {chunks} ran on the library"
    err = max([rel_err(got, want)] + [rel_err(a, b) for kv, kv2 in zip(got_kv, want_kv)
                                      for a, b in zip(kv, kv2)])
    # float32 orders over up to 18 layers reach 1.2e-5; a cache or mask error is 1e-2 or more
    check_bound("runs of new tokens: rel err against the torch modules", err, 1e-4, f"{which} (seed {SEED})")


def test_a_journaled_run_rewinds_as_the_torch_modules_do(gemma_path, monkeypatch):
    """A verify: a journaled 16-token run on the library, rewound to keep 6,
    leaves the caches (sliding rings wrapped) as the torch modules leave them."""
    model = muser_torch.from_gguf(gemma_path, dtype=torch.float32)
    for layer in model.layers:          # short windows, so the run's writes wrap the rings
        if layer.attention.window is not None:
            layer.attention.window = 24
    g = torch.Generator().manual_seed(SEED + 3)
    chunks = [14, 16, 16]
    ids = torch.randint(0, model.config.vocab_size, (1, sum(chunks)), generator=g)
    _, want = _chunked(model, ids, chunks, False, monkeypatch, journal_keep=6)
    _, got = _chunked(model, ids, chunks, True, monkeypatch, journal_keep=6)
    _, unrewound = _chunked(model, ids, chunks, True, monkeypatch)
    # float32 orders over 18 layers reach 2e-5 (seed 5916362); the unrewound caches are 1e-2 or more off
    err = max(rel_err(a, b) for kv, kv2 in zip(got, want) for a, b in zip(kv, kv2))
    check_bound("rewound caches: rel err against the torch modules'", err, 1e-4, f"(seed {SEED})")
    moved = max(rel_err(a, b) for kv, kv2 in zip(got, unrewound) for a, b in zip(kv, kv2))
    check_floor("unrewound caches: rel err against the rewound ones", moved, 1e-2, f"(seed {SEED})")
