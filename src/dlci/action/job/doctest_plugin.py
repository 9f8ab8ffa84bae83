"""pytest plugin of the tests step (``-p dlci.action.job.doctest_plugin``): doctests from the
project's own packages only (the folders dlci.action.job.doctests finds, one
``--dlci-doctest-package`` each).

A ``.py`` file inside one of them is collected as a doctest module, as ``--doctest-modules``
would; no other file is imported for its doctests, so a training script at the project's root
is left alone. The test files are collected as pytest would from its own paths (the command
line's, else ``testpaths``, else the current folder). A package those paths do not reach is
added to them for its doctests alone: the test files inside it are not collected. With
``--doctest-modules`` (pytest-args, or the project's ``addopts``) the plugin steps aside and
pytest collects every module, as before.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest
from _pytest.doctest import DoctestModule

from dlci.action.job.doctests import OPTION

ADDED = pytest.StashKey[list[Path]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("dlci").addoption(
        OPTION,
        action="append",
        default=[],
        dest="dlci_doctest_packages",
        metavar="FOLDER",
        help="dl-ci: collect doctests from this package's modules (repeatable)",
    )


def _everything(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "doctestmodules", False))


def _roots(config: pytest.Config) -> list[Path]:
    base = config.invocation_params.dir
    return [(base / p).resolve() for p in config.option.dlci_doctest_packages]


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Add the packages pytest's own paths do not reach, to collect their doctests."""
    added: list[Path] = []
    if not _everything(config):
        base = config.invocation_params.dir
        reached = [(base / a.split("::")[0]).resolve() for a in config.args]
        for root in _roots(config):
            if not _under(root, reached):
                config.args.append(str(root))
                added.append(root)
    config.stash[ADDED] = added


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(
    file_path: Path, parent: pytest.Collector
) -> Generator[None, list[pytest.Collector], list[pytest.Collector]]:
    collected = yield
    config = parent.config
    if file_path.suffix != ".py" or _everything(config):
        return collected
    if _under(file_path, config.stash.get(ADDED, [])):  # there for its doctests alone
        collected = [
            c for c in collected if not isinstance(c, pytest.Module) or isinstance(c, DoctestModule)
        ]
    if file_path.name not in ("setup.py", "__main__.py") and _under(file_path, _roots(config)):
        collected.append(DoctestModule.from_parent(parent, path=file_path))
    return collected


def pytest_report_header(config: pytest.Config) -> str:
    if _everything(config):
        return "dl-ci doctests: every module (--doctest-modules)"
    roots = config.option.dlci_doctest_packages
    if not roots:
        return (
            "dl-ci doctests: none, no package of the project's own found (src/, pyproject's "
            "packages, top-level folders with __init__.py)"
        )
    return (
        f"dl-ci doctests: the modules of {', '.join(roots)} "
        "(--doctest-modules in pytest-args collects every module)"
    )
