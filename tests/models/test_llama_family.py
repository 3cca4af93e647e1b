"""llama, qwen2 and qwen3 GGUFs (random weights in a mix of ggml-quantized
types) run packed by ``muser_torch.from_gguf``, against transformers' own
LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM loaded from the same
files: logits, greedy continuations, and the cache and compile paths."""
from __future__ import annotations

import pytest
import torch

import muser_torch
from muser_torch.models import Llama, Qwen2, Qwen3

from ..slots import decode_in_slots
from .conftest import SEED, rel_err
from .family_files import ARCH_VARIANTS, VARIANTS, hf_file, reference, tokens  # noqa: F401 (fixtures)
from ..bounds import check_bound

CLASSES = {"llama": Llama, "qwen2": Qwen2, "qwen3": Qwen3}


def ours(hf_file, variant: str):
    return muser_torch.from_gguf(hf_file(variant))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_match_transformers(hf_file, reference, variant):
    model, ref = ours(hf_file, variant), reference(variant)
    assert type(model) is CLASSES[VARIANTS[variant][0]]
    V = model.config.vocab_size
    assert V == ref.config.vocab_size
    for salt, (batch, n) in enumerate([(1, 5), (2, 19), (1, 40)]):
        x = tokens(V, n, batch, salt)
        with torch.no_grad():
            got, want = model(x), ref(x).logits
        err = rel_err(got, want)
        check_bound("logits: rel err to transformers", err, 1e-3, f"{variant}: prompt {batch}x{n} logits differ by {err:.2e} (seed {SEED})")


def _reference_greedy(ref, prompt: torch.Tensor, n: int) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation by full forwards, with each step's
    top-2 margin."""
    ids, margins = prompt.clone(), []
    for _ in range(n):
        with torch.no_grad():
            last = ref(ids).logits[0, -1]
        top = last.topk(2).values
        margins.append(float(top[0] - top[1]))
        ids = torch.cat((ids, last.argmax().view(1, 1)), dim=1)
    return ids[0, prompt.shape[1]:].tolist(), margins


@pytest.mark.parametrize("variant", ["llama", "llama-llama3", "qwen2", "qwen2-tied-yarn", "qwen3"])
def test_same_greedy_continuation(hf_file, reference, variant):
    model, ref = ours(hf_file, variant), reference(variant)
    prompt = tokens(model.config.vocab_size, 9, salt=5)
    got = model.generate(prompt, 16, stop=[])[0, 9:].tolist()
    want, margins = _reference_greedy(ref, prompt, 16)
    if got != want:
        k = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
        # Only a near-tie (within float32 rounding) may pick the other token.
        assert margins[k] < 1e-4, (f"{variant}: step {k} gives {got[k]}, transformers {want[k]} "
                                   f"(margin {margins[k]:.3g}); {got} vs {want} (seed {SEED})")


@pytest.mark.parametrize("variant", ARCH_VARIANTS + ("llama-yarn",))
def test_incremental_decode_equals_full_forward(hf_file, variant):
    model = ours(hf_file, variant)
    x = tokens(model.config.vocab_size, 30, salt=8)
    full = model(x)[0]
    model.setup_cache(1, 32)
    slot = torch.tensor([0])
    steps = [model(x[:, :11], slot)[0]] + [model(x[:, t:t + 1], slot)[0] for t in range(11, 30)]
    err = rel_err(torch.cat(steps), full)
    check_bound("cached decode against full forward: rel err", err, 1e-5, f"{variant}: cached decode differs from the full forward by {err:.2e} (seed {SEED})")


# Inductor's code generation is the slow part on a small CPU: it runs once; the
# other architectures (the same code with biases or q/k norms) are traced whole
# (fullgraph: no graph break) and run through aot_eager.
@pytest.mark.parametrize("variant,backend", [("llama", "inductor"), ("qwen2", "aot_eager"),
                                             ("qwen3", "aot_eager")])
def test_compiled_decode_step_matches_eager(hf_file, variant, backend):
    model = ours(hf_file, variant)
    x = tokens(model.config.vocab_size, 20, batch=2, salt=9)
    step = torch.compile(model.forward, fullgraph=True, backend=backend)
    slots = torch.tensor([0, 1])
    results = []
    for fn in (model.forward, step):
        model.setup_cache(2, 32)
        out = [model(x[:, :12], slots)[:, -1]]
        out += [fn(x[:, t:t + 1], slots)[:, 0] for t in range(12, 20)]
        results.append(torch.stack(out, 1))
    err = rel_err(results[1], results[0])
    check_bound("compiled against eager: rel err", err, 1e-5, f"{variant}: compiled decode differs from eager by {err:.2e} (seed {SEED})")


@pytest.mark.parametrize("variant", ARCH_VARIANTS)
def test_slots_of_one_cache_equal_each_sequence_alone(hf_file, variant):
    model = ours(hf_file, variant)
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(SEED + 3)
    lengths = torch.randint(1, 15, (3,), generator=g).tolist()
    steps = 6
    seqs = [tokens(V, n + steps, salt=20 + i)[0] for i, n in enumerate(lengths)]
    slots = [3, 0, 2]
    together = decode_in_slots(model, seqs, lengths, slots, steps, max_seq_len=32)
    for i, (seq, n) in enumerate(zip(seqs, lengths)):
        alone = model(seq[None, :n + steps])[0, n:]
        err = rel_err(together[i], alone)
        check_bound("a slot against alone: rel err", err, 1e-5, f"{variant}: slot {slots[i]} differs by {err:.2e} (seed {SEED})")


def test_tied_files_reuse_the_embedding(hf_file):
    model = ours(hf_file, "qwen3-tied")
    assert model.output.packed is model.tok_embeddings.packed
    untied = ours(hf_file, "qwen3")
    assert untied.output.packed is not untied.tok_embeddings.packed


def test_rope_facts_reach_the_model(hf_file):
    """The scaling each file carries is the one the model runs."""
    yarn = ours(hf_file, "llama-yarn").config.rope
    assert (yarn.mode, yarn.freq_scale, yarn.ext_factor, yarn.n_ctx_orig) == ("normal", 0.25, 1.0, 64)
    qwen = ours(hf_file, "qwen2-tied-yarn").config.rope
    assert (qwen.mode, qwen.beta_fast, qwen.beta_slow) == ("neox", 16.0, 2.0)
    l3 = ours(hf_file, "llama-llama3")
    assert l3.rope_freqs is not None and (l3.rope_freqs.weight > 1).any()
    assert ours(hf_file, "llama").rope_freqs is None


@pytest.mark.parametrize("variant", ARCH_VARIANTS)
def test_model_tokenizer_is_the_files(hf_file, variant):
    """``model.tokenizer`` (llama: sentencepiece; qwen: byte-level BPE) gives
    transformers' ids for the same file, decodes back, and ``generate`` stops
    at its end-of-sequence tokens."""
    from pathlib import Path

    from transformers import AutoTokenizer
    path = Path(hf_file(variant))
    model = ours(hf_file, variant)
    tok = model.tokenizer
    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    text = "the model reads packed weights: données, 東京, x = 1 + 2"
    ids = tok.encode(text, bos=False, eos=False)
    assert ids == ref.encode(text, add_special_tokens=False), f"{variant} (seed {SEED})"
    assert tok.decode(ids) == text
    stop = list(tok.stop_ids)
    assert stop and all(0 <= s < model.config.vocab_size for s in stop)
    out = model.generate(torch.tensor(ids), 12)[len(ids):].tolist()
    assert all(t not in stop for t in out[:-1])   # it runs until a stop token or the limit
