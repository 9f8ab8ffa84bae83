"""The job inside the container (``dlci run``): its steps one after another, and ``run.json``.

install -> tests (pytest with doctests, coverage, JUnit) -> memorize -> doctor -> profile
(with analyze). Each step is its own process, so one that crashes or is killed leaves the
others' results; ``OUT/run.json`` (a RunRecord of dlci.report.fields) is rewritten after
every step starts and ends, so a job killed in the middle still says which step was running.

``--phase`` runs one part: ``install`` alone, ``tests`` (install and tests) or one gate
(install, then that gate), each in its own container (dlci.action.host.gates), so nothing the
tests step leaves behind reaches a gate; with ``--installed`` a part skips the install step
(the host runs it once and hands every part an image with it: dlci.action.host.installed).
The gates run the ``dlci`` console script next to this interpreter, never ``python -m dlci``
from the workspace, so a ``dlci/`` folder there is not imported.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from dlci import jsonio
from dlci.action.host.gates import stale_files
from dlci.action.host.verdicts import judge
from dlci.action.job.doctests import pytest_arguments
from dlci.action.job.files import image_torch, relative_coverage
from dlci.action.job.options import JobOptions, configured
from dlci.action.job.threads import from_container
from dlci.ladder.plan import read_plan
from dlci.report.fields import RunRecord, RunStep, Threads
from dlci.report.text import clean
from dlci.script.command import command_words

REPORT_NAME = "run.json"
STEPS = ("install", "tests", "memorize", "doctor", "profile")
GATES = ("memorize", "doctor", "profile")
PHASES = ("all", "install", "tests", *GATES)
INSTALLED_ONCE = "done once for the job, in its install container (dlci.action.host.installed)"
LOG_TAIL = 40
BAD = ("failed", "error", "interrupted")


def run_job(options: JobOptions) -> int:
    """Run every step, record each in OUT/run.json; 1 when a step failed, else 0."""
    options.out.mkdir(parents=True, exist_ok=True)
    if options.plan:  # the one hand-off of the host's plan: made absolute for every step
        read_plan(options.plan)  # a bad file is one clear error, before any step
        options = dataclasses.replace(options, plan=str(Path(options.plan).resolve()))
    options = configured(options)
    runner = Runner(options.out)
    threads, record = from_container(options.cpu_threads)
    runner.threads = msgspec.convert(record, Threads)
    runner.env.update(threads)  # every step's process: torch's and OpenMP's pools
    if os.environ.get("DLCI_IN_CONTAINER"):  # bytecode of its own: never a planted __pycache__
        runner.env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="dlci-pycache-")
    runner.rules = {
        "gpu_gate": options.min_gpu_util is not None or options.max_gpu_memory is not None,
        "allow_no_tests": options.allow_no_tests,
    }
    if options.installed:  # the host committed the install container: this image has it
        runner.skip("install", INSTALLED_ONCE)
    else:
        install = install_command(options.install)
        runner.step("install", install, shell=options.install not in ("auto", "none"))
    installed = runner.steps[-1].status in ("passed", "skipped")
    blocked = None if installed else "the install step failed"
    if options.phase in ("all", "tests"):
        _tests_step(runner, options, blocked)
    for name, command in _dlci_steps(options).items():
        if options.phase not in ("all", name):
            continue
        if command is None:
            runner.skip(name, f"switched off ({name}: false)")
        else:
            runner.step(name, command, blocked=blocked)
    return runner.finish()


def _tests_step(runner: Runner, options: JobOptions, blocked: str | None) -> None:
    current = options.out / ".current-test"
    current.unlink(missing_ok=True)
    runner.step(
        "tests",
        pytest_command(options),
        blocked=blocked,
        env={"DLCI_CURRENT_TEST_FILE": str(current)},
        current_test=current,
    )
    if runner.steps[-1].status != "interrupted":
        current.unlink(missing_ok=True)
    relative_coverage(options.out / "coverage.xml", Path.cwd())


def _dlci_steps(options: JobOptions) -> dict[str, list[str] | None]:
    """The memorize, doctor and profile steps' commands; None for a step switched off."""
    out = str(options.out)
    if options.plan:  # the host's plan, handed on by argument: each gate uses it as it is
        tier = ["--plan", options.plan]
    else:
        tier = ["--budget", options.budget, "--hardware", options.hardware]
        tier += ["--ladder", options.ladder] if options.ladder else []
    # a training command where the target goes (python train.py ...): script mode, the
    # command after -- and last (docs/script-mode.md); else --target MODULE:FUNCTION
    script = command_words(options.target) if options.target else None
    after = ["--", *script] if script is not None else []
    tail = [*tier, *(["--target", options.target] if options.target and not after else [])]
    dlci = [dlci_script()]
    doctor = ["--json", str(options.out / "doctor.json")]
    doctor += ["--markdown", str(options.out / "doctor.md")]
    profile = [*dlci, "profile", "--out", out, *tail]
    if options.min_gpu_util is not None:
        profile += ["--min-gpu-util", f"{options.min_gpu_util:g}"]
    if options.max_gpu_memory is not None:
        profile += ["--max-gpu-memory", f"{options.max_gpu_memory:g}"]
    return {
        "memorize": [*dlci, "memorize", "--out", out, *tail, *after] if options.memorize else None,
        "doctor": [*dlci, "doctor", "--out", out, *doctor, *tail, *after]
        if options.doctor
        else None,
        "profile": [*profile, *after] if options.profile else None,
    }


