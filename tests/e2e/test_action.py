"""The kit's own action.yml, run by act on the host executor with the real Docker engine.

The job is the one users get: preflight on the host (no torch), the image (the kit image the
setup script built, passed as `image`), `dlci run` in the container on the bundled digits
example at the PR tier on the CPU (its tests here; the whole job as users get it runs in
test_workflows.py, from examples/workflows/pr.yml), cleanup, the job summary. Uploads to GitHub and Codecov
need GitHub's servers; they are switched off here by input and checked statically in
tests/test_action_yml.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from test_act import ROOT, ActRun, git, make_repo, run_act

pytestmark = pytest.mark.e2e

WHEELHOUSE = ROOT / "docker" / "wheelhouse"
SECRET = "hunter2-e2e-secret"  # pragma: allowlist secret (a test value, set with act --secret)
# A test in the user's project that fails if the runner's secret reached the container.
SECRET_TEST = f'''
import os


def test_no_secret_in_the_container():
    assert os.environ.get("DLCI_IN_CONTAINER") == "1"
    assert not [k for k, v in os.environ.items() if "{SECRET}" in v]
'''


def kit_copy(dest: Path) -> Path:
    """The repository as git sees it (tracked and untracked, not ignored): what a tag holds."""
    listed = git(ROOT, "ls-files", "--cached", "--others", "--exclude-standard", "-z")
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file() or source.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name, follow_symlinks=False)
    return dest


def job(steps: str, *, on: str = "push") -> str:
    # The host installs dl-ci from the wheelhouse the setup script filled: no network needed.
    head = (
        f"name: e2e\non: {on}\njobs:\n  e2e:\n    runs-on: self-hosted\n"
        f"    env:\n      PIP_NO_INDEX: '1'\n      PIP_FIND_LINKS: {WHEELHOUSE}\n"
        "      RUNNER_SECRET: ${{ secrets.RUNNER_SECRET }}\n    steps:\n"
    )
    return head + "".join(f"      {line}\n" for line in steps.strip("\n").splitlines())


CHECKS = """
- id: check
  if: always()
  run: |
    art="$GITHUB_WORKSPACE/dlci-artifacts"
    echo "files=$(ls "$art" | sort | tr '\\n' ' ')" >> "$GITHUB_OUTPUT"
    echo "sources=$(grep -o '<source>[^<]*</source>' "$art/coverage.xml" | tr '\\n' ' ')" >> "$GITHUB_OUTPUT"
    echo "foreign=$(find "$GITHUB_WORKSPACE" ! -user "$(id -u)" | wc -l)" >> "$GITHUB_OUTPUT"
    echo "containers=$(docker ps -aq --filter "label=dlci.job=$DLCI_JOB_ID" | wc -l)" >> "$GITHUB_OUTPUT"
    echo "job=$DLCI_JOB_ID" >> "$GITHUB_OUTPUT"
    echo "secret_set=$([ -n "$RUNNER_SECRET" ] && echo yes)" >> "$GITHUB_OUTPUT"
    echo "secret_hits=$(grep -rl -- "$RUNNER_SECRET" "$art" | wc -l)" >> "$GITHUB_OUTPUT"
