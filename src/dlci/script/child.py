"""The child process of script mode: ``python -m dlci.script.child`` with the plan in
``$DLCI_SCRIPT_PLAN`` (run.py writes it). Installs the hooks, runs the user's script as
``python train.py ...`` would, and writes what it found to the plan's ``result`` file: the
gate's result, or the located message of what script mode cannot follow, or the script's
own failure. The script's output goes where it always goes."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from dlci.errors import DlciError
from dlci.fsutil import atomic_write_bytes
from dlci.memorization.engine import MemorizeConfig, deterministic, seed_everything
from dlci.profiling.capture import Profiler
from dlci.profiling.session import forward_marked
from dlci.progress import StepProgress
from dlci.report.text import clean
from dlci.script.doctor import ScriptDoctor
from dlci.script.gate import ScriptGate
from dlci.script.hooks import Hooks, ScriptStop, Unsupported, find_model, run_script, user_frame
from dlci.script.plan import (
    PLAN_VARIABLE,
    Answer,
    AnyPlan,
    MemorizeFound,
    MemorizePlan,
    ProfileFound,
    ProfilePlan,
    decode_plan,
    encode,
)
from dlci.script.report import ScriptReport


def main() -> int:
    plan = decode_plan(Path(os.environ.pop(PLAN_VARIABLE)).read_bytes())
    outcome = Answer(error="the child ended before a result")
    try:
        outcome = run_plan(plan)
    finally:
        atomic_write_bytes(plan.result, encode(outcome))
    sys.stdout.flush()
    return 0


def _say(line: str) -> None:
    print(f"{clean(line)}", file=sys.stderr, flush=True)


def run_plan(plan: AnyPlan) -> Answer:
    """Install the hooks, run the script, take them out: what was found (run.py's answer)."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return Answer(
            error="the script runs under a distributed launcher (WORLD_SIZE > 1): script "
            "mode follows one process",
            where=plan.script,
        )
    driver: _Memorize | ScriptDoctor | _Profile
    if isinstance(plan, MemorizePlan):
        driver = _Memorize(plan)
    elif isinstance(plan, ProfilePlan):
        driver = _Profile(plan)
    else:
        driver = ScriptDoctor(plan)
    hooks = driver.hooks
    hooks.install()
    failure = None
    try:
        with driver:
            _script(plan, hooks)
    except Unsupported as exc:
        driver.failed(f"{exc.where}: {exc.message}")
        return Answer(error=exc.message, where=exc.where, hint=exc.hint)
    except _Stopped:
        pass
    except SystemExit as exc:
        if exc.code not in (None, 0):
            failure = f"the script exited with status {exc.code}"
    except Exception as exc:  # the script's own failure: its traceback, as python prints it
        traceback.print_exc()
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else ""  # the traceback
        said = said if len(said) <= 300 else said[:300] + "..."  # above has the rest
        failure = f"the script raised {type(exc).__name__}: {said}"
        failure += f" (at {_where(exc)})" if _where(exc) else ""
    finally:
        hooks.uninstall()
    if failure is not None:
        driver.failed(failure)
        return Answer(failure=failure)
    return driver.outcome()


class _Stopped(BaseException):
    pass


def _script(plan: AnyPlan, hooks: Any) -> None:
    """The script, then its last step's judgement (``hooks.flush``) once it ended by itself."""
    try:
        try:
            run_script(plan.script, plan.module, list(plan.args))
        except SystemExit as exc:
            if exc.code in (None, 0):
                hooks.flush()
            raise
        hooks.flush()
    except ScriptStop:
        raise _Stopped() from None


def _where(exc: BaseException) -> str:
    """The script's innermost line in the traceback."""
    return user_frame(traceback.extract_tb(exc.__traceback__))


class _Memorize:
    """The gate, its report, its progress, and the engine's deterministic mode around the
    script."""

    def __init__(self, plan: MemorizePlan) -> None:
        self.plan = plan
        self.report = ScriptReport(plan)  # failing until the verdict replaces it
        self.config = MemorizeConfig(**msgspec.structs.asdict(plan.settings))
        seed_everything(self.config.seed)  # as for a Target: the same start on every run
        self.bar = StepProgress(self.config.max_epochs, plan.label, enabled=not plan.quiet)
        say = (lambda _line: None) if plan.quiet else (lambda line: _say(f"memorize: {line}"))
        self.gate = ScriptGate(self.config, say, self.bar)
        self.hooks = self.gate.hooks

    def __enter__(self) -> _Memorize:
        self._deterministic = deterministic()
        self._deterministic.__enter__()
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.gate.close()  # functional dropout back, whatever stopped the script
        self.bar.__exit__(*exc)
        self._deterministic.__exit__(*exc)

    def failed(self, text: str) -> None:
        self.report.error(text)

    def outcome(self) -> Answer:
        if not self.gate.losses:
            message = (
                f"the script ended after {self.hooks.steps} optimizer steps with no loss read: "
                "it never stepped an optimizer after a backward()"
            )
            self.failed(message)
            return Answer(
                error=message,
                where=self.plan.script,
                hint="check that the command trains (not --sample-only or 0 epochs)",
            )
        found: MemorizeFound = self.report.finish(self.gate.result(), self.hooks.parsed)
        return Answer(memorize=found)


class _Profile:
    """torch.profiler's schedule driven by the script's optimizer steps."""

    def __init__(self, plan: ProfilePlan) -> None:
        seed_everything(plan.seed)
        schedule = msgspec.structs.asdict(plan.schedule)
        self.total = sum(schedule.values())
        self.profiler = Profiler(plan.out, analyze=False, device=plan.device, **schedule)
        self.hooks = Hooks(False, self.on_step, on_optimizer=self.on_optimizer)
        self.marks = contextlib.ExitStack()
        quiet = plan.quiet
        self.say: Callable[[str], None] = lambda line: None if quiet else _say(f"profile: {line}")
        self.error: str | None = None
        self.start = time.perf_counter()

    def on_optimizer(self, optimizer: Any) -> None:
        """At the first step (never recorded: the schedule waits), the model the optimizer
        trains gets its forward annotated ``dlci/forward``, as a Target's own step does."""
        for model in find_model(optimizer):
            self.marks.enter_context(forward_marked(model))

    def on_step(self, _value: float) -> None:
        step = self.hooks.steps
        self.say(f"step {step}/{self.total} ({self.profiler.schedule.phase_of(step)})")
        if not self.profiler.step():
            raise ScriptStop("profiled")

    def __enter__(self) -> _Profile:
        self.profiler.__enter__()
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        self.marks.close()
        stop = kind is None or kind is _Stopped or issubclass(kind, SystemExit)
        try:
            self.profiler.__exit__(*((None, None, None) if stop else (kind, exc, tb)))
        except DlciError as err:
            self.error = err.message

    def failed(self, text: str) -> None:
        pass  # the parent says it; a profile has no partial report

    def outcome(self) -> Answer:
        import torch

        device = self.profiler.device or ("cuda" if torch.cuda.is_available() else "cpu")
        written = self.profiler.trace_path.is_file() and self.error is None
        found = ProfileFound(
            trace=str(self.profiler.trace_path) if written else None,
            steps=self.profiler.schedule.active,
            device=str(device),
            cpu_only=not str(device).startswith("cuda"),
            wall_time_s=time.perf_counter() - self.start,
            log=str(self.profiler.log) if self.profiler.log else None,
            steps_taken=self.hooks.steps,
            error=self.error,
        )
        return Answer(profile=found)


if __name__ == "__main__":
    sys.exit(main())
