"""The parent side of script mode: the tier, the child process, its answer (no torch here).

``dlci memorize -- python train.py ...`` chooses the tier as for a Target and runs the script
under the hooks in a child process (child.py), which writes the failing partial report
before the script starts and the verdict after it, with the same writers as a Target's run.
``dlci profile -- python train.py ...`` gets the trace the same way and analyzes it as for a
Target.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from dlci.checks import select
from dlci.checks.doctor import DoctorOutcome, DoctorRequest
from dlci.errors import DlciError
from dlci.ladder.model import Tier
from dlci.memorization.request import MemorizeOutcome, MemorizeRequest, Say, check_out
from dlci.policy import Policy
from dlci.profiling.capture import ProfileResult
from dlci.script.command import ScriptCommand, parse_command
from dlci.script.plan import (
    PLAN_VARIABLE,
    Answer,
    AnyPlan,
    DoctorPlan,
    MemorizePlan,
    Outputs,
    ProfilePlan,
    Schedule,
    Settings,
    decode_answer,
    encode,
)

_Found = TypeVar("_Found")
REPORT_NAME = "memorization.json"  # report/memorization.py's, without importing it here


def memorize_script(request: MemorizeRequest, words: list[str], say: Say) -> MemorizeOutcome:
    """``dlci memorize [options] -- python train.py ...``: the verdict on the script's steps."""
    command = parse_command(words)
    check_out(request.out)
    if request.seeds != 1 or request.quorum is not None or (request.nproc or 1) > 1:
        raise DlciError(
            "--seeds, --quorum and --nproc are for a Target: script mode runs the script once, "
            "in one process",
            hint="leave them out, or write a Target (docs/target.md)",
        )
    for given, name in ((request.target, "--target"), (request.device, "--device")):
        if given:
            say(
                f"{name} {given} is not used in script mode: the script builds and places its model"
            )
    tier = request.tier.choose()
    if tier.nproc > 1:
        say(f"the tier asks for {tier.nproc} processes; script mode runs the script in one")
    plan = memorize_plan(request, command, tier)
    json_path = request.json or str(Path(request.out) / REPORT_NAME)
    if json_path != "-":  # an earlier run's report must not stand for this one
        Path(json_path).unlink(missing_ok=True)
    cap = plan.settings.time_cap_s
    try:
        found = run_child(command, plan, timeout=cap * 1.5 + 120)
    except subprocess.TimeoutExpired:
        raise DlciError(
            f"the script outlived the time cap of {cap / 60:g} min by half and 2 min; the "
            "report stays failing",
            file=command.script,
            hint="lower its epoch count, or raise the tier's time cap",
        ) from None
    outcome = _expect(found.memorize, "memorize")
    curve = Path(outcome.curve) if outcome.curve else None
    return MemorizeOutcome(outcome.exit_code, outcome.report, outcome.json_path, curve)


def memorize_plan(request: MemorizeRequest, command: ScriptCommand, tier: Tier) -> MemorizePlan:
    """What the child needs for a memorization run (child.run_plan): the tier's numbers, the
    request's outputs, the command (its args for the hint on a script that ends first)."""
    settings = Settings(
        max_epochs=tier.max_epochs,
        max_loss=tier.max_loss,
        time_cap_s=tier.time_cap_minutes * 60,
        batch_size=tier.batch_size,
        max_relative_loss=tier.max_relative_loss,
        seed=request.seed,
        early_stop=request.early_stop,
    )
    keep = ("out", "json", "seed", "tracker", "quiet", "early_stop")
    return MemorizePlan(
        settings=settings,
        label=f"memorize {tier.budget}/{tier.hardware_class}",
        quiet=request.quiet,
        seed=request.seed,
        request=Outputs(**{key: getattr(request, key) for key in keep}),
        tier=tier,
        spec=command.text(),
        script=command.script,
        module=command.module,
        args=list(command.args),
    )


