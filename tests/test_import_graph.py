"""The hub's and the agent's module graphs have no cycles, imports inside functions included
(issue 15 item 2): a function-local import can no longer hide one. The layer rules themselves
are import-linter contracts (.importlinter, `make lint`)."""

from __future__ import annotations

import grimp
import pytest


def _cycles(package: str) -> list[list[str]]:
    graph = grimp.build_graph(package, include_external_packages=False)
    modules = sorted(m for m in graph.modules if ".migrations" not in m)
    known = set(modules)
    edges = {
        m: sorted(d for d in graph.find_modules_directly_imported_by(m) if d in known)
        for m in modules
    }
    # Tarjan's strongly connected components, iteratively (no recursion limit to hit).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
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
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(edges[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


@pytest.mark.parametrize("package", ["hub", "supplier_agent"])
def test_no_import_cycles(package: str) -> None:
    assert _cycles(package) == []


def test_the_cycle_finder_finds_a_cycle(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    root = Path(str(tmp_path)) / "loopy"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "a.py").write_text("def f():\n    from loopy import b\n")
    (root / "b.py").write_text("from loopy import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _cycles("loopy") == [["loopy.a", "loopy.b"]]
