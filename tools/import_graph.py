"""Check muser_torch's layering: the imports between its layers
(``docs/architecture.md``) go only downward, no import circle exists, the
model layer names no backend folder (``ops/cpu``, ``ops/cuda``, ``ops/metal``),
and no backend folder imports a module that imports another backend folder.

    python tools/import_graph.py            # prints violations; exit 1 if any

Every import counts, at module level or inside a function: a lazy import
still makes its module depend on the target, and a circle closed by one only
moves the failure to the first call. ``from PKG import NAME`` is an arrow to
the module PKG.NAME when that is a module, and to the package PKG otherwise.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "muser_torch"
# The Metal emulator is a package of its own beside muser_torch: it imports
# nothing from muser_torch, and ops/metal is its one caller.
EMULATOR, EMULATOR_CALLER = "muser_torch_metal_emulator", "muser_torch.ops.metal"

# The backend folders: only ops/ itself and the commands (layer 8: the benchmarks
# time kernels) import them. The model layer asks ops/ (``ops.warm_up``,
# ``ops.backend``) and never names a backend.
BACKENDS = ("muser_torch.ops.cpu", "muser_torch.ops.cuda", "muser_torch.ops.metal")
BACKEND_FREE = ("models",)

# Layer of each top-level module or package, lowest first (docs/architecture.md).
LAYERS = {
    "errors": 0, "cache": 0,
    "formats": 1,
    "ops": 2,
    "nn": 3, "changes": 3, "gguf_io": 3, "text": 3,
    "arch": 4,
    "loader": 5, "vision": 5,
    "models": 6, "glimmer": 6, "config": 6,
    "tiny": 7, "convert": 7,
    "inspect": 8, "run": 8, "bench": 8, "serve": 8, "cli": 8, "__init__": 9,
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


def module_imports(path: Path, modules: "set[str] | frozenset[str]" = frozenset()) -> set[str]:
    """muser_torch modules imported anywhere in ``path`` (module level and
    function bodies alike); ``modules`` are the known module names, to tell
    ``from . import submodule`` from ``from . import function``."""
    tree = ast.parse(path.read_text())
    me = _module_of(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("muser_torch"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in modules else target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("muser_torch"))
    return out


def main() -> int:
    files = {_module_of(p): p for p in ROOT.rglob("*.py")}
    raw = {m: module_imports(p, set(files)) for m, p in files.items()}
    graph = {m: {t for t in raw[m] if t in files and t != m} for m in files}
    bad = []
    for m in sorted(raw):
        if m != EMULATOR_CALLER and any(t.split(".")[0] == EMULATOR for t in raw[m]):
            bad.append(f"emulator: {m} imports {EMULATOR}; only {EMULATOR_CALLER} may")
    emulator = ROOT.parent / EMULATOR
    for p in sorted(emulator.rglob("*.py")) if emulator.is_dir() else ():
        if any(t.split(".")[0] == "muser_torch" for t in module_imports(p)):
            bad.append(f"emulator: {_module_of(p)} imports muser_torch; the emulator stands alone")
    for m in sorted(raw):
        for t in sorted(raw[m]):
            if _top(m) in BACKEND_FREE and any(t == b or t.startswith(b + ".") for b in BACKENDS):
                bad.append(f"backend: {m} imports {t}; {_top(m)}/ asks muser_torch.ops instead")
    # a backend folder imports no module (outside itself) that imports another
    # backend folder: CUDA's kernels reach the CPU's only through ops/ asking
    def folder(name: str) -> str | None:
        return next((b for b in BACKENDS if name == b or name.startswith(b + ".")), None)

    for m in sorted(graph):
        own = folder(m)
        for t in sorted(graph[m]) if own else ():
            if folder(t) == own:
                continue
            for u in sorted(graph[t]):
                other = folder(u)
                if other is not None and other != own:
                    bad.append(f"backend: {m} imports {t}, which imports {u}; a backend folder "
                               f"reaches another only through what ops/ asks of it")
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
