"""Bounded rendering changes nothing a real template renders: each template
(``chat_templates.TEMPLATES``, and any published one under ``templates/``)
over each conversation, with and without the generation prompt, renders to
exactly the text transformers' own renderer
(``transformers.utils.chat_template_utils.render_jinja_template``) makes,
given the same special tokens (the family's, ``chat_templates.special_tokens``)
and the same extra variables (``enable_thinking``, ...: each set of
``chat_templates.render_variables``); where transformers' render fails,
ours fails with a ChatTemplateError."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from muser_torch.errors import ChatTemplateError

from .chat_templates import CONVERSATIONS, TEMPLATES, render_variables, special_tokens

pytest.importorskip("transformers")
from muser_torch.text.chat import ChatTemplate  # noqa: E402

PUBLISHED = sorted((Path(__file__).parent / "templates").glob("*.jinja"))
ALL = {**TEMPLATES, **{p.stem: p.read_text(encoding="utf-8") for p in PUBLISHED}}


CASES = [(name, i) for name in sorted(ALL) for i in range(len(render_variables(name)))]


def _transformers(source: str, messages, tools, add_generation_prompt: bool,
                  tokens: dict, variables: dict) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template
    rendered, _ = render_jinja_template(conversations=[copy.deepcopy(messages)],
                                        tools=copy.deepcopy(tools), chat_template=source,
                                        add_generation_prompt=add_generation_prompt,
                                        **tokens, **copy.deepcopy(variables))
    return rendered[0]


def _ours(source: str, messages, tools, add_generation_prompt: bool, tokens: dict,
          variables: dict) -> str:
    return ChatTemplate(source, tokens).render(copy.deepcopy(messages), add_generation_prompt,
                                               tools=copy.deepcopy(tools),
                                               **copy.deepcopy(variables))


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("name,variant", CASES)
def test_renders_as_transformers_does(name, variant, conversation, add_generation_prompt):
    source, tokens, variables = ALL[name], special_tokens(name), render_variables(name)[variant]
    messages, tools = CONVERSATIONS[conversation]
    try:
        want = _transformers(source, messages, tools, add_generation_prompt, tokens, variables)
    except Exception:  # noqa: BLE001  (the template refuses this conversation)
        with pytest.raises(ChatTemplateError, match="failed to render"):
            _ours(source, messages, tools, add_generation_prompt, tokens, variables)
        return
    assert _ours(source, messages, tools, add_generation_prompt, tokens, variables) == want


def test_the_corpus_renders_something_for_most_pairs():
    """A corpus whose every render fails would compare nothing."""
    rendered = 0
    for name, source in TEMPLATES.items():
        for messages, tools in CONVERSATIONS.values():
            try:
                out = _transformers(source, messages, tools, True, special_tokens(name), {})
            except Exception:  # noqa: BLE001
                continue
            rendered += 1
            assert _ours(source, messages, tools, True, special_tokens(name), {}) == out
    assert rendered >= 0.7 * len(TEMPLATES) * len(CONVERSATIONS)


def test_glimmer_tool_namespaces_and_result_names():
    """Muse Glimmer's format beyond the six conversations: dotted tool names
    give one metadata line and one "ns.*" recipient per namespace, an
    undotted one its own name; a result without a name takes its call's."""
    def tool(name: str) -> dict:
        return {"type": "function", "function": {
            "name": name, "description": f"{name} it", "parameters": {
                "type": "object", "properties": {"x": {"type": "integer"}}}}}
    tools = [tool("weather.get"), tool("weather.alerts"), tool("math.add"), tool("ping")]
    call = {"id": "c1", "type": "function",
            "function": {"name": "math.add", "arguments": {"x": 2, "ys": [1, 2]}}}
    messages = [{"role": "user", "content": "Add?"},
                {"role": "assistant", "content": "", "reasoning_content": "Add them.",
                 "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "3"}]
    tokens = special_tokens("glimmer-atem")
    source = TEMPLATES["glimmer-atem"]
    got = _ours(source, messages, tools, True, tokens, {})
    assert got == _transformers(source, messages, tools, True, tokens, {})
    assert ('// Tool metadata\n{"name": "weather", "description": ""}\n'
            '{"name": "math", "description": ""}\n// Function schemas\n') in got
    assert '# Valid recipients: "self", "weather.*", "math.*", "ping", "user".<|eot|>' in got
    assert ('<|start|>assistant to=self<|message|>Add them.<|eom|>'
            '<|start|>assistant to=math.add<|message|><atem:function_calls>\n'
            '<atem:invoke name="math.add">\n<atem:parameter name="x">2</atem:parameter>\n'
            '<atem:parameter name="ys">[1, 2]</atem:parameter>\n</atem:invoke>\n'
            '</atem:function_calls><|eom|>'
            '<|start|>tool math.add<|message|><tool_output name="math.add">\n3\n</tool_output>'
            '<|eot|><|start|>assistant') in got
