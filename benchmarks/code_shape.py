"""The shape of the source tree: module sizes and function lengths.

    python benchmarks/code_shape.py [--json] [ROOT]

Prints the largest modules, every function over 60 lines (and whether it carries a
``# long:`` comment saying why), the median function length, the number of modules and of
lines, the untyped edges (``dict[str, Any]``, ``.get("...")`` reads), and the
package's own imports inside functions (each must say why, on its line or the line above:
what it keeps off the host side, out of the pytest plugin, or which cycle it breaks).
A report, not a rule: scripts/test.sh prints it at the end of every run, and a module that
does one job may be long (tests/test_house.py guards the imports instead).
"""

from __future__ import annotations

import ast
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MODULE_LIMIT = 400  # lines
FUNCTION_LIMIT = 60  # lines, unless the function says why with a "# long:" comment


@dataclass(frozen=True)
class Function:
    path: str
    name: str
    line: int
    length: int
    explained: bool


def functions(path: Path, root: Path) -> list[Function]:
    """Every function and method of one file with its length in lines."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            end = node.end_lineno or node.lineno
            body = lines[first - 1 : end]
            explained = any("# long:" in text for text in body[:4])
            found.append(
                Function(
                    str(path.relative_to(root)), node.name, node.lineno, end - first + 1, explained
                )
            )
    return found


@dataclass(frozen=True)
class InnerImport:
    path: str
    line: int
    module: str
    explained: bool


def inner_imports(path: Path, root: Path) -> list[InnerImport]:
    """The package's own imports inside a function (relative ones too), each with whether a
    comment on its line or the line above says why it is not at the top."""
    package = path.relative_to(root).parts[0]
    lines = path.read_text(encoding="utf-8").splitlines()
    found: dict[int, InnerImport] = {}
    for node in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for sub in ast.walk(node):
            name = (sub.module or "") if isinstance(sub, ast.ImportFrom) else ""
            if isinstance(sub, ast.ImportFrom) and (sub.level or name.split(".")[0] == package):
                above = lines[sub.lineno - 2].strip() if sub.lineno > 1 else ""
                said = "#" in lines[sub.lineno - 1] or above.startswith("#")
                relative = str(path.relative_to(root))
                found[sub.lineno] = InnerImport(relative, sub.lineno, name, said)
    return [found[line] for line in sorted(found)]


def shape(root: Path) -> dict[str, Any]:
    """Module sizes and function lengths under ``root``."""
    modules = {
        str(p.relative_to(root)): len(p.read_text(encoding="utf-8").splitlines())
        for p in sorted(root.rglob("*.py"))
    }
    funcs = [f for p in sorted(root.rglob("*.py")) for f in functions(p, root)]
    long = sorted((f for f in funcs if f.length > FUNCTION_LIMIT), key=lambda f: -f.length)
    inner = [i for p in sorted(root.rglob("*.py")) for i in inner_imports(p, root)]
    texts = [p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.py"))]
    return {
        "modules": len(modules),
        "largest_modules": sorted(modules.items(), key=lambda kv: -kv[1])[:8],
        "modules_over_limit": [m for m, n in modules.items() if n > MODULE_LIMIT],
        "functions": len(funcs),
        "median_function_lines": statistics.median(f.length for f in funcs) if funcs else 0,
        "functions_over_limit": [asdict(f) for f in long],
        "lines": sum(modules.values()),
        # the untyped edges issue 45 counts: dicts of anything, and fields read by name
        "dict_str_any": sum(t.count("dict[str, Any]") for t in texts),
        "get_reads": sum(t.count('.get("') for t in texts),
        "inner_imports": len(inner),
        "inner_imports_unexplained": [asdict(i) for i in inner if not i.explained],
    }


def main(argv: list[str]) -> int:
    as_json = "--json" in argv
    rest = [a for a in argv if a != "--json"]
    root = Path(rest[0]) if rest else Path(__file__).resolve().parent.parent / "src"
    data = shape(root)
    if as_json:
        print(json.dumps(data, indent=2))
        return 0
    print(
        f"modules: {data['modules']}, functions: {data['functions']}, "
        f"median function: {data['median_function_lines']} lines, lines: {data['lines']}"
    )
    print(f'dict[str, Any]: {data["dict_str_any"]}, .get("...") reads: {data["get_reads"]}')
    for name, size in data["largest_modules"]:
        print(f"  {size:5d}  {name}")
    over = data["functions_over_limit"]
    print(f"functions over {FUNCTION_LIMIT} lines: {len(over)}")
    for f in over:
        note = "" if not f["explained"] else "  (says why)"
        print(f"  {f['length']:4d}  {f['path']}:{f['line']} {f['name']}{note}")
    bare = data["inner_imports_unexplained"]
    print(f"imports inside functions: {data['inner_imports']}, {len(bare)} without a reason")
    for i in bare:
        print(f"  {i['path']}:{i['line']} {i['module']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
