"""Workflows run for real with act on the host executor (`-P self-hosted=-self-hosted`).

What act does here, found by running it (act 0.2.89):

- ``$GITHUB_OUTPUT`` and ``$GITHUB_STEP_SUMMARY`` are files in act's own temporary folder; act
  reads them after each step and reports them in its ``--json`` log as events with
  ``"command": "set-output"`` (``name``, ``arg``, ``stepID``) and ``"command": "summary"``
  (``content``). The summary file is emptied for the next step, as on GitHub, so the log is
  where a test reads it.
- ``actions/checkout`` with no ``repository`` input is never fetched: act copies the local
  working tree (uncommitted changes and untracked files included, ``.gitignore``d files left
  out, ``.git`` included) into the workspace.
- ``uses: org/dl-ci@v1`` resolves offline with ``--local-repository org/dl-ci@v1=FOLDER``;
  without it act tries to clone from GitHub and the job fails.

The offline tests point act at a proxy that refuses every connection, so nothing reaches the
network even on a machine that could.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DEAD_PROXY = "http://127.0.0.1:9"

SMOKE_ACTION = """\
name: e2e smoke
description: a composite action that writes an output and a step summary
inputs:
  who:
    description: who to greet
    default: world
outputs:
  greeting:
    description: the greeting
    value: ${{ steps.greet.outputs.greeting }}
runs:
  using: composite
  steps:
    - id: greet
      shell: bash
      env:
        WHO: ${{ inputs.who }}
      run: |
        echo "greeting=hello $WHO" >> "$GITHUB_OUTPUT"
        echo "### dl-ci e2e summary for $WHO" >> "$GITHUB_STEP_SUMMARY"