def dlci_script() -> str:
    """The ``dlci`` console script of this interpreter's environment.

    Not ``python -m dlci``: that puts the working directory (the pull request's workspace)
    first on sys.path, so a ``dlci/`` folder planted there would be imported instead.
    """
    import shutil

    beside = Path(sys.executable).with_name("dlci")
    if beside.is_file():
        return str(beside)
    return shutil.which("dlci") or "dlci"


def install_command(install: str) -> list[str] | str | None:
    """The install step: pip for ``auto``, None for ``none``, else the user's shell command."""
    if install == "none":
        return None
    if install != "auto":
        return install
    cmd: list[str] = []
    for name in ("requirements.txt", "requirements-dev.txt", "requirements-test.txt"):
        if Path(name).is_file():
            cmd += ["-r", name]
    if Path("pyproject.toml").is_file() or Path("setup.py").is_file():
        cmd += ["-e", "."]
    if not cmd:
        return None
    # No build isolation: the container may have no network, and the build backend
    # (setuptools) is already in its environment. -I: pip is never imported from the
    # workspace (a pip/ folder planted there would run in every gate's install).
    return [sys.executable, "-I", "-m", "pip", "install", "--no-build-isolation", *cmd]


def pytest_command(options: JobOptions) -> list[str]:
    """The tests step: pytest with JUnit XML, doctests and coverage unless switched off."""
    out = options.out
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    cmd.append(f"--junitxml={out / 'junit.xml'}")
    extra = shlex.split(options.pytest_args) if options.pytest_args else []
    if options.plan and not blocks_the_plugin(extra):
        # the dlci_tier fixture and assert_memorizes() take the host's tier. "-p dlci" loads
        # the plugin by its entry point's name, so the option exists also where the project
        # turns autoloading off (PYTEST_DISABLE_PLUGIN_AUTOLOAD); where it is loaded already,
        # pytest skips it.
        cmd += ["-p", "dlci", f"--dlci-plan={options.plan}"]
    if options.doctest:  # the project's own packages (dlci.action.job.doctests)
        cmd += pytest_arguments(Path("."))
    if options.coverage and not any(a.startswith("--cov") for a in extra):
        cmd += ["--cov=.", f"--cov-report=xml:{out / 'coverage.xml'}", "--cov-report=term"]
    cmd += extra
    cmd += shlex.split(options.tests) if options.tests else []
    return cmd


def blocks_the_plugin(args: list[str]) -> bool:
    """Whether the project's pytest arguments turn dl-ci's plugin off (``-p no:dlci``): then
    the tests get no plan, as they asked for no plugin.

    >>> blocks_the_plugin(["-p", "no:dlci"]), blocks_the_plugin(["-pno:dlci"])
    (True, True)
    >>> blocks_the_plugin(["-p", "no:randomly", "-k", "no:dlci"])
    False
    """
    given = [b for a, b in itertools.pairwise(args) if a == "-p"]
    given += [a[2:] for a in args if a.startswith("-p") and len(a) > 2]
    return "no:dlci" in given


def classify(name: str, code: int, stopping: bool, running_test: str) -> dict[str, str]:
    """A step's status (and reason) from its exit code alone; its report must agree
    (dlci.action.host.gates.judge), and pytest's 5 (no tests collected) is a failure there unless
    allowed.

    >>> classify("tests", 5, False, "")
    {'status': 'failed'}
    >>> classify("memorize", -9, False, "")["killed"]
    'oom-or-kill'
    """
    if stopping:
        return {"status": "interrupted"}
    if code == 0:
        return {"status": "passed"}
    if code == 1 or (name == "tests" and code in (1, 2, 3, 4, 5)):
        return {"status": "failed"}
    if not (code < 0 or code >= 128):
        return {"status": "error"}
    signum = abs(code) if code < 0 else code - 128
    result = {"status": "interrupted", "reason": f"killed by signal {signum}"}
    if signum == signal.SIGKILL:
        result["reason"] += " (most likely out of memory: the container's limit or the machine's)"
        result["killed"] = "oom-or-kill"
    if running_test:
        result["reason"] += f" while running {running_test}"
        result["test"] = running_test
    return result


