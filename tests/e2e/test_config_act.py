"""A pull request waives its own failing doctor check, against the real action.yml under act.

The user's project (the digits example) trains a target whose inputs are far from unit
scale: the doctor's input-normalization check fails, and only that one. The pull request's
head adds a warn-only waiver for it in pyproject.toml. On the pull_request event the waiver
is the pull request's own proposal: the host reads the configuration from the base commit
(preflight.json's ``config``), the doctor in its container reads that snapshot, the check
fails, the job fails at the doctor's gate, and the job summary says the waiver takes effect
once merged. The control is the same waiver already in the base commit: the job passes and
the summary lists the waiver with its reason and where it was set.

The memorization test and the profile are switched off to keep the jobs short; each job's
time under act is printed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_act import git
from test_action import act, job, kit_copy, user_repo

pytestmark = pytest.mark.e2e

CHECK = "input-normalization"
# The example's target with its training inputs scaled far from unit scale: of the doctor's
# checks, input-normalization alone fails (label-alignment warns).
UNSCALED = '''"""The digits target with its training inputs far from unit scale."""

import torch
from torch.utils.data import DataLoader, TensorDataset

from digits_example.target import make_target as _make_target


def make_target():
    target = _make_target()
    data = target.train_loader.dataset
    xs = torch.stack([data[i][0] for i in range(len(data))]) * 40 + 25
    ys = torch.stack([torch.as_tensor(data[i][1]) for i in range(len(data))])
    target.train_loader = DataLoader(TensorDataset(xs, ys), batch_size=64, shuffle=True)
    return target
'''
WAIVER = f"""
[tool.dlci.doctor.checks.{CHECK}]
waive = "warn-only"
reason = "the inputs are raw pixel counts; normalization lands with the new loader"
"""


def workflow(kit_image: str) -> str:
    return job(
        f"""
- uses: actions/checkout@v4
- id: dlci
  uses: org/dl-ci@v1
  with:
    budget: pr
    working-directory: project
    image: {kit_image}
    target: digits_example.unscaled:make_target
    memorize: "false"
    profile: "false"
    doctest: "false"
    coverage: "false"
    tests: tests/test_digits.py
    pytest-args: -k "batches or every_class"
    upload-artifacts: "false"
- id: check
  if: always()
  run: |
    art="$GITHUB_WORKSPACE/dlci-artifacts"
    echo "config=$(python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['config']))" "$art/preflight.json")" >> "$GITHUB_OUTPUT"
""",
        on="[push, pull_request]",
    )


def pull_request(tmp_path: Path, kit_image: str, *, waiver_in_base: bool) -> tuple:
    """The kit, the user's repository at the pull request's head (which has the waiver), and
    the event's payload naming the base commit."""
    kit = kit_copy(tmp_path / "kit")
    repo = tmp_path / "repo"
    user_repo(tmp_path, kit, workflow(kit_image))
    (repo / "project" / "digits_example" / "unscaled.py").write_text(UNSCALED)
    pyproject = repo / "project" / "pyproject.toml"
    if waiver_in_base:
        pyproject.write_text(pyproject.read_text() + WAIVER)
    git(repo, "add", "--all")
    git(repo, "commit", "--quiet", "--message", "the unscaled target")
    base = git(repo, "rev-parse", "HEAD")
    if not waiver_in_base:
        pyproject.write_text(pyproject.read_text() + WAIVER)  # the pull request's proposal
    git(repo, "commit", "--quiet", "--all", "--allow-empty", "--message", "waive it")
    event = tmp_path / "event.json"
    event.write_text(
        json.dumps(
            {
                "pull_request": {
                    "head": {"repo": {"full_name": "org/project"}},
                    "base": {"sha": base},
                },
                "repository": {"full_name": "org/project"},
            }
        )
    )
    return kit, repo, event, base


def test_a_pull_request_cannot_waive_its_own_failing_check(
    tmp_path: Path, kit_image: str, act_bin: Path
) -> None:
    kit, repo, event, _base = pull_request(tmp_path, kit_image, waiver_in_base=False)
    run = act(act_bin, tmp_path, repo, kit=kit, event="pull_request", payload=event)
    print(f"pull request proposing a waiver, under act: {run.seconds:.1f} s")
    out = run.outputs("dlci")
    assert out.get("verdict") == "fail", run.explain()
    assert run.job_result() == "failure"
    config = json.loads(run.outputs("check")["config"])
    assert config["policy"]["waivers"] == []  # the base commit's policy: no waiver
    summary = "".join(run.summaries())
    assert "step doctor failed" in summary, summary
    assert f"| `{CHECK}` | ❌ fail |" in summary  # the check itself, not another one
    assert f"the pull request adds a waiver for {CHECK}: it takes effect once merged" in summary
    assert "### Waived checks" not in summary


def test_control_the_same_waiver_in_the_base_commit_applies(
    tmp_path: Path, kit_image: str, act_bin: Path
) -> None:
    kit, repo, event, base = pull_request(tmp_path, kit_image, waiver_in_base=True)
    run = act(act_bin, tmp_path, repo, kit=kit, event="pull_request", payload=event)
    print(f"pull request under a waiver of its base commit, under act: {run.seconds:.1f} s")
    out = run.outputs("dlci")
    assert out.get("verdict") == "pass", run.explain()
    assert run.job_result() == "success"
    summary = "".join(run.summaries())
    assert "### Waived checks" in summary
    assert f"| `{CHECK}` | warn-only | the inputs are raw pixel counts" in summary
    assert f"base commit {base[:12]}:project/pyproject.toml:" in summary
