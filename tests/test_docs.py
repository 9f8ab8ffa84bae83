"""The docs describe the format the code reads: every key, with the code's own words."""

from __future__ import annotations

import re
from pathlib import Path

from dlci.cli import VERBS
from dlci.ladder.format import CLASS_FIELDS, TIER_FIELDS, TOP_KEYS

ROOT = Path(__file__).resolve().parents[1]


def test_every_ladder_key_is_documented_with_its_description() -> None:
    doc = (ROOT / "docs" / "budget-ladder.md").read_text("utf-8")
    for spec in (*TIER_FIELDS, *CLASS_FIELDS):
        assert f"| `{spec.name}` |" in doc, spec.name
        assert spec.description in doc, spec.name
    for key, description in TOP_KEYS.items():
        assert f"| `{key}` | {description} |" in doc, key


def test_the_architecture_doc_names_every_verb_module() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text("utf-8")
    assert "commands/<verb>.py" in doc
    for verb in VERBS:
        module = verb.replace("-", "_")
        assert (ROOT / "src" / "dlci" / "commands" / f"{module}.py").exists(), verb


def test_ci_runs_the_readmes_test_command() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    assert "\nscripts/test.sh\n" in readme
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text("utf-8")


def test_every_check_id_is_documented() -> None:
    from dlci.checks import CHECK_IDS

    doc = (ROOT / "docs" / "doctor.md").read_text("utf-8")
    for check in CHECK_IDS:
        assert f"| `{check}` |" in doc, check


def test_every_utilization_report_key_is_documented(tmp_path) -> None:
    from dlci.profiling.metrics import analyze
    from dlci.profiling.reader import read_trace
    from tracegen import training_trace

    path = training_trace(steps=2, kernels=2).write(tmp_path / "t.json")
    report = analyze(read_trace(path))
    doc = (ROOT / "docs" / "profiling.md").read_text("utf-8")
    for key in report:
        assert f"`{key}`" in doc, key
    for key in report["devices"][0]:
        if key not in ("device", "name", "gpu_utilization"):
            assert f"`devices[].{key}`" in doc, key


def test_the_architecture_doc_names_every_module() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text("utf-8")
    families = next(line for line in doc.splitlines() if "<family>.py" in line)
    families += next(line for line in doc.splitlines()[doc.splitlines().index(families) + 1 :])
    missing = []
    for path in sorted((ROOT / "src" / "dlci").rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        in_family = path.parent.name == "checks" and re.search(rf"\b{path.stem}\b", families)
        a_verb = path.parent.name == "commands" and path.stem.replace("_", "-") in VERBS
        if path.name not in doc and not in_family and not a_verb:
            missing.append(str(path.relative_to(ROOT)))
    assert missing == []
