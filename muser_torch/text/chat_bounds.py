"""Bounds on one render of a chat template: CPU time, the size of every value
and of the output, the work done in all, and how deep calls nest.

A template is code from the file. The sandbox stops it reaching Python's
internals, but not from looping for ever or building a string of gigabytes.
So the things that blow up are bounded where they happen, before the
memory is taken, not by a timer around a render that has already grown:

- every ``{% for %}`` iterates through the internal filter ``muser_iter`` (the
  template's syntax tree is rewritten before it is compiled), as do a
  recursive loop's ``loop(...)`` calls and the generators filters return:
  each step checks the CPU clock and is counted as work;
- the operators ``+ - * / // % **`` go through ``call_binop``, which works
  out the size of ``'x' * n``, ``n ** m`` or ``'%999999999s' % x`` before
  computing it; ``~`` is rewritten into ``muser_concat``, which measures its
  parts first;
- every call (methods such as ``str.center``, ``str.replace``, ``str.join``,
  ``str.format``; macros; ``caller``) goes through ``call``, with the same
  checks for the methods whose result can outgrow their input, and a depth
  count for calls nested inside calls (a macro calling itself);
- every filter is wrapped: ``center``, ``indent``, ``replace``, ``join``,
  ``format``, ``batch``, ``slice``, ``sum``, ``tojson``, ``string``, ...
  are measured before they run, and every filter's result after;
- every ``{{ ... }}`` output (``finalize``) and every run of literal text
  (a charge put in front of each output node) is counted as it is made.

No value may be larger than ``Budget.chars`` (characters of its text, not
counting ``special``'s marks around a message's text: ``chat_limits.chars``;
items of a list), and everything made in one render (text, items, loop steps)
together at most ``WORK_FACTOR`` times that, which bounds what a render can
hold at once. ``ChatLimits`` holds the settings; ``ChatTemplate.render``
(``chat.py``) turns a stop into a ``ChatTemplateError`` naming the bound.
"""
from __future__ import annotations

import contextvars
import functools
import re
import string
import time
import types
from typing import Any, Iterable, Iterator

from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.runtime import LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.utils import Namespace, generate_lorem_ipsum, pass_context
from jinja2.visitor import NodeTransformer

from .chat_limits import WORK_FACTOR, ChatLimits, chars, text_size

CLOCK_EVERY = 16   # steps between readings of the CPU clock

class BoundExceeded(Exception):
    """A render reached one of its bounds; ``str`` says which."""


class Budget:
    """The running account of one render."""

    def __init__(self, limits: ChatLimits, chars: int) -> None:
        self.limits = limits
        self.chars = chars
        self.work = WORK_FACTOR * chars
        self.made = 0
        self.depth = 0
        self.ticks = 0
        self.deadline = time.thread_time() + limits.seconds
        self.stopped: str | None = None    # kept: the template must not swallow the stop

    def stop(self, why: str) -> None:
        self.stopped = self.stopped or why
        raise BoundExceeded(self.stopped)

    def tick(self) -> None:
        """One step of the render; the CPU clock is read every ``CLOCK_EVERY``
        steps (each step's own work is bounded by the size bound)."""
        if self.stopped:
            raise BoundExceeded(self.stopped)
        self.ticks += 1
        if not self.ticks % CLOCK_EVERY and time.thread_time() > self.deadline:
            self.stop(f"its time bound: more than {self.limits.seconds:g} s of CPU in one render "
                      f"(--chat-template-seconds)")

    def fits(self, n: float, what: str) -> None:
        """Refuse a value of ``n`` characters (or items) before it is made."""
        if n > self.chars:
            self.stop(f"its size bound: {what} would be {int(n):,} characters or items, over "
                      f"the bound of {self.chars:,} (--chat-template-max-chars)")

    def charge(self, n: int) -> None:
        self.made += n
        if self.made > self.work:
            self.stop(f"its work bound: more than {self.work:,} characters, items and loop steps "
                      f"made in one render ({WORK_FACTOR} x the size bound)")

    def made_value(self, v: Any, what: str) -> Any:
        """Check and count a value the template just made: its length (a
        list's items, not their text: that is measured where a value
        becomes text), a generator's steps as they are taken."""
        self.tick()
        if isinstance(v, (str, bytes)):
            n = chars(v)
        elif isinstance(v, (list, tuple, dict, set, frozenset)):
            n = len(v)
        elif isinstance(v, int):
            n = v.bit_length() // 8
        else:
            n = 0
        self.fits(n, what)
        self.charge(n)
        if isinstance(v, (types.GeneratorType, map, filter)):
            return _steps(self, v)
        return v


