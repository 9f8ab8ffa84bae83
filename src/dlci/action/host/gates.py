"""The job's containers, one per part: the tests, then each gate in a ``docker run`` of its own.

Host-side (the runner), never imports torch. The pull request's code runs in every container
(its install step, its tests, its target), so the host keeps its decisions out of reach and
reads what the containers write as claims:

- the job plan (the host's preflight.json: dlci.ladder.plan) is read here once, before any
  container, and copied into a host folder mounted read-only at /dlci/host, outside the
  workspace; each part runs with ``--plan /dlci/host/plan.json``;
- the install step runs once, in a container of its own, committed to the job's image
  (dlci.action.host.installed); the tests and each gate (memorize, doctor, profile) then run
  in a fresh container from that image, one after another, so nothing the tests changed
  outside the workspace is there (docs/security.md);
- a gate writes its reports to /dlci/out, a fresh host directory only its container mounts;
  when a container has gone the host copies out the regular files of the names it writes
  (no link, FIFO or device; size caps: dlci.fsutil.copy_beneath), the tests' from the workspace;
- each container's run.json is read into its classes (dlci.report.fields.read_run): a step
  that is no object or a field of a wrong type makes that part's step an error naming it; a
  step's claimed status is never a gate's verdict (the host's own: the container's exit code
  and the report it copied, dlci.action.host.verdicts);
- after the last one the host writes the reports and its run.json into a host folder beside
  its record (what ``dlci summary`` reads), then into the workspace's artifacts, never through
  a link (a link there is a problem); the record (tier, exit codes, each report's SHA-256,
  what was refused: a HostRecord) is a host file outside the workspace (DLCI_HOST_RECORD).
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from msgspec import UnsetType

from dlci import jsonio
from dlci.action.host.summary import read_report
from dlci.action.host.verdicts import as_bool, held_to_gates, held_to_policy, judge
from dlci.errors import DlciError
from dlci.fsutil import NOT_ALLOWED, copy_beneath, mirror_beneath, write_beneath
from dlci.ladder.plan import decode_plan, parse_plan
from dlci.report.fields import HostRecord, KitTime, ReportCopy, RunRecord, RunStep, Timing, read_run
from dlci.trust import host as trusted

HOST_MOUNT = "/dlci/host"  # read-only: the host's decisions
PLAN_NAME = "plan.json"  # the job plan under HOST_MOUNT
OUT_MOUNT = "/dlci/out"  # writable, one gate's reports only
WORKSPACE = "/workspace"
GATES = ("memorize", "doctor", "profile")
RECORD_VARIABLE = "DLCI_HOST_RECORD"
# What each gate writes to its --out (a report planted in the artifacts under one is removed)
GATE_FILES = {
    "memorize": ("memorization.json", "memorization-curve.png", "memorization.md"),
    "doctor": ("doctor.json", "doctor.md"),
    "profile": ("utilization.json", "utilization.md", "utilization.png", "trace.json.gz"),
}
# What the host copies out of a gate's directory (also tensorboard/, wandb/) and the tests'.
KEPT = frozenset([*(n for names in GATE_FILES.values() for n in names), "run.json", "profiler.log"])
TESTS_FILES = ("run.json", "junit.xml", "coverage.xml")
FIGURES = "figures"  # the doctor's figures folder (dlci.report.figures.FOLDER)
FILE_LIMIT, TOTAL_LIMIT = 512 << 20, 1 << 30  # bytes: one file (a long trace fits), a container
EXTRA_LIMIT, EXTRA_TOTAL = 16 << 20, 64 << 20  # the tests' other files handed back: each, all
# Names in the artifacts folder that only the host writes: never taken from a container
HOST_NAMES = frozenset([*KEPT, "preflight.json", "cleanup.json", "report.html"])


@dataclass
class Part:
    """One ``docker run``: its name (tests or a gate), dlci run's arguments, extra flags."""

    name: str
    argv: list[str]
    flags: list[str]
    out: Path | None = None  # the gate's own report directory on the host


