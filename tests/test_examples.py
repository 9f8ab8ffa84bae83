"""The bundled examples' own test suites (examples/digits, lightning, transformers), as a user
runs them: doctests, and memorization tests through the pytest plugin with ``--dlci-budget pr``.

One nested pytest runs all three (what each example's pyproject.toml collects: its tests/ and
its package, with --doctest-modules): one interpreter start and one import of torch instead of
three. Each example's count of passed tests is checked on its own, so one that collects
nothing, or fewer tests than it has, fails here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
#: each example's package, and how many tests (doctests included) its suite has
SUITES = {"digits": ("digits_example", 10), "lightning": ("lightning_example", 8)}
SUITES["transformers"] = ("transformers_example", 7)


def test_the_examples_own_tests_pass(tmp_path: Path) -> None:
    paths = []
    for name, (package, _) in SUITES.items():
        paths += [str(EXAMPLES / name / "tests"), str(EXAMPLES / name / package)]
    # dl-ci from this tree, whatever the environment's install of it points at
    pythonpath = os.pathsep.join(
        [str(EXAMPLES.parent / "src")] + [str(EXAMPLES / n) for n in SUITES]
    )
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=pythonpath)
    junit = tmp_path / "examples.xml"
    # The examples' pytest configurations are the same but for testpaths, and their dl-ci
    # configurations but for the default target, which no test uses (each names its own):
    # digits' stands for all three, from digits' folder, as its own run did.
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--dlci-budget", "pr"]
    argv += ["-c", str(EXAMPLES / "digits" / "pyproject.toml"), f"--junitxml={junit}"]
    argv += ["-o", "junit_family=xunit1", *paths]  # xunit1: each test's file
    done = subprocess.run(
        argv,
        cwd=EXAMPLES / "digits",
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    passed: Counter[str] = Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        if not any(child.tag in {"failure", "error", "skipped"} for child in case):
            # the file, relative to the run's root (digits' folder): its example's folder
            path = (EXAMPLES / "digits" / case.get("file", "?")).resolve()
            passed[path.relative_to(EXAMPLES).parts[0]] += 1
    assert passed == {name: count for name, (_, count) in SUITES.items()}, done.stdout[-3000:]