_BUDGET: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("muser_chat_budget",
                                                                          default=None)


def _steps(budget: Budget, items: Iterable[Any]) -> Iterator[Any]:
    for x in items:
        budget.tick()
        budget.charge(1)
        yield x


# ---- measuring before computing ----------------------------------------------------

_PERCENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")


def _check_percent(b: Budget, fmt: str, args: Any) -> None:
    """``fmt % args``: refuse field widths and precisions over the bound."""
    star = False
    for width, precision in _PERCENT.findall(fmt):
        for n in (width, precision):
            star |= n == "*"
            if n.isdigit():
                b.fits(int(n), "a %-format field")
    if star:
        for a in args if isinstance(args, tuple) else (args,):
            if isinstance(a, int):
                b.fits(abs(a), "a %-format field")
    b.fits(chars(fmt) + text_size(args, stop=b.chars), "a %-formatted string")


def _check_format_spec(b: Budget, fmt: str, args: tuple, kwargs: dict) -> None:
    """``fmt.format(...)``: refuse widths over the bound, nested ones too."""
    nested = False
    for _, _, spec, _ in string.Formatter().parse(fmt):
        if spec:
            nested |= "{" in spec
            for n in re.findall(r"\d+", spec):
                b.fits(int(n), "a format field")
    if nested:
        for a in (*args, *kwargs.values()):
            if isinstance(a, int):
                b.fits(abs(a), "a format field")
    b.fits(chars(fmt) + text_size((args, kwargs), stop=b.chars), "a formatted string")


def _size(v: str | bytes | list | tuple) -> int:
    return chars(v) if isinstance(v, (str, bytes)) else len(v)


