"""The official ``openai`` client against the server on the bundled demo (CPU,
float32), in the spirit of llama.cpp's own server tests for chat completion:
whole and streamed answers, max_tokens, stop strings, seeds, usage and
logprobs. Every answer is held to ``model.generate`` on the same prompt ids
(computed while no server runs: they share the model)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from ..random_seed import fresh_seed
from .harness import MODEL_ID, chatml, greedy, queued_completions, serving, text_of

SEED = fresh_seed()
CHAT = [{"role": "system", "content": "You write Python."},
        {"role": "user", "content": "Write a function."}]
PROMPTS = ["def main(", "import os\n", "class Foo:\n    ", "x = ["]


def _chat_ref(model, n: int) -> tuple[list[int], list[int], str]:
    ids = model.tokenizer.encode(chatml(CHAT))
    new = greedy(model, ids, n)
    text = text_of(model, new)
    assert "<|im_end|>" not in text, "pick a prompt whose answer is not cut by the template's stop"
    return ids, new, text


def test_chat_completion_is_generate_of_the_chatml_prompt(demo_model):
    ids, new, text = _chat_ref(demo_model, 16)
    with serving(demo_model) as live:
        res = live.client().chat.completions.create(model="anything", messages=CHAT,
                                                    max_tokens=16, temperature=0)
    assert res.object == "chat.completion" and res.model == MODEL_ID
    choice = res.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == text
    assert choice.finish_reason == "length" and choice.logprobs is None
    assert (res.usage.prompt_tokens, res.usage.completion_tokens, res.usage.total_tokens) == \
        (len(ids), 16, len(ids) + 16)


def test_chat_stream_is_the_whole_answer_in_pieces(demo_model):
    ids, new, text = _chat_ref(demo_model, 20)
    with serving(demo_model) as live:
        chunks = list(live.client().chat.completions.create(
            messages=CHAT, model=MODEL_ID, max_tokens=20, temperature=0, stream=True,
            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    with_choice = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in with_choice) == text
    assert [c.choices[0].finish_reason for c in with_choice][-1] == "length"
    assert all(c.choices[0].finish_reason is None for c in with_choice[:-1])
    assert len({c.id for c in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"
    assert not chunks[-1].choices and chunks[-1].usage.prompt_tokens == len(ids)
    assert chunks[-1].usage.completion_tokens == 20


@pytest.mark.parametrize("as_ids", [False, True], ids=["text", "token-ids"])
def test_completion_whole_and_streamed(demo_model, as_ids):
    tok = demo_model.tokenizer
    ids = tok.encode("def main(")
    new = greedy(demo_model, ids, 12)
    prompt = ids if as_ids else "def main("
    with serving(demo_model) as live:
        client = live.client()
        whole = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=12,
                                          temperature=0)
        chunks = list(client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=12,
                                                temperature=0, stream=True))
    assert whole.object == "text_completion" and whole.choices[0].text == text_of(demo_model, new)
    assert whole.usage.prompt_tokens == len(ids) and whole.usage.completion_tokens == 12
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize("max_tokens", [1, 5, 33])
def test_max_tokens_is_obeyed_exactly(demo_model, max_tokens):
    # Greedy: a sampled answer may draw the end token first (a fresh seed did, at
    # temperature 0.8, on a loaded fresh-clone run); _chat_ref checks that the
    # greedy answer runs past max_tokens, so only the limit can end it.
    _, new, text = _chat_ref(demo_model, max_tokens)
    with serving(demo_model) as live:
        res = live.client().chat.completions.create(model=MODEL_ID, messages=CHAT,
                                                    max_tokens=max_tokens, temperature=0)
    assert res.usage.completion_tokens == max_tokens and res.choices[0].finish_reason == "length"
    assert res.choices[0].message.content == text


def test_stop_strings_cut_the_answer_and_are_never_streamed(demo_model):
    tok = demo_model.tokenizer
    ids = tok.encode("class Foo:\n    ")
    new = greedy(demo_model, ids, 40)
    text = text_of(demo_model, new)
    stop = text[12:15]
    want = text[:text.find(stop)]
    used = next(k for k in range(1, len(new) + 1) if stop in tok.decode(new[:k]))
    stops = ["never appears \u2603", stop]
    with serving(demo_model) as live:
        client = live.client()
        whole = client.completions.create(model=MODEL_ID, prompt="class Foo:\n    ",
                                          max_tokens=40, temperature=0, stop=stops)
        chunks = list(client.completions.create(model=MODEL_ID, prompt="class Foo:\n    ",
                                                max_tokens=40, temperature=0, stop=stops,
                                                stream=True, stream_options={"include_usage": True}))
        chat = client.chat.completions.create(model=MODEL_ID, messages=CHAT, max_tokens=40,
                                              temperature=0, stop=stop)
    assert whole.choices[0].text == want and whole.choices[0].finish_reason == "stop"
    assert whole.usage.completion_tokens == used
    streamed = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(streamed) == want and chunks[-1].usage.completion_tokens == used
    assert stop not in chat.choices[0].message.content


def test_same_seed_same_answer_alone_or_batched_different_seeds_differ(demo_model):
    def ask(client, seed):
        return client.completions.create(model=MODEL_ID, prompt="def ", max_tokens=24,
                                         temperature=1.0, seed=seed).choices[0].text

    with serving(demo_model) as live:
        client = live.client()
        first = ask(client, SEED)
        assert ask(client, SEED) == first, f"seed {SEED}"
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(lambda _: ask(client, SEED), range(4)))
        others = {ask(client, SEED + k) for k in range(1, 5)}
    assert together == [first] * 4, f"seed {SEED}"
    assert len(others | {first}) > 1, f"seed {SEED}: five seeds gave one answer"


def test_concurrent_requests_decode_batched_and_equal_generate(demo_model):
    tok = demo_model.tokenizer
    want = [text_of(demo_model, greedy(demo_model, tok.encode(p), 24)) for p in PROMPTS]
    got, max_batch = queued_completions(demo_model, PROMPTS, 24, slots=4)
    assert max_batch == len(PROMPTS)
    assert [res.choices[0].text for res in got] == want


def _logprobs_ref(model, ids: list[int], new: list[int]) -> torch.Tensor:
    """float64 log-softmax of the model's logits before each new token (no cache)."""
    seq = torch.tensor([ids + new[:-1]])
    with torch.no_grad():
        logits = model(seq)[0, len(ids) - 1:]
    return torch.log_softmax(logits.double(), dim=-1)


