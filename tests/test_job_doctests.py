"""The tests step's doctests: the project's own packages (dlci.action.job.doctests) and the
pytest plugin that collects them from there alone (dlci.action.job.doctest_plugin).

A whole job over a project with a training script at its root is in tests/test_run_command.py.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from dlci.action.job.doctests import OPTION, PLUGIN, package_roots

INIT = "__init__.py"


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


@pytest.mark.parametrize(
    ("files", "roots"),
    [
        # the src/ layout wins over a top-level package (here, the tests' own)
        ({"src/a/" + INIT: "", "src/b/" + INIT: "", "tests/" + INIT: ""}, ["src/a", "src/b"]),
        # setuptools' packages: dotted names, their top-level folder once
        (
            {
                "pyproject.toml": '[tool.setuptools]\npackages = ["lib", "lib.sub"]\n',
                "lib/" + INIT: "",
                "tools/" + INIT: "",
            },
            ["lib"],
        ),
        # setuptools' packages.find: where and include
        (
            {
                "pyproject.toml": '[tool.setuptools.packages.find]\nwhere = ["code"]\n'
                'include = ["mine*"]\n',
                "code/mine/" + INIT: "",
                "code/other/" + INIT: "",
            },
            ["code/mine"],
        ),
        # hatch's wheel target
        (
            {
                "pyproject.toml": '[tool.hatch.build.targets.wheel]\npackages = ["model"]\n',
                "model/" + INIT: "",
                "scripts/" + INIT: "",
            },
            ["model"],
        ),
        # nothing configured: the top-level folders with an __init__.py
        ({"pkg/" + INIT: "", "data/x.py": "", ".hidden/" + INIT: ""}, ["pkg"]),
        # a configured folder that does not exist: the fallback
        (
            {"pyproject.toml": '[tool.setuptools]\npackages = ["gone"]\n', "pkg/" + INIT: ""},
            ["pkg"],
        ),
        ({"train.py": "", "pyproject.toml": "not toml ["}, []),
    ],
)
def test_the_projects_own_packages(tmp_path: Path, files: dict[str, str], roots: list[str]) -> None:
    assert package_roots(tree(tmp_path, files)) == roots


def test_doctests_from_a_package_that_testpaths_miss_and_no_test_file_of_it(
    pytester: pytest.Pytester,
) -> None:
    """testpaths = ["tests"] never reaches the package: it is added for its doctests alone
    (its test_inside.py is not collected), and train.py is never imported."""
    tree(
        pytester.path,
        {
            "pyproject.toml": '[tool.pytest.ini_options]\ntestpaths = ["tests"]\n',
            "pkg/" + INIT: "",
            "pkg/m.py": '''
                def f():
                    """
                    >>> f()
                    1
                    """
                    return 1
                ''',
            "pkg/test_inside.py": "def test_inside():\n    pass\n",
            "tests/test_a.py": "def test_a():\n    pass\n",
            "train.py": "import sys\nsys.exit(2)\n",
        },
    )
    result = pytester.runpytest("-p", PLUGIN, f"{OPTION}=pkg", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["dl-ci doctests: the modules of pkg *", "*pkg.m.f PASSED*"])
    result.stdout.no_fnmatch_line("*test_inside*")
    # control: without the plugin, the package's doctest is not collected
    pytester.runpytest().assert_outcomes(passed=1)
    # control: pytest's own collection (the plugin steps aside) over the root imports train.py
    result = pytester.runpytest("-p", PLUGIN, f"{OPTION}=pkg", "--doctest-modules", ".")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["dl-ci doctests: every module (--doctest-modules)"])
