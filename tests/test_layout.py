"""Each module sits above what it imports: no import circles (lazy imports
inside functions and ``importlib.import_module("...")`` count too), each
folder imports only the layers below it (README "Layout"), and inside a
folder its rooms (subfolders and loose modules) import each other one way
only. ``benchmarks/`` is held to the same rules.

``python -m tests.test_layout`` prints the picture in numbers: rooms,
floors, arrows, circles and lines per room (``-s`` shows it in pytest)."""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dp_ops", "models", "transforms", "pipelines", "deploy")
# The package root (``dpsynth/__init__``: the API's names on first use) is
# a room above ``pipelines``; its version module (``dpsynth/version.py``,
# imports nothing) a room below everything.
ROOT_PACKAGE = "dpsynth"
VERSION = "version"
# Not installed (no ``dpsynth.`` prefix) but held to the same rules.
SCRIPTS = ("benchmarks",)
FOLDERS = PACKAGES + SCRIPTS + (ROOT_PACKAGE, VERSION)
# What each folder may import from the project.
ALLOWED = {
    "dp_ops": {"dp_ops"},
    "models": {"dp_ops", "models"},
    "transforms": {"dp_ops", "models", "transforms"},
    "pipelines": {"dp_ops", "models", "transforms", "pipelines"},
    "deploy": {"dp_ops", "models", "transforms", "pipelines", "deploy"},
    "benchmarks": set(FOLDERS),
    # dpsynth/__init__ re-exports the API and the readers (imported on
    # first use); dpsynth/version imports nothing.
    "dpsynth": {"dpsynth", "pipelines"},
    "version": set(),
}
# Every folder may read the version (a leaf).
for _allowed in ALLOWED.values():
    _allowed.add(VERSION)
IMPORTERS = {"import_module", "__import__"}  # called with a module's name


def _module_name(path: Path) -> str:
    """The installed name: the design's folders live under ``dpsynth``."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    if parts[0] in SCRIPTS or parts[0] == ROOT_PACKAGE:
        return ".".join(parts)
    return ".".join(("dpsynth",) + parts)


def _package(name: str) -> str:
    """The design folder a ``dpsynth.<folder>...`` (or ``benchmarks...``)
    module lives in."""
    parts = name.split(".")
    if parts[0] in SCRIPTS:
        return parts[0]
    if parts[0] != "dpsynth":
        return ""
    if parts[1:2] == [VERSION]:
        return VERSION
    if len(parts) == 1 or parts[1] not in PACKAGES:
        return ROOT_PACKAGE
    return parts[1]


@functools.lru_cache(maxsize=None)
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in FOLDERS
            for p in (ROOT / pkg).rglob("*.py")}


def _imported_names(tree: ast.AST, modules=()) -> list[str]:
    """Every absolute import, and every ``import_module("x")`` of a literal
    name (a module imported by name is imported all the same). ``from P
    import m`` of submodules only names the submodules: the package's
    ``__init__`` runs for any ``P.x`` import, so it is no arrow of its own
    (``from dpsynth import version`` is not an import of the API)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            names += subs
            if not all(sub in modules for sub in subs):
                names.append(node.module)
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None))
              in IMPORTERS):
            names.append(node.args[0].value)
    return names


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules imported anywhere in the file."""
    found = set()
    for name in _imported_names(ast.parse(path.read_text()), modules):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and _package(name) in FOLDERS:
            found.add(name)
    return found


@functools.lru_cache(maxsize=None)
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        deps = _imports(path, modules) - {name}
        # A package __init__ is not a dependency of its own submodules
        # (the root's is: ``import dpsynth`` runs the API's re-exports).
        graph[name] = {d for d in deps if d == ROOT_PACKAGE
                       or not name.startswith(d + ".")}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts with more than one node (Tarjan), each
    sorted: every import circle is inside one of them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    parts = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                parts.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(parts)


def _room_of(path: Path, folder: Path) -> str:
    """The room of ``folder`` a file is in: its subfolder, or the file
    itself when it sits loose in ``folder``."""
    rel = path.relative_to(folder).parts
    return rel[0] + "/" if len(rel) > 1 else rel[0]


def _in_rooms(path: Path, folder: Path) -> bool:
    """Under ``folder``, but not its own ``__init__.py`` (a package's front
    door, not a room) nor a cache."""
    return (folder in path.parents and path != folder / "__init__.py"
            and "__pycache__" not in path.parts)


def _room_graph(folder: Path) -> dict[str, set[str]]:
    """``folder``'s rooms with code and the rooms each imports."""
    modules = _modules()
    graph = _graph()
    rooms: dict[str, set[str]] = {}
    for name, path in modules.items():
        if not _in_rooms(path, folder):
            continue
        room = rooms.setdefault(_room_of(path, folder), set())
        for dep in graph[name]:
            if _in_rooms(modules[dep], folder):
                room.add(_room_of(modules[dep], folder))
        room.discard(_room_of(path, folder))
    return rooms