@dataclass
class Parts:
    """The parts of one job, their host directories, and what the host collected from them."""

    inner: Sequence[str]
    workspace: Path
    workdir: str = "."
    record_path: str = ""
    base: Path = field(init=False)
    artifacts: Path = field(init=False)
    args: list[str] = field(init=False)
    tier: dict[str, Any] | None = field(init=False, default=None)
    source: dict[str, Any] | None = field(init=False, default=None)
    exit_codes: dict[str, int] = field(init=False, default_factory=dict)
    collected: dict[str, Path] = field(init=False, default_factory=dict)
    blocked: str = field(init=False, default="not run: the job was stopped")
    refused: list[str] = field(init=False, default_factory=list)  # what the host left out
    unreadable: dict[str, str] = field(init=False, default_factory=dict)  # part -> why
    planted: list[str] = field(init=False, default_factory=list)  # git files a part planted
    reports: Path = field(init=False)  # the host's folder of reports, outside the workspace
    # the host's own seconds per part: copy_s, container_s, commit_s (the install's)
    timing: dict[str, dict[str, float]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.record_path:
            Path(self.record_path).unlink(missing_ok=True)  # never an earlier job's record
        args, plan_file, out = _split(list(self.inner))
        self.args = args
        self.artifacts = self._host_path(out or "dlci-artifacts")
        self.base = Path(tempfile.mkdtemp(prefix="dlci-parts-", dir=os.environ.get("RUNNER_TEMP")))
        self.reports = reports_dir(self.record_path) if self.record_path else self.base / "reports"
        shutil.rmtree(self.reports, ignore_errors=True)  # never an earlier job's reports
        if plan_file:
            self._take_plan(plan_file)

    def _host_path(self, path: str) -> Path:
        """A path as the container sees it -> the same path on the host (in the workspace)."""
        if path == WORKSPACE or path.startswith(WORKSPACE + "/"):
            return self.workspace / os.path.relpath(path, WORKSPACE)
        if os.path.isabs(path):
            raise DlciError(f"--out {path}: outside the workspace ({WORKSPACE})")
        return self.workspace / self.workdir / path

    def _take_plan(self, plan_file: str) -> None:
        """Read the job plan once (here, before any container runs; a bad file is one clear
        error) and copy it to the read-only mount."""
        path = Path(plan_file)
        if not path.is_file() and plan_file.startswith(WORKSPACE + "/"):
            path = self._host_path(plan_file)  # the workspace's copy, read before any container
        data = decode_plan(str(path))
        parse_plan(data, str(path))
        self.source = data  # the host record's "preflight": what trusted.* read
        self.tier = data["tier"] if "plan_version" in data else data  # or a tier alone
        host = self.base / "host"
        host.mkdir(mode=0o755)
        shutil.copyfile(path, host / PLAN_NAME)

    def plan(self) -> list[Part]:
        """The install part (unless the install is none), the tests part, then one part per
        gate that is not switched off."""
        tier = ["--plan", f"{HOST_MOUNT}/{PLAN_NAME}"] if self.tier is not None else []
        flags = ["-v", f"{self.base / 'host'}:{HOST_MOUNT}:ro"] if self.tier is not None else []
        out = os.path.join(WORKSPACE, self._rel())
        parts = []
        if _option(self.args, "--install") != "none":  # once a job (dlci.action.host.installed)
            mine = self._own_out("install")
            argv = [*self.args, "--out", OUT_MOUNT, *tier, "--phase", "install"]
            parts.append(Part("install", argv, [*flags, "-v", f"{mine}:{OUT_MOUNT}"], mine))
        parts.append(Part("tests", [*self.args, "--out", out, *tier, "--phase", "tests"], flags))
        for gate in GATES:
            if f"--no-{gate}" in self.args:
                continue
            mine = self._own_out(gate)
            argv = [*self.args, "--out", OUT_MOUNT, *tier, "--phase", gate]
            parts.append(Part(gate, argv, [*flags, "-v", f"{mine}:{OUT_MOUNT}"], mine))
        return parts

    def _own_out(self, name: str) -> Path:
        """A fresh host folder for one container's reports (mounted at /dlci/out)."""
        mine = self.base / f"out-{name}"
        mine.mkdir(mode=0o755)
        if os.geteuid() == 0:  # the container's user (run_command's --user) must write here
            os.chown(mine, os.getuid(), os.getgid())
        return mine

    def collect(self, part: Part, code: int, copy: Path | None = None) -> None:
        """Note the container's exit code; copy out, now that it has gone, the regular files
        it may write (a gate's reports; the tests' files and what else they left in the
        artifacts folder of ``copy``, the part's copy of the checkout), out of every later
        container's reach.
        """
        self.exit_codes[part.name] = code
        self.unreadable.pop(part.name, None)  # its record is copied anew below
        kept = self.base / f"kept-{part.name}"
        tests = copy or self.workspace
        root, rel = (tests, self._rel()) if part.out is None else (part.out, ".")
        allowed = _tests_file if part.out is None else _gate_file
        if part.name == "install":
            allowed = _install_file
        elif part.out is not None:
            self.collected[part.name] = kept
        try:
            left = copy_beneath(root, rel, kept, allowed, limit=FILE_LIMIT, total=TOTAL_LIMIT)
            if part.out is None and copy is not None:  # the tests' other files, smaller caps
                extra = self.base / "kept-tests-extra"
                copy_beneath(root, rel, extra, _tests_extra, limit=EXTRA_LIMIT, total=EXTRA_TOTAL)
        except DlciError as exc:  # the folder itself is a link (or gone)
            left = []
            self.refused.append(f"{part.name}: {exc.message}")
        if part.out is None:  # the workspace holds much else: only the tests' own names count
            left = [why for why in left if why.partition(":")[0] in TESTS_FILES]
        self.refused += [f"{part.name}: {why}" for why in left]

    def finish(self, planned: Sequence[Part]) -> HostRecord:
        """Reports and run.json into the host's folder, then the workspace's; the host record."""
        self.reports.mkdir(parents=True, exist_ok=True)
        reports: dict[str, ReportCopy] = {}
        for gate, kept in [("tests", self.base / "kept-tests"), *self.collected.items()]:
            for item in sorted(kept.rglob("*")) if kept.is_dir() else ():
                rel = item.relative_to(kept).as_posix()
                if rel == "run.json" or not item.is_file():
                    continue  # copy_beneath made ``kept``: regular files and folders only
                (self.reports / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(item, self.reports / rel)
                if gate != "tests" and "/" not in rel and item.suffix == ".json":
                    digest = hashlib.sha256(item.read_bytes()).hexdigest()
                    reports[rel] = ReportCopy(part=gate, sha256=digest)
        run = self._run_record(planned)
        jsonio.write(self.reports / "run.json", run)
        problems = [f"not copied: {why}" for why in self.refused if not why.endswith(NOT_ALLOWED)]
        problems += self.planted
        try:  # for the steps after this one; never through a link a container left there
            planted = [n for names in GATE_FILES.values() for n in names]
            mirror_beneath(self.reports, self.workspace, self._rel(), planted)
            self._hand_back(self.base / "kept-tests-extra")
        except DlciError as exc:
            problems.append(f"{exc.message}: nothing more written into the workspace")
        record = HostRecord(
            tier=self.tier,
            preflight=self.source if self.source and "tier" in self.source else None,
            exit_codes=self.exit_codes,
            isolated_parts=sorted(self.collected),
            reports=reports,
            reports_dir=str(self.reports),
            refused=self.refused,
            planted=self.planted,
            problems=problems,
            run=run,
        )
        if self.record_path:
            jsonio.write(Path(self.record_path), record)
        return record

    def _hand_back(self, kept: Path) -> None:
        """The tests' other files in their artifacts folder (regular files only, under the
        caps, no git file, never a name the host writes) into the workspace's artifacts."""
        for item in sorted(kept.rglob("*")) if kept.is_dir() else ():
            rel = item.relative_to(kept).as_posix()
            if item.is_file() and _tests_extra(rel):
                write_beneath(self.workspace, f"{self._rel()}/{rel}", item.read_bytes())

    def _rel(self) -> str:
        return os.path.relpath(self.artifacts, self.workspace)

    def _claims(self, part: str) -> tuple[RunRecord | None, str]:
        """The run.json a part's container wrote (its own claims), read into its classes; None
        and why not when it cannot be read ('': there is none, or it is not a JSON object).
        Read anew each time (the caller may change its steps); what cannot be read is kept:
        naming a hostile record's fields is the slow path, and it is asked for several times."""
        if part in self.unreadable:
            return None, self.unreadable[part]
        raw = read_report(self.base / f"kept-{part}" / "run.json")
        if raw is None:
            return None, ""
        try:
            return read_run(raw), ""
        except ValueError as exc:  # a field of a wrong type: named in the step's reason
            self.unreadable[part] = str(exc)
            return None, str(exc)

    def _run_record(self, planned: Sequence[Part]) -> RunRecord:
        """run.json: the tests container's steps (its own claims), then each gate's step."""
        ran = "tests" in self.exit_codes
        tests, why = self._claims("tests") if ran else (None, "")
        # the last step of each name (a record repeats none): install and tests
        named = {
            s.name: s for s in (tests.steps if tests else []) if s.name in ("install", "tests")
        }
        if tests is not None and "tests" not in named:  # a record without its tests step
            why = "it records no tests step"
        if "install" in self.exit_codes:  # the install container's step, not the tests' skip
            named["install"] = self._install_step()
        elif tests is not None and "install" not in named:  # dlci run always records it
            named["install"] = _missing("install", self.exit_codes["tests"],
                                        "it records no install step")  # fmt: skip
        steps = list(named.values())
        if "tests" in named:
            install = named.get("install")
            broke = install is not None and install.status in ("failed", "error", "interrupted")
            steps = [self._tests_step(s, not broke) if s.name == "tests" else s for s in steps]
        else:
            steps.append(_missing("tests", self.exit_codes["tests"], why) if ran else
                         _skipped("tests", self.blocked))  # fmt: skip
        for part in planned:
            if part.name in GATES:
                steps.append(self._gate_step(part.name))
        for gate in GATES:
            if f"--no-{gate}" in self.args:
                steps.append(_skipped(gate, f"switched off ({gate}: false)"))
        order = {name: i for i, name in enumerate(("install", "tests", *GATES))}
        steps.sort(key=lambda s: order.get(s.name, 99))
        failed = [s.name for s in steps if s.status not in ("passed", "skipped")]
        if not failed:  # a step blocked by a failure no step records: the claims hid it
            for step in steps:
                if step.status == "skipped" and step.reason == self.blocked:
                    why = f"{self.blocked}, yet no step is recorded as failed"
                    step.apply({"status": "error", "reason": why})
                    failed.append(step.name)
        return RunRecord(
            timing=where_the_time_went(self.timing, steps),
            started=tests.started if tests else "",
            cwd=tests.cwd if tests else "",
            steps=steps,
            failed_steps=failed,
            verdict="fail" if failed else "pass",
            isolated_gates=sorted(self.collected),
            torch=tests.torch if tests else None,  # the image's record (a claim, shown as such)
            threads=tests.threads if tests else None,  # CPU threads set in the tests container
        )

    def _gate_step(self, gate: str) -> RunStep:
        code = self.exit_codes.get(gate)
        if gate not in self.collected:
            return _skipped(gate, self.blocked)
        claims, why = self._claims(gate)
        named = {s.name: s for s in claims.steps} if claims else {}  # the last of each name
        step = named.get(gate)
        if step is None:
            return _missing(gate, code, why)
        install = named.get("install")
        if install is not None and install.status in ("failed", "error", "interrupted"):
            step.status = "error"
            step.reason = "the install step failed in the gate's own container"
        elif step.status not in STATUSES:  # a planned gate's container runs it: never skips it
            step.apply(_unknown(step, code))
        elif code not in (0, 1) and step.status == "passed":
            step.apply({"status": "error", "reason": f"its container exited {code}"})
        elif code in (0, 1) and step.status in ("passed", "failed"):
            # the host's own verdict: the container's exit code and the report it copied
            status = "passed" if code == 0 and step.status == "passed" else "failed"
            gpu_gate = self.rules()["gpu_gate"]
            who = f"{gate}'s container"
            found = judge(gate, code, status, self.collected[gate], gpu_gate=gpu_gate, who=who)
            if step.status == status == "failed" and step.reason:
                found.pop("reason", None)  # the step's own words, from inside, say more
            if gate == "doctor" and found.get("status", status) == "passed":
                found.update(held_to_policy(self.collected[gate], trusted.policy(self.source)))
            if gate == "profile" and found.get("status", status) == "passed":
                bounds = (
                    trusted.number(self.source, k) for k in ("min-gpu-util", "max-gpu-memory")
                )
                found.update(held_to_gates(self.collected[gate], *bounds))
            step.status = status
            step.apply(found)
        step.container_exit_code, step.isolated = code, True
        return step

    def rules(self) -> dict[str, bool]:
        """judge's options from dlci run's arguments: the GPU gate, allow-no-tests."""
        allow = False
        for index, arg in enumerate(self.args):
            name, eq, value = arg.partition("=")
            if name != "--allow-no-tests":
                continue
            following = self.args[index + 1 : index + 2]
            if not eq and following and not following[0].startswith("-"):
                value = following[0]
            try:  # a bad value: dlci run refuses it in the container (exit 2)
                allow = as_bool(value) if eq or value else True
            except ValueError:
                allow = False
        asked = ("--min-gpu-util", "--max-gpu-memory")
        gpu = any(a.partition("=")[0] in asked for a in self.args) or trusted.gpu_gate(self.source)
        return {"gpu_gate": gpu, "allow_no_tests": allow}

    def _tests_step(self, step: RunStep, installed: bool) -> RunStep:
        """The tests container's claim that its tests passed, held against its exit code and
        junit.xml; a skip stands only where its install is recorded as failed (``installed``
        False: not run, blocked)."""
        code, container = step.exit_code, self.exit_codes.get("tests")
        if step.status == "skipped" and not installed:
            return step
        if step.status not in STATUSES:
            step.apply(_unknown(step, container))
            return step
        if step.status != "passed":
            return step
        if not isinstance(code, int):
            step.apply(
                {
                    "status": "error",
                    "reason": "its container claims the tests passed "
                    f"with no exit code of pytest (the container exited {container})",
                }
            )
            return step
        if container != 0:  # a passing tests step leaves its container nothing to fail on
            step.apply({"status": "error", "reason": f"its container exited {container}"})
            return step
        allow = self.rules()["allow_no_tests"]
        step.apply(judge("tests", code, "passed", self.base / "kept-tests", allow_no_tests=allow))
        return step

    def _install_step(self) -> RunStep:
        """The install container's record of its step (its own claim), with its exit code."""
        code = self.exit_codes.get("install")
        claims, why = self._claims("install")
        step = claims.step("install") if claims else None
        if step is None:
            return _missing("install", code, why)
        if step.status not in (*STATUSES, "skipped"):
            step.apply(_unknown(step, code))
        elif code not in (0, 1) and step.status in ("passed", "skipped"):
            step.apply({"status": "error", "reason": f"its container exited {code}"})
        step.container_exit_code = code
        return step

    def install_passed(self) -> bool:
        """Whether the install container installed something (worth keeping as an image)."""
        return "install" in self.exit_codes and self._install_step().status == "passed"

    def installed(self) -> bool:
        """Whether the install step passed (or had nothing to do): the install container's,
        else the tests container's."""
        if "install" in self.exit_codes:
            return self._install_step().status in ("passed", "skipped")
        claims, _ = self._claims("tests")
        install = claims.step("install") if claims else None
        return install is not None and install.status in ("passed", "skipped")

    def close(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


def where_the_time_went(parts: dict[str, dict[str, float]], steps: Sequence[RunStep]) -> Timing:
    """The job's container phase split into the project's work (its install, its tests, the
    gates' training and profiled steps: each step's own time, as its container recorded it)
    and the kit's own (the host's copies of the checkout, each container's start and stop,
    dl-ci's start-up inside it, the install image's commit). The host measures each part's
    wall time; the steps' times are the containers' claims, shown, never judged.

    >>> t = where_the_time_went({"tests": {"copy_s": 0.5, "container_s": 10.0}},
    ...                         [RunStep(name="tests", duration_s=8.0)])
    >>> t.project_s, t.kit_s, t.kit
    (8.0, 2.5, KitTime(copies_s=0.5, containers_s=2.0, commit_s=0.0))
    """
    work = {}
    for step in steps:
        value = step.duration_s
        part = parts.get(step.name) or parts.get("tests" if step.name == "install" else "") or {}
        bound = part.get("container_s", math.inf)  # a claim longer than its container ran
        if not isinstance(value, UnsetType) and 0 <= value <= bound and math.isfinite(value):
            work[step.name] = float(value)
    kit = {"copies_s": 0.0, "containers_s": 0.0, "commit_s": 0.0}
    for name, part in parts.items():
        inside = work.get(name, 0.0) + (work.get("install", 0.0) if name == "tests" and
                                        "install" not in parts else 0.0)  # fmt: skip
        kit["copies_s"] += part.get("copy_s", 0.0)
        kit["commit_s"] += part.get("commit_s", 0.0)
        kit["containers_s"] += max(part.get("container_s", 0.0) - inside, 0.0)
    kit = {k: round(v, 2) for k, v in kit.items()}
    project = {name: round(value, 2) for name, value in work.items() if value > 0}
    return Timing(
        project_s=round(sum(project.values()), 2),
        project=project,
        kit_s=round(sum(kit.values()), 2),
        kit=KitTime(**kit),
        parts=parts,
    )


def reports_dir(record_path: str) -> Path:
    """The host's folder of reports, beside its record (outside the workspace)."""
    record = Path(record_path)
    return record.with_name(record.stem + "-reports")


def _gate_file(path: str) -> bool:
    """A file (or a folder, ending in /) that a gate writes to its --out: its reports, the
    trackers' folders, the doctor's figures (figures/NAME.png, one level; the host's
    report.html embeds only what is a PNG by its bytes)."""
    top = path.partition("/")[0]
    if top == FIGURES:
        return path == f"{FIGURES}/" or (path.count("/") == 1 and path.endswith(".png"))
    return path in KEPT or (top in ("tensorboard", "wandb") and path.count("/") <= 6)


def _tests_file(path: str) -> bool:
    return path in TESTS_FILES


def _install_file(path: str) -> bool:
    return path == "run.json"


def _option(args: Sequence[str], name: str) -> str | None:
    """The last value given to ``name`` in dlci run's arguments (``--x v`` or ``--x=v``).

    >>> _option(["--install", "auto", "--install=none"], "--install")
    'none'
    """
    value = None
    for index, arg in enumerate(args):
        key, eq, given = arg.partition("=")
        if key == name:
            value = given if eq else (args[index + 1] if index + 1 < len(args) else None)
    return value


def _tests_extra(path: str) -> bool:
    """The other files the tests left in the artifacts folder of their copy, handed back to
    the workspace: never a git file at any depth (git on the host would read it), never a
    name the host writes there, at most 8 folders deep."""
    parts = path.rstrip("/").split("/")
    if any(p.lower().startswith(".git") for p in parts) or len(parts) > 8:
        return False
    return path.endswith("/") or path not in (*HOST_NAMES, *TESTS_FILES)


def _split(inner: list[str]) -> tuple[list[str], str, str]:
    """dlci run's arguments without --plan, --out and --phase (the host sets them)."""
    args: list[str] = []
    found = {"--plan": "", "--out": "", "--phase": ""}
    index = 0
    while index < len(inner):
        arg = inner[index]
        name, eq, value = arg.partition("=")
        if name in found and eq:
            found[name] = value
        elif arg in found and index + 1 < len(inner):
            found[arg] = inner[index + 1]
            index += 1
        else:
            args.append(arg)
        index += 1
    return args, found["--plan"], found["--out"]


# The statuses a step of a container that ran it can end in (dlci.action.job.run): a
# skipped, or any other word, in a part's own record is the host's to question.
STATUSES = ("passed", "failed", "error", "interrupted", "running")


def _unknown(step: RunStep, code: int | None) -> dict[str, Any]:
    """A planned step its container says it did not run, or gives a status dl-ci never
    writes: an error, whatever the container's exit code (``code``)."""
    said = "skipped it" if step.status == "skipped" else "gives a status dl-ci never writes"
    return {"status": "error", "reason": f"its container {said} (exit code {code})"}


def _skipped(name: str, why: str) -> RunStep:
    return RunStep(name=name, status="skipped", reason=why, duration_s=0.0)


def _missing(name: str, code: int | None, wrong: str = "") -> RunStep:
    """The step of a container that wrote no record, or one whose ``wrong`` fields (a claim
    of the pull request's code) the host cannot read."""
    why = f"its container wrote no record (exit code {code})"
    if wrong:
        why = f"its container's record cannot be read (exit code {code}): {wrong}"
    return RunStep(name=name, status="error", reason=why, duration_s=0.0)


def stale_files(name: str) -> tuple[str, ...]:
    """What a step writes as its verdict: deleted before it runs, so a stale one never counts."""
    return ("junit.xml",) if name == "tests" else GATE_FILES.get(name, ())