class Runner:
    """Runs the steps one process at a time; SIGTERM stops the running one and skips the rest."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.steps: list[RunStep] = []
        self.started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.child: subprocess.Popen[str] | None = None
        self.stopping = False
        self.env: dict[str, str] = {}  # for every step's process
        self.rules: dict[str, bool] = {}  # gates.judge's options: gpu_gate, allow_no_tests
        self.threads: Threads | None = None  # CPU threads set, and why (threads.py)
        self._previous = signal.signal(signal.SIGTERM, self._terminate)

    def _terminate(self, signum: int, frame: Any) -> None:
        # docker stop / a cancelled job: stop the step, record it, exit.
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.terminate()

    def _save(self, verdict: str | None = None) -> None:
        failed = [s.name for s in self.steps if s.status in BAD]
        report = RunRecord(
            started=self.started,
            cwd=str(Path.cwd()),
            steps=self.steps,
            failed_steps=failed,
            verdict=verdict or ("running" if not failed else "failing"),
            torch=image_torch(),
            threads=self.threads,
        )
        jsonio.write(self.out / REPORT_NAME, report)

    def skip(self, name: str, why: str) -> None:
        self.steps.append(RunStep(name=name, status="skipped", reason=why, duration_s=0.0))
        self._save()

    def step(
        self,
        name: str,
        command: list[str] | str | None,
        *,
        shell: bool = False,
        blocked: str | None = None,
        env: dict[str, str] | None = None,
        current_test: Path | None = None,
    ) -> None:
        """Run one step (or record why it is skipped), and save run.json before and after.

        The step passes only on the report it writes now: an earlier one is deleted first."""
        for stale in stale_files(name):
            (self.out / stale).unlink(missing_ok=True)
        why = _skip_reason(name, command, blocked, self.stopping)
        if why or command is None:
            self.skip(name, why)
            return
        shown = command if isinstance(command, str) else shlex.join(command)
        record = RunStep(name=name, command=shown, status="running")
        self.steps.append(record)
        self._save()
        start = time.perf_counter()
        code, tail = self._execute(name, command, shell, {**self.env, **(env or {})})
        seconds = round(time.perf_counter() - start, 3)
        record.exit_code, record.duration_s, record.log_tail = code, seconds, tail
        record.apply(classify(name, code, self.stopping, _read(current_test)))
        gate, allow = self.rules.get("gpu_gate", False), self.rules.get("allow_no_tests", False)
        record.apply(
            judge(name, code, record.status, self.out, gpu_gate=gate, allow_no_tests=allow)
        )
        print(f"dlci run: {name} {record.status} in {seconds:.1f} s", flush=True)
        if record.reason:
            print(f"dlci run: {name}: {clean(record.reason)}", flush=True)
        self._save()

    def _execute(
        self, name: str, command: list[str] | str, shell: bool, env: dict[str, str]
    ) -> tuple[int, list[str]]:
        """Run the step's process, its output streamed through; its exit code and last lines."""
        shown = command if isinstance(command, str) else shlex.join(command)
        print(
            f"::group::dlci run: {name}" if _in_actions() else f"==> dlci run: {name}", flush=True
        )
        print(f"$ {shown}", flush=True)
        tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL)
        try:
            self.child = subprocess.Popen(
                command,
                shell=shell,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                env={**os.environ, **env},
            )
            assert self.child.stdout is not None
            for line in self.child.stdout:
                sys.stdout.write(line)
                tail.append(line.rstrip("\n"))
            code = self.child.wait()
        except OSError as exc:
            code = 127
            tail.append(f"cannot start: {exc}")
        finally:
            self.child = None
            if _in_actions():
                print("::endgroup::", flush=True)
        return code, list(tail)

    def finish(self) -> int:
        """Write the verdict; 1 when a step failed, was interrupted or errored."""
        signal.signal(signal.SIGTERM, self._previous)
        failed = [s for s in self.steps if s.status in BAD]
        self._save("fail" if failed else "pass")
        if failed:
            names = ", ".join(f"{s.name} ({s.status})" for s in failed)
            print(f"dlci run: FAILED: {names}", flush=True)
            return 1
        print("dlci run: all steps passed", flush=True)
        return 0


def _skip_reason(name: str, command: object, blocked: str | None, stopping: bool) -> str:
    if blocked:
        return f"not run: {blocked}"
    if command is None:
        return "nothing to install" if name == "install" else "nothing to run"
    if stopping:
        return "not run: the job was stopped"
    return ""


def _read(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def _in_actions() -> bool:
    # in the action's container the host stops workflow commands around all output: no groups
    return os.environ.get("GITHUB_ACTIONS") == "true" and "DLCI_IN_CONTAINER" not in os.environ
