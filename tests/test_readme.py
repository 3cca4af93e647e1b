"""Every path, class and attribute the README names (in backticks) exists in
the repository: a file or folder (from the root, the package, or any folder
of it for a bare file name; docs name tests from ``tests/``), a class of the package (with the method or
attribute named after it, inherited ones included), or a module's top-level
name. Read from the source (``ast``), so a module that needs an optional
package (Triton) is checked too. Names of other projects' classes and of
the user's files are listed here, each with what it is."""
from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("muser_torch", "muser_torch_metal_emulator")
DOCS = ("README.md", "docs/testing.md")
ELSEWHERE = {
    "MuseGlimmerForConditionalGeneration": "transformers' class (a checkpoint's architecture)",
    "MuseGlimmerTextModel": "transformers' class",
    "model.safetensors.index.json": "a sharded checkpoint's index (the user's file)",
    "type_traits_cpu": "ggml's table",
    "tokenizer.model": "a checkpoint's sentencepiece model (the user's file)",
    "tokenizer.chat_template": "a GGUF metadata key",
}
FILE = re.compile(r"^[\w.*-]+(?:/[\w.*-]*)*$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")
CLASS = re.compile(r"^[A-Z][a-z]\w*[a-z0-9]\w*$")    # CamelCase, not an ALL_CAPS constant


@lru_cache(maxsize=1)
def index() -> tuple[dict[str, set[str]], dict[str, tuple[set[str], list[str]]]]:
    """({module path: its top-level names}, {class name: (its names, its bases)})."""
    modules: dict[str, set[str]] = {}
    classes: dict[str, tuple[set[str], list[str]]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            tree = ast.parse(path.read_text())
            names = modules.setdefault(module, set())
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                        names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    names.update((a.asname or a.name).split(".")[0] for a in node.names)
                if isinstance(node, ast.ClassDef):
                    own = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
                    own |= {t.id for n in node.body if isinstance(n, ast.Assign)
                            for t in n.targets if isinstance(t, ast.Name)}
                    own |= {n.target.id for n in node.body
                            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
                    bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                    classes[node.name] = (own, bases)
    return modules, classes


def _has_member(cls: str, name: str) -> bool:
    _, classes = index()
    if cls not in classes:
        return False
    own, bases = classes[cls]
    return name in own or any(_has_member(b, name) for b in bases)


def _resolves(dotted: str) -> bool:
    modules, classes = index()
    if any(full == dotted or full.endswith("." + dotted) for full in modules):
        return True
    head, *rest = dotted.split(".")
    if head in classes:
        return len(rest) == 1 and _has_member(head, rest[0])
    for i in range(len(dotted.split(".")) - 1, 0, -1):     # the longest module the name ends with
        module, names = ".".join(dotted.split(".")[:i]), dotted.split(".")[i:]
        for full in modules:
            if full == module or full.endswith("." + module):
                if names[0] in modules[full] and (len(names) == 1 or _has_member(names[0], names[1])):
                    return True
    return False


def _exists(p: str) -> bool:
    p = p.rstrip("/")
    for base in (ROOT, ROOT / "tests", *(ROOT / pkg for pkg in PACKAGES)):
        if list(base.glob(p)):
            return True
    return "/" not in p and any(True for pkg in PACKAGES for _ in (ROOT / pkg).rglob(p))


def named(doc: str) -> list[tuple[str, str]]:
    """(kind, name) of each backticked path, dotted name and class name of ``doc``."""
    text = (ROOT / doc).read_text()
    found = []
    for span in sorted(set(re.findall(r"`([^`\n]+)`", text))):
        if span in ELSEWHERE or span.startswith(("torch.", "pytest.", "muser-torch ", "-", ".")):
            continue
        if ("/" in span or re.search(r"\.(py|md|c|h|metal|sh|cpp|json|txt)$", span)) and FILE.match(span):
            found.append(("path", span))
        elif DOTTED.match(span) and not re.search(r"\.(py|md|c|h|metal|sh|cpp|json|txt)$", span):
            found.append(("name", span))
        elif CLASS.match(span):
            found.append(("class", span))
    return found


@pytest.mark.parametrize("doc", DOCS)
def test_every_name_in_the_docs_exists(doc):
    _, classes = index()
    missing = []
    for kind, name in named(doc):
        ok = {"path": _exists, "name": _resolves, "class": lambda n: n in classes}[kind](name)
        if not ok:
            missing.append(f"{kind} {name}")
    assert not missing, f"{doc} names what the repository does not have: {missing}"


def test_the_check_finds_a_name_that_does_not_exist():
    _, classes = index()
    assert _resolves("Decoder.forward") and _resolves("muser_torch.Glimmer")
    assert not _resolves("TransformerBlock.forward_all") and not _resolves("Decoder.nothing")
    assert "NoSuchBlock" not in classes and not _exists("muser_torch/no_such_file.py")
