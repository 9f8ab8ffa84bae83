"""A pull request edits what the host trusts: the parent of its ladder and its own waiver.

The real action.yml under act with the real Docker engine, two jobs of one repository (the
digits example as the user's project, at the pull request's head):

- the user's ladder in ci/ extends a parent in ladders/ (a relative path across folders); the
  pull request edits only the parent (max_epochs 100000, max_loss 100, time cap 600 minutes);
- the target's training inputs are far from unit scale, so of the doctor's checks
  input-normalization alone fails; the pull request adds a warn-only waiver for it in its
  pyproject.toml.

On the pull_request event both are the pull request's own proposals: the host reads the
ladder and the configuration from the base commit (preflight, before any of the pull
request's code runs); the tier in the action's output, in preflight.json and in the
memorization step's own report is the base commit's; the doctor in its container reads the
base commit's snapshot, the check fails, the job fails at the doctor's gate and the summary
says the waiver takes effect once merged. The control is the same head on a push (trusted):
both edits are taken (the greedy tier, the waiver listed with its reason and where it was set),
so the first job shows the protection. One pair of jobs serves both protections, which had a
pair each before (the suite's time).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_act import git
from test_action import act, job, kit_copy, user_repo

pytestmark = pytest.mark.e2e

PARENT = """version: 1
extends: default
revision: team
budgets:
  pr:
    cpu: {max_epochs: 100, max_loss: 1.0, time_cap_minutes: 3}
"""
CHILD = "version: 1\nextends: ../ladders/team.yaml\nrevision: ci\n"
GREEDY = PARENT.replace("max_epochs: 100,", "max_epochs: 100000,").replace(
    "max_loss: 1.0, time_cap_minutes: 3", "max_loss: 100, time_cap_minutes: 600"
)
KEYS = ("max_epochs", "max_loss", "time_cap_minutes")
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
# What the memorization step in the container used (its own report), and what preflight kept.
USED = (
    "import json, sys; t = json.load(open(sys.argv[1]))['tier']; "
    f"print(json.dumps([t[k] for k in {list(KEYS)!r}]))"
)
KEPT = "import json, sys; print(json.dumps(json.load(open(sys.argv[1]))[sys.argv[2]]))"


def workflow(kit_image: str) -> str:
    return job(
        f"""
- uses: actions/checkout@v4
- id: dlci
  uses: org/dl-ci@v1
  with:
    budget: pr
    ladder: ci/ladder.yaml
    working-directory: project
    image: {kit_image}
    target: digits_example.unscaled:make_target
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
    echo "used=$(python3 -c "{USED}" "$art/memorization.json")" >> "$GITHUB_OUTPUT"
    echo "ladder=$(python3 -c "{KEPT}" "$art/preflight.json" ladder)" >> "$GITHUB_OUTPUT"
    echo "config=$(python3 -c "{KEPT}" "$art/preflight.json" config)" >> "$GITHUB_OUTPUT"
""",
        on="[push, pull_request]",
    )


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory, kit_image: str, act_bin: Path):
    """The pull request's job and the push of the same head: (runs, base commit)."""
    tmp_path = tmp_path_factory.mktemp("trust-config")
    kit = kit_copy(tmp_path / "kit")
    repo = tmp_path / "repo"
    for name, text in (("ci/ladder.yaml", CHILD), ("ladders/team.yaml", PARENT)):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    user_repo(tmp_path, kit, workflow(kit_image))
    (repo / "project" / "digits_example" / "unscaled.py").write_text(UNSCALED)
    git(repo, "add", "--all")
    git(repo, "commit", "--quiet", "--message", "the unscaled target")
    base = git(repo, "rev-parse", "HEAD")
    # the attacks: only the parent ladder changes, and the pull request waives its own check
    (repo / "ladders" / "team.yaml").write_text(GREEDY)
    pyproject = repo / "project" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + WAIVER)
    git(repo, "commit", "--quiet", "--all", "--message", "more GPU for me, and waive it")
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
    runs = {}
    for name, extra in (("pull", {"event": "pull_request", "payload": event}), ("push", {})):
        folder = tmp_path / name
        folder.mkdir()
        runs[name] = act(act_bin, folder, repo, kit=kit, **extra)
        print(f"{name} job under act: {runs[name].seconds:.1f} s")
    return runs, base


def _tier(run) -> list[float]:
    tier = json.loads(run.outputs("dlci")["tier"])
    return [tier[k] for k in KEYS]


def test_a_pull_request_cannot_raise_its_budget_through_the_parent_ladder(jobs) -> None:
    runs, base = jobs
    run = runs["pull"]
    assert run.outputs("dlci").get("tier"), run.explain()
    assert _tier(run) == [100, 1.0, 3]  # the base commit's chain, not 100000 / 100 / 600
    check = run.outputs("check")
    assert json.loads(check["used"]) == [100, 1.0, 3], run.explain()  # the container's too
    ladder = json.loads(check["ladder"])
    assert ladder["verified"] is True
    assert ladder["used"] == f"{base[:12]}:ci/ladder.yaml"
    assert "the pull request changes ladders/team.yaml" in ladder["notes"][0]


def test_a_pull_request_cannot_waive_its_own_failing_check(jobs) -> None:
    run = jobs[0]["pull"]
    assert run.outputs("dlci").get("verdict") == "fail", run.explain()
    assert run.job_result() == "failure"
    config = json.loads(run.outputs("check")["config"])
    assert config["policy"]["waivers"] == []  # the base commit's policy: no waiver
    summary = "".join(run.summaries())
    assert "step doctor failed" in summary, summary
    assert f"| `{CHECK}` | ❌ fail |" in summary  # the check itself, not another one
    assert f"the pull request adds a waiver for {CHECK}: it takes effect once merged" in summary
    assert "### Waived checks" not in summary


def test_control_the_same_edits_on_a_push_are_taken(jobs) -> None:
    run = jobs[0]["push"]
    assert run.outputs("dlci").get("verdict") == "pass", run.explain()
    assert run.job_result() == "success"
    assert _tier(run) == [100000, 100, 600]  # the edit works where the ladder is trusted
    check = run.outputs("check")
    assert json.loads(check["used"]) == [100000, 100, 600], run.explain()
    assert json.loads(check["ladder"])["notes"] == []
    summary = "".join(run.summaries())
    assert "### Waived checks" in summary
    assert f"| `{CHECK}` | warn-only | the inputs are raw pixel counts" in summary
    assert "project/pyproject.toml:" in summary
