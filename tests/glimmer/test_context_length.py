"""Past the context: every entry point (``generate``, ``stream``,
``setup_cache``, ``forward`` with slots on CPU tensors; ``Decoder.forward``
says why not on an accelerator) refuses a sequence longer than the context
length or the cache's capacity with a ``ContextLengthError`` that names both
numbers, before any step runs and without moving the cache. The CLI's
refusal (one line, exit 2) is in test_cli.py."""
from __future__ import annotations

import pytest
import torch

from muser_torch import ContextLengthError, Glimmer

from .conftest import SEED, TINY


def _tokens(n: int, batch: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(SEED * 13 + n)
    return torch.randint(0, TINY.vocab_size, (batch, n), generator=g)


@pytest.fixture(scope="module")
def model(tiny_files):
    return Glimmer.from_gguf(tiny_files["q4_k_xl"], dtype=torch.float32)


def _refused(call, asked: int, capacity: int) -> ContextLengthError:
    with pytest.raises(ContextLengthError) as info:
        call()
    e = info.value
    assert (e.asked, e.capacity) == (asked, capacity), f"{e} (seed {SEED})"
    assert str(asked) in str(e) and str(capacity) in str(e) and "\n" not in str(e), str(e)
    return e


@pytest.mark.parametrize("prompt, new", [(90, 10), (97, 0), (96, 1), (200, 5)])
def test_generate_and_stream_refuse_past_the_context(model, prompt, new):
    ctx = TINY.context_length
    ids = _tokens(prompt)
    _refused(lambda: model.generate(ids, new), prompt + new, ctx)
    _refused(lambda: next(model.stream(ids[0], new)), prompt + new, ctx)


def test_generate_fills_the_context_exactly(model):
    ctx = TINY.context_length
    out = model.generate(_tokens(ctx - 6), 6, stop=[])
    assert out.shape == (1, ctx)


def test_setup_cache_refuses_more_than_the_context(model):
    ctx = TINY.context_length
    _refused(lambda: model.setup_cache(1, ctx + 1), ctx + 1, ctx)
    model.setup_cache(1, ctx)   # the context itself fits
    assert model.max_seq_len == ctx


@pytest.mark.parametrize("slots, batch", [([0], 1), ([1, 0, 2], 3), ([2], 1)])
def test_forward_with_slots_refuses_past_the_cache(model, slots, batch):
    """Prefill 10 of a 16-entry cache, then a 7-token step is refused (17 > 16)
    and leaves the lengths as they were; 6 tokens fill it exactly; then even
    one more decode step is refused. ``[1, 0, 2]`` is the every-slot path."""
    model.setup_cache(3, 16)
    s = torch.tensor(slots)
    model(_tokens(10, batch), s)
    before = model.lengths.clone()
    _refused(lambda: model(_tokens(7, batch), s), 17, 16)
    assert torch.equal(model.lengths, before), "a refused step moved the cache"
    logits = model(_tokens(6, batch), s)
    assert logits.shape == (batch, 6, TINY.vocab_size)
    assert model.lengths[s].tolist() == [16] * batch
    _refused(lambda: model(_tokens(1, batch), s), 17, 16)


def test_forward_refuses_one_slot_full_while_others_have_room(model):
    """The longest of the batch's slots decides."""
    model.setup_cache(2, 16)
    model(_tokens(15), torch.tensor([1]))
    model(_tokens(3), torch.tensor([0]))
    _refused(lambda: model(_tokens(2, 2), torch.tensor([0, 1])), 17, 16)
    model(_tokens(2), torch.tensor([0]))   # slot 0 alone still has room


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_generate_and_setup_cache_refuse_on_cuda(tiny_files):
    model = Glimmer.from_gguf(tiny_files["q4_k_xl"], device="cuda", dtype=torch.float32)
    ctx = TINY.context_length
    ids = _tokens(90).cuda()
    _refused(lambda: model.generate(ids, 10), 100, ctx)
    _refused(lambda: model.setup_cache(1, ctx + 1), ctx + 1, ctx)
