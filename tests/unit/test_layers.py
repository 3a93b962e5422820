"""Guard: imports point one way (raybatch, the CLI, on top -> deployments -> cluster ->
batching; inside deployments, ingress -> batcher -> replica -> wire), and no module imports
itself back through another.

Read from the source with `ast` (no import runs), counting imports inside functions
too: a lazy import hides a dependency from the interpreter, not from a reader.
Package `__init__` files are facades that re-export their children; they are left out
of the cycle check, and a module inside a package must not import its own facade.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("batching", "cluster", "deployments", "raybatch")
KINDS = ("batching.dynamic", "batching.sequence", "batching.iterative", "batching.embedded",
         "batching.simulate")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _known() -> set[str]:
    """Every module name: the Python modules and the C extensions (`*.c`, built in place)."""
    return set(_modules()) | {_module_name(p) for pkg in PACKAGES
                              for p in (ROOT / pkg).rglob("*.c")}


def _imports(path: Path, known: set[str]) -> set[str]:
    """The project modules `path` imports (the most specific known name)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import sub` names the submodule; `from pkg import Name`, the package
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                     else node.module for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = _known()
    return {m: _imports(p, known) - {m} for m, p in mods.items()}


def _all_imports(module: str) -> set[str]:
    """Every module `module` names in an import, project or not (first component)."""
    path = _modules()[module]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_batching_imports_neither_ray_nor_the_layers_above():
    bad = {m: sorted(i for i in _all_imports(m)
                     if any(_under(i, top) for top in ("ray", "cluster", "deployments", "torch")))
           for m in _modules() if _under(m, "batching")}
    assert not {m: v for m, v in bad.items() if v}


def test_the_batching_core_does_not_import_the_kinds_of_batching():
    graph = _graph()
    core = [m for m in graph if m.count(".") == 1 and _under(m, "batching")
            and not any(_under(m, k) for k in KINDS)]
    bad = {m: sorted(i for i in graph[m] if any(_under(i, k) for k in KINDS)) for m in core}
    assert not {m: v for m, v in bad.items() if v}


def test_cluster_imports_neither_deployments_nor_the_cli():
    graph = _graph()
    bad = {m: sorted(i for i in deps if _under(i, "deployments") or _under(i, "raybatch"))
           for m, deps in graph.items() if _under(m, "cluster")}
    assert not {m: v for m, v in bad.items() if v}


def test_deployments_does_not_import_the_cli():
    graph = _graph()
    bad = {m: sorted(i for i in deps if _under(i, "raybatch"))
           for m, deps in graph.items() if _under(m, "deployments")}
    assert not {m: v for m, v in bad.items() if v}


# A wing is the code of one process on a request's road; each may import the wings after
# it (what it calls across a hop) and never one before it.
WINGS = ("deployments.ingress", "deployments.batcher", "deployments.replica",
         "deployments.wire")
SHARED = ("deployments.signature", "deployments.metrics", "deployments.heap")


def _wing(module: str) -> int | None:
    return next((i for i, w in enumerate(WINGS) if _under(module, w)), None)


def test_wings_import_only_the_wings_after_them():
    graph = _graph()
    bad = {}
    for m, deps in graph.items():
        rank = _wing(m)
        if rank is None and not any(_under(m, s) for s in SHARED):
            continue
        limit = len(WINGS) if rank is None else rank
        back = sorted(i for i in deps if (r := _wing(i)) is not None
                      and (rank is None or r < limit))
        if back:
            bad[m] = back
    assert not bad, f"imports against the road (ingress -> batcher -> replica -> wire): {bad}"


def test_the_wings_are_imported_by_nothing_but_the_app_and_the_cli_outside_them():
    """The protocol, HTTP, gRPC and model packages serve the ingress and the replicas; they
    do not reach into the processes' own code."""
    graph = _graph()
    bad = {m: sorted(i for i in deps if _wing(i) is not None)
           for m, deps in graph.items()
           if _under(m, "deployments") and _wing(m) is None
           and m not in ("deployments", "deployments.app")}
    assert not {m: v for m, v in bad.items() if v}


def test_deployments_keeps_at_most_six_modules_at_its_top():
    top = sorted(p.name for p in (ROOT / "deployments").glob("*.py"))
    assert len(top) <= 6, f"put these in a wing (ingress, batcher, replica, wire): {top}"


def test_no_module_imports_its_own_package_facade():
    graph = _graph()
    facades = {m for m, p in _modules().items() if p.name == "__init__.py"}
    bad = {m: sorted(i for i in deps if i in facades and _under(m, i))
           for m, deps in graph.items() if m not in facades}
    assert not {m: v for m, v in bad.items() if v}


def test_no_import_cycles():
    facades = {m for m, p in _modules().items() if p.name == "__init__.py"}
    graph = {m: {d for d in deps if d not in facades}
             for m, deps in _graph().items() if m not in facades}
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
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
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


MAX_LINES = 450


def test_every_module_stays_within_450_lines():
    """A module a reader can hold in mind (tests too): past 450 lines, split it by what it
    decides or checks."""
    roots = [ROOT / name for name in (*PACKAGES, "benchmarks", "tests", "docs")]
    vendored = ROOT / "tests" / "e2e" / "triton_examples"  # Triton's programs, kept unchanged
    long = {str(p.relative_to(ROOT)): n for root in roots for p in root.rglob("*.py")
            if vendored not in p.parents and (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these modules (at most {MAX_LINES} lines each): {long}"
