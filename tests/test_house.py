"""The plan of the house holds: thin verbs, one-way imports between rooms, no import cycle, no
private name taken across modules, the public API. Sizes are a report
(benchmarks/code_shape.py, printed at the end of scripts/test.sh), not a rule.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

from dlci import cli

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
VERB_MODULE_LIMIT = 120


def _shape_module():
    spec = importlib.util.spec_from_file_location(
        "code_shape", ROOT / "benchmarks" / "code_shape.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["code_shape"] = module
    spec.loader.exec_module(module)
    return module


shape = _shape_module()


def test_every_public_name_imports() -> None:
    import dlci

    for name in dlci.__all__:
        assert getattr(dlci, name) is not None, name
    from dlci.memorization.testing import assert_memorizes

    assert dlci.assert_memorizes is assert_memorizes
    assert callable(dlci.Target) and callable(dlci.profile) and callable(dlci.Instruments)


@pytest.mark.parametrize("verb", sorted(set(cli.VERBS) | set(getattr(cli, "ALIASES", {}))))
def test_every_verb_is_a_thin_main(verb: str) -> None:
    module_name = getattr(cli, "ALIASES", {}).get(verb, verb)
    module = importlib.import_module(f"dlci.commands.{module_name.replace('-', '_')}")
    assert callable(module.main)
    path = Path(module.__file__ or "")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= VERB_MODULE_LIMIT, f"{path.name}: {len(lines)} lines"
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(ast.parse("\n".join(lines)))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (
            node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
        )
    }
    assert not imported & {"subprocess", "docker", "numpy", "torch"}, f"{path.name}: {imported}"


def test_the_shape_is_a_report(tmp_path: Path) -> None:
    """Sizes are reported (benchmarks/code_shape.py, printed by scripts/test.sh), not enforced:
    a module that does one job may be long. The report itself must see a long one."""
    body = "\n".join(f"    x{i} = {i}" for i in range(shape.FUNCTION_LIMIT + 1))
    (tmp_path / "big.py").write_text(
        f"def long_one():\n{body}\n\n\ndef said_why():\n    # long: a table\n{body}\n"
        + "\n" * shape.MODULE_LIMIT
    )
    data = shape.shape(tmp_path)
    assert data["modules_over_limit"] == ["big.py"]
    assert sorted((f["name"], f["explained"]) for f in data["functions_over_limit"]) == [
        ("long_one", False),
        ("said_why", True),
    ]


def test_every_import_inside_a_function_says_why(tmp_path: Path) -> None:
    """The package's imports sit at the top; one inside a function says, on its line or the
    line above, what it keeps off the host side or out of the pytest plugin (the control: a
    bare one is found, a relative one too, and one with its reason is not)."""
    data = shape.shape(SRC)
    assert data["inner_imports_unexplained"] == []
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        "def bare():\n    from pkg import a\n    from . import b\n    import json\n\n\n"
        "def said():\n    # numpy: off the host side\n    from pkg.c import d\n"
        "    from pkg import e  # as above\n"
    )
    control = shape.shape(tmp_path)
    assert control["inner_imports"] == 4
    assert [(i["line"], i["module"]) for i in control["inner_imports_unexplained"]] == [
        (2, "pkg"),
        (3, ""),
    ]


def _module_name(path: Path, root: Path) -> str:
    parts = path.with_suffix("").relative_to(root.parent).parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _from_base(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` names, a relative one resolved."""
    if not node.level:
        return node.module or ""
    package = module.split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    package = package[: len(package) - node.level + 1]
    return ".".join(package + ([node.module] if node.module else []))


