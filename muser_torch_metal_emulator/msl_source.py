"""Read and rewrite Metal Shading Language source for the CPU emulator.

``check_source`` refuses, before anything is compiled, what PyTorch or Metal
would refuse and what the emulator cannot model. ``rewrite`` takes the
translation unit that ``g++ -E`` made of the source with the shim
force-included and returns it as C++, with every kernel found:

- address-space qualifiers go (``constant`` becomes ``const``): the shim has
  one address space;
- ``threadgroup T name[n];`` inside a function becomes a reference to one
  allocation per threadgroup (``emu_tg``), shared by the lanes;
- unsuffixed floating literals get ``f``: Metal has no double;
- ``kernel`` functions (plain, and template instantiations named with
  ``[[host_name(...)]]``) are parsed for their parameters: attributes, or,
  without attributes, buffer indices in declaration order as Metal assigns
  them;
- ``constant T name [[function_constant(i)]];`` goes, and every later use of
  ``name`` reads the value the dispatch set for index i
  (``emu_function_constant<T>``); ``is_function_constant_defined(name)``
  asks whether one was set;
- with ``only``, explicit instantiations of kernels outside it are dropped
  (g++ then never instantiates them), and asking for a kernel the source
  lacks is an error.

Only the user's part is rewritten: regions of the translation unit that
come from system headers (the shim is included as one) are copied as they are.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .msl_lex import (FLOAT_LITERAL, MetalCompileError, MetalEmulatorError, Tok, attributes, check_source, closing,
                      join_text, split_commas, tokens)

__all__ = ["BUILTINS", "Kernel", "MetalCompileError", "MetalEmulatorError", "Param", "check_source", "rewrite"]


# Builtin attribute -> id in shim_runtime.h's EmuBuiltin.
BUILTINS = {
    "thread_position_in_grid": 0, "threadgroup_position_in_grid": 1, "thread_position_in_threadgroup": 2,
    "thread_index_in_threadgroup": 3, "thread_index_in_simdgroup": 4, "simdgroup_index_in_threadgroup": 5,
    "threads_per_threadgroup": 6, "dispatch_threads_per_threadgroup": 7, "threadgroups_per_grid": 8,
    "threads_per_grid": 9, "threads_per_simdgroup": 10, "thread_execution_width": 10,
    "simdgroups_per_threadgroup": 11, "dispatch_simdgroups_per_threadgroup": 12,
    "thread_index_in_quadgroup": 13, "quadgroup_index_in_threadgroup": 14, "quadgroups_per_threadgroup": 15,
    "grid_origin": 16, "grid_size": 9,
}
_ADDRESS_SPACES = {"device": "", "constant": "const", "thread": "", "threadgroup": ""}
_UNSUPPORTED_WORDS = {
    "threadgroup_imageblock": "imageblocks", "ray_data": "ray tracing payloads", "object_data": "mesh shaders",
    "imageblock": "imageblocks", "visible_function_table": "function tables",
    "intersection_function_table": "function tables", "acceleration_structure": "ray tracing",
}
_TEXTURES = re.compile(r"(texture|depth)(1d|2d|3d|cube|_buffer)\w*$")
_UNSUPPORTED_ATTRS = {"texture": "textures", "sampler": "samplers", "stage_in": "stage_in inputs",
                      "function_constant": "function constants as parameters", "color": "render targets",
                      "payload": "mesh payloads", "imageblock_data": "imageblocks"}


@dataclass(frozen=True)
class Param:
    name: str
    decl: str               # as written, without attributes
    kind: str               # "buffer" | "builtin" | "threadgroup"
    index: int              # buffer / threadgroup index, or the builtin's id
    builtin: str | None = None


@dataclass
class Kernel:
    host_name: str          # the name the library exposes
    call: str               # C++ expression naming the function (qualified, with template arguments)
    params: list[Param]
    line: int
    file: str
    max_threads: int | None = None   # [[max_total_threads_per_threadgroup(n)]]


# ------------------------------------------------------------------ the rewrite
@dataclass
class _State:
    toks: list[Tok]
    edits: list[tuple[int, int, str]] = field(default_factory=list)
    kernels: list[Kernel] = field(default_factory=list)
    templates: dict[str, list[Param]] = field(default_factory=dict)
    pending: list[tuple[str, str, str, int, str, int | None, tuple[int, int]]] = field(default_factory=list)
    constants: dict[str, tuple[str, str]] = field(default_factory=dict)   # name -> (C++ type, index expression)
    only: frozenset[str] | None = None

    def fail(self, i: int, msg: str):
        t = self.toks[i]
        raise MetalCompileError(f"{t.file}:{t.line}: {msg}")

    def replace(self, i: int, j: int, text: str) -> None:
        """Replace tokens i..j (inclusive)."""
        self.edits.append((self.toks[i].start, self.toks[j].end, text))


def rewrite(ii: str, only: frozenset[str] | None = None) -> tuple[str, list[Kernel]]:
    """(C++ source, kernels) from a preprocessed translation unit; see the module docstring."""
    st = _State(tokens(ii), only=only)
    toks = st.toks
    scopes: list[tuple[str, str]] = []   # ("code" | "init" | "struct" | "namespace", name)
    i = 0
    while i < len(toks):
        t = toks[i]
        prev = toks[i - 1].text if i else ";"
        inner = scopes[-1][0] if scopes else "namespace"
        if t.kind == "num" and FLOAT_LITERAL.match(t.text):
            st.replace(i, i, t.text + "f")
        elif t.kind == "id":
            if t.text in _UNSUPPORTED_WORDS:
                st.fail(i, f"{t.text}: {_UNSUPPORTED_WORDS[t.text]} are not supported by the Metal emulator")
            if _TEXTURES.match(t.text) and i + 1 < len(toks) and toks[i + 1].text == "<":
                st.fail(i, f"{t.text}: textures are not supported by the Metal emulator")
            if t.text == "sampler" and i + 1 < len(toks) and toks[i + 1].kind == "id":
                st.fail(i, "sampler: samplers are not supported by the Metal emulator")
            if t.text == "kernel" and inner in ("namespace", "struct") and prev != "::":
                _kernel(st, i, scopes)
                st.replace(i, i, "")
                i += 1
                continue
            if t.text == "threadgroup" and inner == "code" and prev in (";", "{", "}", ":"):
                i = _threadgroup_decl(st, i)
                continue
            if t.text == "constant" and inner == "namespace" and prev in (";", "{", "}"):
                end = _function_constant(st, i)
                if end is not None:
                    i = end + 1
                    continue
            if t.text in st.constants and prev not in (".", "->", "::"):
                ctype, index = st.constants[t.text]
                # A leading space: `a%::f` would lex as the digraph `%:`.
                st.replace(i, i, f' ::emu_function_constant<{ctype}>(({index}), "{t.text}")')
                i += 1
                continue
            if t.text == "is_function_constant_defined" and i + 3 < len(toks) and toks[i + 1].text == "(":
                close = closing(toks, i + 1)
                name = join_text(toks, i + 2, close)
                if name not in st.constants:
                    st.fail(i, f"is_function_constant_defined({name}): {name} is not a function constant")
                st.replace(i, close, f" ::emu_function_constant_defined(({st.constants[name][1]}))")
                i = close + 1
                continue
            if t.text == "threadgroup" and inner == "namespace" and prev in (";", "{", "}"):
                st.fail(i, "threadgroup variables can only be declared inside a function")
            if t.text in _ADDRESS_SPACES:
                sub = _ADDRESS_SPACES[t.text]
                if sub == "const" and _has_const(toks, i):
                    sub = ""            # `const constant T&`: one const
                st.replace(i, i, sub)
        elif t.text == "[" and i + 1 < len(toks) and toks[i + 1].text == "[":
            k = closing(toks, i)
            name = toks[i + 2].text if i + 2 < k else ""
            if name == "kernel" and inner in ("namespace", "struct"):
                _kernel(st, i, scopes)
            i = k + 1
            continue
        elif t.text == "=" and inner == "code" and _range_designator(st, i):
            i = closing(toks, i + 1) + 1
            continue
        elif t.text == "{":
            scopes.append(_scope_of(toks, i, inner))
        elif t.text == "}":
            if scopes:
                scopes.pop()
        i += 1
    _instantiate_pending(st)
    out, last = [], 0
    for a, b, text in sorted(st.edits):
        out.append(ii[last:a])
        out.append(text)
        last = b
    out.append(ii[last:])
    return "".join(out), st.kernels


def _function_constant(st: _State, i: int) -> int | None:
    """`constant T name [[function_constant(i)]];` at toks[i]: recorded and removed (index of its `;`),
    or None when the declaration is not a function constant."""
    toks = st.toks
    j = i
    while j < len(toks) and toks[j].text not in (";", "{", "="):
        j += 1
    if j >= len(toks) or toks[j].text != ";":
        return None
    attrs, keep = attributes(toks, i + 1, j)
    fc = [a for a in attrs if a.startswith("function_constant(")]
    if not fc:
        return None
    words = [toks[k].text for k in keep]
    if len(words) < 2 or not re.match(r"[A-Za-z_]\w*$", words[-1]) or "," in words:
        st.fail(i, f"cannot read the function constant declaration {join_text(toks, i, j + 1)!r}")
    ctype = " ".join(w for w in words[:-1] if w != "const")
    index = fc[0][len("function_constant("):-1]
    st.constants[words[-1]] = (ctype, index)
    st.replace(i, j, f"/* function constant {words[-1]} */")
    return j


def _range_designator(st: _State, i: int) -> bool:
    """`name[n] = { [lo ... hi] = v };` at the `=` toks[i]: rewritten to a fill (shim_runtime.h's
    emu_fill_range); False when the initializer is not one range designator."""
    toks = st.toks
    if i + 3 >= len(toks) or toks[i + 1].text != "{" or toks[i + 2].text != "[":
        return False
    close = closing(toks, i + 1)
    br = closing(toks, i + 2)
    dots = next((k for k in range(i + 3, br) if toks[k].text == "..."), None)
    if dots is None or toks[br + 1].text != "=" or close + 1 >= len(toks) or toks[close + 1].text != ";":
        return False
    j = i - 1                      # back over the declarator's [n] groups to its name
    while toks[j].text == "]":
        j = _opening(toks, j) - 1
    if toks[j].kind != "id":
        st.fail(i, "cannot read the declaration with a range designator")
    lo, hi = join_text(toks, i + 3, dots), join_text(toks, dots + 1, br)
    value = join_text(toks, br + 2, close)
    st.replace(i, close, f"; ::emu_fill_range({toks[j].text}, ({lo}), ({hi}), ({value}))")
    return True


def _opening(toks: list[Tok], j: int) -> int:
    """Index of the `[` that the `]` at toks[j] closes."""
    depth = 0
    for k in range(j, -1, -1):
        depth += toks[k].text == "]"
        depth -= toks[k].text == "["
        if depth == 0:
            return k
    raise MetalCompileError(f"{toks[j].file}:{toks[j].line}: unbalanced ']'")


def _has_const(toks: list[Tok], i: int) -> bool:
    """Whether the declaration specifiers around toks[i] already say const."""
    for step, stops in ((-1, {";", ",", "(", ")", "{", "}", "=", "*", "&", "<", ">"}),
                        (1, {";", ",", "(", ")", "{", "}", "=", "*", "&", "[", "<", ">"})):
        j = i + step
        while 0 <= j < len(toks) and toks[j].text not in stops:
            if toks[j].text == "const":
                return True
            j += step
    return False


def _scope_of(toks: list[Tok], i: int, inner: str) -> tuple[str, str]:
    """What the brace at toks[i] opens."""
    prev = toks[i - 1].text if i else ";"
    # Walk back to the start of the statement that owns the brace.
    j = i - 1
    while j >= 0 and toks[j].text not in (";", "{", "}"):
        j -= 1
    head = [t.text for t in toks[j + 1:i]]
    if head[:1] == ["namespace"] or (head[:2] == ["inline", "namespace"]):
        return "namespace", next((h for h in head[1:] if re.match(r"[A-Za-z_]\w*$", h) and h != "namespace"), "")
    if prev in (")", "const", "noexcept", "override", "else", "do", "try", "mutable", "]") or \
            (inner == "code" and prev in (";", "{", "}", ":")):
        return "code", ""
    if prev in ("=", ",", "(", "return", "[", "?", ":") or inner in ("code", "init"):
        return "init", ""
    if any(h in ("struct", "class", "union", "enum") for h in head):
        return "struct", ""
    if head[:2] == ["extern", '"C"'] or head[:2] == ["extern", '"C++"']:
        return "namespace", ""
    return "init", ""


def _threadgroup_decl(st: _State, i: int) -> int:
    """`threadgroup T a[n], b;` at statement start in a function: shared allocations.
    A pointer or reference declared with the qualifier keeps only the qualifier's removal."""
    toks = st.toks
    j, depth = i + 1, 0
    while j < len(toks) and not (toks[j].text == ";" and depth == 0):
        depth += toks[j].text in "([{"
        depth -= toks[j].text in ")]}"
        j += 1
    if j >= len(toks):
        st.fail(i, "unterminated threadgroup declaration")
    parts = split_commas(toks, i + 1, j)
    first = [toks[k].text for k in range(*parts[0])]
    first = first[:first.index("[")] if "[" in first else first
    if "*" in first or "&" in first or "&&" in first:
        st.replace(i, i, "")           # a pointer to threadgroup memory, itself a local variable
        return i + 1
    if any(toks[k].text == "=" for a, b in parts for k in range(a, b)):
        st.fail(i, "threadgroup variables cannot be initialized where they are declared (Metal)")
    # The first declarator: type tokens, then the name, then [dims].
    a, b = parts[0]
    bracket = next((k for k in range(a, b) if toks[k].text == "["), b)
    name_at = bracket - 1
    if toks[name_at].kind != "id" or name_at <= a:
        st.fail(i, f"cannot read the threadgroup declaration {join_text(toks, i, j + 1)!r}")
    type_text = " ".join(_ADDRESS_SPACES.get(t.text, t.text) for t in toks[a:name_at])
    decls = [(toks[name_at].text, join_text(toks, bracket, b))]
    for a2, b2 in parts[1:]:
        br = next((k for k in range(a2, b2) if toks[k].text == "["), b2)
        if br - a2 != 1 or toks[a2].kind != "id":
            st.fail(a2, f"cannot read the threadgroup declarator {join_text(toks, a2, b2)!r}")
        decls.append((toks[a2].text, join_text(toks, br, b2)))
    t = toks[i]
    file = t.file.replace("\\", "\\\\").replace('"', '\\"')
    out = " ".join(f'auto& {name} = emu_tg<{type_text} {dims}>("{name}", "{file}", {t.line});'
                   for name, dims in decls)
    st.replace(i, j, out)
    return j + 1


