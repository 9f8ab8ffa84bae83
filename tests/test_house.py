"""The plan of the house holds: thin verbs, small modules, short functions, the public API.

The limits are the ones docs/architecture.md states; benchmarks/code_shape.py prints the figures.
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


def test_no_module_is_over_the_limit() -> None:
    data = shape.shape(SRC / "dlci")
    assert data["modules_over_limit"] == []


def test_no_function_is_over_the_limit_without_saying_why() -> None:
    data = shape.shape(SRC / "dlci")
    unexplained = [
        f"{f['path']}:{f['line']} {f['name']} ({f['length']} lines)"
        for f in data["functions_over_limit"]
        if not f["explained"]
    ]
    assert unexplained == []


def test_the_shape_check_can_fail(tmp_path: Path) -> None:
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


# The rooms from the bottom up: a module imports only from its own room or a lower one
# (docs/architecture.md draws the same order). Function-level imports count too.
LEVELS = {
    "errors": 0, "fsutil": 0, "jsonio": 0, "policy": 0, "progress": 0, "__version__": 0,
    "report": 1,
    "hardware": 2,
    "ladder": 3,
    "memorization": 4,
    "checks": 5, "profiling": 5, "calibration": 5,
    "action": 6, "config": 6,
    "commands": 7, "pytest_plugin": 7,
    "cli": 8, "__main__": 9,
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
    (tmp_path / "dlci" / "ladder" / "load.py").write_text("from dlci.action.image import build\n")
    assert upward_imports(tmp_path / "dlci") == ["dlci.ladder.load imports dlci.action.image"]
