"""One rule for special text: what a chat template writes is markup, what a
message says is text.

llama.cpp's ``llama_tokenize(..., parse_special)`` decides whether the text of
a CONTROL or UNKNOWN token (``<end_of_turn>``, ``<|im_end|>``) becomes that
token: with parse_special false it is text like any other, with true it is the
token. USER_DEFINED tokens (``<think>``) are matched whole either way
(llama-vocab.cpp, ``tokenizer_st_partition``); the tokenizer's backend does that,
in the text left between control tokens (llama.cpp takes all of them longest
first; the two differ only where a USER_DEFINED token overlaps a control one).
The types are those llama.cpp's loader leaves (``llama_cpp_types``): it retypes
some tokens by their text, so an ``<|im_end|>`` the file calls USER_DEFINED is
CONTROL, and gpt-oss's channel markers, CONTROL in the file, are USER_DEFINED.
Those markers are matched whole by ``encode`` as llama.cpp matches them, but a
chat takes them from the template's markup only (``GGUFTokenizer.markup``):
Muse Glimmer writes its turns with them.

A chat prompt needs both at once: the template's markup as control tokens, a
message's content as text, even where it spells a control token (else a user
closes their own turn and opens the model's). The template is rendered with
each text field marked (``Marker.mark_messages``: content, content parts'
text, reasoning): its text between two Unicode noncharacters, ``OPEN`` and
``CLOSE``, which Unicode reserves for a program's internal use and which are
refused in any message. The other strings of a message (role, name, ...) are
compared by templates, so they cannot be marked; one that spells a control
token is refused instead. ``spans`` then
cuts the rendered prompt back into markup and content; control tokens are
looked for in the markup only, and the text between two control tokens,
markup and content together, is tokenized as one fragment, as llama.cpp
tokenizes a prompt fragment by fragment.

A template may transform a content string. Leading and trailing whitespace
stays outside the marks, so ``|trim`` and ``.strip()`` still reach it; a
content split at a USER_DEFINED token (``content.split('</think>')``, as the
reasoning templates do) keeps its marks, since each run of text between such
tokens is marked on its own. A template that cuts through a marked run or
reorders the marks leaves them unbalanced, and ``spans`` refuses the prompt
(``ChatTemplateError``) rather than guess where content ends; so it does when
the markup holds a mark escaped (a content list rendered as its Python repr).
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from ..errors import ChatTemplateError

OPEN, CLOSE = "\ufdd0", "\ufdd1"   # noncharacters: never in text a client sends
MARKS = OPEN + CLOSE
# A third noncharacter: where a caller's own markup goes inside a message's text
# (a server's image placeholder; ``mark_messages(slots=...)``), outside the marks.
SLOT = "\ufdd2"
# The marks as a template could escape them: Python's repr of a list of parts
# and JSON's ensure_ascii (\ufdd0, \U0000fdd0), a URL's UTF-8 (%EF%B7%90).
# Found in the markup, they mean a message's text was written there unmarked.
ESCAPED_MARK = re.compile(r"\\u0{0,4}fdd[01]|%ef%b7%9[01]", re.IGNORECASE)
# llama.cpp's token types: parse_special decides UNKNOWN and CONTROL tokens.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4
# Texts that llama.cpp's loader makes CONTROL whatever the file says
# (its end-of-turn, end-of-generation and fill-in-the-middle detection by text).
CONTROL_BY_TEXT = frozenset({
    "</s>", "<EOT>", "<MID>", "<PAD>", "<PRE>", "<REPO>", "<SUF>", "<end_of_turn>",
    "<end_of_utterance>", "<eos>", "<fim-middle>", "<fim-pad>", "<fim-prefix>", "<fim-repo>",
    "<fim-suffix>", "<fim_middle>", "<fim_pad>", "<fim_prefix>", "<fim_suffix>", "<reponame>",
    "<turn|>", "<|calls|>", "<|call|>", "<|code_middle|>", "<|code_prefix|>", "<|code_suffix|>",
    "<|end_of_text|>", "<|endoftext|>", "<|end|>", "<|eom_id|>", "<|eot_id|>", "<|file_sep|>",
    "<|fim_middle|>", "<|fim_pad|>", "<|fim_prefix|>", "<|fim_repo|>", "<|fim_suffix|>",
    "<|flush|>", "<|im_end|>", "<|middle|>", "<|prefix|>", "<|repo_name|>", "<|return|>",
    "<|suffix|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>",
    "<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581end\uff5c>", "<\uff5cfim\u2581hole\uff5c>",
    "[EOS]", "[EOT]", "[PAD]", "[e~[", "_<EOT>", "\u2581<MID>", "\u2581<PRE>", "\u2581<SUF>",
})
# gpt-oss's markers, which llama.cpp's loader makes USER_DEFINED (matched whole
# with or without parse_special).
USER_DEFINED_BY_TEXT = frozenset({"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})
# The message fields that hold text; every other string is structure (role,
# name, tool call ids, ...) that templates compare, so it is checked, not marked.
TEXT_FIELDS = frozenset({"content", "reasoning_content", "thinking", "reasoning"})


def llama_cpp_types(texts: Sequence[str], types: Sequence[int] | None,
                    ids: Mapping[str, int]) -> list[int]:
    """The token types as llama.cpp's loader leaves them, ``ids`` being its
    text-to-id map (a repeated text: the later id). It overrides the file in
    ways that change tokenization: a text of ``CONTROL_BY_TEXT`` becomes
    CONTROL, gpt-oss's four markers USER_DEFINED; ``<|end|>`` is USER_DEFINED
    beside ``<|return|>`` and ``<|call|>`` (or ``<|calls|>`` and ``<|flush|>``),
    and ``</s>`` NORMAL beside ``<|tool_response>`` (the end tokens it then
    ends generation with instead)."""
    out = list(types) if types is not None else [NORMAL] * len(texts)
    for group, kind in ((CONTROL_BY_TEXT, CONTROL), (USER_DEFINED_BY_TEXT, USER_DEFINED)):
        for t in group:
            i = ids.get(t)
            if i is not None:
                out[i] = kind
    has = ids.__contains__
    call = has("<|call|>") or has("<|calls|>")
    if has("<|end|>") and ((has("<|return|>") and call) or (call and has("<|flush|>"))):
        out[ids["<|end|>"]] = USER_DEFINED
    if has("</s>") and has("<|tool_response>"):
        out[ids["</s>"]] = NORMAL
    return out


def control_table(tokens: Sequence[str], types: Sequence[int] | None) -> dict[str, int]:
    """text -> id of the tokens that parse_special turns on (CONTROL, UNKNOWN).
    Empty texts are left out: they match nowhere in llama.cpp either."""
    table: dict[str, int] = {}
    for i, (t, k) in enumerate(zip(tokens, types or ())):
        if k in (UNKNOWN, CONTROL) and t and t not in table:
            table[t] = i
    return table


def split_controls(text: str, table: Mapping[str, int]) -> list[str | int]:
    """``text`` as text pieces and control-token ids, as llama.cpp's
    ``tokenizer_st_partition`` with parse_special true cuts it: the longest
    token first (ties by id), each occurrence left to right, then the next
    token in what is left."""
    present = sorted((t for t in table if t in text),
                     key=lambda t: (-len(t.encode("utf-8")), table[t]))   # llama.cpp: bytes
    parts: list[str | int] = [text] if text else []
    for t in present:
        out: list[str | int] = []
        for p in parts:
            if isinstance(p, int):
                out.append(p)
                continue
            for k, piece in enumerate(p.split(t)):
                if k:
                    out.append(table[t])
                if piece:
                    out.append(piece)
        parts = out
    return parts


def first_control(text: str, table: Mapping[str, int]) -> str | None:
    """A control token's text found in ``text``, or None."""
    return next((t for t in table if t in text), None)


