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
from typing import Any

from dlci import jsonio
from dlci.checks import select
from dlci.checks.doctor import DoctorOutcome, DoctorRequest
from dlci.errors import DlciError
from dlci.memorization.request import MemorizeOutcome, MemorizeRequest, Say, check_out
from dlci.policy import Policy
from dlci.profiling.capture import ProfileResult
from dlci.report import doctor as doctor_report
from dlci.report import memorization as memorization_report
from dlci.script.command import ScriptCommand, parse_command

PLAN_VARIABLE = "DLCI_SCRIPT_PLAN"  # child.py reads it
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
    cap = plan["config"]["time_cap_s"]
    try:
        found = run_child(command, plan, timeout=cap * 1.5 + 120)
    except subprocess.TimeoutExpired:
        raise DlciError(
            f"the script outlived the time cap of {cap / 60:g} min by half and 2 min; the "
            "report stays failing",
            file=command.script,
            hint="lower its epoch count, or raise the tier's time cap",
        ) from None
    outcome = found["outcome"]
    curve = Path(outcome["curve"]) if outcome["curve"] else None
    report = memorization_report.read(outcome["report"])  # the child's answer, as JSON
    return MemorizeOutcome(outcome["exit_code"], report, outcome["json_path"], curve)


def memorize_plan(request: MemorizeRequest, command: ScriptCommand, tier: Any) -> dict[str, Any]:
    """What the child needs for a memorization run (child.run_plan): the tier's numbers, the
    request's outputs, the command (its args for the hint on a script that ends first)."""
    config = {
        "max_epochs": tier.max_epochs,
        "max_loss": tier.max_loss,
        "time_cap_s": tier.time_cap_minutes * 60,
        "batch_size": tier.batch_size,
        "max_relative_loss": tier.max_relative_loss,
        "seed": request.seed,
        "early_stop": request.early_stop,
    }
    keep = ("out", "json", "seed", "tracker", "quiet", "early_stop")
    return {
        "mode": "memorize",
        "config": config,
        "label": f"memorize {tier.budget}/{tier.hardware_class}",
        "quiet": request.quiet,
        "request": {key: getattr(request, key) for key in keep},
        "tier": tier.to_dict(),
        "spec": command.text(),
        "script": command.script,
        "module": command.module,
        "args": list(command.args),
    }


def profile_script(words: list[str], args: Any, schedule: Any, out: Path) -> Any:
    """``dlci profile -- python train.py ...``: the trace of the script's own steps, the
    schedule driven by its optimizer steps; a ProfileResult as for a Target (no memory
    pass: it needs a Target)."""
    command = parse_command(words)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("trace.json.gz", "utilization.json"):
        (out / stale).unlink(missing_ok=True)
    steps = {"wait": schedule.wait, "warmup": schedule.warmup, "steps": schedule.active}
    plan: dict[str, Any] = {"mode": "profile", "schedule": steps, "out": str(out.resolve())}
    plan.update(device=args.device, seed=args.seed, quiet=args.quiet, script=command.script)
    plan.update(module=command.module, args=list(command.args))
    found = run_child(command, plan, timeout=None)["profile"]
    if found["trace"] is None:
        raise DlciError(
            f"the script ended after {found['steps_taken']} optimizer steps, before the "
            f"{schedule.total} the schedule needs ({found['error'] or 'no trace'})",
            file=command.script,
            hint="raise its epoch or step count, or lower --steps, --wait and --warmup",
        )
    return ProfileResult(
        trace=Path(found["trace"]),
        steps=found["steps"],
        device=found["device"],
        cpu_only=found["cpu_only"],
        wall_time_s=found["wall_time_s"],
        log=Path(found["log"]) if found["log"] else None,
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
    found = run_child(command, plan, timeout=None)["doctor"]
    page = Path(found["html"]) if found["html"] else None
    data = doctor_report.read(found["report"])  # the child's answer, read back as JSON
    return DoctorOutcome(data, found["json_path"], found["exit_code"], page)


def doctor_plan(request: DoctorRequest, command: ScriptCommand, tier: Any) -> dict[str, Any]:
    """What the child needs for the doctor (doctor.ScriptDoctor): the checks asked for, the
    tier, the project's policy, where the report goes."""
    plan: dict[str, Any] = {"mode": "doctor", "tier": tier.to_dict(), "spec": command.text()}
    plan.update(only=request.only, stop_on_fail=request.stop_on_fail, seed=request.seed)
    plan.update(out=request.out, json=request.json, markdown=request.markdown, quiet=False)
    plan.update(policy=(request.policy or Policy()).to_json(), today=request.today.isoformat())
    plan.update(script=command.script, module=command.module, args=list(command.args))
    return plan


def run_child(command: ScriptCommand, plan: dict[str, Any], timeout: float | None) -> Any:
    """Run the script under the hooks; what the child found (a located error raised)."""
    python = command.python
    if os.sep not in python:  # a bare python: the environment dl-ci runs in
        python = sys.executable
    with tempfile.TemporaryDirectory(prefix="dlci-script-") as folder:
        plan = {**plan, "result": str(Path(folder) / "result.json")}
        plan_path = Path(folder) / "plan.json"
        jsonio.write(plan_path, plan)
        env = {**os.environ, PLAN_VARIABLE: str(plan_path)}
        child = [python, *command.flags, "-m", "dlci.script.child"]
        code = subprocess.run(child, env=env, timeout=timeout, check=False).returncode
        result_path = Path(plan["result"])
        if not result_path.is_file():
            raise DlciError(
                f"the script's process ended (exit status {code}) before dl-ci could judge it: "
                "os._exit, a signal, or out of memory",
                file=command.script,
            )
        found = jsonio.decode(result_path.read_bytes())
    if "error" in found:
        where = str(found.get("where") or command.script)
        file, _, line = where.rpartition(":")
        located = line.isdigit()
        raise DlciError(
            f"script mode: {found['error']}",
            file=file if located else where,
            line=int(line) if located else None,
            hint=found.get("hint"),
        )
    if "failure" in found:
        raise DlciError(
            f"script mode: {found['failure']}; no verdict",
            file=command.script,
            hint="the script's traceback is above; run it without dl-ci to see it fail alone",
        )
    return found
