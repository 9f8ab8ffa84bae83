"""What ``dlci bisect`` does: plan and print the cost, then run the gate on candidate commits,
each in a clean worktree of its own, as :mod:`dlci.bisect.search` decides, until the first bad
commit (or the range it lies in) is known or the budget is spent.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlci import jsonio
from dlci.action.github.api import ApiError, GitHub
from dlci.bisect import git
from dlci.bisect.gates import Gate, Judged
from dlci.bisect.install import INSTALLS, Installed, Unrunnable, install
from dlci.bisect.result import AnswerShape, RunShape, result
from dlci.bisect.search import Answer, Search, Step
from dlci.errors import EXIT_USAGE, DlciError
from dlci.fsutil import read_input
from dlci.report.history import checked

SCHEMA_VERSION = 1
TAIL_LINES = 3
TIMED_OUT = 124
# what a gate run never gets: the job's tokens (GitHub's, the runtime's, OIDC's)
TOKENS = frozenset({
    "GITHUB_TOKEN", "GH_TOKEN", "DLCI_GITHUB_TOKEN", "ACTIONS_RUNTIME_TOKEN",
    "ACTIONS_ID_TOKEN_REQUEST_TOKEN", "ACTIONS_ID_TOKEN_REQUEST_URL",
})  # fmt: skip


@dataclass(frozen=True)
class BisectRequest:
    repo: Path
    good: str
    bad: str
    gate: Gate = field(default_factory=Gate)
    install: str = "path"
    reruns: int = 2  # extra seeds a near or decisive verdict is re-run on; 0: none
    seed: int = 0
    max_runs: int | None = None  # gate runs; None: the bisection's need plus 4
    time_cap_minutes: float = 60.0
    run_timeout_minutes: float = 30.0
    workdir: Path | None = None  # worktrees and run folders (default: a temporary folder)
    keep: bool = False  # keep the worktrees and run folders
    dlci: tuple[str, ...] = ()  # the command that runs dlci (default: this environment's)
    github_token: str | None = field(default=None, repr=False)  # pull requests and authors
    history: str | None = None  # history.json, for --good last-green

    def checked(self) -> BisectRequest:
        if self.install not in INSTALLS:
            raise DlciError(f"--install {self.install!r}: choose from {', '.join(INSTALLS)}")
        if not 0 <= self.reruns <= 10:
            raise DlciError(f"--reruns must be from 0 to 10, got {self.reruns}")
        if self.max_runs is not None and self.max_runs < 0:
            raise DlciError(f"--max-runs must be 0 (the plan only) or more, got {self.max_runs}")
        for name, value in (
            ("--time-cap", self.time_cap_minutes),
            ("--run-timeout", self.run_timeout_minutes),
        ):
            if not value > 0:
                raise DlciError(f"{name} must be more than 0 minutes, got {value:g}")
        return self


def needed_runs(candidates: int) -> int:
    """First runs a plain bisection needs for ``candidates`` commits where the first bad
    one may be.

    >>> needed_runs(11), needed_runs(1)
    (4, 0)
    """
    return math.ceil(math.log2(candidates)) if candidates > 1 else 0


def plan(request: BisectRequest, commits: list[git.Commit]) -> dict[str, Any]:
    """The cost bound, before anything runs."""
    n = len(commits) - 1
    need = needed_runs(n)
    max_runs = request.max_runs if request.max_runs is not None else need + 4
    return {
        "candidates": n,
        "bisection_runs": need,
        "max_runs": max_runs,
        "time_cap_minutes": request.time_cap_minutes,
        "run_timeout_minutes": request.run_timeout_minutes,
        "reruns": request.reruns,
        "text": (
            f"{n} commit(s) after the good one, the bad one included; a plain bisection needs "
            f"{need} gate run(s), confirming the answer 1 or 2 more, each verdict near its "
            f"threshold or overturned 1 more (re-runs take {request.reruns} seed(s) at once); "
            f"this bisect stops at {max_runs} gate runs or {request.time_cap_minutes:g} min, "
            f"each run at most {request.run_timeout_minutes:g} min"
        ),
    }


def dlci_command() -> tuple[str, ...]:
    """This environment's ``dlci`` console script, else ``python -m dlci``."""
    script = Path(sys.executable).with_name("dlci")
    return (str(script),) if script.exists() else (sys.executable, "-m", "dlci")


class _TimeCap(Exception):
    """A gate run cut short by the bisect's own time cap: no verdict, the bisect ends."""


