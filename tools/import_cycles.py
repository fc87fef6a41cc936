"""Report import cycles among a package's modules, counting function-level imports.

A cycle hidden behind ``def f(): from x import y`` is still a cycle in the
design (each module needs the other to work), so every ``import`` statement in
the file counts, wherever it stands. Importing a package counts as importing its
``__init__``; ``from pkg import name`` counts as importing ``pkg.name`` when that
is a module, else ``pkg``; ``importlib.import_module("a.b")`` with a literal name
counts as ``import a.b`` (a deferred import is still a dependency). Several
packages of one ``src`` folder are one graph, so cycles between them show too.
Cycles are the strongly connected components of more than one module (or a
module importing itself).

    python tools/import_cycles.py packages/vllm-ir-core/src vllm_ir vllm_ir_cli
    python tools/import_cycles.py packages/vllm-ir-core/src vllm_ir --exclude vllm_ir._cli

Exit status 1 when there is a cycle, so the lint session can run it.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path


def _modules(src: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``packages`` under ``src``."""
    found = {}
    paths = sorted(p for package in packages for p in (src / package).rglob("*.py"))
    for path in paths:
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _resolve(module: str, level: int, current: str, is_package: bool) -> str:
    """The absolute name of a (possibly relative) ``from`` import."""
    if level == 0:
        return module
    base = current.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _import_module_literal(node: ast.AST) -> str | None:
    """``"a.b"`` of ``importlib.import_module("a.b")`` (or ``import_module("a.b")``)."""
    if not (isinstance(node, ast.Call) and node.args):
        return None
    func, name = node.func, node.args[0]
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called != "import_module" or not isinstance(name, ast.Constant):
        return None
    return name.value if isinstance(name.value, str) else None


def import_graph(src: Path, *packages: str) -> dict[str, set[str]]:
    """Module -> the packages' modules it imports (at any depth in the file)."""
    modules = _modules(src, packages)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node.module or "", node.level, name, is_package)
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    for a in node.names
                ]
            elif (literal := _import_module_literal(node)) is not None:
                targets = [literal]
            for target in targets:
                # ``import a.b.c`` needs a.b.c (and runs a, a.b): the deepest known module
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="the src/ folder holding the package")
    parser.add_argument("packages", nargs="+", help="top-level packages, e.g. vllm_ir")
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        help="leave out a module and its submodules (repeatable)",
    )
    args = parser.parse_args(argv)
    graph = import_graph(args.src, *args.packages)

    def kept(m: str) -> bool:
        return not any(m == e or m.startswith(e + ".") for e in args.exclude)

    graph = {m: {t for t in ts if kept(t)} for m, ts in graph.items() if kept(m)}
    found = cycles(graph)
    edges = sum(len(t) for t in graph.values())
    print(f"{len(graph)} modules, {edges} import edges, {len(found)} cycles")
    for component in found:
        print(f"  cycle over {len(component)} modules: {' '.join(component)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
