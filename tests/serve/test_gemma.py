"""The server on the real Gemma 3 270M file (the test extra's package; CPU,
float32): its chat falls back to ChatML (the file carries no template) and is
cut at ChatML's end of turn; batched completions equal ``model.generate``;
the file's end-of-turn token is among the stops. Few tokens: a step of this
model takes a tenth of a second or more on the CPU."""
from __future__ import annotations

from muser_torch.serve.sampling import SamplingParams

from .harness import MODEL_ID, chatml, greedy, queued_completions, run_jobs, serving, text_of

SAY = [{"role": "user", "content": "Say hello."}]
PROMPTS = ["The capital of France is", "def fibonacci(n):"]


def test_the_files_end_of_turn_token_stops_generation(gemma_model):
    with serving(gemma_model, slots=1, context=64) as live:
        names = {gemma_model.tokenizer.token(i) for i in live.scheduler.stop_ids}
    assert gemma_model.tokenizer.chat_template is None
    assert {"<end_of_turn>", "<eos>"} <= names


def test_chat_without_a_template_is_chatml_cut_at_its_end_of_turn(gemma_model):
    tok = gemma_model.tokenizer
    ids = tok.encode(chatml(SAY))
    new = greedy(gemma_model, ids, 12)
    text = text_of(gemma_model, new)
    assert "<|im_end|>" in text, "the reference answer should end its turn within 12 tokens"
    used = next(k for k in range(1, len(new) + 1) if "<|im_end|>" in tok.decode(new[:k]))
    with serving(gemma_model, slots=2, context=128) as live:
        res = live.client().chat.completions.create(model=MODEL_ID, messages=SAY, max_tokens=12,
                                                    temperature=0)
        chunks = list(live.client().chat.completions.create(
            model=MODEL_ID, messages=SAY, max_tokens=12, temperature=0, stream=True))
    assert res.choices[0].message.content == text.split("<|im_end|>")[0]
    assert res.choices[0].finish_reason == "stop"
    assert (res.usage.prompt_tokens, res.usage.completion_tokens) == (len(ids), used)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == \
        res.choices[0].message.content


def test_batched_completions_equal_generate(gemma_model):
    tok = gemma_model.tokenizer
    refs = [greedy(gemma_model, tok.encode(p), 6) for p in PROMPTS]
    got, max_batch = queued_completions(gemma_model, PROMPTS, 6, slots=2, context=64)
    assert max_batch == len(PROMPTS)
    for res, ref in zip(got, refs):
        assert res.choices[0].text == text_of(gemma_model, ref)
        assert res.usage.completion_tokens == len(ref)


def test_batched_decode_keeps_greedy_token_ids(gemma_model):
    tok = gemma_model.tokenizer
    ids = [tok.encode(p) for p in PROMPTS + ["Once upon a time"]]
    refs = [greedy(gemma_model, i, 5) for i in ids]
    sinks, sched = run_jobs(gemma_model, [(i, SamplingParams(max_tokens=5, temperature=0.0))
                                          for i in ids], slots=3, context=64)
    assert sched.stats.max_batch == 3
    assert [s.tokens for s in sinks] == refs
