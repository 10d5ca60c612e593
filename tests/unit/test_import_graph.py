"""The package's import graph (grimp): no module imports, directly or through others, a module
that imports it back; no module imports another module's private (``_name``) helper; and no
package imports a layer above its own (the layers contract, ``LAYERS``).

Imports inside functions and under ``TYPE_CHECKING`` count: a lazy import is still a
dependency, and a cycle through one is still two modules that cannot be understood apart."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kvprefetch

grimp = pytest.importorskip("grimp")

PACKAGE_DIR = Path(kvprefetch.__file__).resolve().parent


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively: the components of more than one module (cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return out


def test_the_cycle_finder_finds_cycles() -> None:
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert strongly_connected(g) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_cycles() -> None:
    graph = grimp.build_graph("kvprefetch")
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    cycles = strongly_connected(edges)
    shown = []
    for comp in cycles:
        a, b = comp[0], comp[1]
        chain = graph.find_shortest_chain(importer=a, imported=b)
        back = graph.find_shortest_chain(importer=b, imported=a)
        shown.append(f"{' -> '.join(chain or ())} and {' -> '.join(back or ())}")
    assert not cycles, "import cycles:\n" + "\n".join(shown)


def _private_imports(path: Path, module: str) -> list[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join(parts + ([base] if base else []))
        if base.split(".")[0] != "kvprefetch":
            continue
        out += [f"{module}: from {base} import {a.name}" for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def test_no_module_imports_another_modules_private_helper() -> None:
    found = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = ("kvprefetch", *path.relative_to(PACKAGE_DIR).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found += _private_imports(path, module)
    assert not found, "private helpers imported across modules:\n" + "\n".join(found)


# The layers, top first: a package may import its own layer and any layer below it, never one
# above, inside functions included (grimp reads every import statement). The base layer is
# the package's loose modules: errors, runner, hashing, the console, the kit's own facts, and
# upstream (what vLLM 0.10.2 is, pinned, and the names of the variants and trees).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli", "__main__"),
    ("slurm",),
    ("vmm",),
    ("bench",),
    ("builds",),
    ("verify",),
    ("doctor",),
    ("overlay",),
    ("machine",),
    ("sources",),
    ("workspace",),
    ("kernels",),
    ("probe",),
    ("upstream", "reading", "timings", "kitinfo", "console", "stdio", "oserrors", "hashing",
     "runner", "proctree", "gitenv",
     "errors", "__init__"),
)

# The upward imports the package still has, each named with what removes it. The list only
# shrinks: an upward import not here fails, and so does an entry that no longer exists. Empty
# since issue 45: what doctor needs of the build (foresight's pure half, torch's probe, cmake)
# lives in machine/, and each build mode calls doctor for its preflight, never the reverse.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> int:
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else "__init__"
    for i, layer in enumerate(LAYERS):
        if name in layer:
            return i
    raise AssertionError(f"{module}: its package {name!r} is in no layer of LAYERS; add it")


def upward_imports(graph: object) -> dict[tuple[str, str], int]:
    out = {}
    for m in sorted(graph.modules):  # type: ignore[attr-defined]
        for t in graph.find_modules_directly_imported_by(m):  # type: ignore[attr-defined]
            if layer_of(t) < layer_of(m):
                out[(m, t)] = layer_of(m) - layer_of(t)
    return out


def test_the_layer_check_sees_an_upward_import() -> None:
    class Graph:
        modules = frozenset({"kvprefetch.workspace.a", "kvprefetch.cli.b", "kvprefetch.errors"})

        def find_modules_directly_imported_by(self, m: str) -> set[str]:
            return {"kvprefetch.workspace.a": {"kvprefetch.cli.b", "kvprefetch.errors"},
                    "kvprefetch.cli.b": {"kvprefetch.workspace.a"}}.get(m, set())

    assert list(upward_imports(Graph())) == [("kvprefetch.workspace.a", "kvprefetch.cli.b")]


def test_no_package_imports_a_layer_above_it() -> None:
    graph = grimp.build_graph("kvprefetch")
    found = {(m.removeprefix("kvprefetch."), t.removeprefix("kvprefetch."))
             for m, t in upward_imports(graph)}
    new = sorted(found - set(KNOWN_UPWARD))
    gone = sorted(set(KNOWN_UPWARD) - found)
    assert not new, ("imports of a layer above (see LAYERS; move the shared thing down "
                     "instead):\n" + "\n".join(f"{m} -> {t}" for m, t in new))
    assert not gone, ("these upward imports are gone: remove them from KNOWN_UPWARD:\n"
                      + "\n".join(f"{m} -> {t}" for m, t in gone))
