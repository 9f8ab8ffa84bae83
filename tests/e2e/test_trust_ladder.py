"""A pull request raises its own budget by editing the parent of its ladder's ``extends``.

The real action under act with the real Docker engine: the user's repository has a ladder in
ci/ that extends a parent in ladders/ (a relative path across folders); the pull request
edits only the parent (max_epochs 100000, max_loss 100, time cap 600 minutes). On the
pull_request event the tier, and the memorization test in the container, must use the base
commit's values; the control is the same repository on a push (trusted), where the edited
values are taken: the edit is effective, so the first run shows the protection.

The tier is the host's decision (preflight, before any of the pull request's code runs): the
tests read it from the action's `tier` output and preflight.json, whatever the container
steps do after; the memorization step's own report must name the same tier.
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
# The tier the memorization step in the container used, from its own report.
USED = (
    "import json, sys; t = json.load(open(sys.argv[1]))['tier']; "
    f"print(json.dumps([t[k] for k in {list(KEYS)!r}]))"
)


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
    doctor: "false"
    profile: "false"
    doctest: "false"
    tests: tests/test_digits.py
    pytest-args: -k "not memoriz and not doctor"
    upload-artifacts: "false"
- id: check
  if: always()
  run: |
    art="$GITHUB_WORKSPACE/dlci-artifacts"
    echo "used=$(python3 -c "{USED}" "$art/memorization.json")" >> "$GITHUB_OUTPUT"
    echo "ladder=$(python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['ladder']))" "$art/preflight.json")" >> "$GITHUB_OUTPUT"
""",
        on="[push, pull_request]",
    )


@pytest.fixture
def greedy_pull_request(tmp_path: Path, kit_image: str) -> tuple[Path, Path, Path, str]:
    """The kit, the user's repository at the pull request's head, its event payload."""
    kit = kit_copy(tmp_path / "kit")
    repo = tmp_path / "repo"
    for name, text in (("ci/ladder.yaml", CHILD), ("ladders/team.yaml", PARENT)):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    user_repo(tmp_path, kit, workflow(kit_image))
    base = git(repo, "rev-parse", "HEAD")
    (repo / "ladders" / "team.yaml").write_text(GREEDY)  # the attack: only the parent changes
    git(repo, "commit", "--quiet", "--all", "--message", "more GPU for me")
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


def _tier(run) -> list[float]:
    tier = json.loads(run.outputs("dlci")["tier"])
    return [tier[k] for k in KEYS]


def test_a_pull_request_cannot_raise_its_budget_through_the_parent_ladder(
    tmp_path: Path, act_bin: Path, greedy_pull_request
) -> None:
    kit, repo, event, base = greedy_pull_request
    run = act(act_bin, tmp_path, repo, kit=kit, event="pull_request", payload=event)
    assert run.outputs("dlci").get("tier"), run.explain()
    assert _tier(run) == [100, 1.0, 3]  # the base commit's chain, not 100000 / 100 / 600
    check = run.outputs("check")
    assert json.loads(check["used"]) == [100, 1.0, 3], run.explain()  # the container's too
    ladder = json.loads(check["ladder"])
    assert ladder["verified"] is True
    assert ladder["used"] == f"{base[:12]}:ci/ladder.yaml"
    assert "the pull request changes ladders/team.yaml" in ladder["notes"][0]
    print(f"pull request with a greedy parent ladder: {run.seconds:.1f} s")


def test_control_the_same_edit_on_a_push_is_taken(
    tmp_path: Path, act_bin: Path, greedy_pull_request
) -> None:
    kit, repo, _event, _base = greedy_pull_request
    run = act(act_bin, tmp_path, repo, kit=kit)
    assert run.outputs("dlci").get("tier"), run.explain()
    assert _tier(run) == [100000, 100, 600]  # the edit works where the ladder is trusted
    assert json.loads(run.outputs("check")["used"]) == [100000, 100, 600], run.explain()
    assert json.loads(run.outputs("check")["ladder"])["notes"] == []
    print(f"push with the same ladder: {run.seconds:.1f} s")
