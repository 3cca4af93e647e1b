"""Chat prompts against llama.cpp's tokenizer, for every chat template the
tests use: the corpus of ``chat_templates.py`` (each family's format, with its
render variables), the tiny vocabularies' ChatML, Llama 2 and Gemma templates
(``tiny_tokenizers.py``), Muse Glimmer's test template and serve's ChatML
fallback (``serve/prompts.py``).

Each conversation of ``chat_templates.CONVERSATIONS`` is rendered and encoded
as a chat (``encode_marked`` of the marked render, what ``encode_chat`` and
``serve`` do), on a byte-level vocabulary whose CONTROL tokens are every
family's markup (written as a file: llama.cpp loads its vocabulary only), and
on the real Gemma 3 file for the two Gemma templates:
- with no message spelling a control token, the ids are llama.cpp's
  ``llama_tokenize`` of the rendered prompt with parse_special true, token for
  token, and hold control ids;
- with every message carrying all the markup there is, the control ids are the
  same ones: the messages add none, and their text decodes back.
Without the peer (``tools/peers.sh``) these tests skip, saying so."""
from __future__ import annotations

import copy

import pytest

from muser_torch.errors import ChatTemplateError
from muser_torch.gguf_io import load_gguf
from muser_torch.serve.prompts import render_chatml
from muser_torch.text import tokenizer_from_metadata
from muser_torch.text.chat import ChatTemplate

from .. import lcpp
from .chat_templates import CONVERSATIONS, TEMPLATES, render_variables, special_tokens
from .family_templates import FAMILY_CONTROL, FAMILY_USER, MUSE_TEMPLATE
from .samples import fresh_seed
from .tiny_tokenizers import (CHATML_TEMPLATE, GEMMA_TEMPLATE, LLAMA2_TEMPLATE, gpt2_metadata,
                              write_tokenizer_gguf)

pytest.importorskip("transformers")

SEED = fresh_seed()
GEMMA_TOKENS = {"bos_token": "<bos>", "eos_token": "<eos>"}
# name -> (source, the special tokens it is rendered with); None: serve's ChatML
OTHER_TEMPLATES = {"tiny-chatml": (CHATML_TEMPLATE, {}),
                   "tiny-llama2": (LLAMA2_TEMPLATE, special_tokens("tiny-llama2")),
                   "tiny-gemma": (GEMMA_TEMPLATE, GEMMA_TOKENS),
                   "muse-glimmer-test": (MUSE_TEMPLATE, {}),
                   "serve-chatml-fallback": (None, {})}
CASES = [(name, i) for name in sorted(TEMPLATES) for i in range(len(render_variables(name)))] \
    + [(name, 0) for name in OTHER_TEMPLATES]


def renderer(name: str, variant: int, add_generation_prompt: bool):
    """``(messages, tools) -> prompt`` for a template of the tests."""
    if name in TEMPLATES:
        template = ChatTemplate(TEMPLATES[name], special_tokens(name))
        variables = render_variables(name)[variant]
    else:
        source, tokens = OTHER_TEMPLATES[name]
        if source is None:
            return lambda messages, tools: render_chatml(messages, tools)
        template, variables = ChatTemplate(source, tokens), {}
    return lambda messages, tools: template.render(
        copy.deepcopy(messages), add_generation_prompt, tools=tools, **copy.deepcopy(variables))


def carrying(messages: list[dict], payload: str) -> list[dict]:
    """``messages`` with ``payload`` in every non-empty text, inside and at the end."""
    out = copy.deepcopy(messages)
    for m in out:
        if isinstance(m.get("content"), str) and m["content"]:
            m["content"] = m["content"][:2] + payload + m["content"][2:] + payload
    return out


def chats(tok, render) -> list[tuple[str, str, list[int], list[int], str]]:
    """(conversation, plain prompt, its chat ids, the chat ids with every
    message carrying the template's own markup, that payload) for each
    conversation the template renders."""
    out = []
    for conversation, (messages, tools) in sorted(CONVERSATIONS.items()):
        marker = tok.marker()
        try:
            plain = render(messages, tools)
            ids = tok.encode_marked(render(marker.mark_messages(messages), tools), bos=False)
        except ChatTemplateError:   # the template refuses this conversation
            continue
        # every markup token the prompt holds, and the file's BOS and EOS
        payload = "".join([t for t in tok.markup if t in plain]
                          + [tok.token(i) for i in (tok.bos_id, tok.eos_id) if i is not None])
        try:
            spoofed = tok.encode_marked(render(marker.mark_messages(carrying(messages, payload)),
                                               tools), bos=False)
        except ChatTemplateError as e:   # macro-schema truncates a tool's output: refused
            assert "cut" in str(e), e
            spoofed = None
        out.append((conversation, plain, ids, spoofed, payload))
    assert len(out) >= 3
    return out


def control_ids(tok, ids: list[int]) -> list[int]:
    markup = set(tok.markup.values())
    return [i for i in ids if i in markup]


def check_against_llama_cpp(tok, path, tmp_path, render, where: str) -> None:
    found = chats(tok, render)
    want = lcpp.llama_cpp_tokenize_many(path, [plain for _, plain, *_ in found], True, tmp_path)
    for (conversation, plain, ids, spoofed, payload), lcpp_ids in zip(found, want):
        at = f"seed {SEED}, {where} on {conversation!r}"
        assert ids == lcpp_ids, f"{at}: ours {ids[:30]} llama.cpp {lcpp_ids[:30]}"
        assert control_ids(tok, ids), at
        if spoofed is not None:
            assert control_ids(tok, spoofed) == control_ids(tok, ids), f"{at}: a message added one"
            assert tok.decode(spoofed).count(payload) >= 1, at


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """A byte-level vocabulary whose CONTROL tokens are every family's markup, and its file."""
    md = gpt2_metadata(SEED, control=FAMILY_CONTROL, user=FAMILY_USER)
    path = write_tokenizer_gguf(tmp_path_factory.mktemp("chat") / "families.gguf", md, "qwen2")
    return tokenizer_from_metadata(load_gguf(path).metadata), path


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("name,variant", CASES)
def test_chat_ids_are_llama_cpps(families, tmp_path, name, variant, add_generation_prompt):
    tok, path = families
    check_against_llama_cpp(tok, path, tmp_path, renderer(name, variant, add_generation_prompt),
                            f"{name} {variant} add_generation_prompt={add_generation_prompt}")


@pytest.fixture(scope="module")
def gemma(gemma_path):
    return tokenizer_from_metadata(load_gguf(gemma_path).metadata)


@pytest.mark.parametrize("name", ["gemma3", "tiny-gemma"])
def test_gemma_chat_ids_are_llama_cpps(gemma, gemma_path, tmp_path, name):
    check_against_llama_cpp(gemma, gemma_path, tmp_path, renderer(name, 0, True), name)


def test_the_comparison_sees_markup_from_a_message(families, tmp_path):
    """The twin: the old chat path (the render encoded whole, parse_special true)
    gives the messages' markup control ids, and the check above fails."""
    tok, path = families
    render = renderer("chatml-tools-reasoning", 0, True)
    messages, tools = CONVERSATIONS["system and turns"]
    payload = "".join(t for t in tok.markup if t in render(messages, tools))
    plain = tok.encode(render(messages, tools), bos=False, parse_special=True)
    old = tok.encode(render(carrying(messages, payload), tools), bos=False, parse_special=True)
    assert len(control_ids(tok, old)) > len(control_ids(tok, plain))
