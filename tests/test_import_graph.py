"""The import graph of engine/ and app/, read from the source (AST): no circles, no import running back up.

Every ``import`` counts, module level or inside a function (a lazy import is still a dependency), except
those under ``if TYPE_CHECKING:`` (annotations only, never run). An
import of a package counts as an import of its ``__init__``; ``from pkg import name`` counts as an import
of ``pkg.name`` when that is a module. Rules: no cycle among modules; models and backbones never import
the benches or the command lines; the engine never imports the app; the session imports no part package (no
backbone package, no decoder under engine.models: it reads what a part offers from the registry); the
core (clocks, planner, arenas, executor, graphs) imports nothing above it, only itself and the leaf utilities
of :data:`CORE_LEAVES`; the app never imports the benches (the bundle leaves them out).
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "app")
#: the part packages: every backbone package (engine.backbones' modules beside them are shared code) and the models
PARTS = tuple(sorted(f"engine.backbones.{d.name}" for d in (ROOT / "engine" / "backbones").iterdir()
                     if (d / "__init__.py").is_file())) + ("engine.models",)
#: (importer prefix, forbidden imported prefix): the layering
FORBIDDEN = (("engine.models", "engine.bench"), ("engine.models", "engine.cli"),
             ("engine.backbones", "engine.bench"), ("engine.backbones", "engine.cli"), ("engine", "app"),
             ("app", "engine.bench")) \
    + tuple(("engine.session", part) for part in PARTS)
#: the modules outside engine.core that the core may import: utilities that import nothing of the engine
CORE_LEAVES = ("engine.stats",)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> Dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _resolve(name: str, known: Dict[str, Path]) -> str:
    """The longest known module that ``name`` is or lies in ("" when outside engine/ and app/)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _run_nodes(tree: ast.AST):
    """Every node that may run (``ast.walk`` without the ``if TYPE_CHECKING:`` bodies)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                todo.extend(child.orelse)
            else:
                todo.append(child)


def imports_of(mod: str, path: Path, known: Dict[str, Path]) -> Set[str]:
    """The engine/app modules ``mod`` imports."""
    is_pkg = path.name == "__init__.py"
    found: Set[str] = set()
    for node in _run_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(_resolve(a.name, known) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if sub in known else _resolve(base, known))
    found.discard("")
    found.discard(mod)
    return found


def import_graph() -> Dict[str, Set[str]]:
    known = modules()
    return {m: imports_of(m, p, known) for m, p in known.items()}


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    out: List[List[str]] = []

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


def _within(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


def _above_core(importer: str, imported: str) -> bool:
    """An import from the core of a module that is not core and not one of its leaf utilities."""
    return (_within(importer, "engine.core") and not _within(imported, "engine.core")
            and imported not in CORE_LEAVES)


def upward_imports(graph: Dict[str, Set[str]]) -> List[str]:
    found = {f"{m} -> {d}" for m, deps in graph.items() for d in deps
             for low, high in FORBIDDEN if _within(m, low) and _within(d, high)}
    found.update(f"{m} -> {d}" for m, deps in graph.items() for d in deps if _above_core(m, d))
    return sorted(found)


def test_no_import_circles():
    found = cycles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_import_runs_back_up():
    found = upward_imports(import_graph())
    assert not found, "imports that run back up:\n" + "\n".join(found)


def test_the_graph_reader_sees_circles_and_upward_imports():
    graph = {"engine.a": {"engine.b"}, "engine.b": {"engine.c"}, "engine.c": {"engine.a"}, "engine.d": set(),
             "engine.models.x": {"engine.bench.y"}, "app.loopback": {"engine.bench.echo_sim", "engine.echo.room"}}
    assert cycles(graph) == [["engine.a", "engine.b", "engine.c"]]
    assert upward_imports(graph) == ["app.loopback -> engine.bench.echo_sim", "engine.models.x -> engine.bench.y"]
    layered = {"engine.session.session": {"engine.backbones.minicpmo45.prompt", "engine.backbones.base",
                                          "engine.models.step_audio2.voice", "engine.registry"},
               "engine.core.planner": {"engine.core.regions", "engine.stats", "engine.registry"},
               "engine.core.executor": {"engine.session.records"}}
    assert "engine.backbones.minicpmo45" in PARTS and "engine.backbones.synthetic" in PARTS
    assert "engine.backbones.base" not in PARTS
    assert upward_imports(layered) == ["engine.core.executor -> engine.session.records",
                                       "engine.core.planner -> engine.registry",
                                       "engine.session.session -> engine.backbones.minicpmo45.prompt",
                                       "engine.session.session -> engine.models.step_audio2.voice"]
    assert "engine.session.config" in import_graph()["engine.session.session"]     # relative imports resolved


if __name__ == "__main__":
    g = import_graph()
    for c in cycles(g):
        print("cycle:", " <-> ".join(c))
    for u in upward_imports(g):
        print("up:", u)
