"""``dlci run``: the whole job inside the container, one step after another.

install -> tests (pytest with doctests, coverage, JUnit) -> memorize -> doctor -> profile
(with analyze). Each step is its own process, so one that crashes or is killed leaves the
others' results; ``OUT/run.json`` is rewritten after every step starts and ends, so a job
killed in the middle still says which step was running.
"""

from __future__ import annotations

import collections
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlci.commands import _common

REPORT_NAME = "run.json"
STEPS = ("install", "tests", "memorize", "doctor", "profile")
LOG_TAIL = 40


def _flag(p: Any, name: str, help_on: str) -> None:
    p.add_argument(f"--{name}", dest=name.replace("-", "_"), action="store_true", default=True)
    p.add_argument(
        f"--no-{name}", dest=name.replace("-", "_"), action="store_false", help=f"skip {help_on}"
    )


def main(argv: Sequence[str]) -> int:
    p = _common.parser(
        "run",
        "Run the job's steps in order (install, tests with doctests and coverage, the "
        "memorization test, the debugging checks, the profile and its analysis), writing "
        "every report to OUT and a step-by-step record to OUT/run.json. Exit 1 when a step "
        "fails; the later steps still run.",
    )
    _common.add_target(p)
    _common.add_tier_options(p)
    p.add_argument(
        "--out", default="dlci-artifacts", metavar="DIR", help="reports (default: dlci-artifacts)"
    )
    p.add_argument(
        "--install",
        default="auto",
        metavar="CMD",
        help="how to install the project: auto (pip install the requirements files and the "
        "project in place), none, or a shell command (default: auto)",
    )
    p.add_argument(
        "--tests", default="", metavar="PATHS", help="test paths for pytest (default: pytest's own)"
    )
    p.add_argument(
        "--pytest-args", default="", metavar="ARGS", help="more pytest arguments, shell-quoted"
    )
    _flag(p, "doctest", "doctests (--doctest-modules)")
    _flag(p, "coverage", "coverage")
    _flag(p, "memorize", "the memorization test")
    _flag(p, "doctor", "the debugging checks")
    _flag(p, "profile", "the profile and its analysis")
    p.add_argument("--min-gpu-util", type=float, metavar="PCT", help="the utilization gate")
    p.add_argument(
        "--tier-json",
        metavar="FILE",
        help="use the tier recorded in FILE (preflight.json or dlci tier --json) in every step, "
        "instead of selecting it again here",
    )
    _common.add_detection(p)
    args = p.parse_args(list(argv))

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.tier_json:
        from dlci.ladder.tiers import tier_from_file

        tier_from_file(args.tier_json)  # a bad file is one clear error, before any step
    runner = _Runner(out)
    if args.tier_json:
        from dlci.ladder.tiers import TIER_JSON_VARIABLE

        runner.env[TIER_JSON_VARIABLE] = str(Path(args.tier_json).resolve())
    tier_args = ["--budget", args.budget, "--hardware", args.hardware]
    if args.ladder:
        tier_args += ["--ladder", args.ladder]
    target_args = ["--target", args.target] if args.target else []
    dlci = [sys.executable, "-m", "dlci"]

    runner.step(
        "install", _install_command(args.install), shell=args.install not in ("auto", "none")
    )
    installed = runner.steps[-1]["status"] in ("passed", "skipped")
    blocked = None if installed else "the install step failed"

    current = out / ".current-test"
    current.unlink(missing_ok=True)
    runner.step(
        "tests",
        _pytest_command(args, out),
        blocked=blocked,
        env={"DLCI_CURRENT_TEST_FILE": str(current)},
        current_test=current,
    )
    if runner.steps[-1]["status"] != "interrupted":
        current.unlink(missing_ok=True)
    _relative_coverage(out / "coverage.xml", Path.cwd())

    if args.memorize:
        cmd = [*dlci, "memorize", "--out", str(out), *tier_args, *target_args]
        runner.step("memorize", cmd, blocked=blocked)
    else:
        runner.skip("memorize", "switched off (memorize: false)")
    if args.doctor:
        cmd = [
            *dlci,
            "doctor",
            "--out",
            str(out),
            "--json",
            str(out / "doctor.json"),
            "--markdown",
            str(out / "doctor.md"),
            *tier_args,
            *target_args,
        ]
        runner.step("doctor", cmd, blocked=blocked)
    else:
        runner.skip("doctor", "switched off (doctor: false)")
    if args.profile:
        cmd = [*dlci, "profile", "--out", str(out), *tier_args, *target_args]
        if args.min_gpu_util is not None:
            cmd += ["--min-gpu-util", f"{args.min_gpu_util:g}"]
        runner.step("profile", cmd, blocked=blocked)
    else:
        runner.skip("profile", "switched off (profile: false)")
    return runner.finish()


def _install_command(install: str) -> list[str] | str | None:
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
    # (setuptools) is already in its environment.
    return [sys.executable, "-m", "pip", "install", "--no-build-isolation", *cmd]


