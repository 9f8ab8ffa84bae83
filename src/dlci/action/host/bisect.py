"""The action's bisect of a red run (``dlci container bisect``, the ``bisect`` input): on the
trusted branch's own run whose gate failed, ``dlci bisect`` in one container of the job's
image names the first commit since the last green run that fails the same gate.

Host-side, never imports torch. What the host decides, and what the container does:

- whether to bisect at all: only on a run of the branch's own code (a push, schedule or
  manual run: never a pull request's job, whose code nobody has reviewed; bisecting runs the
  code of every commit since the last green run), and only by a gate the host's own record
  says failed: the memorization test; else the first failing doctor check; else the
  profile's GPU gate at the trusted ``min-gpu-util``;
- the good commit: ``last-green``, the commit of the newest successful run of this workflow
  on this branch (GitHub's API, with the token's ``actions: read``), or a revision given;
- the container: the job's image and GPUs (dlci.action.host.container.run_command) with a
  pull request's limits, whatever the event (the untrusted cache volume, pids and memory,
  and no network unless the ``network`` input asks): it runs the code of commits that may
  never have run on this runner, a reverted one too; the job plan read-only at /dlci/host
  (tonight's tier judges every commit), the checkout's ``.git`` read-only under an empty
  workspace (the bisect clones it, ``--shared``, and checks each commit out in that clone),
  its answer into /dlci/out, and no token;
- after it: the answer is a claim. It is read back under caps and rebuilt from its declared
  shape (dlci.bisect.result.read_answer), must name the good and bad commits asked for, and
  what it says of pull requests is dropped: each suspect's pull request is looked up here
  with the token. ``bisect.json`` goes beside the host's reports (``dlci summary`` puts the
  culprit at the top; the upload keeps it); the console lines are printed with workflow
  commands stopped; the opt-in comment goes only to the pull request GitHub names for the
  culprit, and only when GitHub confirms the culprit lies between the good and bad commits.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlci import jsonio
from dlci.action.github import artifacts
from dlci.action.github.api import ApiError, GitHub
from dlci.action.github.comment import MAX_BODY, post_or_update
from dlci.action.host import container
from dlci.action.host.cache import UNTRUSTED
from dlci.action.host.gates import HOST_MOUNT, OUT_MOUNT, PLAN_NAME, WORKSPACE, reports_dir
from dlci.action.host.gitview import hide_credentials, host_temp
from dlci.action.host.image import say
from dlci.action.host.summary import read_report
from dlci.bisect.render import console_lines, markdown
from dlci.bisect.result import AnswerShape, add_pulls, read_answer
from dlci.bisect.run import github_client
from dlci.errors import DlciError
from dlci.policy import CHECK_IDS
from dlci.script.command import command_words
from dlci.trust import host as trusted

ANSWER = "bisect.json"
SHA = re.compile(r"[0-9a-f]{40}")
START_MINUTES = 10.0  # beyond the bisect's own time cap: the container's start, the clone
MARKER = "<!-- dl-ci bisect -->"


@dataclass(frozen=True)
class NightRequest:
    """What ``dlci container bisect`` was asked for."""

    image: str
    record: str  # the host's record of the job's run (DLCI_HOST_RECORD)
    good: str = "last-green"
    time_cap_minutes: float = 60.0
    comment: bool = False
    workspace: str = "."
    workdir: str = "."
    gpus: str = "auto"
    gpu_found: str = ""
    shm_size: str = ""
    memory: str = ""
    network: str = "auto"
    target: str = ""  # the action's target input (module:function); '' each commit's own
    job: str = ""
    token: str = ""


@dataclass(frozen=True)
class Outcome:
    """What the step outputs: ``status`` (found, range, not-reproduced, unfinished, or
    skipped), the culprit's commit and pull request; ``exit_code`` for the step."""

    status: str
    culprit: str = ""
    pull: str = ""
    exit_code: int = 0

    def outputs(self) -> dict[str, str]:
        return {"bisect-status": self.status, "culprit": self.culprit, "culprit-pull": self.pull}


