"""The example workflows users copy (examples/workflows/), run for real by act on the host executor.

Each runs as it is written, in a user's repository (the bundled digits example at its root),
with `uses: org/dl-ci@v1` resolved to a copy of this tree (act's --local-repository), the
kit image passed the way users pass a published one (the repository variable DLCI_IMAGE, here
`--var`), and the runner labels mapped to this machine (`-P self-hosted=-self-hosted`: act
takes the first label of a `runs-on` list that a platform names). This machine has no GPU, so
the action detects the class `cpu` and takes the CPU path of the ladder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_act import ROOT, SMOKE_ACTION, ActRun, make_repo, run_act, workflow
from test_action import (  # noqa: F401 (no_job_containers: a fixture)
    SECRET,
    WHEELHOUSE,
    kit_copy,
    no_job_containers,
    stand_in_actions,
)

from github_standin import StandIn, zipped

# every test: no job container may be left behind (the fixture is test_action's)
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("no_job_containers")]

EXAMPLES = ROOT / "examples" / "workflows"
# the host side installs dl-ci from the wheelhouse the setup script filled: no network
OFFLINE_PIP = ["--env", "PIP_NO_INDEX=1", "--env", f"PIP_FIND_LINKS={WHEELHOUSE}"]


UPLOAD_STAND_IN = """\
name: upload-artifact stand-in
description: records what actions/upload-artifact would upload (GitHub's artifact service is not here)
inputs:
  name:
    description: artifact name
  path:
    description: what to upload
  if-no-files-found:
    description: warn, error or ignore
runs:
  using: composite
  steps:
    - shell: bash
      env:
        NAME: ${{ inputs.name }}
        UPLOAD_PATH: ${{ inputs.path }}
      run: |
        test -n "$NAME"
        echo "uploaded=$NAME $(ls "$UPLOAD_PATH" | sort | tr '\\n' ' ')" >> "$GITHUB_OUTPUT"
"""


def act(act_bin: Path, tmp_path: Path, repo: Path, kit: Path, *extra: str, **kwargs) -> ActRun:
    """act with the example as written: uploads on (to a stand-in that records the name)."""
    args = ["--secret", f"RUNNER_SECRET={SECRET}", "--local-repository", f"org/dl-ci@v1={kit}"]
    for ref, folder in stand_in_actions(tmp_path).items():
        if ref.startswith("actions/upload-artifact@"):
            (folder / "action.yml").write_text(UPLOAD_STAND_IN)
        args += ["--local-repository", f"{ref}={folder}"]
    run = run_act(act_bin, repo, tmp_path / "cache", *args, *extra, timeout=900, **kwargs)
    (tmp_path / "act.log").write_text(run.log + "\n" + run.stderr)  # kept for a failure's reader
    return run


def uploaded(run: ActRun) -> str:
    """What the upload stand-in recorded (its step is nested in the action: any stepID)."""
    names = {
        e["arg"]
        for e in run.events
        if e.get("command") == "set-output" and e.get("name") == "uploaded"
    }
    assert len(names) == 1, names  # act reports it again at each level of composite actions
    return names.pop()


def user_repo(tmp_path: Path, workflow: str) -> tuple[Path, Path]:
    """A user's repository: the digits example at the root, the example workflow as written."""
    kit = kit_copy(tmp_path / "kit")
    repo = tmp_path / "repo"
    shutil.copytree(kit / "examples" / "digits", repo)
    (repo / ".github" / "workflows").mkdir(parents=True)
    shutil.copy2(EXAMPLES / workflow, repo / ".github" / "workflows" / workflow)
    make_repo(repo, {})
    return repo, kit


def test_the_pr_example_passes_on_a_pull_request_of_the_repository(
    tmp_path: Path, kit_image: str, act_bin: Path
) -> None:
    """The whole PR-tier job users get, as pr.yml is written: its outputs, every report, the
    summary (test_action.py's job checks the secrets and the workspace on a tests-only job)."""
    repo, kit = user_repo(tmp_path, "pr.yml")
    event = tmp_path / "event.json"
    event.write_text(
        json.dumps(
            {
                "number": 7,
                "pull_request": {"number": 7, "head": {"repo": {"full_name": "org/project"}}},
                "repository": {"full_name": "org/project"},
            }
        )
    )
    run = act(
        act_bin, tmp_path, repo, kit, "--var", f"DLCI_IMAGE={kit_image}", *OFFLINE_PIP,
        event="pull_request", payload=event,
    )  # fmt: skip
    assert run.returncode == 0, run.explain()
    assert run.job_result() == "success", run.explain()
    out = run.outputs("dlci")
    assert out["hardware-class"] == "cpu"
    assert json.loads(out["tier"])["budget"] == "pr"
    assert out["memorization-passed"] == "true"
    assert float(out["memorization-loss"]) < 1.0
    assert out["gpu-utilization"] == ""  # the CPU path
    assert out["verdict"] == "pass"
    assert float(out["coverage"]) > 50
    assert "dl-ci on cpu: pass (memorization loss" in run.log
    summary = "".join(run.summaries())
    assert "## ✅ dl-ci: passed" in summary
    assert "| tests | 10 passed, 0 failed" in summary
    assert "### ✅ Memorization test: pass" in summary
    assert "Debugging checks: 0 failed" in summary
    assert "### Trace profile (CPU-only trace" in summary
    name, files = uploaded(run).split(" ", 1)
    assert name.startswith("dlci-artifacts-cpu-")  # the action's unique name
    assert {
        "preflight.json", "run.json", "junit.xml", "coverage.xml", "memorization.json",
        "memorization-curve.png", "doctor.json", "trace.json.gz", "utilization.json",
        "utilization.md", "utilization.png", "report.html",
    } <= set(files.split())  # fmt: skip
    print(f"examples/workflows/pr.yml under act: {run.seconds:.1f} s")


def test_the_pr_example_refuses_a_fork(tmp_path: Path, kit_image: str, act_bin: Path) -> None:
    repo, kit = user_repo(tmp_path, "pr.yml")
    event = tmp_path / "event.json"
    event.write_text(
        json.dumps(
            {
                "number": 8,
                "pull_request": {"number": 8, "head": {"repo": {"full_name": "mallory/project"}}},
                "repository": {"full_name": "org/project"},
            }
        )
    )
    run = act(
        act_bin, tmp_path, repo, kit, "--var", f"DLCI_IMAGE={kit_image}", *OFFLINE_PIP,
        event="pull_request", payload=event,
    )  # fmt: skip
    assert run.job_result() == "failure", run.explain()
    assert "refusing to run a pull request from a fork (mallory/project)" in "".join(
        run.summaries()
    )
    assert "### Steps" not in "".join(run.summaries())  # nothing ran in a container


NIGHTLY_TOKEN = "ghs_e2eNightlyToken0123456789"  # pragma: allowlist secret (a test value)


def test_the_nightly_example_compares_with_last_night_and_keeps_a_history(
    tmp_path: Path, kit_image: str, act_bin: Path
) -> None:
    """GitHub's API is a stand-in (tests/github_standin.py): last night's run holds a copy of
    tonight's reports (made when the job downloads it) and a one-entry history."""
    repo, kit = user_repo(tmp_path, "nightly.yml")
    subprocess.run(
        ["git", "remote", "add", "origin", "https://github.com/org/project.git"],
        cwd=repo, check=True,
    )  # fmt: skip
    standin = StandIn(token=NIGHTLY_TOKEN).start()

    def tonight() -> bytes:  # "last night" is a copy of tonight's report
        (found,) = (tmp_path / "cache").glob("act/*/hostexecutor/dlci-artifacts/utilization.json")
        return zipped({"utilization.json": found.read_bytes()})

    entry = {"date": "2026-11-30T03:17Z", "run_id": "4242", "hardware_class": "cpu"}
    history = {"schema_version": 1, "kind": "history", "entries": [entry]}
    last = standin.add_run("nightly.yml", event="schedule")
    standin.add_artifact(last, "nightly-cpu-4242-1-0000abcd", tonight)
    standin.add_artifact(
        last, "nightly-history-cpu", zipped({"history.json": json.dumps(history).encode()})
    )
    ref = "org/project/.github/workflows/nightly.yml@refs/heads/main"
    api = [
        "--env", f"GITHUB_API_URL={standin.api}", "--env", f"GITHUB_WORKFLOW_REF={ref}",
        "--env", "NO_PROXY=127.0.0.1", "--env", "no_proxy=127.0.0.1",
        "--secret", f"GITHUB_TOKEN={NIGHTLY_TOKEN}",
    ]  # fmt: skip
    try:
        run = act(
            act_bin, tmp_path, repo, kit, "--var", f"DLCI_IMAGE={kit_image}", *OFFLINE_PIP, *api,
            "--matrix", "hardware:a100", event="workflow_dispatch",
        )  # fmt: skip
    finally:
        standin.stop()
    assert run.returncode == 0, run.explain()
    assert run.job_result() == "success", run.explain()
    out = run.outputs("dlci")
    assert json.loads(out["tier"])["budget"] == "nightly"
    assert out["verdict"] == "pass"
    assert out["comparison"] == "not comparable", out  # tonight against itself, on a CPU
    assert out["baseline-run"] == str(last["id"])
    summary = "".join(run.summaries())
    assert f"base: run {last['id']} on `main`" in summary
    assert "| step time (median) |" in summary
    assert "## dl-ci history: 2 entries" in summary
    names = {
        e["arg"]
        for e in run.events
        if e.get("command") == "set-output" and e.get("name") == "uploaded"
    }
    history_upload = {n for n in names if n.startswith("nightly-history-cpu ")}
    assert len(history_upload) == 1, names
    assert set(history_upload.pop().split()[1:]) == {"history.json", "history.md", "trend.svg"}
    assert any(n.startswith("nightly-cpu-") for n in names)  # the reports: prefix-class-jobid
    status = [
        s.query.get("status") for s in standin.requests(pattern="/workflows/nightly.yml/runs$")
    ]
    # the baseline before the job (preflight sizes the profile: its download fails here, since "last
    # night" is made from tonight's report, not there yet), again for the comparison, then
    # the history
    assert status == [["success"], ["success"], ["completed"]]
    print(f"examples/workflows/nightly.yml (one leg) under act: {run.seconds:.1f} s")


ACT_LOCAL = ROOT / "scripts" / "act_local.sh"


def act_local(act_bin: Path, repo: Path, cache: Path, *args: str) -> ActRun:
    """scripts/act_local.sh, as a user runs it in their repository, with act's --json log."""
    env = {**os.environ, "ACT": str(act_bin), "XDG_CACHE_HOME": str(cache)}
    for name in ("GITHUB_TOKEN", "GH_TOKEN", "ACTIONS_RUNTIME_TOKEN"):
        env.pop(name, None)
    argv = ["bash", str(ACT_LOCAL), "--offline", *args, "push", "--json"]
    proc = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    log = "\n".join(str(e.get("msg", "")) for e in events)
    return ActRun(proc.returncode, 0.0, events, proc.stderr, log)


def test_act_local_maps_every_pinned_action_and_the_kit(act_bin: Path, tmp_path: Path) -> None:
    """Every `uses: owner/repo@<sha>` of action.yml, run by act offline, is the script's stand-in;
    `org/dl-ci@v1` is the kit it is given: here the smoke action with action.yml's pinned steps
    (no container, so the test takes seconds)."""
    text = (ROOT / "action.yml").read_text()
    pinned = sorted(set(re.findall(r"uses:\s*(\S+@[0-9a-f]{40})", text)))
    assert len(pinned) >= 2  # the upload actions
    kit = tmp_path / "kit"
    kit.mkdir()
    uses = "".join(f"    - uses: {ref}  # vX\n      with:\n        name: x\n" for ref in pinned)
    (kit / "action.yml").write_text(SMOKE_ACTION + uses)
    repo = make_repo(
        tmp_path / "repo",
        {
            ".github/workflows/e2e.yml": workflow(
                "- id: kit\n  uses: org/dl-ci@v1\n  with:\n    who: act_local\n"
            )
        },
    )
    run = act_local(act_bin, repo, tmp_path / "cache", "--kit", str(kit))
    assert run.returncode == 0, run.explain()
    assert run.job_result() == "success", run.explain()
    for ref in pinned:
        assert f"stand-in for {ref.split('@')[0]}" in run.log, ref
    assert run.outputs("kit") == {"greeting": "hello act_local"}
    # the control: stand-ins told to fail turn the job red, so it was they that ran
    failing = act_local(act_bin, repo, tmp_path / "cache", "--kit", str(kit), "--failing-stand-ins")
    assert failing.returncode != 0
    assert failing.job_result() == "failure", failing.explain()
