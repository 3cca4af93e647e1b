"""Bounded rendering changes nothing a real template renders: each template
(``chat_templates.TEMPLATES``, and any published one under ``templates/``)
over each conversation, with and without the generation prompt, renders to
exactly the text transformers' own renderer
(``transformers.utils.chat_template_utils.render_jinja_template``) makes;
where transformers' render fails, ours fails with a ChatTemplateError."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from muser_torch.errors import ChatTemplateError

from .chat_templates import CONVERSATIONS, SPECIAL_TOKENS, TEMPLATES

pytest.importorskip("transformers")
from muser_torch.text.chat import ChatTemplate  # noqa: E402

PUBLISHED = sorted((Path(__file__).parent / "templates").glob("*.jinja"))
ALL = {**TEMPLATES, **{p.stem: p.read_text(encoding="utf-8") for p in PUBLISHED}}


def _transformers(source: str, messages, tools, add_generation_prompt: bool) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template
    rendered, _ = render_jinja_template(conversations=[copy.deepcopy(messages)],
                                        tools=copy.deepcopy(tools), chat_template=source,
                                        add_generation_prompt=add_generation_prompt,
                                        **SPECIAL_TOKENS)
    return rendered[0]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("name", sorted(ALL))
def test_renders_as_transformers_does(name, conversation, add_generation_prompt):
    source = ALL[name]
    messages, tools = CONVERSATIONS[conversation]
    try:
        want = _transformers(source, messages, tools, add_generation_prompt)
    except Exception:  # noqa: BLE001  (the template refuses this conversation)
        with pytest.raises(ChatTemplateError, match="failed to render"):
            ChatTemplate(source, SPECIAL_TOKENS).render(messages, add_generation_prompt,
                                                        tools=tools)
        return
    got = ChatTemplate(source, SPECIAL_TOKENS).render(copy.deepcopy(messages), add_generation_prompt,
                                                      tools=copy.deepcopy(tools))
    assert got == want


def test_the_corpus_renders_something_for_most_pairs():
    """A corpus whose every render fails would compare nothing."""
    rendered = 0
    for source in TEMPLATES.values():
        for messages, tools in CONVERSATIONS.values():
            try:
                out = _transformers(source, messages, tools, True)
            except Exception:  # noqa: BLE001
                continue
            rendered += 1
            assert ChatTemplate(source, SPECIAL_TOKENS).render(messages, True, tools=tools) == out
    assert rendered >= 0.7 * len(TEMPLATES) * len(CONVERSATIONS)
