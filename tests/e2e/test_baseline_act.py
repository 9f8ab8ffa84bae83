"""The action's baseline under act: base against head in the job summary, fetched through a
stand-in of GitHub's REST API.

GitHub's servers cannot be reached here, so tests/github_standin.py serves the endpoints on
127.0.0.1 (named a stand-in) and act points the action at it through ``GITHUB_API_URL``. Three
jobs of the digits example on one runner, at the merge tier (5 profiled steps):

1. a push to main, no baseline: its reports become the baseline artifact of a run on main;
2. a pull request of the unchanged code, re-run while a busy loop loads this 2-core machine,
   with both bounds set: it must pass, with the table in the summary and one sticky comment
   (on this CPU-only machine the step time is measured and shown, never gated);
3. a pull request whose target plants a synthetic GPU trace at 48.9 % utilization, against
   a baseline at 80.4 % (the same generator, tests/tracegen.py, at a 10 us launch gap): the
   30-point drop must fail the job, and the comment is updated in place.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_act import git
from test_action import (  # noqa: F401 (no_job_containers: a fixture)
    act,
    job,
    kit_copy,
    left_behind,
    no_job_containers,
    user_repo,
    worker_bases,
    worker_job_containers,
)

from github_standin import StandIn, zipped

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("no_job_containers")]

TESTS = Path(__file__).resolve().parents[1]
TOKEN = "ghs_e2eStandInToken0123456789"  # pragma: allowlist secret (a test value)
WORKFLOW_REF = "org/project/.github/workflows/e2e.yml@refs/pull/7/merge"
REPORTS = ("utilization.json", "memorization.json", "preflight.json", "coverage.xml")

PLANTED = '''"""A planted profile for dl-ci's e2e test: what torch.profiler exports is replaced by a
synthetic GPU trace at 48.9 % utilization (tracegen.py, copied beside this file)."""

from dlci.profiling import session

from digits_example.target import make_target  # noqa: F401 (the target itself is unchanged)
from digits_example.tracegen import training_trace


def _planted(self, prof):
    training_trace(steps=12, launch_gap_us=50, first_step=2).write(self.path)
    self.written = True


session.TraceWriter.__call__ = _planted
'''


def workflow(kit_image: str) -> str:
    return job(
        f"""
- uses: actions/checkout@v4
- id: dlci
  uses: org/dl-ci@v1
  with:
    budget: merge
    working-directory: project
    image: {kit_image}
    target: ${{{{ vars.TARGET }}}}
    memorize: ${{{{ vars.TARGET == '' }}}}
    doctor: "false"
    doctest: "false"
    tests: tests/test_digits.py
    pytest-args: -k "batches or every_class"
    upload-artifacts: "false"
    baseline: ${{{{ github.event_name == 'pull_request' && 'auto' || 'none' }}}}
    max-utilization-drop: "10"
    max-step-time-regression: "10"
    comment: "true"
- id: keep
  if: always() && github.event_name == 'push'
  env:
    KEEP: ${{{{ vars.KEEP }}}}
  run: cp -r "$GITHUB_WORKSPACE/dlci-artifacts/." "$KEEP"
""",
        on="[push, pull_request]",
    )


def _event(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def synthetic_base(folder: Path) -> dict[str, bytes]:
    """The planted job's baseline: 12 synthetic GPU steps at 80.4 % (launch gap 10 us)."""
    sys.path.insert(0, str(TESTS))
    from dlci import jsonio
    from dlci.profiling.metrics import analyze
    from dlci.profiling.reader import read_trace
    from tracegen import training_trace

    trace = training_trace(steps=12, launch_gap_us=10, first_step=2).write(folder / "t.json")
    report = analyze(read_trace(trace))
    preflight = {"passed": True, "tier": {"budget": "merge", "hardware_class": "cpu"}}
    return {
        "utilization.json": jsonio.encode(report),
        "preflight.json": json.dumps(preflight).encode(),
    }