"""


@dataclass
class ActRun:
    returncode: int
    seconds: float
    events: list[dict[str, Any]]
    stderr: str
    log: str = field(repr=False, default="")

    def outputs(self, step_id: str) -> dict[str, str]:
        """The set-output events of one step (the outer id of a composite action)."""
        return {
            e["name"]: e["arg"]
            for e in self.events
            if e.get("command") == "set-output" and e.get("stepID") == [step_id]
        }

    def summaries(self) -> list[str]:
        return [e["content"] for e in self.events if e.get("command") == "summary"]

    def job_result(self) -> str | None:
        results = [e["jobResult"] for e in self.events if "jobResult" in e]
        return results[-1] if results else None

    def explain(self) -> str:
        marks = ("❌", "Failure", "::error", "error:", "Error")
        failures = [line for line in self.log.splitlines() if any(m in line for m in marks)]
        return (
            f"act exited {self.returncode}; failure lines:\n"
            + "\n".join(failures[-40:])
            + f"\n--- log tail:\n{self.log[-4000:]}\n{self.stderr[-2000:]}"
        )


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "e2e",
        "GIT_AUTHOR_EMAIL": "e2e@example.invalid",
        "GIT_COMMITTER_NAME": "e2e",
        "GIT_COMMITTER_EMAIL": "e2e@example.invalid",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }
    proc = subprocess.run(
        ["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True
    )
    return proc.stdout.strip()


def make_repo(path: Path, files: dict[str, str]) -> Path:
    """A git repository with these files committed on main."""
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text, encoding="utf-8")
    git(path, "init", "--quiet", "--initial-branch=main")
    git(path, "add", "--all")
    git(path, "commit", "--quiet", "--message", "e2e")
    return path


# One runner tool cache for every act job of this pytest process, as a self-hosted runner keeps
# one across its jobs: the action installs its host-side venv there once per version of the
# kit's source (action.yml, "dl-ci on the runner host"), so only the first job of a worker pays
# for it (about 10 s). Set by the session fixture `_shared_tool_cache` (tests/e2e/conftest.py);
# a worker's own folder, so two workers never build the same venv at once.
TOOL_CACHE: list[Path] = []


def share_tool_cache(cache: Path) -> None:
    """act keeps the runner's tool cache in ``XDG_CACHE_HOME/act/tool_cache``: a link to the
    shared one when there is one (each job's other files stay in its own cache)."""
    link = cache / "act" / "tool_cache"
    if TOOL_CACHE and not link.exists() and not link.is_symlink():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(TOOL_CACHE[0], target_is_directory=True)


def run_act(
    act_bin: Path,
    repo: Path,
    cache: Path,
    *extra: str,
    offline: bool = True,
    timeout: float = 300,
    event: str = "push",
    payload: Path | None = None,
) -> ActRun:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    share_tool_cache(cache)
    for name in ("GITHUB_TOKEN", "GH_TOKEN", "ACTIONS_RUNTIME_TOKEN", "NO_PROXY", "no_proxy"):
        env.pop(name, None)
    if offline:
        for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY"):
            env[name] = DEAD_PROXY
    argv = [str(act_bin), event, "-P", "self-hosted=-self-hosted", "--action-offline-mode"]
    if payload is not None:
        argv += ["--eventpath", str(payload)]
    argv += ["--json", *extra]
    start = time.monotonic()
    proc = subprocess.run(
        argv,
        cwd=repo,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    seconds = time.monotonic() - start
    events = []
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            events.append(json.loads(line))
    log = "\n".join(str(e.get("msg", "")) for e in events)
    return ActRun(proc.returncode, seconds, events, proc.stderr, log)


def workflow(steps: str) -> str:
    return "name: e2e\non: push\njobs:\n  e2e:\n    runs-on: self-hosted\n    steps:\n" + "".join(
        f"      {line}\n" for line in steps.strip("\n").splitlines()
    )


def test_a_local_composite_action_writes_outputs_and_a_summary(
    act_bin: Path, tmp_path: Path
) -> None:
    repo = make_repo(
        tmp_path / "repo",
        {
            "action.yml": SMOKE_ACTION,
            ".github/workflows/e2e.yml": workflow(
                """
- uses: actions/checkout@v4
- id: smoke
  uses: ./
  with:
    who: e2e
- env:
    GREETING: ${{ steps.smoke.outputs.greeting }}
  run: test "$GREETING" = "hello e2e"
"""
            ),
        },
    )
    run = run_act(act_bin, repo, tmp_path / "cache")
    assert run.returncode == 0, run.explain()
    assert run.job_result() == "success", run.explain()
    assert run.outputs("smoke") == {"greeting": "hello e2e"}
    assert "### dl-ci e2e summary for e2e\n" in run.summaries()
    print(f"act smoke workflow: {run.seconds:.2f} s")


def test_checkout_copies_the_local_working_tree_offline(act_bin: Path, tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "repo",
        {
            ".gitignore": "ignored.txt\n",
            "committed.txt": "committed\n",
            ".github/workflows/e2e.yml": workflow(
                """
- uses: actions/checkout@v4
- id: tree
  run: |
    echo "head=$(git rev-parse HEAD)" >> "$GITHUB_OUTPUT"
    echo "sha=$GITHUB_SHA" >> "$GITHUB_OUTPUT"
    echo "files=$(ls -A | sort | tr '\\n' ' ')" >> "$GITHUB_OUTPUT"
    echo "committed=$(cat committed.txt)" >> "$GITHUB_OUTPUT"
"""
            ),
        },
    )
    head = git(repo, "rev-parse", "HEAD")
    (repo / "ignored.txt").write_text("ignored\n")
    (repo / "untracked.txt").write_text("untracked\n")
    (repo / "committed.txt").write_text("changed, not committed\n")
    run = run_act(act_bin, repo, tmp_path / "cache")
    assert run.returncode == 0, run.explain()
    tree = run.outputs("tree")
    assert tree["head"] == tree["sha"] == head
    files = tree["files"].split()
    assert {".git", ".github", ".gitignore", "committed.txt", "untracked.txt"} <= set(files)
    assert "ignored.txt" not in files
    # the working tree, not the commit: unlike GitHub's checkout
    assert tree["committed"] == "changed, not committed"


def test_a_remote_action_resolves_offline_with_local_repository(
    act_bin: Path, tmp_path: Path
) -> None:
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "action.yml").write_text(SMOKE_ACTION)
    repo = make_repo(
        tmp_path / "repo",
        {
            ".github/workflows/e2e.yml": workflow(
                """
- id: kit
  uses: org/dl-ci@v1
  with:
    who: remote
"""
            )
        },
    )
    run = run_act(act_bin, repo, tmp_path / "cache", "--local-repository", f"org/dl-ci@v1={kit}")
    assert run.returncode == 0, run.explain()
    assert run.outputs("kit") == {"greeting": "hello remote"}
    assert "### dl-ci e2e summary for remote\n" in run.summaries()

    unmapped = run_act(act_bin, repo, tmp_path / "cache")
    assert unmapped.returncode != 0
    assert unmapped.job_result() == "failure"
    assert "github.com/org/dl-ci" in unmapped.log + unmapped.stderr