def _check_binop(b: Budget, op: str, left: Any, right: Any) -> None:
    seq = (str, bytes, list, tuple)
    if op == "*":
        for n, s in ((left, right), (right, left)):
            if isinstance(n, int) and isinstance(s, seq):
                b.fits(max(n, 0) * _size(s), f"{type(s).__name__} * {n}")
        if isinstance(left, int) and isinstance(right, int):
            b.fits((left.bit_length() + right.bit_length()) // 8, "a product of integers")
    elif op == "+" and isinstance(left, seq) and isinstance(right, seq):
        b.fits(_size(left) + _size(right), f"{type(left).__name__} + {type(right).__name__}")
    elif op == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 \
            and abs(left) > 1:
        b.fits(min(right, 8 * b.chars + 1) * left.bit_length() // 8, "a power of an integer")
    elif op == "%" and isinstance(left, str):
        _check_percent(b, left, right)


def _arg(args: tuple, kwargs: dict, i: int, name: str, default: Any) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def _check_str_method(b: Budget, s: str | bytes, name: str, args: tuple, kwargs: dict) -> None:
    if name in ("center", "ljust", "rjust", "zfill"):
        width = _arg(args, kwargs, 0, "width", 0)
        if isinstance(width, int):
            b.fits(width, f"str.{name}({width})")
    elif name == "expandtabs":
        tab = _arg(args, kwargs, 0, "tabsize", 8)
        if isinstance(tab, int):
            b.fits(chars(s) + s.count("\t" if isinstance(s, str) else b"\t") * max(tab, 0),
                   f"str.expandtabs({tab})")
    elif name == "replace":
        old, new = _arg(args, kwargs, 0, "old", ""), _arg(args, kwargs, 1, "new", "")
        if isinstance(old, type(s)) and isinstance(new, type(s)):
            count = _arg(args, kwargs, 2, "count", -1)
            hits = len(s) + 1 if not old else s.count(old)
            if isinstance(count, int) and count >= 0:
                hits = min(hits, count)
            b.fits(chars(s) + hits * (len(new) - len(old)), "str.replace(...)")


# ---- filters ----------------------------------------------------------------------

def _bounded_filter(name: str, f: Any) -> Any:
    skip = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(f)
    def run(*args: Any, **kwargs: Any) -> Any:
        b = _BUDGET.get()
        if b is None or len(args) <= skip:
            return f(*args, **kwargs)
        b.tick()
        value, rest = args[skip], args[skip + 1:]
        if name in ("join", "sum", "unique", "list") and not isinstance(
                value, (str, bytes, list, tuple, dict)):
            value = list(_steps(b, value))     # a generator: its items, counted
            args = args[:skip] + (value,) + rest
        _check_filter(b, name, value, rest, kwargs)
        return b.made_value(f(*args, **kwargs), f"the result of |{name}")

    return run


# Filters that turn a whole value into text: their input is measured first.
_TEXT_OF_VALUE = frozenset({"string", "pprint", "tojson", "join", "urlize", "xmlattr", "sum",
                            "format", "wordwrap", "indent", "center", "replace"})


def _check_filter(b: Budget, name: str, value: Any, rest: tuple, kw: dict) -> None:
    if isinstance(value, (str, bytes)):
        size = chars(value)
    elif name in _TEXT_OF_VALUE:
        size = text_size(value, stop=b.chars)
    else:
        size = 0    # |length, |selectattr, ...: nothing larger than their input
    b.fits(size, f"the input of |{name}")
    if name == "center":
        width = _arg(rest, kw, 0, "width", 80)
        if isinstance(width, int):
            b.fits(width, f"|center({width})")
    elif name == "indent":
        width = _arg(rest, kw, 0, "width", 4)
        per = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        lines = value.count("\n") + 1 if isinstance(value, str) else 1
        b.fits(size + lines * max(per, 0), f"|indent({per})")
    elif name in ("batch", "slice"):
        n = _arg(rest, kw, 0, "linecount" if name == "batch" else "slices", 1)
        if isinstance(n, int):
            b.fits(n, f"|{name}({n})")
    elif name == "replace" and isinstance(value, str):
        _check_str_method(b, value, "replace", rest, kw)
    elif name == "format" and isinstance(value, str):
        _check_percent(b, value, rest or kw)
    elif name == "wordwrap":
        wrap = _arg(rest, kw, 3, "wrapstring", None)
        if isinstance(wrap, str):
            b.fits(size * (1 + len(wrap)), "|wordwrap(...)")
    elif name == "join":
        sep = _arg(rest, kw, 0, "d", "")
        items = len(value) if hasattr(value, "__len__") else 0
        b.fits(size + items * (len(sep) if isinstance(sep, str) else 0), "|join(...)")
    elif name == "tojson":
        indent = _arg(rest, kw, 1, "indent", None)
        per = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
        b.fits(size * (1 + max(per, 0)), f"|tojson(indent={per})")
    elif name == "sum":
        start = _arg(rest, kw, 1, "start", 0)
        if not isinstance(start, (int, float)):
            b.fits(size + text_size(start, stop=b.chars), "|sum(...)")


# ---- the syntax-tree rewrite ------------------------------------------------------

def _internal(name: str, args: list, lineno: int) -> nodes.Filter:
    """``args[0] | name(*args[1:])``: an internal filter (filters are called
    directly, not through ``call``; they take the context, so jinja2 never
    runs them while compiling)."""
    return nodes.Filter(args[0], name, args[1:], [], None, None).set_lineno(lineno)


class _Rewrite(NodeTransformer):
    """Loops through ``muser_iter``, ``~`` through ``muser_concat``, and a
    ``muser_charge`` of its literal text in front of each output node."""

    def __init__(self, env: "BoundedSandbox") -> None:
        self.eval_ctx = nodes.EvalContext(env)

    def visit_For(self, node: nodes.For) -> nodes.For:
        node = self.generic_visit(node)
        node.iter = _internal("muser_iter", [node.iter], node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Call:
        node = self.generic_visit(node)
        return _internal("muser_concat", [nodes.List(list(node.nodes))], node.lineno)

    def visit_Output(self, node: nodes.Output) -> nodes.Output:
        node = self.generic_visit(node)
        literal = 0
        for child in node.nodes:
            try:
                literal += len(str(child.as_const(self.eval_ctx)))
            except Exception:  # noqa: BLE001  (not a constant: counted when it runs)
                pass
        if literal:
            node.nodes.insert(0, _internal("muser_charge", [nodes.Const(literal)], node.lineno))
        return node


class GenerationBlock(Extension):
    """``{% generation %}...{% endgeneration %}``, which transformers' templates
    use to mark the assistant's part: rendered as its body."""
    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


class ChatNamespace(Namespace):
    """``namespace()`` that refuses attribute names starting with "_" (as
    transformers' does), which the sandbox would not let a template read."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805  (Namespace's own signature)
        self, args = args[0], args[1:]
        Namespace.__init__(self, *args, **kwargs)
        for name in object.__getattribute__(self, "_Namespace__attrs"):
            ChatNamespace._check(name)

    def __setitem__(self, name: str, value: Any) -> None:
        ChatNamespace._check(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a namespace attribute may not start with '_': {name!r}")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox with every hook above; renders only inside
    ``bounded(...)``, which sets the render's budget."""
    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

    def __init__(self, **options: Any) -> None:
        super().__init__(finalize=self._finalize, **options)
        self.concat = self._concat
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}
        self.globals["namespace"] = ChatNamespace
        self.filters.update(muser_iter=_iter_filter, muser_concat=_concat_filter,
                            muser_charge=_charge_filter)

    def parse_bounded(self, source: str) -> nodes.Template:
        tree = _Rewrite(self).visit(self.parse(source))
        tree.set_environment(self)
        return tree

    def set_filter(self, name: str, f: Any) -> None:
        self.filters[name] = _bounded_filter(name, f)

    # -- the hooks the compiled template calls --
    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        b = _budget()
        b.tick()
        _check_binop(b, operator, left, right)
        return b.made_value(self.binop_table[operator](left, right), f"the result of {operator}")

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        b = _budget()
        b.tick()
        target = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        if isinstance(target, (str, bytes)):
            _check_str_method(b, target, name, args, kwargs)
            if name == "join" and args:
                items = list(_steps(b, args[0]))
                b.fits(text_size(items, stop=b.chars) + len(items) * len(target), "str.join(...)")
                args = (items,) + args[1:]
        elif __obj is generate_lorem_ipsum:
            n, most = _arg(args, kwargs, 0, "n", 5), _arg(args, kwargs, 3, "max", 100)
            if isinstance(n, int) and isinstance(most, int):
                b.fits(n * most * 12, "lipsum(...)")
        elif isinstance(__obj, LoopContext) and args:
            args = (_steps(b, args[0]),) + args[1:]     # a recursive loop's next level
        b.depth += 1
        try:
            if b.depth > b.limits.max_depth:
                what = "macro" if isinstance(__obj, Macro) else "call"
                b.stop(f"its recursion bound: {what}s nested more than {b.limits.max_depth} "
                       f"deep")
            result = super().call(__context, __obj, *args, **kwargs)
        finally:
            b.depth -= 1
        return b.made_value(result, f"the result of {name or 'a call'}")

    def wrap_str_format(self, value: Any) -> Any:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt, is_map = value.__self__, value.__name__ == "format_map"

        @functools.wraps(wrapped)
        def checked(*args: Any, **kwargs: Any) -> str:
            b = _budget()
            _check_format_spec(b, fmt, args if not is_map else (), args[0] if is_map and args
                               and isinstance(args[0], dict) else kwargs)
            return wrapped(*args, **kwargs)

        return checked

    def _finalize(self, value: Any) -> Any:
        b = _BUDGET.get()
        if b is not None:    # None: a constant folded while compiling (literal text)
            n = chars(value) if type(value) is str else text_size(value, stop=b.chars)
            b.fits(n, "an output")
            b.charge(n)
        return value

    def _concat(self, pieces: Iterable[str]) -> str:
        pieces = list(pieces)
        b = _BUDGET.get()
        if b is not None:
            b.fits(sum(map(chars, pieces)), "a block's output")
        return "".join(pieces)


@pass_context
def _iter_filter(context: Any, items: Any) -> Iterator[Any]:
    return _steps(_budget(), items)


@pass_context
def _concat_filter(context: Any, parts: list) -> str:
    b = _budget()
    b.tick()
    b.fits(sum(text_size(p, stop=b.chars) for p in parts), "a ~ concatenation")
    return b.made_value("".join(map(str, parts)), "a ~ concatenation")


@pass_context
def _charge_filter(context: Any, n: int) -> str:
    b = _budget()
    b.tick()
    b.charge(n)
    return ""


def _budget() -> Budget:
    b = _BUDGET.get()
    if b is None:
        raise BoundExceeded("no render budget is set (render through ChatTemplate.render)")
    return b


def bounded(budget: Budget, pieces: Iterable[str]) -> str:
    """Join a render's output under ``budget``; BoundExceeded at a bound."""
    token = _BUDGET.set(budget)
    try:
        out, size = [], 0
        for piece in pieces:
            size += chars(piece)
            budget.fits(size, "the output")
            out.append(piece)
        if budget.stopped:
            raise BoundExceeded(budget.stopped)
        return "".join(out)
    finally:
        _BUDGET.reset(token)


def with_budget(budget: Budget, f: Any, *args: Any) -> Any:
    """``f(*args)`` with ``budget`` as the current render's."""
    token = _BUDGET.set(budget)
    try:
        return f(*args)
    finally:
        _BUDGET.reset(token)
