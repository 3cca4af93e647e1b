"""Prompt-prefix reuse: a request goes to the free slot whose cache holds
the longest prefix of its prompt and prefills only the rest; ``usage`` says
how many prompt tokens were reused (``prompt_tokens_details.cached_tokens``).
A second chat turn reuses the first turn's prompt and answer, and answers as
a cold server does (greedy, token for token)."""
from __future__ import annotations

from muser_torch.serve.prompts import chat_prompt
from muser_torch.text.chat_limits import ChatLimits

from .harness import MODEL_ID, serving


def _ids(model, messages) -> list[int]:
    return chat_prompt(model.tokenizer, messages, ChatLimits())[0]

TURN1 = [{"role": "user", "content": "Write a function that adds two numbers."}]


def _chat(client, messages, n: int):
    return client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=n,
                                          temperature=0)


def test_a_second_turn_reuses_the_first(demo_model):
    with serving(demo_model, slots=2) as live:
        client = live.client()
        first = _chat(client, TURN1, 24)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        turn2 = TURN1 + [{"role": "assistant", "content": first.choices[0].message.content},
                         {"role": "user", "content": "Now make it subtract."}]
        second = _chat(client, turn2, 16)
        cached = second.usage.prompt_tokens_details.cached_tokens
        # the slot held turn 1's prompt and the answer's tokens it fed back; the
        # new prompt repeats them as far as the template writes the answer again
        ids1 = _ids(demo_model, TURN1)
        assert len(ids1) < cached < second.usage.prompt_tokens
        unrelated = _chat(client, [{"role": "user", "content": "Q"}], 4)
        assert unrelated.usage.prompt_tokens_details.cached_tokens < len(ids1)
    with serving(demo_model, slots=2) as live:        # a cold server
        cold = _chat(live.client(), turn2, 16)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert second.choices[0].message.content == cold.choices[0].message.content


def test_the_slot_with_the_longest_prefix_is_chosen(demo_model):
    """One new token each (so a slot holds exactly its prompt), then a prompt
    that extends the second: it goes to that slot and reuses all of it."""
    a = [{"role": "user", "content": "alpha " * 8}]
    b = [{"role": "user", "content": "bravo " * 8}]
    with serving(demo_model, slots=3) as live:
        client = live.client()
        _chat(client, a, 1)
        _chat(client, b, 1)
        again = _chat(client, b + [{"role": "assistant", "content": "x"},
                                   {"role": "user", "content": "y"}], 2)
    assert again.usage.prompt_tokens_details.cached_tokens == len(_ids(demo_model, b))
