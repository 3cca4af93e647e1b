"""Rendering a file's ``tokenizer.chat_template`` (Jinja) into a prompt string.

The template comes from the file, so it is untrusted code: it runs in
jinja2's immutable sandbox, with every render bounded in CPU time, in the
size of its values and output, in its total work and in how deep its calls
nest (``chat_bounds.py``; the settings are ``ChatLimits``).

The environment is the one chat templates are written for, as transformers
sets it up (``transformers.utils.chat_template_utils``): ``trim_blocks`` and
``lstrip_blocks`` on, the loop-controls extension and ``{% generation %}``,
a ``tojson`` filter that keeps non-ASCII text as it is, the globals
``raise_exception`` and ``strftime_now``, and a ``namespace`` refusing
attribute names that start with "_". A render sees ``messages`` (a
message's reasoning under each of the names templates read it by),
``add_generation_prompt``, ``tools`` and ``documents`` (None unless given),
and the special token strings ``bos_token``, ``eos_token``, ``unk_token``
and ``pad_token`` that the file names.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping, Sequence

from ..errors import ChatTemplateError
from .chat_limits import ChatLimits
from .metadata import CHAT_TEMPLATE_KEY
from .requirements import require

MIN_JINJA2 = (3, 1, 6)   # older releases have known sandbox escapes

# Names a message's reasoning comes under; a template reads one of them.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplate:
    """One compiled template. ``render`` raises ``ChatTemplateError`` for any
    failure of the template itself (a bound reached included), ``ValueError``
    for bad ``messages``."""

    def __init__(self, source: str, special_tokens: Mapping[str, str],
                 limits: ChatLimits | None = None) -> None:
        jinja2 = require("jinja2")
        version = tuple(int(p) for p in jinja2.__version__.split(".")[:3] if p.isdigit())
        if version < MIN_JINJA2:
            raise ImportError(f"chat templates need jinja2>={'.'.join(map(str, MIN_JINJA2))} "
                              f"(its sandbox), found {jinja2.__version__}")
        from . import chat_bounds as cb

        self.source = source
        self.special_tokens = dict(special_tokens)
        self.limits = limits or ChatLimits()
        env = cb.BoundedSandbox(trim_blocks=True, lstrip_blocks=True,
                                extensions=["jinja2.ext.loopcontrols", cb.GenerationBlock])
        env.set_filter("tojson", _tojson)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self._bounds = cb
        # Compiling folds constant filter calls, so it runs under a budget too.
        budget = cb.Budget(self.limits, self.limits.max_chars)
        try:
            self._template = cb.with_budget(budget, lambda: env.from_string(env.parse_bounded(source)))
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"{CHAT_TEMPLATE_KEY} does not compile: line {e.lineno}: "
                                    f"{e.message}") from None
        except Exception as e:  # noqa: BLE001  (a recursion too deep for the parser, ...)
            raise ChatTemplateError(f"{CHAT_TEMPLATE_KEY} does not compile: "
                                    f"{type(e).__name__}: {_one_line(e)}") from None

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               limits: ChatLimits | None = None, **variables: Any) -> str:
        """The prompt; ``limits`` (default: this template's) bound the render."""
        chat = _plain_messages(messages)
        context = {**self.special_tokens, "tools": None, "documents": None, **variables}
        limits = limits or self.limits
        cb = self._bounds
        budget = cb.Budget(limits, limits.chars_for((chat, context)))
        try:
            return cb.bounded(budget, self._template.generate(
                messages=chat, add_generation_prompt=add_generation_prompt, **context))
        except Exception as e:  # the template is the file's code: every failure is the file's
            if budget.stopped:
                raise ChatTemplateError(f"{CHAT_TEMPLATE_KEY} stopped at {budget.stopped}") \
                    from None
            raise ChatTemplateError(f"{CHAT_TEMPLATE_KEY} failed to render: "
                                    f"{type(e).__name__}: {_one_line(e)}") from None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _plain_messages(messages: Any) -> list[dict]:
    """Copies of the messages as plain dicts, keys holding None dropped, and
    a reasoning text under every name in REASONING_FIELDS (as transformers
    does: templates test for a key, not for None, and read one of the names)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError(f"messages must be a list of dicts, got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages is empty: a chat needs at least one message")
    chat = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"messages[{i}] is {type(m).__name__}, expected a dict "
                             f"with 'role' and 'content'")
        plain = {k: v for k, v in m.items() if v is not None}
        reasoning = next((plain[k] for k in REASONING_FIELDS if k in plain), None)
        if reasoning is not None:
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        chat.append(plain)
    return chat


def _raise_exception(message: str) -> None:
    from jinja2.exceptions import TemplateError
    raise TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters, which a prompt must keep.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)