def why_not(environ: Mapping[str, str]) -> str:
    """Why this run may not bisect ('' when it may): a pull request's job never does.

    >>> why_not({"GITHUB_EVENT_NAME": "pull_request"})[:38]
    'not on a pull_request run: bisecting r'
    >>> why_not({"GITHUB_EVENT_NAME": "schedule"})
    ''
    """
    event = environ.get("GITHUB_EVENT_NAME", "")
    if event in artifacts.TRUSTED_EVENTS:  # a merge queue's code is not on the branch yet
        return ""
    return (
        f"not on a {event or 'local'} run: bisecting runs the code of every commit since the "
        "last green run, so only the branch's own runs do it (push, schedule, "
        "workflow_dispatch)"
    )


def gate_of(record: Mapping[str, Any]) -> tuple[list[str], str]:
    """The gate that went red, as ``dlci bisect``'s options, from the host's record (its own
    verdicts, not the containers' claims); ``([], why)`` when no gate can be bisected.

    >>> gate_of({"run": {"steps": [{"name": "memorize", "status": "failed"}]}})
    (['--gate', 'memorize'], 'the memorization test failed')
    >>> gate_of({"run": {"steps": [{"name": "tests", "status": "failed"}]}})[1][:28]
    'no gate failed (failed steps'
    """
    run = record.get("run")
    steps = run.get("steps") if isinstance(run, dict) else None
    failed = [
        str(s.get("name"))
        for s in (steps if isinstance(steps, list) else [])
        if isinstance(s, dict) and s.get("status") == "failed"
    ]
    if "memorize" in failed:
        return ["--gate", "memorize"], "the memorization test failed"
    if "doctor" in failed:
        check = _failing_check(record)
        if check:
            return ["--gate", "doctor", "--check", check], f"the doctor's check {check} failed"
    if "profile" in failed:
        bound = trusted.number(record.get("preflight"), "min-gpu-util")
        if bound is not None:
            return ["--gate", "profile", "--min-gpu-util", f"{bound:g}"], (
                f"GPU utilization fell under min-gpu-util {bound:g}"
            )
    shown = ", ".join(failed[:5]) or "none"
    return [], (
        f"no gate failed (failed steps: {shown}); a bisect judges by the memorization test, "
        "a doctor check or the profile's GPU gate (for failing unit tests: git bisect run "
        "pytest)"
    )


def _failing_check(record: Mapping[str, Any]) -> str:
    """The first doctor check the host's copy of doctor.json says failed, if it is one of
    the kit's (an id the report makes up is never passed on)."""
    folder = record.get("reports_dir")
    report = read_report(Path(folder) / "doctor.json") if isinstance(folder, str) else None
    checks = report.get("checks") if isinstance(report, dict) else None
    for check in checks if isinstance(checks, list) else []:
        if (
            isinstance(check, dict)
            and check.get("status") == "fail"
            and check.get("id") in CHECK_IDS
        ):
            return str(check["id"])
    return ""


def last_green(api: GitHub, environ: Mapping[str, str]) -> tuple[str, str]:
    """The commit of the newest successful run of this workflow on this branch (never this
    run, never a pull request's) and a line saying which run it was."""
    workflow = artifacts.workflow_file(dict(environ))
    branch = environ.get("GITHUB_REF_NAME") or ""
    if not workflow or not branch:
        raise DlciError(
            "bisect-good last-green needs GITHUB_WORKFLOW_REF and GITHUB_REF_NAME",
            hint="GitHub sets both; give bisect-good a commit to bisect from elsewhere",
        )
    runs = artifacts.candidate_runs(
        api, workflow=workflow, branch=branch, status="success",
        this_run=environ.get("GITHUB_RUN_ID", ""),
    )  # fmt: skip
    try:
        run = next(runs, None)
    except ApiError as exc:
        raise DlciError(f"the last green run could not be looked up: {exc}") from None
    if run is None:
        raise DlciError(
            f"no successful run of {workflow} on {branch} yet: nothing green to bisect from",
            hint="give bisect-good a commit that passed",
        )
    sha = str(run.get("head_sha") or "")
    if not SHA.fullmatch(sha):
        raise DlciError(f"run {run['id']}: its head_sha is not a commit id ({sha[:60]!r})")
    return sha, f"run {run['id']} of {workflow} on {branch}, the newest successful one"


