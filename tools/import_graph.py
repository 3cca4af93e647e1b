"""Check muser_torch's layering: the module-level imports between its layers
(``docs/architecture.md``) go only downward, and no import circle exists.

    python tools/import_graph.py            # prints violations; exit 1 if any

Imports inside functions are allowed to reach up (they run after the package
is loaded, and each says why in a comment); module-level ones are the graph.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "muser_torch"

# Layer of each top-level module or package, lowest first (docs/architecture.md).
LAYERS = {
    "errors": 0,
    "formats": 1,
    "ops": 2,
    "nn": 3, "gguf_io": 3, "text": 3,
    "arch": 4,
    "loader": 5,
    "models": 6, "glimmer": 6, "config": 6,
    "tiny": 7, "convert": 7,
    "inspect": 8, "run": 8, "bench": 8, "cli": 8, "__init__": 9,
}


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_imports(path: Path) -> set[str]:
    """muser_torch modules imported at module level (not inside functions)."""
    tree = ast.parse(path.read_text())
    me = _module_of(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("muser_torch"):
                if node.module:            # "from . import cpu" imports only the module named
                    out.add(target)
                for alias in node.names:
                    out.add(f"{target}.{alias.name}")
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("muser_torch"))
    return out


def main() -> int:
    files = {_module_of(p): p for p in ROOT.rglob("*.py")}
    graph = {m: {t for t in module_imports(p) if t in files and t != m} for m, p in files.items()}
    bad = []
    for m, targets in sorted(graph.items()):
        for t in sorted(targets):
            a, b = _top(m), _top(t)
            if a != b and LAYERS[b] > LAYERS[a]:
                bad.append(f"upward: {m} (layer {LAYERS[a]}) imports {t} (layer {LAYERS[b]})")
    # circles among modules (the package __init__ re-exports are left out: they sit on top)
    colour: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        colour[m] = 1
        for t in graph[m]:
            if t == "muser_torch":
                continue
            if colour.get(t) == 1:
                bad.append("circle: " + " -> ".join(stack[stack.index(t):] + [t]))
            elif t not in colour:
                visit(t, stack + [t])
        colour[m] = 2

    for m in sorted(graph):
        if m not in colour and m != "muser_torch":
            visit(m, [m])
    for line in bad:
        print(line)
    print(f"{len(files)} modules, {sum(map(len, graph.values()))} imports, {len(bad)} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