def _namespace_prefix(scopes: list[tuple[str, str]]) -> str:
    names = [n for kind, n in scopes if kind == "namespace"]
    if any(n == "" for n in names):
        return ""   # anonymous namespace: visible unqualified in this translation unit
    return "::" + "".join(n + "::" for n in names)


def _kernel(st: _State, i: int, scopes) -> None:
    """Record the kernel whose declaration contains toks[i] (`kernel` or `[[kernel]]`):
    a definition, or an explicit instantiation of a kernel template."""
    toks = st.toks
    s = i - 1                     # the statement's start: back to the previous ; { }
    while s >= 0 and toks[s].text not in (";", "{", "}"):
        s -= 1
    s += 1
    # Find the function name: the identifier before `(` or `<...>(` or `<...>;` at depth 0.
    j, name_at, targs, paren = i, None, "", None
    while j < len(toks):
        tx = toks[j].text
        if tx == "[" and j + 1 < len(toks) and toks[j + 1].text == "[":
            j = closing(toks, j) + 1
            continue
        if tx == "decltype":                     # [[kernel]] decltype(f<T>) f<T>;
            j = closing(toks, j + 1) + 1
            continue
        if tx == "(":
            paren = j
            name_at = j - 1
            break
        if tx == "<" and toks[j - 1].kind == "id" and toks[j - 1].text not in ("template",):
            k = closing(toks, j)
            if k + 1 < len(toks) and toks[k + 1].text in ("(", ";"):
                name_at, targs = j - 1, join_text(toks, j, k + 1)
                paren = k + 1 if toks[k + 1].text == "(" else None
                j = k + 1
                break
            j = k + 1
            continue
        if tx in (";", "{"):
            break
        j += 1
    if name_at is None or toks[name_at].kind != "id":
        st.fail(i, "cannot read this kernel declaration")
    name = toks[name_at].text
    head = [t.text for t in toks[s:i]]
    attrs, _ = attributes(toks, s, name_at)
    # host_name("a" "b"): adjacent string literals concatenate (llama.cpp builds names in macros).
    host = next(("".join(re.findall(r'"((?:\\.|[^"\\])*)"', a[len("host_name("):-1]))
                 for a in attrs if a.startswith("host_name(")), None)
    max_threads = next((int(re.search(r"\d+", a).group()) for a in attrs
                        if a.startswith("max_total_threads_per_threadgroup(")), None)
    if paren is None:           # template [[host_name("x")]] kernel kernel_t name<T>;
        end = j
        while toks[end].text != ";":
            end += 1
        body = None
    else:
        close = closing(toks, paren)
        end = close + 1
        while end < len(toks) and toks[end].text not in (";", "{"):
            if toks[end].text == "[" and toks[end + 1].text == "[":
                k = closing(toks, end)
                a = join_text(toks, end + 2, k - 1).replace(" ", "")
                if a.startswith("max_total_threads_per_threadgroup("):
                    max_threads = int(re.search(r"\d+", a).group())
                end = k + 1
                continue
            end += 1
        body = toks[end].text == "{" if end < len(toks) else False
    t = toks[name_at]
    is_template = "template" in head and "<" in head[head.index("template"):head.index("template") + 2]
    is_instance = "template" in head and not is_template
    qual = _namespace_prefix(scopes)
    if is_template:
        if body:
            st.templates[name] = _params(st, paren, closing(toks, paren))
    elif is_instance:
        if not host:
            st.fail(i, f"explicit instantiation of kernel {name} needs [[host_name(\"...\")]]")
        st.pending.append((host, name, qual + name + targs, t.line, t.file, max_threads, (s, end)))
    elif body and (st.only is None or (host or name) in st.only):
        st.kernels.append(Kernel(host or name, qual + name, _params(st, paren, closing(toks, paren)),
                                 t.line, t.file, max_threads))


