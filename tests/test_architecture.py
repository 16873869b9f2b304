"""The package's layers (docs/architecture.md): a module imports only from its own layer or below.

Every ``import evolm...`` / ``from evolm... import`` in the package, at module top level or inside a
function, is checked against the layer table, so an arrow that points back up fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import evolm

ROOT = Path(evolm.__file__).parent

LAYERS = [
    ("bottom", {"errors", "seeding", "categories", "metrics", "rewards", "reference_rewards", "sandbox",
                "resources", "markdown", "console", "plugins", "machine", "checksum"}),
    ("core", {"config", "models", "embedded", "state", "runs", "tasks", "backends", "shards", "plots", "trackers", "memory",
              "streamsave"}),
    ("measure", {"evaluate", "heldout"}),
    ("engines", {"es", "grpo"}),
    ("jobs", {"jobs", "pipeline", "registry", "sweep"}),
    ("results", {"document", "analysis", "report", "export"}),
    ("api", {"__init__", "trainer"}),
    ("commands", {"commands", "__main__"}),
]


def layer_of(module: str) -> int:
    """Layer index of ``evolm.<top>...`` (the first component below ``evolm``)."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for i, (_, names) in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module} is in no layer of tests/test_architecture.py: add it (and to docs/architecture.md)")


def evolm_imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported evolm module) for every import in ``path``."""
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] == "evolm":
            if node.module == "evolm":  # from evolm import config, models -> each name is a module
                out += [(node.lineno, f"evolm.{a.name}") for a in node.names if a.name != "__version__"]
            else:
                out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "evolm"]
    return out


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__") if rel.name == "__init__" and len(rel.parts) > 2 else ".".join(rel.parts)


def test_no_module_imports_upward():
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        name = module_name(path)
        own = layer_of(name)
        for line, imported in evolm_imports(path):
            if layer_of(imported) > own:
                upward.append(f"{path.relative_to(ROOT)}:{line} ({LAYERS[own][0]}) imports {imported} "
                              f"({LAYERS[layer_of(imported)][0]})")
    assert not upward, "imports that point up the layers:\n" + "\n".join(upward)


def test_the_layer_table_knows_every_module():
    for path in ROOT.rglob("*.py"):
        layer_of(module_name(path))


def test_the_checker_sees_local_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from evolm.report import build_report\n")
    assert evolm_imports(f) == [(2, "evolm.report")]


def test_no_two_packages_import_each_other():
    """Within a layer, imports between top-level modules and packages must not form a cycle."""
    edges: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        src = module_name(path).split(".")
        top = src[1] if len(src) > 1 else "__init__"
        for _, imported in evolm_imports(path):
            parts = imported.split(".")
            dst = parts[1] if len(parts) > 1 else "__init__"
            if dst != top and "__init__" not in (top, dst):
                edges.setdefault(top, set()).add(dst)
    seen, stack = set(), []

    def visit(node):
        if node in stack:
            raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(node):] + [node]))
        if node in seen:
            return
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            visit(nxt)
        stack.pop()
        seen.add(node)

    for node in sorted(edges):
        visit(node)


def module_graph() -> dict[str, set[str]]:
    """``module -> the evolm modules it imports`` (top level or inside a function); ``from evolm.es import
    fused`` names the module ``evolm.es.fused`` when that is a module, else the package."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        out = set()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] == "evolm":
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    out.add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name.split(".")[0] == "evolm"}
        graph[name] = {m for m in out if m in modules and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, once each, as the modules in order (Tarjan's strongly connected components)."""
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


def test_modules_import_one_way():
    """No import circle between modules, even through imports inside function bodies (which Python
    tolerates and the layer check above cannot see within a package): each piece has one home."""
    circles = cycles({m: deps for m, deps in module_graph().items() if m != "evolm"})
    assert not circles, "modules that import each other: " + "; ".join(" <-> ".join(c) for c in circles)


def test_the_cycle_finder_finds_a_hidden_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