def inner_command(request: NightRequest, good: str, bad: str, gate: list[str]) -> list[str]:
    """``dlci bisect``'s command line in the container."""
    repo = WORKSPACE if os.path.normpath(request.workdir or ".") == "." else (
        f"{WORKSPACE}/{os.path.normpath(request.workdir)}"
    )  # fmt: skip
    target = ["--target", request.target] if request.target else []
    return [
        "dlci", "bisect", "--repo", repo, "--good", good, "--bad", bad, *gate, *target,
        "--plan", f"{HOST_MOUNT}/{PLAN_NAME}", "--time-cap", f"{request.time_cap_minutes:g}",
        "--json", f"{OUT_MOUNT}/{ANSWER}",
    ]  # fmt: skip


def bisect(request: NightRequest, environ: Mapping[str, str] = os.environ) -> Outcome:
    """The whole step: decide, run the container, read back, look up, write, comment."""
    why = why_not(environ)
    record = read_report(Path(request.record)) if request.record else None
    gate, words = gate_of(record or {}) if record else ([], "no host record of the job's run")
    if request.target and command_words(request.target) is not None:
        why = "the target is a training command (script mode): dlci bisect runs a Target"
    if why or not gate:
        say(f"bisect: not run: {why or words}")
        return Outcome("skipped")
    api = github_client(request.token, lambda line: say(f"bisect: {line}"))
    good = request.good.strip() or "last-green"
    if good == "last-green":
        if api is None:
            raise DlciError("bisect-good last-green needs the token (github-token)")
        good, which = last_green(api, environ)
        say(f"bisect: last green: {good[:12]}, {which}")
    bad = environ.get("GITHUB_SHA", "")
    bad = bad if SHA.fullmatch(bad) else "HEAD"
    say(f"bisect: {words}: the first commit after {good[:12]} up to {bad[:12]} that fails it")
    data = _run(request, record or {}, inner_command(request, good, bad, gate), environ)
    asked = {"good": good, "bad": bad}
    for side, rev in asked.items():
        named = (data.good if side == "good" else data.bad).sha
        if SHA.fullmatch(rev) and named != rev:
            raise DlciError(f"the bisect's answer names {side} {named[:12]}, "
                            f"not the {rev[:12]} it was asked for: not shown")  # fmt: skip
    if api is not None:
        add_pulls(data, api, lambda line: say(f"bisect: {line}"))
    folder = reports_dir(request.record)
    folder.mkdir(parents=True, exist_ok=True)
    jsonio.write(folder / ANSWER, data)
    _print(console_lines(data))
    first = data.first_bad
    culprit = first.sha if first else ""
    pull = first.pull.number if first and first.pull else None
    if request.comment:
        doubt = _between(api, data.good.sha, culprit, data.bad.sha)
        say(f"bisect: {doubt or _comment(api, pull, data, environ)}")
    status = str(data.status)
    return Outcome(status, culprit, str(pull or ""),
                   1 if status == "unfinished" else 0)  # fmt: skip


def _print(lines: list[str]) -> None:
    """The answer's lines (escaped by the renderer) between ``::stop-commands::`` and its
    token: none of them is ever read as a workflow command."""
    token = secrets.token_hex(16)
    print(f"::stop-commands::{token}", flush=True)
    print("\n".join(lines), flush=True)
    print(f"::{token}::", flush=True)