@pytest.fixture(scope="module")
def jobs(
    tmp_path_factory: pytest.TempPathFactory, kit_image: str, act_bin: Path, docker_engine: str
):
    tmp_path = tmp_path_factory.mktemp("baseline-act")
    kit = kit_copy(tmp_path / "kit")
    repo = user_repo(tmp_path, kit, workflow(kit_image))
    package = repo / "project" / "digits_example"
    shutil.copy2(TESTS / "tracegen.py", package / "tracegen.py")
    (package / "planted.py").write_text(PLANTED)
    git(repo, "add", "--all")
    git(repo, "commit", "--quiet", "--message", "a planted profile for the third job")
    git(repo, "remote", "add", "origin", "https://github.com/org/project.git")
    standin = StandIn(token=TOKEN).start()
    keep = tmp_path / "keep"
    keep.mkdir()
    api = [
        "--env", f"GITHUB_API_URL={standin.api}", "--env", f"GITHUB_WORKFLOW_REF={WORKFLOW_REF}",
        "--env", "NO_PROXY=127.0.0.1", "--env", "no_proxy=127.0.0.1",
        "--secret", f"GITHUB_TOKEN={TOKEN}", "--var", f"KEEP={keep}",
    ]  # fmt: skip
    push = _event(
        tmp_path / "push.json",
        {"ref": "refs/heads/main", "repository": {"full_name": "org/project"}},
    )
    pull = _event(
        tmp_path / "pull.json",
        {
            "number": 7,
            "pull_request": {
                "number": 7,
                "base": {"ref": "main", "repo": {"full_name": "org/project"}},
                "head": {"ref": "feature", "repo": {"full_name": "org/project"}},
            },
            "repository": {"full_name": "org/project"},
        },
    )
    runs = {}
    bases = worker_bases(tmp_path_factory)
    before = worker_job_containers(docker_engine, bases)
    try:
        folder = tmp_path / "main"
        folder.mkdir()
        runs["main"] = act(act_bin, folder, repo, *api, kit=kit, payload=push)
        base = standin.add_run("e2e.yml")
        kept = {name: (keep / name).read_bytes() for name in REPORTS if (keep / name).is_file()}
        standin.add_artifact(base, "dlci-artifacts-cpu-4242-1-0000abcd", zipped(kept))

        folder = tmp_path / "rerun"
        folder.mkdir()
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            runs["rerun"] = act(
                act_bin, folder, repo, *api, kit=kit, event="pull_request", payload=pull
            )
        finally:
            hog.kill()
            hog.wait()

        planted = standin.add_run("e2e.yml")
        standin.add_artifact(
            planted, "dlci-artifacts-cpu-4343-1-0000abcd", zipped(synthetic_base(tmp_path))
        )
        folder = tmp_path / "planted"
        folder.mkdir()
        target = ["--var", "TARGET=digits_example.planted:make_target"]
        runs["planted"] = act(
            act_bin, folder, repo, *api, *target, kit=kit, event="pull_request", payload=pull
        )
        runs["left"] = left_behind(docker_engine, bases, before)  # the three jobs': none left
        yield runs, standin, base
    finally:
        standin.stop()


def test_the_base_job_passes_and_keeps_its_reports(jobs) -> None:
    runs, _, _ = jobs
    run = runs["main"]
    assert run.job_result() == "success", run.explain()
    assert run.outputs("dlci").get("comparison", "") == ""  # baseline: none
    assert runs["left"] == set()  # no job container left behind by any of the three jobs
    print(f"baseline act job (push, no baseline): {run.seconds:.1f} s")


def test_a_rerun_on_a_loaded_machine_shows_the_table_and_passes(jobs) -> None:
    runs, standin, base = jobs
    run = runs["rerun"]
    assert run.job_result() == "success", run.explain()
    out = run.outputs("dlci")
    assert out["comparison"] == "not comparable", out
    assert out["baseline-run"] == str(base["id"])
    summary = "".join(run.summaries())
    assert "dl-ci against the baseline: " in summary
    assert f"base: run {base['id']} on `main`" in summary
    assert "| memorization: epochs to threshold |" in summary
    # act reports a composite action's summary again at each level: the same rows, repeated
    (row,) = {line for line in summary.splitlines() if line.startswith("| step time (median) |")}
    assert row.endswith("| not comparable |"), row  # a CPU-only trace: measured, never gated
    assert "its steps time the shared host CPU, whose load moves a whole run" in summary
    assert "| GPU utilization | - | - | - | not comparable |" in summary  # the CPU path
    assert "| coverage |" in summary
    assert "```mermaid" in summary
    # the stand-in was asked what GitHub would be, with the job's token, never on the redirect
    listing = standin.requests(pattern="/actions/workflows/e2e.yml/runs$")[0]
    assert listing.query["branch"] == ["main"] and listing.authorization == f"Bearer {TOKEN}"
    storage = standin.requests(pattern="^/storage/blob/")
    assert storage and all(s.authorization is None for s in storage)
    assert TOKEN not in run.log + run.stderr
    assert "commented on pull request 7" in run.log
    # the baseline was fetched once, before the job, and kept for the comparison after it
    assert "baseline: profile: not sized: a CPU-only baseline" in run.log
    assert len(storage) == 2, storage  # one download per pull request's job (this and the
    # planted one): the sizing's, kept for the comparison (two each if it fetched again)
    print(f"re-run under load: step time {row}; act job {run.seconds:.1f} s")


def test_a_planted_thirty_point_utilization_drop_fails_the_job(jobs) -> None:
    runs, standin, _ = jobs
    run = runs["planted"]
    assert run.job_result() == "failure", run.explain()
    out = run.outputs("dlci")
    assert out["verdict"] == "pass"  # the job's own gates passed: the comparison failed it
    summary = "".join(run.summaries())
    (row,) = {line for line in summary.splitlines() if line.startswith("| GPU utilization | 8")}
    assert "| 80.4 % | 48.9 % | ↓ -31.6 pt" in row and "**regressed**" in row, row
    assert "::error" in run.log and "gpu_utilization_pct regressed against the baseline" in run.log
    # sized from the baseline's 12 steady GPU steps: the tier's 5 already decide a 10-point bound
    assert "baseline: profile: profile_steps 5 kept" in run.log, run.explain()
    (comment,) = standin.comments[7]  # one sticky comment, updated in place
    assert "48.9 %" in comment["body"] and len(standin.requests("PATCH")) == 1
    print(f"planted drop: act job {run.seconds:.1f} s")
