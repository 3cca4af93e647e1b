"""Rendering a file's ``tokenizer.chat_template`` (Jinja) into a prompt string.

The template comes from the file, so it is untrusted code: it runs in
jinja2's immutable sandbox. The environment is the one chat templates are
written for, as transformers sets it up (utils/chat_template_utils.py):
``trim_blocks`` and ``lstrip_blocks`` on, the loop-controls extension, a
``tojson`` filter that keeps non-ASCII text as it is, and the globals
``raise_exception`` and ``strftime_now``. A render sees ``messages``,
``add_generation_prompt``, ``tools`` and ``documents`` (None), and the
special token strings ``bos_token``, ``eos_token``, ``unk_token`` and
``pad_token`` that the file names.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping, Sequence

from ..errors import ChatTemplateError
from .metadata import CHAT_TEMPLATE_KEY
from .requirements import require

MIN_JINJA2 = (3, 1, 6)   # older releases have known sandbox escapes


class ChatTemplate:
    """One compiled template. ``render`` raises ``ChatTemplateError`` for any
    failure of the template itself, ``ValueError`` for bad ``messages``."""

    def __init__(self, source: str, special_tokens: Mapping[str, str]) -> None:
        jinja2 = require("jinja2")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        version = tuple(int(p) for p in jinja2.__version__.split(".")[:3] if p.isdigit())
        if version < MIN_JINJA2:
            raise ImportError(f"chat templates need jinja2>={'.'.join(map(str, MIN_JINJA2))} "
                              f"(its sandbox), found {jinja2.__version__}")
        self.source = source
        self.special_tokens = dict(special_tokens)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"{CHAT_TEMPLATE_KEY} does not compile: line {e.lineno}: "
                                    f"{e.message}") from None

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               **variables: Any) -> str:
        chat = _plain_messages(messages)
        context = {**self.special_tokens, "tools": None, "documents": None, **variables}
        try:
            return self._template.render(messages=chat, add_generation_prompt=add_generation_prompt,
                                         **context)
        except Exception as e:  # the template is the file's code: every failure is the file's
            raise ChatTemplateError(f"{CHAT_TEMPLATE_KEY} failed to render: "
                                    f"{type(e).__name__}: {e}") from None


def _plain_messages(messages: Any) -> list[dict]:
    """Copies of the messages as plain dicts, keys holding None dropped (as
    transformers does: templates test for a key, not for None)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError(f"messages must be a list of dicts, got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages is empty: a chat needs at least one message")
    chat = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"messages[{i}] is {type(m).__name__}, expected a dict "
                             f"with 'role' and 'content'")
        chat.append({k: v for k, v in m.items() if v is not None})
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