@dataclass
class _Runner:
    request: BisectRequest
    commits: list[git.Commit]
    workdir: Path
    say: Callable[[str], None]
    clone: Path  # the shared clone the worktrees are made from
    prefix: str  # the project's folder inside the repository ('' at its root)
    deadline: float
    max_runs: int
    runs: int = 0
    seed_runs: int = 0
    installed: dict[int, Installed | str] = field(default_factory=dict)
    log: dict[int, list[RunShape]] = field(default_factory=dict)
    next_seed: dict[int, int] = field(default_factory=dict)

    def worktree(self, index: int) -> Installed | str:
        """The commit's clean worktree, installed once; a string: why it cannot be."""
        if index not in self.installed:
            commit = self.commits[index]
            git.add_worktree(self.clone, commit.sha, self.workdir / "trees" / commit.short)
            path = self.tree(index)
            try:
                into = self.workdir / "installs" / commit.short
                left = max(self.deadline - time.monotonic(), 1.0)
                self.installed[index] = install(path, self.request.install, into, timeout=left)
            except Unrunnable as exc:
                self.installed[index] = str(exc)
        return self.installed[index]

    def tree(self, index: int) -> Path:
        """The commit's project folder in its worktree (the repository's subfolder given)."""
        return self.workdir / "trees" / self.commits[index].short / self.prefix

    def run(self, step: Step) -> tuple[list[str], bool]:
        """One step: the gate on the commit (its first run, or re-runs on new seeds)."""
        index, commit = step.index, self.commits[step.index]
        seed = self.next_seed.get(index, self.request.seed)
        seeds = 1 if step.purpose == "test" else self.request.reruns
        installed = self.worktree(index)
        start = time.monotonic()
        if isinstance(installed, str):
            judged = Judged(["skip"], {}, False, installed)
            exit_code = None
        else:
            judged, exit_code = self._gate(index, installed, seed, seeds)
        self.next_seed[index] = seed + seeds
        seconds = time.monotonic() - start
        self.seed_runs += len(judged.verdicts)
        record = RunShape(
            purpose=step.purpose,  # type: ignore[arg-type]
            seeds=list(range(seed, seed + len(judged.verdicts))) if exit_code is not None else [],
            verdicts=judged.verdicts,  # type: ignore[arg-type]
            near=judged.near,
            figures=judged.figures,
            reason=judged.reason,
            exit_code=exit_code,
            seconds=round(seconds, 2),
        )
        self.log.setdefault(index, []).append(record)
        shown = ",".join(judged.verdicts) + (" (near its threshold)" if judged.near else "")
        self.say(f"{commit.short} {step.purpose}: {shown} in {seconds:.1f} s: {judged.reason}")
        return judged.verdicts, judged.near

    def _gate(
        self, index: int, installed: Installed, seed: int, seeds: int
    ) -> tuple[Judged, int | None]:
        gate = self.request.gate
        commit = self.commits[index]
        runs = seeds if gate.kind == "memorize" else 1
        verdicts: list[str] = []
        judged = Judged([])
        code: int | None = None
        for k in range(seeds if gate.kind != "memorize" else 1):
            if k and self.spent():  # one process per seed: the budget holds between them
                break
            out = self.workdir / "runs" / f"{commit.short}-{self.runs + 1}"
            out.mkdir(parents=True, exist_ok=True)
            argv = [*(self.request.dlci or dlci_command()), *gate.argv(out, seed + k, runs)]
            env = installed.environment(gate_environment(os.environ))
            timeout = min(self.request.run_timeout_minutes * 60, self.deadline - time.monotonic())
            self.runs += 1
            code = _call(argv, self.tree(index), env, out, timeout)
            if code == TIMED_OUT and time.monotonic() >= self.deadline:
                raise _TimeCap
            if code == EXIT_USAGE:  # the same dlci runs every commit: the bisect's mistake
                raise DlciError(
                    f"dlci {gate.kind} refused the gate's command line: {_tail(out / 'gate.log')}",
                    hint="check the gate's options (dlci bisect --help)",
                )
            judged = gate.judge(out, code, runs, _tail(out / "gate.log"))
            verdicts += judged.verdicts
        judged.verdicts = verdicts
        return judged, code

    def spent(self) -> str | None:
        if self.runs >= self.max_runs:
            return f"the budget of {self.max_runs} gate runs is spent"
        if time.monotonic() >= self.deadline:
            return f"the time cap of {self.request.time_cap_minutes:g} min is spent"
        return None