def profile_script(words: list[str], args: Any, schedule: Any, out: Path) -> Any:
    """``dlci profile -- python train.py ...``: the trace of the script's own steps, the
    schedule driven by its optimizer steps; a ProfileResult as for a Target (no memory
    pass: it needs a Target)."""
    command = parse_command(words)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("trace.json.gz", "utilization.json"):
        (out / stale).unlink(missing_ok=True)
    plan = ProfilePlan(
        schedule=Schedule(wait=schedule.wait, warmup=schedule.warmup, steps=schedule.active),
        out=str(out.resolve()),
        device=args.device,
        seed=args.seed,
        quiet=args.quiet,
        script=command.script,
        module=command.module,
        args=list(command.args),
    )
    found = _expect(run_child(command, plan, timeout=None).profile, "profile")
    if found.trace is None:
        raise DlciError(
            f"the script ended after {found.steps_taken} optimizer steps, before the "
            f"{schedule.total} the schedule needs ({found.error or 'no trace'})",
            file=command.script,
            hint="raise its epoch or step count, or lower --steps, --wait and --warmup",
        )
    return ProfileResult(
        trace=Path(found.trace),
        steps=found.steps,
        device=found.device,
        cpu_only=found.cpu_only,
        wall_time_s=found.wall_time_s,
        log=Path(found.log) if found.log else None,
    )


def doctor_script(request: DoctorRequest, words: list[str]) -> DoctorOutcome:
    """``dlci doctor [options] -- python train.py ...``: the checks that need only the model,
    optimizer and batch the hooks see, on the script's own steps (doctor.py); the others
    listed as needing a Target. A DoctorOutcome, as for a Target."""
    command = parse_command(words)
    select(request.only)  # a typo in --only fails before the script runs
    if request.target or request.device:
        raise DlciError(
            "--target and --device are not used in script mode: the script builds and "
            "places its model",
            hint="leave them out, or drop the command after --",
        )
    plan = doctor_plan(request, command, request.tier.choose())
    found = _expect(run_child(command, plan, timeout=None).doctor, "doctor")
    page = Path(found.html) if found.html else None
    return DoctorOutcome(found.report, found.json_path, found.exit_code, page)


def doctor_plan(request: DoctorRequest, command: ScriptCommand, tier: Tier) -> DoctorPlan:
    """What the child needs for the doctor (doctor.ScriptDoctor): the checks asked for, the
    tier, the project's policy, where the report goes."""
    return DoctorPlan(
        tier=tier,
        spec=command.text(),
        only=request.only,
        stop_on_fail=request.stop_on_fail,
        seed=request.seed,
        out=request.out,
        json=request.json,
        markdown=request.markdown,
        policy=(request.policy or Policy()).to_json(),
        today=request.today.isoformat(),
        script=command.script,
        module=command.module,
        args=list(command.args),
    )


def run_child(command: ScriptCommand, plan: AnyPlan, timeout: float | None) -> Answer:
    """Run the script under the hooks; what the child found (a located error raised)."""
    python = command.python
    if os.sep not in python:  # a bare python: the environment dl-ci runs in
        python = sys.executable
    with tempfile.TemporaryDirectory(prefix="dlci-script-") as folder:
        result_path = Path(folder) / "result.json"
        plan = msgspec.structs.replace(plan, result=str(result_path))
        plan_path = Path(folder) / "plan.json"
        plan_path.write_bytes(encode(plan))
        env = {**os.environ, PLAN_VARIABLE: str(plan_path)}
        child = [python, *command.flags, "-m", "dlci.script.child"]
        code = subprocess.run(child, env=env, timeout=timeout, check=False).returncode
        if not result_path.is_file():
            raise DlciError(
                f"the script's process ended (exit status {code}) before dl-ci could judge it: "
                "os._exit, a signal, or out of memory",
                file=command.script,
            )
        found = decode_answer(result_path.read_bytes())
    if found.error is not None:
        where = found.where or command.script
        file, _, line = where.rpartition(":")
        located = line.isdigit()
        raise DlciError(
            f"script mode: {found.error}",
            file=file if located else where,
            line=int(line) if located else None,
            hint=found.hint,
        )
    if found.failure is not None:
        raise DlciError(
            f"script mode: {found.failure}; no verdict",
            file=command.script,
            hint="the script's traceback is above; run it without dl-ci to see it fail alone",
        )
    return found


def _expect(part: _Found | None, mode: str) -> _Found:
    """The mode's result in the child's answer (an answer without one is dl-ci's bug)."""
    if part is None:
        raise DlciError(f"script mode: the child's answer has no {mode} result and no error")
    return part
