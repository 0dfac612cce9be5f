"""Each module sits above what it imports: no import circles (lazy imports
inside functions count too), and each folder imports only the layers below
it (README "Layout")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dp_ops", "models", "transforms", "pipelines", "deploy")
# What each folder may import from the project.
ALLOWED = {
    "dp_ops": {"dp_ops"},
    "models": {"dp_ops", "models"},
    "transforms": {"dp_ops", "models", "transforms"},
    "pipelines": {"dp_ops", "models", "transforms", "pipelines"},
    "deploy": {"dp_ops", "models", "transforms", "pipelines", "deploy"},
}


def _module_name(path: Path) -> str:
    """The installed name: the design's folders live under ``dpsynth``."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return "dpsynth." + ".".join(parts[:-1] if parts[-1] == "__init__"
                                 else parts)


def _package(name: str) -> str:
    """The design folder a ``dpsynth.<folder>...`` module lives in."""
    parts = name.split(".")
    return parts[1] if parts[0] == "dpsynth" and len(parts) > 1 else ""


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES
            for p in (ROOT / pkg).rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules imported anywhere in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}"
                                     for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and _package(name) in PACKAGES:
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        deps = _imports(path, modules) - {name}
        # A package __init__ is not a dependency of its own submodules.
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
    return graph


def test_no_import_circles():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import circles: " + "; ".join(
        " -> ".join(c) for c in cycles)


def test_each_folder_imports_only_the_layers_below():
    bad = [f"{mod} imports {dep}" for mod, deps in _graph().items()
           for dep in deps
           if _package(dep) not in ALLOWED[_package(mod)]]
    assert not bad, "\n".join(bad)


def test_product_packages_never_import_benchmarks_or_studies():
    """The product holds what it runs: baselines, audits and studies live in
    benchmarks/ (issue 28), and nothing in the product imports them."""
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names]
                         if isinstance(node, ast.Import) else
                         [node.module or ""]
                         if isinstance(node, ast.ImportFrom) else [])
                assert not any(n.split(".")[0] == "benchmarks"
                               for n in names), path
    assert not (ROOT / "models" / "baselines").exists()
    assert not (ROOT / "dp_ops" / "audit.py").exists()