"""


def stand_in_actions(tmp_path: Path) -> dict[str, Path]:
    """Stand-ins for the upload actions, which act would clone from GitHub to resolve them.

    The uploads need GitHub's servers; the e2e jobs switch them off by input, so these never
    run (their wiring is checked in tests/test_action_yml.py). Each stand-in fails if run.
    """
    import yaml

    refs = [
        s["uses"]
        for s in yaml.safe_load((ROOT / "action.yml").read_text())["runs"]["steps"]
        if "uses" in s
    ]
    out = {}
    for i, ref in enumerate(refs):
        folder = tmp_path / f"stand-in-{i}"
        folder.mkdir(exist_ok=True)
        (folder / "action.yml").write_text(
            "name: stand-in\ndescription: stands in for " + ref.split("@")[0] + "\n"
            "runs:\n  using: composite\n  steps:\n    - shell: bash\n"
            "      run: echo 'a stand-in for an upload ran' && exit 1\n"
        )
        out[ref] = folder
    return out


def act(
    act_bin: Path, tmp_path: Path, repo: Path, *extra: str, kit: Path | None = None, **kwargs
) -> ActRun:
    args = ["--secret", f"RUNNER_SECRET={SECRET}", *extra]
    for ref, folder in stand_in_actions(tmp_path).items():
        args += ["--local-repository", f"{ref}={folder}"]
    if kit is not None:
        args += ["--local-repository", f"org/dl-ci@v1={kit}"]
    run = run_act(act_bin, repo, tmp_path / "cache", *args, timeout=900, **kwargs)
    (tmp_path / "act.log").write_text(run.log + "\n" + run.stderr)  # kept for a failure's reader
    return run


def worker_job_containers(docker: str, bases: set[str]) -> set[str]:
    """The job containers (label ``dlci.job``) that mount a folder under one of ``bases``.

    Under pytest-xdist another worker's tests start and remove their own job containers at
    any moment, and those mount that worker's folders: only these are a test's own.
    """
    done = subprocess.run(
        [docker, "ps", "-aq", "--filter", "label=dlci.job"], capture_output=True, text=True
    )
    ids = done.stdout.split()
    if not ids:
        return set()
    shown = "{{.Id}} {{range .Mounts}}{{.Source}} {{end}}"
    inspected = subprocess.run(
        [docker, "inspect", "--format", shown, *ids], capture_output=True, text=True
    )  # a container removed in between is left out (exit status 1, the others listed)
    found = set()
    for line in inspected.stdout.splitlines():
        cid, *sources = line.split()
        if any(s == b or s.startswith(b + "/") for s in sources for b in bases):
            found.add(cid[:12])
    return found


def worker_bases(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """This pytest process's base temporary folder, as given and resolved."""
    base = tmp_path_factory.getbasetemp()
    return {str(base), str(base.resolve())}


def left_behind(docker: str, bases: set[str], before: set[str], wait_s: float = 30) -> set[str]:
    """This worker's job containers not there before. ``docker run --rm`` removes an exited
    container a moment after the job saw it exit: one still there is waited for (``wait_s``),
    a container left behind stays."""
    deadline = time.monotonic() + wait_s
    while (left := worker_job_containers(docker, bases) - before) and time.monotonic() < deadline:
        time.sleep(1)
    return left


@pytest.fixture
def no_job_containers(docker_engine: str, tmp_path_factory: pytest.TempPathFactory):
    """No container of a job the test ran may be left behind (the test's jobs are those whose
    containers mount a folder of this pytest process: its base temporary folder holds every
    tmp_path, and act's workspaces under them)."""
    bases = worker_bases(tmp_path_factory)
    before = worker_job_containers(docker_engine, bases)
    yield
    left = left_behind(docker_engine, bases, before)
    assert left == set(), f"containers left behind: {left}"


def user_repo(tmp_path: Path, kit: Path, workflow: str) -> Path:
    """A user's repository: the digits example as `project/`, one workflow, one commit."""
    repo = tmp_path / "repo"
    shutil.copytree(kit / "examples" / "digits", repo / "project")
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "e2e.yml").write_text(workflow)
    return make_repo(repo, {})


def test_uses_dot_keeps_the_runners_secret_and_the_workspace(
    tmp_path: Path, kit_image: str, act_bin: Path, no_job_containers
) -> None:
    """The kit's self-test shape (`uses: ./` in dl-ci's own repository), its tests alone (the
    gates' containers get the same environment; tests/e2e/test_workflows.py runs the whole
    job as users get it): the runner's secret is in the job's environment (the control: the
    host-side step sees it) and a test in the project fails if it reached the container."""
    repo = kit_copy(tmp_path / "repo")
    (repo / "examples" / "digits" / "tests" / "test_secret.py").write_text(SECRET_TEST)
    (repo / ".github" / "workflows").mkdir(parents=True, exist_ok=True)
    for old in (repo / ".github" / "workflows").iterdir():
        old.unlink()
    (repo / ".github" / "workflows" / "e2e.yml").write_text(
        job(
            f"""
- uses: actions/checkout@v4
- id: dlci
  uses: ./
  with:
    budget: pr
    working-directory: examples/digits
    image: {kit_image}
    memorize: "false"
    doctor: "false"
    profile: "false"
    upload-artifacts: "false"
{CHECKS}"""
        )
    )
    make_repo(repo, {})
    run = act(act_bin, tmp_path, repo)
    assert run.returncode == 0, run.explain()
    assert run.job_result() == "success", run.explain()
    out = run.outputs("dlci")
    assert out["hardware-class"] == "cpu" and out["verdict"] == "pass"
    assert out["memorization-passed"] == ""  # switched off: the test did not run
    check = run.outputs("check")
    assert {"preflight.json", "run.json", "junit.xml", "coverage.xml", "cleanup.json"} <= set(
        check["files"].split()
    )
    assert check["sources"].strip() == "<source>.</source>"  # relative paths for Codecov
    assert check["foreign"] == "0"  # nothing owned by another user in the workspace
    assert check["containers"] == "0" and check["job"]
    # the runner's secret was set in the job, and is in no report (nor in the container)
    assert check["secret_set"] == "yes"  # pragma: allowlist secret
    assert check["secret_hits"] == "0"
    summary = "".join(run.summaries())
    assert SECRET not in summary
    assert "## ✅ dl-ci: passed" in summary
    assert "| tests | 11 passed, 0 failed" in summary  # 10 of the example's + the secret check
    print(f"uses: ./ tests-only job on the digits example: {run.seconds:.1f} s")