def test_logprobs_are_the_models_distribution(demo_model):
    tok = demo_model.tokenizer
    ids = tok.encode(chatml(CHAT))
    new = greedy(demo_model, ids, 8)
    text_ids = tok.encode("x = [")
    text_new = greedy(demo_model, text_ids, 6)
    with serving(demo_model) as live:
        client = live.client()
        chat = client.chat.completions.create(model=MODEL_ID, messages=CHAT, max_tokens=8,
                                              temperature=0, logprobs=True, top_logprobs=3)
        text = client.completions.create(model=MODEL_ID, prompt="x = [", max_tokens=6,
                                         temperature=0, logprobs=2)
    ref = _logprobs_ref(demo_model, ids, new)
    entries = chat.choices[0].logprobs.content
    assert [e.bytes for e in entries] == [[t] for t in new]
    for k, e in enumerate(entries):
        assert e.logprob == pytest.approx(float(ref[k, new[k]]), abs=1e-4)
        top = torch.topk(ref[k], 3)
        assert [t.bytes for t in e.top_logprobs] == [[t] for t in top.indices.tolist()]
        assert [t.logprob for t in e.top_logprobs] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert e.top_logprobs[0].token == e.token       # greedy picks the most likely
    lp = text.choices[0].logprobs
    ref = _logprobs_ref(demo_model, text_ids, text_new)
    assert lp.tokens == [tok.decode([t]) for t in text_new]
    assert lp.token_logprobs == pytest.approx([float(ref[k, t]) for k, t in enumerate(text_new)],
                                              abs=1e-4)
    assert all(len(d) <= 2 for d in lp.top_logprobs)
    assert lp.text_offset == [len(tok.decode(text_new[:k])) for k in range(len(text_new))]