def _folders_with_rooms() -> list[Path]:
    """Every folder of FOLDERS (at any depth) with a subfolder of code."""
    found = []
    for top in FOLDERS:
        for folder in [ROOT / top, *sorted((ROOT / top).rglob("*"))]:
            if folder.is_dir() and any(
                    sub.is_dir() and any(sub.rglob("*.py"))
                    for sub in folder.iterdir()):
                found.append(folder)
    return found


def test_no_import_circles():
    circles = _circles(_graph())
    assert not circles, "import circles: " + "; ".join(
        " <-> ".join(c) for c in circles)


def test_no_circle_between_the_rooms_of_a_folder():
    """Inside each folder, its subfolders and loose modules import each
    other one way only (``pipelines/``: cli/ -> release/ -> runners/)."""
    bad = []
    for folder in _folders_with_rooms():
        for circle in _circles(_room_graph(folder)):
            bad.append(f"{folder.relative_to(ROOT)}/: " + " <-> ".join(circle))
    assert not bad, "circles between rooms: " + "; ".join(bad)


def test_string_imports_are_seen():
    """``options`` imports the Dask runner by name: an arrow too."""
    graph = _graph()
    assert ("dpsynth.pipelines.runners.dask.runner"
            in graph["dpsynth.pipelines.runners.options"])
    assert any(n.startswith("benchmarks.") for n in graph)


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


def test_study_data_sits_apart_from_the_code():
    """Measurements live under benchmarks/results/ (issue 62), not among
    the benchmarks' and studies' code."""
    data = [p for p in (ROOT / "benchmarks").rglob("*")
            if p.suffix in (".json", ".jsonl", ".csv")]
    assert data
    assert all((ROOT / "benchmarks" / "results") in p.parents
               for p in data), [str(p) for p in data
                                if "results" not in p.parts]


# ------------------------------------------------------------- the picture

def _floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """1 for a room importing no other room, else 1 + its highest
    import's floor (rooms of one circle share a floor)."""
    part_of = {n: tuple(c) for c in _circles(graph) for n in c}
    floors: dict[str, int] = {}

    def floor(node: str) -> int:
        if node not in floors:
            floors[node] = 1  # a guard while a circle is followed
            same = part_of.get(node, (node,))
            deps = {d for n in same for d in graph.get(n, ())} - set(same)
            floors.update({n: 1 + max((floor(d) for d in deps), default=0)
                           for n in same})
        return floors[node]

    for node in graph:
        floor(node)
    return floors


def _lines(paths) -> int:
    return sum(len(p.read_bytes().splitlines()) for p in paths)


def _room_table(title: str, graph: dict[str, set[str]],
                files: dict[str, list[Path]]) -> list[str]:
    floors = _floors(graph)
    arrows = sum(len(d) for d in graph.values())
    circles = _circles(graph)
    out = [f"{title}: {len(graph)} rooms on {len(set(floors.values()))} "
           f"floors, {arrows} arrows between rooms, {len(circles)} circles"]
    out.append(f"  {'floor':>5}  {'room':<24} {'.py':>4} {'lines':>6} "
               f"{'data lines':>10}  imports")
    for room in sorted(graph, key=lambda r: (-floors[r], r)):
        py = [p for p in files[room] if p.suffix == ".py"]
        data = [p for p in files[room]
                if p.suffix in (".json", ".jsonl", ".csv")]
        out.append(f"  {floors[room]:>5}  {room:<24} {len(py):>4} "
                   f"{_lines(py):>6} {_lines(data):>10}  "
                   f"{', '.join(sorted(graph[room])) or '-'}")
    for circle in circles:
        out.append("  circle: " + " <-> ".join(circle))
    return out


def summary() -> str:
    """The layout in numbers (what ``python -m tests.test_layout`` prints)."""
    graph = _graph()
    top: dict[str, set[str]] = {f: set() for f in FOLDERS}
    for mod, deps in graph.items():
        top[_package(mod)] |= {_package(d) for d in deps} - {_package(mod)}
    files = {f: [p for p in (ROOT / f).rglob("*") if p.is_file()
                 and "__pycache__" not in p.parts] for f in FOLDERS}
    out = _room_table("repository", top, files)
    for folder in _folders_with_rooms():
        rooms = _room_graph(folder)
        where: dict[str, list[Path]] = defaultdict(list)
        for p in folder.rglob("*"):
            if p.is_file() and _in_rooms(p, folder):
                where[_room_of(p, folder)].append(p)
        for room in where:  # data-only folders (benchmarks/results/) too
            if room.endswith("/"):
                rooms.setdefault(room, set())
        out += _room_table(f"{folder.relative_to(ROOT)}/", rooms, where)
    circles = _circles(graph)
    out.append(f"modules: {len(graph)}, imports between them: "
               f"{sum(len(d) for d in graph.values())}, module circles: "
               f"{len(circles)}")
    out += ["  circle: " + " <-> ".join(c) for c in circles]
    return "\n".join(out)


def test_summary_adds_up():
    """The picture counts every module once (``-s`` prints it)."""
    text = summary()
    print("\n" + text)
    assert text.startswith("repository: ")
    assert f"modules: {len(_modules())}," in text


if __name__ == "__main__":
    print(summary())
