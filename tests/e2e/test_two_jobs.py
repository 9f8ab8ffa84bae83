"""Two jobs of one machine at once (issue 51): the consumer's pull request and its push, each
from its own work folder, under act at the same time on one Docker engine.

The consumer is examples/workflows/pr.yml in a user's repository (the digits example), with
one change: the image is built from the repository's own Dockerfile (``FROM`` the kit image,
a step that takes seconds), so the two jobs meet at the build. The push starts first; the pull
request starts once the push's build has begun, so it reaches the build while the push holds
the machine's build lock, and reuses the push's image (an untrusted job may use a trusted
job's image of the same inputs; never the other way round). Each job says which runner it is
(``DLCI_RUNNER``, as setup.sh writes in a runner's .env), and while the pull request's
container runs, the job-completed hook of a third runner on the machine removes its own
runner's containers: none of the two jobs'.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from test_act import DEAD_PROXY, ROOT, ActRun, share_tool_cache
from test_action import no_job_containers, stand_in_actions  # noqa: F401 (a fixture)
from test_workflows import OFFLINE_PIP, UPLOAD_STAND_IN, user_repo

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("no_job_containers")]

HOOK = ROOT / "docker" / "runner" / "cleanup-hook.sh"


class Job:
    """An act run in the background: its JSON log read as it comes."""

    def __init__(self, act_bin: Path, tmp: Path, repo: Path, kit: Path, runner: str, *extra: str):
        cache = tmp / "cache"
        env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
        share_tool_cache(cache)  # one tool cache for both: the host venv is installed once
        for name in ("GITHUB_TOKEN", "GH_TOKEN", "ACTIONS_RUNTIME_TOKEN", "NO_PROXY", "no_proxy"):
            env.pop(name, None)
        for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY"):
            env[name] = DEAD_PROXY
        args = ["--local-repository", f"org/dl-ci@v1={kit}", "--env", f"DLCI_RUNNER={runner}"]
        for ref, folder in stand_in_actions(tmp).items():
            if ref.startswith("actions/upload-artifact@"):
                (folder / "action.yml").write_text(UPLOAD_STAND_IN)
            args += ["--local-repository", f"{ref}={folder}"]
        argv = [str(act_bin), *extra, "-P", "self-hosted=-self-hosted", "--action-offline-mode"]
        self.cache, self.started = cache, time.monotonic()
        self.lines: list[str] = []
        self.stderr = tmp / "act.stderr"
        with open(self.stderr, "w") as stderr:  # a file: a full pipe would stop act
            self.proc = subprocess.Popen(
                [*argv, "--json", *args, *OFFLINE_PIP],
                cwd=repo, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=stderr, text=True,
            )  # fmt: skip
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def saw(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def finish(self, timeout: float) -> ActRun:
        try:
            self.proc.wait(timeout=timeout)  # the reader thread alone reads its stdout
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(30)
        stderr = self.stderr.read_text()
        events = [json.loads(x) for x in self.lines if x.startswith("{")]
        log = "\n".join(str(e.get("msg", "")) for e in events)
        seconds = time.monotonic() - self.started
        return ActRun(self.proc.returncode, seconds, events, stderr, log)


def consumer(tmp: Path, marker: str) -> tuple[Path, Path]:
    """pr.yml in a user's repository, its image built from the repository's Dockerfile."""
    repo, kit = user_repo(tmp, "pr.yml")
    workflow = repo / ".github" / "workflows" / "pr.yml"
    text = workflow.read_text()
    image_line = "          image: ${{ vars.DLCI_IMAGE }}\n"
    assert image_line in text
    # the memorization gate's container alone is the window in which both jobs run at once:
    # the doctor and the profile are left to the tests that read them (the suite's time)
    lean = '          dockerfile: ci.Dockerfile\n          doctor: "false"\n          profile: "false"\n'
    workflow.write_text(text.replace(image_line, lean))
    image = os.environ.get("DLCI_E2E_IMAGE", "dl-ci:e2e")
    # a step of a few seconds, unique to this test run (no layer cache from an earlier one)
    (repo / "ci.Dockerfile").write_text(f"FROM {image}\nRUN echo {marker} && sleep 10\n")
    (repo / ".dockerignore").write_text("*\n")  # the context: the Dockerfile alone
    subprocess.run(["git", "add", "--all"], cwd=repo, check=True)
    env = {**os.environ, "GIT_AUTHOR_NAME": "e2e", "GIT_AUTHOR_EMAIL": "e2e@example.invalid"}
    env |= {"GIT_COMMITTER_NAME": "e2e", "GIT_COMMITTER_EMAIL": "e2e@example.invalid"}
    subprocess.run(["git", "commit", "-qm", "ci image"], cwd=repo, env=env, check=True)
    return repo, kit


def job_containers(docker: str) -> dict[str, str]:
    """The running job containers of the engine: id -> their runner's label."""
    done = subprocess.run(
        [docker, "ps", "--filter", "label=dlci.job", "--format", '{{.ID}} {{.Label "dlci.runner"}}'],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)


