"""The action's bisect under act: a red nightly names the commit that broke it.

A consumer repository (tests/test_bisect.py's, its project in ``project/``) has a dozen
commits on main; the seventh reads the learning rate by a name the settings do not have, so
the rate is 0 and the model no longer memorizes, while its unit tests pass. The night, a push
to main with ``bisect: true``, runs on tonight's commit (the last) at the ladder's short
``merge`` tier, where the gate is flaky: one seed in four fails on a healthy commit (an
initialisation 20 epochs are too few for), and the culprit's healthy parent draws such a seed
first. Tonight's memorization test fails, so the action's bisect step runs ``dlci bisect`` in
a container of the kit image, from the last green run's commit to tonight's, by the
memorization gate: it must name the culprit in at most five gate runs, the flaky fail of the
healthy parent re-run on other seeds and not blamed.

GitHub's servers cannot be reached here: tests/github_standin.py (a stand-in, on 127.0.0.1)
answers the last green run (the newest successful run of the workflow on main: the first
commit), the culprit's pull request, and takes the comment. The target asserts that no token
reached it in any gate run. A commit that cannot be imported (skipped, the range said) is
tests/test_bisect.py's (the same ``dlci bisect``, without the action around it).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_act import git
from test_action import (  # noqa: F401 (no_job_containers: a fixture)
    act,
    job,
    kit_copy,
    no_job_containers,
)

from github_standin import StandIn
from test_bisect import CULPRIT, build_repository

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("no_job_containers")]

TOKEN = "ghs_e2eBisectStandIn0123456789"  # pragma: allowlist secret (a test value)
WORKFLOW_REF = "org/project/.github/workflows/e2e.yml@refs/heads/main"


def workflow(kit_image: str) -> str:
    return job(
        f"""
- uses: actions/checkout@v4
- id: dlci
  uses: org/dl-ci@v1
  with:
    budget: merge
    ladder: project/ladder.yaml
    working-directory: project
    image: {kit_image}
    doctor: "false"
    profile: "false"
    doctest: "false"
    upload-artifacts: "false"
    bisect: "true"
    bisect-comment: "true"
    bisect-time-cap-minutes: "15"
"""
    )


@pytest.fixture(scope="module")
def night(
    tmp_path_factory: pytest.TempPathFactory, kit_image: str, act_bin: Path, docker_engine: str
):
    tmp_path = tmp_path_factory.mktemp("bisect-act")
    kit = kit_copy(tmp_path / "kit")
    history = build_repository(tmp_path, prefix="project/")
    repo, main = Path(history["repo"][0]), history["main"]
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "e2e.yml").write_text(workflow(kit_image))
    git(repo, "remote", "add", "origin", "https://github.com/org/project.git")
    standin = StandIn(token=TOKEN)
    standin.add_run("e2e.yml", head_sha=main[0])  # the last green night: the first commit
    standin.add_run("e2e.yml", conclusion="failure")  # newer, red: never the good one
    pull = {"number": 7, "title": "settings: read the learning rate by its long name",
            "html_url": "https://github.com/org/project/pull/7", "user": {"login": "ada"},
            "merged_at": "2026-12-01T10:00:00Z"}  # fmt: skip
    standin.pulls[main[CULPRIT]] = [pull]
    # GitHub places the culprit between the good and bad commits: the comment may be made
    standin.compare[f"{main[0]}...{main[CULPRIT]}"] = "ahead"
    standin.compare[f"{main[CULPRIT]}...{main[-1]}"] = "ahead"
    standin.start()
    payload = tmp_path / "push.json"
    payload.write_text('{"ref": "refs/heads/main", "repository": {"full_name": "org/project"}}')
    api = [
        "--env", f"GITHUB_API_URL={standin.api}", "--env", f"GITHUB_WORKFLOW_REF={WORKFLOW_REF}",
        "--env", "NO_PROXY=127.0.0.1", "--env", "no_proxy=127.0.0.1",
        "--secret", f"GITHUB_TOKEN={TOKEN}",
    ]  # fmt: skip
    try:
        run = act(act_bin, tmp_path, repo, *api, kit=kit, payload=payload)
        yield run, standin, main
    finally:
        standin.stop()


def test_the_red_night_names_the_commit_that_broke_it(night) -> None:
    run, _, main = night
    assert run.job_result() == "failure", run.explain()  # the night stays red
    out = run.outputs("dlci")
    assert out["memorization-passed"] == "false"
    assert out["bisect-status"] == "found", run.explain()
    assert out["culprit"] == main[CULPRIT]
    assert out["culprit-pull"] == "7"


def test_the_culprit_is_at_the_top_of_the_summary_within_five_gate_runs(night) -> None:
    run, _, main = night
    summary = "\n".join(run.summaries())
    first = summary.lstrip().splitlines()[0]
    assert first == f"### dl-ci bisect: first bad commit `{main[CULPRIT][:12]}`", summary[:500]
    assert re.search(r"pull request \\?#\u200b?7 by @\u200b?ada", summary), summary[
        :500
    ]  # md-escaped
    runs = int(re.search(r"(\d+) gate run\(s\)", summary).group(1))
    assert 1 <= runs <= 5, summary
    # the job's own summary follows, after the answer
    assert summary.index("dl-ci bisect") < summary.index("memoriz")
    # the flaky gate: the culprit's healthy parent failed its first seed, was re-run on two
    # others and passed (the control: that first run alone would have blamed it)
    parent = main[CULPRIT - 1][:12]
    (row,) = {line for line in summary.splitlines() if line.startswith(f"| `{parent}` |")}
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "pass", row
    assert cells[3].startswith("test seed 0: fail") and "recheck seeds 1,2: pass,pass" in cells[3]


def test_the_last_green_run_was_asked_and_the_culprit_got_a_comment(night) -> None:
    _, standin, main = night
    listed = standin.requests("GET", "/actions/workflows/e2e.yml/runs")
    assert listed and all(seen.authorization for seen in listed)
    assert listed[0].query.get("status") == ["success"]
    assert standin.requests("GET", f"/commits/{main[CULPRIT]}/pulls")
    (comment,) = standin.comments[7]
    assert main[CULPRIT][:12] in comment["body"]
    assert comment["body"].startswith("<!-- dl-ci bisect")
