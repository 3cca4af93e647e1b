"""Lexing for the Metal emulator's source pass: refusals on the raw source
(``check_source``), the tokens of a g++ -E translation unit's user regions,
and bracket helpers. See ``msl_source`` for the rewrite that uses them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["FLOAT_LITERAL", "MetalCompileError", "MetalEmulatorError", "Tok", "attributes", "check_source", "closing",
           "join_text", "split_commas", "tokens"]


class MetalEmulatorError(RuntimeError):
    """A kernel broke a Metal rule the emulator checks (divergence, bounds, limits, binding)."""


class MetalCompileError(MetalEmulatorError, SyntaxError):
    """The source does not compile, or uses what Metal or the emulator does not support
    (the message names it and the line). A SyntaxError, as compile_shader raises."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


# ------------------------------------------------------------------ raw source checks
def _strip_comments(src: str) -> str:
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * src.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            out.append(src[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def check_source(src: str, ascii_only: bool = True) -> None:
    """Refuse what compile_shader (``ascii_only``) or Metal would refuse, or the emulator cannot model."""
    for lineno, line in enumerate(src.split("\n"), 1):
        bad = next((c for c in line if ord(c) > 127), None) if ascii_only else None
        if bad is not None:
            raise MetalCompileError(f"line {lineno}: non-ASCII character {bad!r}; PyTorch passes the source to Metal "
                              f"with ASCII encoding, so it would not compile on a Mac")
    body = _strip_comments(src)
    for lineno, line in enumerate(body.split("\n"), 1):
        s = line.strip()
        safe = re.search(r"math_mode\(\s*safe\s*\)|contract\(\s*off\s*\)", s)
        if re.match(r"#\s*pragma\s+METAL\s+fp\b", s) and not safe:
            raise MetalCompileError(f"line {lineno}: {s!r}: the emulator models safe math only")
        if re.search(r"\bdouble\b", line) and not s.startswith("#"):
            raise MetalCompileError(f"line {lineno}: double is not supported by Metal: {s}")


# ------------------------------------------------------------------ tokens
_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r\f\v]+|\n)
  | (?P<num>\.?\d(?:[eEpP][+-]|[\w.'])*)
  | (?P<id>[A-Za-z_]\w*)
  | (?P<str>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
  | (?P<op>\.\.\.|::|->|<<=|>>=|<<|>>|<=|>=|==|!=|&&|\|\||\+\+|--|[-+*/%&|^~!=<>?:;,.(){}\[\]#@$\\])
""", re.X)
_MARKER = re.compile(r'#\s*(\d+)\s+"((?:\\.|[^"\\])*)"([ \d]*)')
# An unsuffixed floating literal: hex with an exponent, decimal with a point, or with an exponent.
FLOAT_LITERAL = re.compile(r"(?:0[xX][\da-fA-F.']*[pP][+-]?\d+"
                           r"|(?:\d[\d']*\.[\d']*|\.\d[\d']*)(?:[eE][+-]?\d+)?"
                           r"|\d[\d']*[eE][+-]?\d+)$")


@dataclass
class Tok:
    kind: str
    text: str
    start: int
    end: int
    line: int
    file: str


def tokens(ii: str) -> list[Tok]:
    """Tokens of the user regions of a g++ -E translation unit (system regions skipped)."""
    toks: list[Tok] = []
    pos, n = 0, len(ii)
    file, line, system = "<source>", 1, False
    at_line_start = True
    while pos < n:
        if at_line_start and ii.startswith("#", pos):
            end = ii.find("\n", pos)
            end = n if end < 0 else end
            m = _MARKER.match(ii, pos, end)
            if m:
                line, file = int(m.group(1)), m.group(2)
                system = "3" in m.group(3).split() or file.startswith("<")
            else:
                line += 1       # #pragma and the like
            pos = end + 1
            continue
        if system:
            end = ii.find("\n#", pos)
            pos = n if end < 0 else end + 1
            at_line_start = True
            continue
        m = _TOKEN.match(ii, pos)
        if not m:
            raise MetalCompileError(f"{file}:{line}: cannot read {ii[pos:pos + 20]!r}")
        kind = m.lastgroup
        if kind == "ws":
            if m.group() == "\n":
                line += 1
                at_line_start = True
            pos = m.end()
            continue
        at_line_start = False
        toks.append(Tok(kind, m.group(), m.start(), m.end(), line, file))
        pos = m.end()
    return toks


def closing(toks: list[Tok], i: int) -> int:
    """Index of the bracket closing the one at i."""
    pairs = {"(": ")", "[": "]", "{": "}", "<": ">"}
    open_, close = toks[i].text, pairs[toks[i].text]
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j].text
        if t == open_:
            depth += 1
        elif t == close or (open_ == "<" and t == ">>"):
            depth -= 2 if t == ">>" else 1
            if depth <= 0:
                return j
        elif open_ == "<" and t in (";", "{"):
            break
    raise MetalCompileError(f"{toks[i].file}:{toks[i].line}: unbalanced {open_!r}")


def split_commas(toks: list[Tok], lo: int, hi: int) -> list[tuple[int, int]]:
    parts, depth, start = [], 0, lo
    for j in range(lo, hi):
        t = toks[j].text
        if t in "([{<":
            depth += 1
        elif t in ")]}>":
            depth -= 1
        elif t == ">>":
            depth -= 2
        elif t == "," and depth == 0:
            parts.append((start, j))
            start = j + 1
    if start < hi:
        parts.append((start, hi))
    return parts


def join_text(toks: list[Tok], lo: int, hi: int) -> str:
    return " ".join(t.text for t in toks[lo:hi])


def attributes(toks: list[Tok], lo: int, hi: int) -> tuple[list[str], list[int]]:
    """The [[...]] attributes in toks[lo:hi] and the indices of tokens outside them."""
    attrs, keep, j = [], [], lo
    while j < hi:
        if toks[j].text == "[" and j + 1 < hi and toks[j + 1].text == "[":
            k = closing(toks, j)
            attrs.append(join_text(toks, j + 2, k - 1).replace(" ", ""))
            j = k + 1
        else:
            keep.append(j)
            j += 1
    return attrs, keep
