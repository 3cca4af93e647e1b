"""Mutants of the tokenizer and its chat template: the metadata a
tokenizer is built from, edited consistently enough to reach the tokenizer's
own checks (a vocabulary one token short or long, a duplicate token, token
types or scores of the wrong length or with a bad entry, special ids at or
past the end, merges naming a token not in the vocabulary, a key deleted),
and ``tokenizer.chat_template`` put in or replaced: hostile templates (the
four of ``known.TEMPLATE_REGRESSIONS`` and more), well-behaved ones, and well-behaved ones with random
edits (which mostly do not compile, or fail while rendering).

Values come from the unmutated base file, read once with ``load_gguf``.
"""
from __future__ import annotations

import struct
from typing import Any

from muser_torch.errors import SplitFileError
from muser_torch.gguf_io import load_gguf

from tests.text.chat_templates import TEMPLATES

from .layout import ARRAY, STRING, Layout

P = "tokenizer.ggml."
TEMPLATE_KEY = "tokenizer.chat_template"
UINT32, INT32, FLOAT32 = 4, 5, 6

HOSTILE_TEMPLATES = {
    "three nested range(99999)": "{% for a in range(99999) %}{% for b in range(99999) %}"
                                 "{% for c in range(99999) %}{% endfor %}{% endfor %}{% endfor %}",
    "'x' * 3000000000": "{{ 'x' * 3000000000 }}",
    "a string doubled 40 times": "{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
                                 "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
    "a macro calling itself": "{% macro f(x) %}{{ f(x ~ 'a') }}{% endmacro %}{{ f('') }}",
    "center(3e9)": "{{ 'x'|center(3000000000) }}",
    "%-width 1e9": "{{ '%999999999s' % messages[0]['content'] }}",
    "format width 1e9": "{{ '{:>999999999}'.format('a') }}",
    "7 ** 1e8": "{{ 7 ** 100000000 }}",
    "list of big strings": "{% set ns = namespace(l=[]) %}{% for i in range(99999) %}"
                           "{% set ns.l = ns.l + ['x' * 9999 ~ i] %}{% endfor %}",
    "caller in a loop": "{% macro f() %}{% for x in range(99999) %}{{ caller() }}{% endfor %}"
                        "{% endmacro %}{% call f() %}{{ 'x' * 100000 }}{% endcall %}",
    "recursive loop": "{% for x in [[1]] recursive %}{{ loop([x]) }}{% endfor %}",
    "sandbox escape": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "raise": "{{ raise_exception('no') }}",
    "syntax error": "{% for m in messages %}{{ m }",
}
_INSERTS = ("{{", "}}", "{%", "%}", "(", ")", "'", '"', "|", "~", " * ", "**", "[", "]",
            "999999999", "loop.", "namespace(", "{% endfor %}", "{% endif %}", "\x00", "é")


def base_metadata(lay: Layout) -> dict[str, Any]:
    cached = getattr(lay, "_base_metadata", None)
    if cached is None:
        try:
            cached = load_gguf(lay.path).metadata
        except SplitFileError:   # a later part of a split model: no tokenizer keys to edit
            cached = {}
        lay._base_metadata = cached
    return cached


def _kv(lay: Layout, key: str):
    return next((kv for kv in lay.kvs if kv.key == key), None)


def _count_field(lay: Layout):
    return next(f for f in lay.fields if f.name == "kv_count")


def set_key(lay: Layout, key: str, vtype: int, value: Any, item_type: int | None = None):
    """(edits, splice) replacing ``key``'s value, or adding the key when absent."""
    kv = _kv(lay, key)
    if kv is not None:
        return [], (kv.start, kv.end, (key, vtype, value, item_type))
    f = _count_field(lay)
    (n,) = struct.unpack_from("<Q", lay.head, f.offset)
    end = lay.kvs[-1].end if lay.kvs else f.offset + f.width
    return [(f.offset, struct.pack("<Q", n + 1), 0)], (end, end, (key, vtype, value, item_type))


def delete_key(lay: Layout, key: str):
    kv = _kv(lay, key)
    f = _count_field(lay)
    (n,) = struct.unpack_from("<Q", lay.head, f.offset)
    return [(f.offset, struct.pack("<Q", n - 1), 0)], (kv.start, kv.end, None)


def vocab_edits(lay: Layout) -> list[tuple[str, str, list, tuple]]:
    """(label, key, edits, splice) of every tokenizer edit this file allows."""
    md = base_metadata(lay)
    tokens = md.get(P + "tokens")
    if not isinstance(tokens, list) or not tokens:
        return []
    n = len(tokens)
    out = []

    def put(label, key, vtype, value, item_type=None):
        out.append((label, key, *set_key(lay, key, vtype, value, item_type)))

    put("one token short", P + "tokens", ARRAY, tokens[:-1], STRING)
    put("one token more (a duplicate)", P + "tokens", ARRAY, tokens + [tokens[-1]], STRING)
    put("a duplicate in place", P + "tokens", ARRAY, tokens[:-1] + [tokens[0]], STRING)
    put("half the tokens", P + "tokens", ARRAY, tokens[: n // 2], STRING)
    put("an empty token", P + "tokens", ARRAY, [""] + tokens[1:], STRING)
    for key, item, bad in ((P + "token_type", INT32, 9), (P + "scores", FLOAT32, float("nan"))):
        values = md.get(key)
        if isinstance(values, list) and values:
            put(f"{key} one short", key, ARRAY, values[:-1], item)
            put(f"{key} one long", key, ARRAY, values + values[-1:], item)
            put(f"{key} bad last entry", key, ARRAY, values[:-1] + [bad], item)
    for name in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id",
                 "eot_token_id"):
        put(f"{name} = vocabulary size", P + name, UINT32, n)
        put(f"{name} = last id", P + name, UINT32, n - 1)
        if P + name in md:
            out.append((f"{name} deleted", P + name, *delete_key(lay, P + name)))
    merges = md.get(P + "merges")
    if isinstance(merges, list):
        put("a merge of an unknown token", P + "merges", ARRAY, merges + [tokens[0] + " \u2603q"],
            STRING)
        put("a malformed merge", P + "merges", ARRAY, ["abc"] + merges, STRING)
    put("an unknown model", P + "model", STRING, "bert")
    return out


def template_variants() -> list[tuple[str, str]]:
    return ([(f"hostile: {k}", v) for k, v in HOSTILE_TEMPLATES.items()]
            + [(f"published style: {k}", v) for k, v in TEMPLATES.items()])


def corrupt_template(rng) -> tuple[str, str]:
    """A well-behaved template with 1-3 random edits."""
    names = sorted(TEMPLATES)
    name = names[int(rng.integers(len(names)))]
    text = TEMPLATES[name]
    for _ in range(int(rng.integers(1, 4))):
        i = int(rng.integers(len(text) + 1))
        j = min(len(text), i + int(rng.integers(1, 40)))
        pick = int(rng.integers(3))
        if pick == 0:
            text = text[:i] + text[j:]                               # delete
        elif pick == 1:
            text = text[:i] + text[i:j] * int(rng.integers(2, 5)) + text[i:]   # repeat
        else:
            text = text[:i] + _INSERTS[int(rng.integers(len(_INSERTS)))] + text[i:]
    return f"edited {name}", text
