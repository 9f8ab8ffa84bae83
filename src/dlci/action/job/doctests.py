"""Which folders the tests step collects doctests from: the project's own packages.

pytest's ``--doctest-modules`` imports every ``.py`` file under the paths it collects, so a
training script at the project's root that parses ``sys.argv`` or downloads data when it is
imported breaks the tests step. By default the step collects doctests from the modules of the
project's packages alone, found here and handed to the pytest plugin
dlci.action.job.doctest_plugin; the test files are collected as pytest would.
``--doctest-modules`` in ``pytest-args`` (or the project's pytest ``addopts``) gives pytest's
own collection, every module, back. Runs in the container; never imports torch or pytest.
"""

from __future__ import annotations

import fnmatch
import sys
from pathlib import Path
from typing import Any

#: the pytest plugin that collects them (``pytest -p``)
PLUGIN = "dlci.action.job.doctest_plugin"
OPTION = "--dlci-doctest-package"


def package_roots(root: Path) -> list[str]:
    """The project's own packages, as folders relative to ``root``: the ``src/`` layout's
    packages, else the top-level packages that pyproject.toml names (setuptools' ``packages``
    or ``packages.find``, hatch's wheel ``packages``), else the top-level folders with an
    ``__init__.py``. Only folders that exist; none when nothing is found.
    """
    found = _packages_in(root, root / "src")
    if not found:
        found = [p for p in _configured(root) if (root / p).is_dir()]
    if not found:
        found = _packages_in(root, root)
    return list(dict.fromkeys(found))


def _packages_in(root: Path, folder: Path, include: list[str] | None = None) -> list[str]:
    if not folder.is_dir():
        return []
    return [
        child.relative_to(root).as_posix()
        for child in sorted(folder.iterdir())
        if child.is_dir()
        and not child.name.startswith((".", "_"))
        and (child / "__init__.py").is_file()
        and (include is None or any(fnmatch.fnmatch(child.name, p) for p in include))
    ]


def _table(data: Any, *keys: str) -> dict[str, Any]:
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data if isinstance(data, dict) else {}


def _configured(root: Path) -> list[str]:
    """The top-level package folders pyproject.toml's build configuration names."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]
    try:
        data: dict[str, Any] = tomllib.loads((root / "pyproject.toml").read_text("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return []
    found: list[str] = []
    setuptools = _table(data, "tool", "setuptools")
    package_dir = _table(setuptools, "package-dir")
    base = str(package_dir.get("", "") or "")
    packages = setuptools.get("packages")
    if isinstance(packages, list):  # dotted names: their top-level folders
        for name in filter(None, (p for p in packages if isinstance(p, str))):
            top = name.split(".")[0]
            found.append(str(package_dir.get(top) or (f"{base}/{top}" if base else top)))
    find = _table(setuptools, "packages", "find")
    if find:
        where, include = find.get("where", ["."]), find.get("include")
        names = None
        if isinstance(include, list):  # patterns of dotted names: their top-level part
            names = [p.split(".")[0] for p in include if isinstance(p, str)]
        for folder in where if isinstance(where, list) else [where]:
            if isinstance(folder, str):
                found += _packages_in(root, root / folder, names)
    hatch = _table(data, "tool", "hatch", "build")
    for table in (_table(hatch, "targets", "wheel"), hatch):  # folders
        named = table.get("packages")
        if isinstance(named, list):
            found += [p for p in named if isinstance(p, str)]
    found = [p.strip("/") for p in found]
    return [p for p in found if p not in ("", ".") and ".." not in Path(p).parts]


def pytest_arguments(root: Path) -> list[str]:
    """The plugin and its folders, for the tests step's pytest command.

    The plugin is loaded even when no package is found: its header line says so.
    """
    args = ["-p", PLUGIN]
    for folder in package_roots(root):
        args.append(f"{OPTION}={folder}")
    return args