def _pytest_command(args: Any, out: Path) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        f"--junitxml={out / 'junit.xml'}",
    ]
    if args.doctest:
        cmd.append("--doctest-modules")
    extra = shlex.split(args.pytest_args) if args.pytest_args else []
    if args.coverage and not any(a.startswith("--cov") for a in extra):
        cmd += ["--cov=.", f"--cov-report=xml:{out / 'coverage.xml'}", "--cov-report=term"]
    cmd += extra
    cmd += shlex.split(args.tests) if args.tests else []
    return cmd


def _relative_coverage(path: Path, root: Path) -> None:
    """Coverage XML with paths relative to the workspace (pytest-cov #329): Codecov needs them."""
    if not path.is_file():
        return
    import xml.etree.ElementTree as ET

    from dlci.fsutil import atomic_write_bytes

    try:
        tree = ET.parse(path)  # noqa: S314 - written by coverage.py in this job
    except ET.ParseError:
        return
    changed = False
    for source in tree.getroot().iter("source"):
        text = (source.text or "").strip()
        if text and os.path.isabs(text):
            try:
                rel = os.path.relpath(text, root)
            except ValueError:
                continue
            if not rel.startswith(".."):
                source.text = rel
                changed = True
    if changed:
        atomic_write_bytes(
            path, ET.tostring(tree.getroot(), xml_declaration=True, encoding="utf-8")
        )


class _Runner:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.steps: list[dict[str, Any]] = []
        self.started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.child: subprocess.Popen[str] | None = None
        self.stopping = False
        self.env: dict[str, str] = {}  # for every step's process
        self._previous = signal.signal(signal.SIGTERM, self._terminate)

    def _terminate(self, signum: int, frame: Any) -> None:
        # docker stop / a cancelled job: stop the step, record it, exit.
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.terminate()

    def _save(self, verdict: str | None = None) -> None:
        failed = [
            s["name"] for s in self.steps if s["status"] in ("failed", "error", "interrupted")
        ]
        report = {
            "schema_version": 1,
            "kind": "run",
            "started": self.started,
            "cwd": str(Path.cwd()),
            "steps": self.steps,
            "failed_steps": failed,
            "verdict": verdict or ("running" if not failed else "failing"),
        }
        _common.emit_json(report, str(self.out / REPORT_NAME))

    def skip(self, name: str, why: str) -> None:
        self.steps.append({"name": name, "status": "skipped", "reason": why, "duration_s": 0.0})
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
        if blocked:
            self.skip(name, f"not run: {blocked}")
            return
        if command is None:
            self.skip(name, "nothing to install" if name == "install" else "nothing to run")
            return
        if self.stopping:
            self.skip(name, "not run: the job was stopped")
            return
        shown = command if isinstance(command, str) else shlex.join(command)
        record: dict[str, Any] = {"name": name, "command": shown, "status": "running"}
        self.steps.append(record)
        self._save()
        print(
            f"::group::dlci run: {name}" if _in_actions() else f"==> dlci run: {name}", flush=True
        )
        print(f"$ {shown}", flush=True)
        start = time.perf_counter()
        tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL)
        try:
            self.child = subprocess.Popen(
                command,
                shell=shell,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                env={**os.environ, **self.env, **(env or {})},
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
        record["exit_code"] = code
        record["duration_s"] = round(time.perf_counter() - start, 3)
        record["log_tail"] = list(tail)
        if self.stopping:
            record["status"] = "interrupted"
        elif name == "tests" and code == 5:
            record["status"] = "passed"
            record["reason"] = "pytest collected no tests"
        elif code == 0:
            record["status"] = "passed"
        elif code == 1 or (name == "tests" and code in (1, 2, 3, 4)):
            record["status"] = "failed"
        elif code < 0 or code >= 128:
            signum = abs(code) if code < 0 else code - 128
            record["status"] = "interrupted"
            record["reason"] = f"killed by signal {signum}"
            if signum == signal.SIGKILL:
                record["reason"] += (
                    " (most likely out of memory: the container's limit or the machine's)"
                )
                record["killed"] = "oom-or-kill"
            running = _read(current_test)
            if running:
                record["reason"] += f" while running {running}"
                record["test"] = running
        else:
            record["status"] = "error"
        print(f"dlci run: {name} {record['status']} in {record['duration_s']:.1f} s", flush=True)
        self._save()

    def finish(self) -> int:
        signal.signal(signal.SIGTERM, self._previous)
        failed = [s for s in self.steps if s["status"] in ("failed", "error", "interrupted")]
        self._save("fail" if failed else "pass")
        if failed:
            names = ", ".join(f"{s['name']} ({s['status']})" for s in failed)
            print(f"dlci run: FAILED: {names}", flush=True)
            return 1
        print("dlci run: all steps passed", flush=True)
        return 0


def _read(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def _in_actions() -> bool:
    return os.environ.get("GITHUB_ACTIONS") == "true"
