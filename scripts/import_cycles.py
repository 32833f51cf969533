"""Print the import cycles between dataguard's modules (exit 1 when there is one).

    python scripts/import_cycles.py [--top-level-only]

Every ``import``/``from ... import`` of a ``dataguard`` module counts, including the lazy
ones inside functions (a lazy import hides a cycle, it does not remove it) and those under
``if TYPE_CHECKING:`` (a type-only import still means the two modules know each other: a
helper that takes the whole stage object, say, and a stage that calls it).
``--top-level-only`` counts only the imports that run when a module is imported (module
level, not under ``TYPE_CHECKING``): the ones that can fail at import time. A package's
``__init__`` is a module of its own.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "dataguard"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(path: Path, modules: set[str], top_level_only: bool) -> set[str]:
    """The dataguard modules ``path`` imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if top_level_only and isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub, top)
                continue
            inner = top and not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import) and (top or not top_level_only):
                for a in child.names:
                    if a.name.split(".")[0] == PACKAGE and (m := resolve(a.name)):
                        found.add(m)
            elif isinstance(child, ast.ImportFrom) and (top or not top_level_only):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                if base.split(".")[0] != PACKAGE:
                    continue
                for a in child.names:  # ``from pkg import mod`` imports the module pkg.mod
                    full = f"{base}.{a.name}"
                    m = full if full in modules else resolve(base)
                    if m:
                        found.add(m)
            visit(child, inner)

    visit(tree, True)
    found.discard(me)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10_000)

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(out)


def main(argv: list[str]) -> int:
    top_only = "--top-level-only" in argv
    files = sorted((ROOT / PACKAGE).rglob("*.py"))
    modules = {module_name(p) for p in files}
    graph = {module_name(p): imports(p, modules, top_only) for p in files}
    found = cycles(graph)
    for comp in found:
        members = set(comp)
        edges = [f"{a} -> {b}" for a in comp for b in sorted(graph[a] & members)]
        print(f"cycle of {len(comp)}: " + ", ".join(comp))
        for e in edges:
            print(f"    {e}")
    print(f"{len(found)} import cycle(s) among {len(modules)} modules")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