def module_imports(root: Path) -> dict[str, dict[str, set[str]]]:
    """Each module of the package at ``root``: the package's modules it imports, and the names
    it takes from each (its own attribute reads ``module._name`` included). Every import
    counts: at the top, inside a function, under ``if TYPE_CHECKING:``."""
    paths = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, dict[str, set[str]]] = {}
    for module, path in paths.items():
        edges: dict[str, set[str]] = {}
        bound: dict[str, str] = {}  # a local name bound to one of the package's modules
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _from_base(module, path, node)
                if base.split(".")[0] != root.name:
                    continue
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    if full in paths:  # a module taken from its package
                        edges.setdefault(full, set())
                        bound[alias.asname or alias.name] = full
                    else:
                        edges.setdefault(base, set()).add(alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == root.name:
                        edges.setdefault(alias.name, set())
                        if alias.asname:
                            bound[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
            ):
                edges.setdefault(bound[node.value.id], set()).add(node.attr)
        graph[module] = {target: names for target, names in edges.items() if target != module}
    return graph


def import_cycles(root: Path) -> list[list[str]]:
    """Groups of modules that import each other, however indirectly (Tarjan's components)."""
    graph = module_imports(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, {}):
            if nxt not in graph:
                continue  # not a module of the package
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def private_names_taken(root: Path) -> list[str]:
    """``_name`` taken from another module: by import, or read as ``module._name``."""
    return [
        f"{module} takes {name} from {target}"
        for module, edges in sorted(module_imports(root).items())
        for target, names in sorted(edges.items())
        for name in sorted(names)
        if name.startswith("_") and not name.startswith("__")
    ]


def test_no_module_imports_itself_through_others() -> None:
    assert import_cycles(SRC / "dlci") == []


def test_no_private_name_is_taken_from_another_module() -> None:
    assert private_names_taken(SRC / "dlci") == []


def test_the_cycle_and_privacy_checks_can_fail(tmp_path: Path) -> None:
    pkg = tmp_path / "dlci"
    (pkg / "profiling").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "profiling" / "__init__.py").write_text("")
    # cycles closed by an import inside a function, one under TYPE_CHECKING, relative ones
    (pkg / "profiling" / "capture.py").write_text(
        "def run():\n    from dlci.profiling.memcapture import measure\n"
    )
    (pkg / "profiling" / "memcapture.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from dlci.profiling import capture\n"
        "def measure():\n    return capture._Trainer\n"
    )
    (pkg / "profiling" / "gate.py").write_text("from .batchfit import _advice\n")
    (pkg / "profiling" / "batchfit.py").write_text("from . import gate\n")
    assert import_cycles(pkg) == [
        ["dlci.profiling.batchfit", "dlci.profiling.gate"],
        ["dlci.profiling.capture", "dlci.profiling.memcapture"],
    ]
    assert private_names_taken(pkg) == [
        "dlci.profiling.gate takes _advice from dlci.profiling.batchfit",
        "dlci.profiling.memcapture takes _Trainer from dlci.profiling.capture",
    ]


# The rooms from the bottom up: a module imports only from its own room or a lower one
# (docs/architecture.md draws the same order). Function-level imports count too.
LEVELS = {
    "errors": 0, "fsutil": 0, "jsonio": 0, "policy": 0, "progress": 0, "schema": 0,
    "__version__": 0,
    "compare": 1, "trust": 1,
    "report": 2,
    "hardware": 2,
    "ladder": 3,
    "training": 4,
    "memorization": 5,
    "checks": 6, "profiling": 6, "calibration": 6,
    "action": 7, "config": 7,
    "bisect": 7,
    "script": 7,
    "commands": 8, "pytest_plugin": 8,
    "cli": 9, "__main__": 10,
}  # fmt: skip


def upward_imports(root: Path) -> list[str]:
    """Imports from a room above the importing module's own room."""

    def room(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else "__version__"

    found = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.with_suffix("").relative_to(root.parent).parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = (
                    [node.module]
                    if node.module != "dlci"
                    else [f"dlci.{a.name}" for a in node.names]
                )
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith("dlci.") and LEVELS[room(name)] > LEVELS[room(module)]:
                    found.append(f"{module} imports {name}")
    return found


def test_every_import_points_down_the_house() -> None:
    assert set(LEVELS) >= {
        p.stem if p.is_file() else p.name
        for p in (SRC / "dlci").iterdir()
        if p.suffix == ".py" or (p / "__init__.py").exists()
    } - {"__init__"}
    assert upward_imports(SRC / "dlci") == []


def test_the_import_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "dlci" / "ladder").mkdir(parents=True)
    (tmp_path / "dlci" / "ladder" / "load.py").write_text(
        "from dlci.action.host.image import build\n"
    )
    assert upward_imports(tmp_path / "dlci") == ["dlci.ladder.load imports dlci.action.host.image"]
