"""The module import graph of stacklib has no cycles among module-level imports.

The graph is built with :mod:`ast` from the sources, without importing them: an edge for
every ``import`` and ``from ... import`` executed when a module loads (its top level,
including ``try``/``if`` blocks, but not ``if TYPE_CHECKING:`` and not imports inside
functions, which run later: the lazy imports that keep optional extras and start-up cheap).
``from package import name`` points at ``package.name`` when that is a module, else at the
package.  A cycle means a module can be imported half-initialized depending on which side
is imported first, and that the layers of docs/architecture.md are crossed upwards.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "stacklib"

#: Cycles that cannot be removed in this part of the code base yet, each with the reason; the
#: test fails when one disappears, so that its entry goes too.
ALLOWED: dict[frozenset[str], str] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements a module runs when it loads."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _top_level_imports(node.body)
            yield from _top_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _top_level_imports(block)
            for handler in node.handlers:
                yield from _top_level_imports(handler.body)
        elif isinstance(node, ast.With):
            yield from _top_level_imports(node.body)


@functools.cache
def import_graph() -> dict[str, frozenset[str]]:
    """stacklib module -> the stacklib modules it imports when it loads."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in _top_level_imports(tree.body):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            graph[name].update(t for t in targets if t in modules and t != name)
    return {name: frozenset(targets) for name, targets in graph.items()}


def cycles(graph: Mapping[str, Collection[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_the_imports() -> None:
    graph = import_graph()
    assert "stacklib.reporting.figures" in graph["stacklib.experiments.tcpip"]
    assert "stacklib.reporting.figures" in graph["stacklib.reproduce"]
    # A lazy import (inside a function) is not an edge: the plots load only when drawn.
    assert "stacklib.reporting.plots" not in graph["stacklib.reproduce"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    found = {frozenset(c): c for c in cycles(import_graph())}
    unexpected = [c for key, c in found.items() if key not in ALLOWED]
    assert not unexpected, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in unexpected)
    gone = [reason for key, reason in ALLOWED.items() if key not in found]
    assert not gone, f"allowed cycles no longer there (remove them from ALLOWED): {gone}"


@pytest.mark.parametrize(
    ("low", "high"),
    [
        ("stacklib.reporting.figures", "stacklib.experiments"),
        ("stacklib.reporting.tables", "stacklib.experiments"),
        ("stacklib.experiments", "stacklib.reproduce"),
        ("stacklib.reproduce", "stacklib.commands"),
        ("stacklib.unet", "stacklib.reporting"),
        ("stacklib.experiments", "stacklib.reporting.plots"),
    ],
)
def test_layers_import_downward(low: str, high: str) -> None:
    """No module of ``low`` imports one of ``high`` when it loads (reporting renders results,
    experiments produce them, the runner runs them, the CLI is on top)."""
    graph = import_graph()
    upward = [
        (module, target)
        for module, targets in graph.items()
        if module == low or module.startswith(low + ".")
        for target in targets
        if target == high or target.startswith(high + ".")
    ]
    assert not upward


def test_only_the_reporting_plots_import_matplotlib() -> None:
    """Plotting lives in stacklib/reporting/plots/ alone, so matplotlib stays an optional
    extra that experiments, U-Net and the commands never import (lazy imports included)."""
    drawing = []
    for name, path in _modules().items():
        if name.startswith("stacklib.reporting.plots") or name == "stacklib.reporting.optional":
            continue  # the plots, and the check whether matplotlib is there
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            modules = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            drawing += [name for module in modules if module.split(".")[0] == "matplotlib"]
    assert drawing == []