def test_a_fork_pull_request_is_refused(
    tmp_path: Path, kit_image: str, act_bin: Path, no_job_containers
) -> None:
    kit = kit_copy(tmp_path / "kit")
    repo = user_repo(
        tmp_path,
        kit,
        job(
            f"""
- uses: actions/checkout@v4
- id: dlci
  uses: org/dl-ci@v1
  with:
    working-directory: project
    image: {kit_image}
    upload-artifacts: "false"
""",
            on="pull_request",
        ),
    )
    event = tmp_path / "event.json"
    event.write_text(
        json.dumps(
            {
                "pull_request": {"head": {"repo": {"full_name": "mallory/dl-ci-fork"}}},
                "repository": {"full_name": "org/project"},
            }
        )
    )
    run = act(act_bin, tmp_path, repo, kit=kit, event="pull_request", payload=event)
    assert run.job_result() == "failure", run.explain()
    summary = "".join(run.summaries())
    assert "refusing to run a pull request from a fork (mallory/dl-ci-fork)" in summary
    assert "allow-fork-prs" in run.log
    # nothing ran: no run.json, so no step table
    assert "### Steps" not in summary


RUNNER_UID = 23456  # a runner user that is not root and has no passwd entry in the image


def test_a_non_root_runner_gets_no_foreign_files(
    kit_image: str, tmp_path: Path, monkeypatch, no_job_containers
) -> None:
    """`dlci container run` as a non-root runner: every file the job writes is the runner's.

    The runner's uid is what os.getuid() answers on the host; here it answers a non-root
    uid, so the container runs as that user, exactly as under a runner service account.
    """
    import os

    from dlci.cli import main

    ws = tmp_path / "ws"
    shutil.copytree(ROOT / "examples" / "digits", ws / "project")
    for path in [ws, *ws.rglob("*")]:
        os.chown(path, RUNNER_UID, RUNNER_UID)
    monkeypatch.setattr(os, "getuid", lambda: RUNNER_UID)
    monkeypatch.setattr(os, "getgid", lambda: RUNNER_UID)
    inner = ["--out", "/workspace/dlci-artifacts", "--budget", "pr", "--hardware", "cpu"]
    inner += ["--install", "none", "--no-doctor", "--no-profile", "--no-doctest"]
    inner += ["--pytest-args", "-k 'not memoriz and not doctor'"]
    argv = ["container", "run", "--image", kit_image, "--workspace", str(ws)]
    argv += ["--workdir", "project", "--job", "e2e-nonroot", "--", *inner]
    assert main(argv) == 0
    names = {p.name for p in (ws / "dlci-artifacts").iterdir()}
    assert {"run.json", "junit.xml", "coverage.xml", "memorization.json"} <= names
    foreign = [str(p) for p in ws.rglob("*") if p.lstat().st_uid != RUNNER_UID]
    assert foreign == []
    out = tmp_path / "out"
    assert main(["container", "cleanup", "--workspace", str(ws), "--out", str(out)]) == 0
    assert json.loads((out / "cleanup.json").read_text())["foreign_files"] == 0
