"""The package's import graph has no cycles.

The graph is read from the source with :mod:`ast`, never by importing: one node per module of ``commscope``, one
edge per ``import`` statement that names another ``commscope`` module, wherever the statement stands, at module
level or inside a function. Why function-level imports count: a circle made only of module-level imports fails at
import time (or works by the luck of import order), and the usual way out is to move one side's import into a
function. That silences the crash but keeps the two-way dependency, which says a shared piece lives in the wrong
module; every circle this test was written against (issue 19) was of that deferred kind, so a test of module-level
imports alone would have passed while all of them stood. Not counted: imports under ``if TYPE_CHECKING:`` (they
never run), and the implicit import of a parent package (``import commscope.a.b`` runs ``commscope/a/__init__.py``
first; counting that would make every package whose ``__init__`` re-exports its modules a circle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import commscope

PACKAGE_DIR = Path(commscope.__file__).parent

# Circles that other branches remove (issue 16: the importers' shared helpers move to a module both formats
# import; issue 20: the routing generators and the MoE workload share a lower module). The integrator empties
# this set when those branches are merged; from then on any circle fails the test.
KNOWN_CYCLES: set[frozenset[str]] = set()  # ``{}`` would be a dict: a new circle would then fail with a TypeError


def module_name(path: Path, root: Path = PACKAGE_DIR) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree``, at any depth, except the bodies of ``if TYPE_CHECKING:``."""
    out: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def import_graph(root: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    """Module -> the commscope modules it imports (a ``from pkg import name`` names ``pkg.name`` when that is a
    module, ``pkg`` otherwise)."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:  # relative: from . import x / from .a import b
                    base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [f"{mod}.{alias.name}" if f"{mod}.{alias.name}" in files else mod for alias in node.names]
            graph[name].update(t for t in targets if t in files and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted; a module that imports
    itself is not a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _edges_within(graph: dict[str, set[str]], component: list[str]) -> set[frozenset[str]]:
    members = set(component)
    return {frozenset({a, b}) for a in component for b in graph[a] & members if a in graph[b]}


def test_the_graph_sees_module_and_function_level_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import c\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from pkg import a\n    from . import c\n")
    (pkg / "sub" / "c.py").write_text("import pkg.sub.b\n")
    graph = import_graph(pkg)
    assert graph == {"pkg": {"pkg.sub.b"}, "pkg.sub": set(), "pkg.a": set(), "pkg.sub.b": {"pkg.a", "pkg.sub.c"},
                     "pkg.sub.c": {"pkg.sub.b"}}
    assert cycles(graph) == [["pkg.sub.b", "pkg.sub.c"]]


def test_only_the_cli_imports_rich() -> None:
    """The terminal library stays at the edge: the analytical core (and every other layer) never imports it."""
    users = set()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        for node in _imports(ast.parse(path.read_text(), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(n == "rich" or n.startswith("rich.") for n in names):
                users.add(module_name(path))
    assert users and all(u.startswith("commscope.cli.") for u in users), sorted(users)


def test_commscope_has_no_import_cycles() -> None:
    graph = import_graph()
    assert len(graph) > 50 and "commscope.pattern.workload.dense" in graph
    unexpected = []
    for component in cycles(graph):
        two_way = _edges_within(graph, component)
        # a component is known when it is exactly the union of known two-module circles
        if not two_way or not two_way <= KNOWN_CYCLES or set().union(*two_way) != set(component):
            unexpected.append(" <-> ".join(component))
    assert not unexpected, f"import cycles: {unexpected}"
