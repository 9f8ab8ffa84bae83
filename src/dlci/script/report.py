"""The memorization report of a script's run, written by the child (torch is there already):
the failing partial report before the script starts, then the verdict with the writers a
Target's run uses (memorization/single.py), its next step said for a script."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec

from dlci.memorization.request import NO_VERDICT, MemorizeRequest
from dlci.memorization.single import RunReport, write_run_outputs
from dlci.memorization.tracking import make_tracker
from dlci.memorization.verdict import DOCTOR, FLOOR_ASSUMED_HINT, TARGET_SLOT, MemorizeResult
from dlci.script.command import epoch_arguments, raise_hint
from dlci.script.plan import MemorizeFound, MemorizePlan

SCRIPT_FLOOR_HINT = (
    "; the floor was assumed 0 (script mode reads the loss from the script's backward()): a "
    "loss that cannot reach 0 on its targets (continuous or soft targets under BCE, label "
    "smoothing, a KL term) flattens above it; a Target with its loss_fn gets its floor "
    "measured on the batch (docs/target.md)"
)


class ScriptReport:
    """memorization.json of a script's run: failing until the verdict replaces it."""

    def __init__(self, plan: MemorizePlan) -> None:
        self.request = MemorizeRequest(**msgspec.structs.asdict(plan.request))
        self.tier = plan.tier
        self.spec, self.args = plan.spec, list(plan.args)
        self.run = RunReport(self.request, self.spec, self.tier)
        self.run.write_partial("exited", NO_VERDICT)

    def error(self, text: str) -> None:
        self.run.write_partial("error", text)

    def finish(self, result: MemorizeResult, parsed: list[tuple[str, str]]) -> MemorizeFound:
        """Write the verdict; what the parent needs to print it and exit."""
        result.next_step = for_a_script(result.next_step, self.spec)
        if result.stopped_by == "ended" and not result.passed:
            hint = raise_hint(epoch_arguments(self.args, parsed), self.tier.max_epochs)
            result.next_step = f"{hint}; {result.next_step}" if result.next_step else hint
        request = self.request
        tracker = make_tracker(request.tracker, Path(request.out), "memorize")
        try:
            for step, loss in enumerate(result.losses, 1):
                if math.isfinite(loss):
                    tracker.log_metric("memorize/loss", loss, step)
            outcome = write_run_outputs(
                request, self.spec, self.tier, result, tracker, script_mode=True
            )
        finally:
            tracker.close()
        if outcome.report is None:  # one process: it is the one that reports
            raise RuntimeError("the memorization run wrote no report")
        return MemorizeFound(
            exit_code=0 if result.passed else 1,
            report=outcome.report,
            json_path=outcome.json_path,
            curve=str(outcome.curve) if outcome.curve else None,
        )


def for_a_script(text: str, command: str = "python train.py") -> str:
    """The engine's next step, said for a script: the doctor on the same command (six of its
    checks run on a script); a declared floor and dlci calibrate need a Target.

    >>> for_a_script("run dlci doctor --target <your target>; lr-range ...")  # doctest: +ELLIPSIS
    'run dlci doctor -- python train.py (six of its checks run on a script; ...); lr-range ...'
    """
    doctor = DOCTOR.format(target=TARGET_SLOT) + "; "
    on_a_script = (
        f"run dlci doctor -- {command} (six of its checks run on a script; the others need a "
        "Target, docs/target.md); "
    )
    text = text.replace(doctor, on_a_script)
    text = text.replace(FLOOR_ASSUMED_HINT, SCRIPT_FLOOR_HINT)
    return text.replace(f"dlci calibrate --target {TARGET_SLOT}", "dlci calibrate on a Target")