def _instantiate_pending(st: _State) -> None:
    for host, name, call, line, file, max_threads, (lo, hi) in st.pending:
        if st.only is not None and host not in st.only:
            # Not asked for: drop the instantiation, and the edits inside it.
            a, b = st.toks[lo].start, st.toks[hi].end
            st.edits = [e for e in st.edits if not (a <= e[0] and e[1] <= b)]
            st.replace(lo, hi, f"/* {host}: not built */")
            continue
        if name not in st.templates:
            raise MetalCompileError(f"{file}:{line}: {host} instantiates {name}, whose template definition the "
                              f"emulator did not find")
        st.kernels.append(Kernel(host, call, st.templates[name], line, file, max_threads))
    if st.only is not None:
        missing = sorted(st.only - {k.host_name for k in st.kernels})
        if missing:
            raise MetalCompileError(f"the source defines no kernel named {', '.join(missing)}")
    seen: dict[str, Kernel] = {}
    for k in st.kernels:
        if k.host_name in seen:
            raise MetalCompileError(f"{k.file}:{k.line}: a second kernel named {k.host_name!r}")
        seen[k.host_name] = k


def _params(st: _State, lo: int, hi: int) -> list[Param]:
    """Parameters between the parentheses at lo and hi, with Metal's index assignment."""
    toks = st.toks
    raw = []
    for a, b in split_commas(toks, lo + 1, hi):
        attrs, keep = attributes(toks, a, b)
        words = [toks[k].text for k in keep]
        if words == ["void"] or not words:
            continue
        name = next((w for w in reversed(words) if re.match(r"[A-Za-z_]\w*$", w)), "")
        decl = " ".join(words)
        space = next((w for w in words if w in _ADDRESS_SPACES), None)
        raw.append((a, name, decl, attrs, space))
    params: list[Param | None] = []
    auto = {"buffer": [], "threadgroup": []}
    explicit = {"buffer": 0, "threadgroup": 0}
    for a, name, decl, attrs, space in raw:
        kind = index = builtin = None
        for at in attrs:
            base = at.split("(")[0]
            if base in ("buffer", "threadgroup"):
                kind, index = base, int(re.search(r"\d+", at).group())
                explicit[base] += 1
            elif base in BUILTINS:
                kind, index, builtin = "builtin", BUILTINS[base], base
            elif base in _UNSUPPORTED_ATTRS:
                st.fail(a, f"parameter {decl!r}: [[{at}]]: {_UNSUPPORTED_ATTRS[base]} are not supported by the "
                           f"Metal emulator")
            elif base in ("raster_order_group", "user", "id", "host_name"):
                continue
            else:
                st.fail(a, f"parameter {decl!r}: unsupported attribute [[{at}]]")
        if kind is None:
            if space in ("device", "constant"):
                kind = "buffer"
            elif space == "threadgroup":
                kind = "threadgroup"
            else:
                st.fail(a, f"parameter {decl!r} has no attribute and is not in the device, constant or "
                           f"threadgroup address space, so Metal cannot bind it")
            auto[kind].append(len(params))
        params.append(Param(name, decl, kind, -1 if index is None else index, builtin))
    for kind in ("buffer", "threadgroup"):
        if auto[kind] and explicit[kind]:
            st.fail(lo, f"this kernel mixes [[{kind}(i)]] parameters with unattributed {kind} parameters; the "
                        f"emulator models Metal's automatic indices only when none is given")
        for n, at in enumerate(auto[kind]):
            p = params[at]
            params[at] = Param(p.name, p.decl, p.kind, n, p.builtin)
    out = [p for p in params if p is not None]
    for kind in ("buffer", "threadgroup"):
        idx = [p.index for p in out if p.kind == kind]
        if len(set(idx)) != len(idx):
            st.fail(lo, f"two parameters bind [[{kind}({max(idx, key=idx.count)})]]")
    return out