def _between(api: GitHub | None, good: str, sha: str, bad: str) -> str:
    """'' when GitHub says ``sha`` comes after ``good`` and not after ``bad`` (the culprit the
    answer names is one of the commits bisected), else why no comment is made."""
    if api is None or not sha:
        return "no comment: no token, or no single culprit"
    try:
        after_good = api.get(f"/repos/{{repo}}/compare/{good}...{sha}")
        before_bad = api.get(f"/repos/{{repo}}/compare/{sha}...{bad}")
    except ApiError as exc:
        return f"no comment: the culprit's place could not be checked: {exc}"
    states = [a.get("status") if isinstance(a, dict) else None for a in (after_good, before_bad)]
    if states[0] == "ahead" and states[1] in ("ahead", "identical"):
        return ""
    return f"no comment: GitHub does not place {sha[:12]} between the good and bad commits"


def _run(
    request: NightRequest, record: Mapping[str, Any], inner: list[str], environ: Mapping[str, str]
) -> AnswerShape:
    """The bisect's container; its answer, checked."""
    plan = record.get("preflight")
    if not isinstance(plan, dict):
        raise DlciError("the host's record has no job plan: the tests step did not run")
    workspace = Path(request.workspace).resolve()
    workdir = os.path.normpath(request.workdir or ".")
    if workdir.startswith("..") or os.path.isabs(workdir):
        raise DlciError(f"working directory {request.workdir!r} is outside the workspace")
    env = dict(environ)
    with host_temp(env) as tmp:
        base = Path(tmp)
        for name in ("host", "out", "ws"):
            (base / name).mkdir(mode=0o755)
        jsonio.write(base / "host" / PLAN_NAME, plan)
        empty = base / "ws"  # the work tree is the clone's: only .git is mounted
        (empty / workdir).mkdir(parents=True, exist_ok=True)
        job = request.job or f"local-{os.getpid()}"
        name = f"dlci-{job}"[:110] + "-bisect"
        gpus, visible = container.job_gpus(request.gpus, request.gpu_found)
        cmd = container.run_command(
            image=request.image, name=name, job=job, workspace=empty, workdir=request.workdir,
            gpus=gpus, shm_size=request.shm_size, env_names=(),
            memory=request.memory or container.default_memory(UNTRUSTED), environ=env,
            inner=inner, uid=os.getuid(), gid=os.getgid(), network=request.network,
            trust=UNTRUSTED, created=int(time.time()), git_from=workspace,
            hidden_files=hide_credentials(workspace, base), runner=container.runner_name(env),
            visible_devices=visible,
        )  # fmt: skip
        cmd[2:2] = ["-v", f"{base / 'host'}:{HOST_MOUNT}:ro", "-v", f"{base / 'out'}:{OUT_MOUNT}"]
        say(f"bisect: {' '.join(cmd)}")
        code, _ = container.watch(cmd, name, request.time_cap_minutes + START_MINUTES)
        answer = base / "out" / ANSWER
        try:
            written = answer.is_file() and not answer.is_symlink()
        except OSError:  # a folder the container made unreadable
            written = False
        if not written:
            raise DlciError(
                f"the bisect's container wrote no answer (exit code {code})",
                hint="its log above says why (a shallow checkout: fetch-depth: 0)",
            )
        data = read_answer(answer)
        shutil.rmtree(base / "out", ignore_errors=True)
    return data


def _comment(api: GitHub | None, pull: Any, data: AnswerShape, environ: Mapping[str, str]) -> str:
    """The answer as a comment on the culprit's pull request (updated in place when this run
    is re-run); what was done, in a line."""
    if data.status != "found" or not isinstance(pull, int) or isinstance(pull, bool):
        return "no comment: no single culprit with a pull request"
    if api is None:
        return "no comment: no token"
    run = environ.get("GITHUB_RUN_ID", "")
    link = f"{environ.get('GITHUB_SERVER_URL', 'https://github.com')}/{api.repository}"
    marker = f"{MARKER[:-4]} {run} -->" if run.isdigit() else MARKER
    body = (
        f"{marker}\n{markdown(data)}\nFound by dl-ci's bisect of the red run "
        f"{link}/actions/runs/{run if run.isdigit() else ''}.\n"
    )[:MAX_BODY]
    return post_or_update(api, pull, body, marker)