def test_a_pull_request_and_a_push_at_once_on_one_engine(
    tmp_path: Path, kit_image: str, act_bin: Path, docker_engine: str
) -> None:
    marker = uuid.uuid4().hex
    pr_repo, pr_kit = consumer(tmp_path / "pr", marker)
    push_repo, push_kit = consumer(tmp_path / "push", marker)
    pr_event, push_event = tmp_path / "pr.json", tmp_path / "push.json"
    project = {"full_name": "org/project", "default_branch": "main"}
    pr_event.write_text(
        json.dumps(
            {
                "number": 7,
                "pull_request": {"number": 7, "head": {"repo": {"full_name": "org/project"}}},
                "repository": project,
            }
        )
    )
    push_event.write_text(json.dumps({"ref": "refs/heads/main", "repository": project}))
    push = Job(
        act_bin, tmp_path / "push", push_repo, push_kit, "runner-push",
        "push", "--eventpath", str(push_event),
    )  # fmt: skip
    seen: dict[str, set[str]] = {"runner-pr": set(), "runner-push": set()}
    at_once: list[str] = []
    hook: subprocess.CompletedProcess[str] | None = None
    hook_saw_pr: list[str] = []
    pr: Job | None = None
    deadline = time.monotonic() + 900
    try:
        while push.proc.poll() is None and time.monotonic() < deadline:
            if pr is None and push.saw("building dlci-local:trusted-"):
                pr = Job(
                    act_bin, tmp_path / "pr", pr_repo, pr_kit, "runner-pr",
                    "pull_request", "--eventpath", str(pr_event),
                )  # fmt: skip
            running = job_containers(docker_engine)
            for cid, runner in running.items():
                seen.setdefault(runner, set()).add(cid)
            if {"runner-pr", "runner-push"} <= set(running.values()):
                at_once = at_once or sorted(running)
            if hook is None and "runner-pr" in running.values():
                # a third runner's job-completed hook, while the pull request's job runs
                env = {**os.environ, "DLCI_RUNNER": "runner-idle"}
                hook = subprocess.run(
                    ["bash", str(HOOK), "containers"], env=env, capture_output=True, text=True,
                    timeout=120,
                )  # fmt: skip
                pr_ids = subprocess.run(
                    [docker_engine, "ps", "-q", "--filter", "label=dlci.runner=runner-pr"],
                    capture_output=True, text=True, timeout=60,
                )  # fmt: skip
                hook_saw_pr = pr_ids.stdout.split()  # the runner's own filter does find it
            time.sleep(0.5)
        push_run = push.finish(timeout=max(deadline - time.monotonic(), 30))
        assert pr is not None, "the push never began its build:\n" + push_run.explain()
        pr_run = pr.finish(timeout=max(deadline - time.monotonic(), 30))
    finally:
        for job in (push, pr):
            if job is not None and job.proc.poll() is None:
                job.proc.kill()
        (tmp_path / "act.log").write_text(
            "".join(push.lines) + "\n\n" + "".join(pr.lines if pr else [])
        )
        # this run's images (their inputs hold the marker: no later run finds them)
        logs = "".join(push.lines) + "".join(pr.lines if pr else [])
        for tag in set(re.findall(r"dlci-local:(?:un)?trusted-[0-9a-f]+", logs)):
            subprocess.run([docker_engine, "image", "rm", "--force", tag], capture_output=True)

    # both jobs finish with their own verdicts
    for run in (push_run, pr_run):
        assert run.returncode == 0, run.explain()
        assert run.job_result() == "success", run.explain()
        assert run.outputs("dlci")["verdict"] == "pass", run.explain()
    assert json.loads(pr_run.outputs("dlci")["tier"])["budget"] == "pr"
    assert "container: cache: volume dlci-cache-untrusted (untrusted job)" in pr_run.log
    assert "container: cache: volume dlci-cache-trusted (trusted job)" in push_run.log

    # the image is built once: by the push; the pull request reuses it
    builds = [x for x in (push_run.log + pr_run.log).splitlines() if "building dlci-local:" in x]
    assert len(builds) == 1 and "dlci-local:trusted-" in builds[0], builds
    tag = builds[0].split("building ", 1)[1].split()[0]
    assert f"{tag} is up to date" in pr_run.log, pr_run.explain()
    assert "building dlci-local:" not in pr_run.log

    # the two jobs ran their containers at the same time, each labelled with its runner
    assert seen["runner-pr"] and seen["runner-push"], seen
    assert at_once, f"the jobs' containers never ran at the same time: {seen}"
    # a neighbour's hook removed none of them, though the pull request's container ran then
    assert hook is not None and hook.returncode == 0, hook
    assert hook_saw_pr, "the pull request's container was not running at the hook"
    assert "removing dl-ci job containers" not in hook.stdout, hook.stdout
    # neither job's cleanup removed a container: the other's were never its to remove
    for run in (push_run, pr_run):
        assert "cleanup: 0 container(s) removed" in run.log, run.explain()
    waited = "waiting for it" in pr_run.log
    print(
        f"two jobs at once: push {push_run.seconds:.0f} s, pull request {pr_run.seconds:.0f} s "
        f"(the pull request {'waited for' if waited else 'came after'} the push's build)"
    )
