"""action.yml and the workflows, checked statically: what the e2e runs cannot reach.

The uploads (actions/upload-artifact, codecov/codecov-action) need GitHub's servers, so act
runs them switched off; here their wiring is checked instead. actionlint and
check-jsonschema (GitHub's published schemas) validate the files as part of the tests.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
STEPS = ACTION["runs"]["steps"]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml")) + sorted(
    (ROOT / "examples" / "workflows").glob("*.yml")
)


def step(name_part: str) -> dict:
    return next(s for s in STEPS if name_part in s.get("name", ""))


def test_every_input_is_documented_has_a_default_and_is_used() -> None:
    text = (ROOT / "action.yml").read_text()
    for name, spec in ACTION["inputs"].items():
        assert spec.get("description"), name
        assert "default" in spec, name
        assert re.search(rf"inputs\.{re.escape(name)}\b(?!-)", text), f"input {name} is unused"


def test_inputs_never_reach_a_shell_line() -> None:
    for s in STEPS:
        assert "${{" not in s.get("run", ""), s["name"]


def test_third_party_actions_are_pinned_to_a_commit() -> None:
    used = [s["uses"] for s in STEPS if "uses" in s]
    assert used, "no upload steps"
    for ref in used:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), ref


def test_uploads_always_run_with_unique_names_and_a_flag_per_class() -> None:
    upload = next(s for s in STEPS if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"].startswith("always()")
    assert upload["with"]["name"] == "${{ steps.summary.outputs.artifact-name }}"
    codecov = next(s for s in STEPS if s.get("uses", "").startswith("codecov/codecov-action@"))
    assert codecov["if"].startswith("always()")
    assert codecov["with"]["flags"] == "${{ steps.preflight.outputs.hardware-class }}"
    # the host's own copy of the reports (regular files only), never the workspace's folder
    assert upload["with"]["path"] == "${{ steps.summary.outputs.artifacts-dir }}"
    assert codecov["with"]["files"] == "${{ steps.summary.outputs.artifacts-dir }}/coverage.xml"


def upload_problems(results: dict, coverage: dict) -> list[str]:
    """What is wrong with the test-results upload step, beside the coverage one."""
    want = {
        "report_type": "test_results",
        # the host's verified copy, alone: no search for a junit*.xml the workspace plants
        "files": "${{ steps.summary.outputs.artifacts-dir }}/junit.xml",
        "disable_search": "true",
        "flags": coverage["with"]["flags"],
        "token": "${{ inputs.codecov-token }}",
        "fail_ci_if_error": False,  # never fails the job
    }
    problems = [
        f"{k}: {results['with'].get(k)!r}" for k, v in want.items() if results["with"].get(k) != v
    ]
    if results["uses"] != coverage["uses"] or not re.fullmatch(
        r"[\w/.-]+@[0-9a-f]{40}", results["uses"]
    ):
        problems.append(f"uses: {results['uses']}")  # Codecov's own action, pinned, as for coverage
    for part in ("always()", "inputs.codecov == 'true'", "inputs.codecov-test-results == 'true'"):
        if part not in results["if"]:
            problems.append(f"if: no {part}")
    return problems


def test_junit_goes_to_codecovs_test_analytics_pinned_and_opt_out() -> None:
    results, coverage = step("Upload test results to Codecov"), step("Upload coverage to Codecov")
    assert upload_problems(results, coverage) == []
    assert ACTION["inputs"]["codecov-test-results"]["default"] == "true"
    # control: the check sees a workspace file, a search, a tag, a step without its opt-out
    bad = {
        "uses": "codecov/test-results-action@v1",
        "if": "always() && inputs.codecov == 'true'",
        "with": {**results["with"], "files": "dlci-artifacts/junit.xml", "disable_search": "false"},
    }
    assert len(upload_problems(bad, coverage)) == 4


def test_every_pinned_action_names_its_version() -> None:
    lines = [line for line in (ROOT / "action.yml").read_text().splitlines() if "uses:" in line]
    assert len(lines) == len([s for s in STEPS if "uses" in s]) >= 3
    for line in lines:
        assert re.search(r"uses: [\w/.-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+$", line), line


def test_cleanup_and_summary_always_run_after_the_container() -> None:
    names = [s["name"] for s in STEPS]
    run_at = names.index(step("in the container")["name"])
    for part in ("Clean up", "Job summary"):
        s = step(part)
        assert s["if"] == "always()"
        assert names.index(s["name"]) > run_at


def plan_writers(steps: list[dict]) -> list[str]:
    """The steps that run dlci preflight, or name preflight.json other than to read it as the
    job plan (``--plan FILE``)."""
    found = []
    for s in steps:
        run = s.get("run", "")
        if "dlci preflight" in run or "preflight.json" in re.sub(r"--plan \S+", "", run):
            found.append(s["name"])
    return found


def test_the_job_plan_is_written_once_by_preflight_alone() -> None:
    """Preflight sizes the profile from the baseline itself: no later step rewrites the plan
    (the control: the separate sizing step that rewrote it is found)."""
    pre = step("Preflight")
    assert plan_writers(STEPS) == [pre["name"]]
    assert {"DLCI_BASELINE", "DLCI_ARTIFACT_PREFIX", "DLCI_GITHUB_TOKEN"} <= set(pre["env"])
    assert '--base-dir "$base"' in pre["run"] and "continue-on-error" not in pre
    # the folder the comparison reads again is the one preflight keeps the baseline in
    keep = re.search(r'base="([^"]+)"', pre["run"])
    assert keep and f'base="{keep.group(1)}"' in step("Compare with the baseline")["run"]
    old = {
        "name": "Size the profile from the baseline",
        "run": 'dlci baseline --size-profile "$GITHUB_WORKSPACE/dlci-artifacts/preflight.json"',
    }
    assert plan_writers([*STEPS, old]) == [pre["name"], old["name"]]


def test_the_codecov_token_stays_on_the_host() -> None:
    for s in STEPS:
        if "uses" not in s:
            assert "codecov-token" not in str(s.get("env", {})), s["name"]


def test_every_output_comes_from_a_step_that_exists() -> None:
    ids = {s.get("id") for s in STEPS}
    for name, spec in ACTION["outputs"].items():
        match = re.fullmatch(r"\$\{\{ steps\.([\w-]+)\.outputs\.([\w-]+) \}\}", spec["value"])
        assert match, name
        assert match.group(1) in ids, name


def _tool(name: str) -> str:
    found = shutil.which(name) or str(Path(sys.executable).parent / name)
    if not Path(found).exists():
        pytest.fail(f"{name} is missing: pip install -e '.[dev]'", pytrace=False)
    return found


def test_check_jsonschema_accepts_the_action_and_the_workflows() -> None:
    tool = _tool("check-jsonschema")
    done = subprocess.run(
        [tool, "--builtin-schema", "vendor.github-actions", str(ROOT / "action.yml")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    if WORKFLOWS:
        done = subprocess.run(
            [tool, "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_accepts_the_workflows() -> None:
    tool = _tool("actionlint")
    done = subprocess.run([tool, *map(str, WORKFLOWS)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