class Marker:
    """Marks the text fields of chat messages for one vocabulary (module docstring).

    Content whitespace left outside the marks, or a USER_DEFINED token cut
    out of them, lands in the markup, where control tokens are matched; so
    each is done only where it cannot complete a control token together with
    the template's own text: edge whitespace only when no control token holds
    whitespace, a cut only at a token that no control token overlaps."""

    def __init__(self, table: Mapping[str, int], user_defined: Sequence[str]) -> None:
        self.table = table
        self.space_outside = not any(c.isspace() for t in table for c in t)
        heads = {t[:k] for t in table for k in range(1, len(t))}   # proper prefixes
        tails = {t[k:] for t in table for k in range(1, len(t))}   # proper suffixes
        cuts = [u for u in set(user_defined) if u.strip() == u and u
                and first_control(u, table) is None
                and not any(u in t for t in table)
                and not any(u[:k] in tails or u[-k:] in heads for k in range(1, len(u) + 1))]
        cuts.sort(key=lambda u: (-len(u), u))   # the regex takes the first that fits: the longest
        self._cuts = re.compile("|".join(map(re.escape, cuts))) if cuts else None

    def mark_messages(self, messages: Any, slot: str | None = None) -> Any:
        """A copy of ``messages`` with every text field marked. A string
        anywhere that holds OPEN or CLOSE is refused (``ValueError``), as is a
        structural string (a role, a name, ...) that spells a control token:
        templates write those into the markup. ``slot``: markup that each
        ``SLOT`` in a text field becomes, outside the marks (a server's image
        placeholder, which the caller, not the client, put there)."""
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            return messages   # the renderer names what is wrong with it
        marked = [self._mark(m, f"messages[{i}]", text=False) for i, m in enumerate(messages)]
        return marked if slot is None else _fill_slots(marked, CLOSE + slot + OPEN)

    def mark_tools(self, tools: Any) -> Any:
        """``tools`` (function specs a client offers) checked as markup: a
        string that spells a control token or holds OPEN or CLOSE is refused
        (``ValueError``), since a template writes the specs into its markup."""
        return None if tools is None else self._mark(list(tools), "tools", text=False)

    def _mark(self, v: Any, where: str, text: bool) -> Any:
        if isinstance(v, str):
            bad = next((c for c in MARKS if c in v), None)
            if bad is not None:
                raise ValueError(f"{where} holds U+{ord(bad):04X}, a Unicode noncharacter "
                                 f"reserved here to tell a message's text from the template's markup")
            if text:
                return self._mark_text(v)
            found = first_control(v, self.table)
            if found is not None:
                raise ValueError(f"{where} spells the control token {found!r}; only a message's "
                                 f"text (content, reasoning) may, and there it stays text")
            return v
        if isinstance(v, Mapping):
            # a content part ({"type": "text", "text": ...}) carries its text under "text"
            return {k: self._mark(x, f"{where}.{k}", k in TEXT_FIELDS or (text and k == "text"))
                    for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [self._mark(x, f"{where}[{i}]", text) for i, x in enumerate(v)]
        return v

    def _mark_text(self, s: str) -> str:
        """Each run of ``s`` between cut tokens marked, its edge whitespace
        outside (when allowed); a run of whitespace alone, or an empty one,
        stays as it is, so a template's ``if content`` sees what it would."""
        out, at = [], 0
        for m in (self._cuts.finditer(s) if self._cuts else ()):
            out += [self._mark_run(s[at:m.start()]), m.group()]
            at = m.end()
        out.append(self._mark_run(s[at:]))
        return "".join(out)

    def _mark_run(self, run: str) -> str:
        core = run.strip() if self.space_outside else run
        if not core:
            return run
        start = run.index(core)
        return run[:start] + OPEN + core + CLOSE + run[start + len(core):]


def _fill_slots(v: Any, markup: str) -> Any:
    """``v`` with each SLOT inside a marked run replaced by ``markup`` (which
    closes the run and opens it again); an empty run left by it is dropped."""
    if isinstance(v, str):
        return v.replace(SLOT, markup).replace(OPEN + CLOSE, "") if SLOT in v else v
    if isinstance(v, Mapping):
        return {k: _fill_slots(x, markup) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_fill_slots(x, markup) for x in v]
    return v


def spans(rendered: str) -> list[tuple[bool, str]]:
    """``rendered`` as (is_content, text) spans, the marks taken out; a
    ``ChatTemplateError`` when they do not pair up."""
    out: list[tuple[bool, str]] = []
    inside, start = False, 0
    for at, c in enumerate(rendered):
        if c not in MARKS:
            continue
        if (c == OPEN) == inside:
            raise ChatTemplateError(
                "the chat template cut or reordered a message's text (an unpaired "
                f"{'start' if c == OPEN else 'end'} mark at character {at}), so its markup "
                "cannot be told from the message; refused rather than guessed")
        out.append((inside, rendered[start:at]))
        inside, start = not inside, at + 1
    if inside:
        raise ChatTemplateError("the chat template cut a message's text short (its end mark "
                                "is missing), so its markup cannot be told from the message")
    out.append((False, rendered[start:]))
    for is_text, t in out:
        found = None if is_text else ESCAPED_MARK.search(t)
        if found:
            raise ChatTemplateError(
                f"the chat template wrote a message's text with its marks escaped "
                f"({found.group()!r}: a list's repr, JSON's ensure_ascii, a URL escape), so "
                f"its markup cannot be told from the message; refused rather than guessed")
    return [(c, t) for c, t in out if t]