def gate_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment without its tokens: a commit's code needs none to be judged.

    >>> sorted(gate_environment({"PATH": "/bin", "GITHUB_TOKEN": "t", "GH_TOKEN": "t"}))
    ['PATH']
    """
    return {k: v for k, v in base.items() if k not in TOKENS}


def _call(argv: list[str], cwd: Path, env: dict[str, str], out: Path, timeout: float) -> int:
    """Run the gate; its output to out/gate.log; exit code 124 on a time-out."""
    with open(out / "gate.log", "wb") as log:
        try:
            return subprocess.run(
                argv,
                cwd=cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=max(timeout, 1.0),
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            log.write(b"\ndlci bisect: the gate run timed out\n")
            return TIMED_OUT


def _tail(path: Path) -> str:
    try:
        lines = path.read_bytes()[-4096:].decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in lines[-TAIL_LINES:] if line.strip())[:500]


def run_bisect(request: BisectRequest, say: Callable[[str], None]) -> AnswerShape:
    """The bisect, start to answer (see the module docstring)."""
    request = request.checked()
    repo = Path(git.git(request.repo, "rev-parse", "--show-toplevel").strip())
    prefix = git.git(request.repo, "rev-parse", "--show-prefix").strip()  # a monorepo's project
    good = request.good
    if good == "last-green":
        good = last_green(request.history)
        say(f"good: {good[:12]}, the newest night in {request.history} whose memorization passed")
    request = BisectRequest(**{**request.__dict__, "repo": repo, "good": good})
    commits = git.chain(repo, request.good, request.bad)
    cost = plan(request, commits)
    say(f"gate: {request.gate.describe()}")
    say(f"cost: {cost['text']}")
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="dlci-bisect-", dir=request.workdir))
    clone = git.shared_clone(repo, workdir / "repo")
    deadline = started + request.time_cap_minutes * 60
    runner = _Runner(request, commits, workdir, say, clone, prefix, deadline, cost["max_runs"])
    search = Search(
        len(commits) - 1, reruns=request.reruns, confirm_passes=request.gate.confirm_passes
    )
    try:
        answer = _loop(search, runner)
    finally:
        if not request.keep:  # the clone, its worktrees and every run's folder
            shutil.rmtree(workdir, ignore_errors=True)

    setup = {"gate": request.gate.describe(), "install": request.install}
    return result(
        setup,
        github_client(request.github_token, say),
        commits,
        search,
        answer,
        runner.log,
        cost,
        {
            "gate_runs": runner.runs,
            "seed_runs": runner.seed_runs,
            "wall_s": round(time.monotonic() - started, 1),
            "workdir": str(workdir) if request.keep else None,
        },
        say,
    )


def last_green(history: str | None) -> str:
    """The commit of the newest night in a ``dlci history`` file whose memorization passed."""
    if not history:
        raise DlciError("--good last-green needs --history FILE (dlci history's history.json)")
    try:
        data, _, _ = checked(jsonio.decode(read_input(history, what="the history")))
    except jsonio.DecodeError as exc:
        raise DlciError(f"{history}: not JSON ({exc})") from None
    green = [e for e in data.entries if e.sha and e.epochs_to_threshold is not None]
    if not green:
        raise DlciError(
            f"{history}: no night with a commit whose memorization passed",
            hint="give --good REV",
        )
    return str(green[-1].sha)


def github_client(token: str | None, say: Callable[[str], None]) -> GitHub | None:
    """A GitHub client from the environment when a token is given, else None (and why not,
    said, when the environment cannot make one)."""
    if not token:
        return None
    try:
        return GitHub.from_environment(token)
    except ApiError as exc:
        say(f"pull requests not looked up: {exc}")
        return None


def _loop(search: Search, runner: _Runner) -> Answer:
    near: int | None = None
    while True:
        step = search.next(near)
        if isinstance(step, Answer):
            return step
        why = runner.spent()
        if why:
            runner.say(f"stopped: {why}")
            return search.unfinished()
        try:
            verdicts, is_near = runner.run(step)
        except _TimeCap:
            runner.say(
                f"stopped: the time cap of {runner.request.time_cap_minutes:g} min "
                f"cut the run of {runner.commits[step.index].short} short"
            )
            return search.unfinished()
        search.record(step.index, verdicts)
        near = step.index if step.purpose == "test" and is_near else None
