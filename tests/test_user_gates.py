"""Gates need a positive verdict: what the target's own code does to ``dlci memorize``,
``dlci doctor``, ``dlci profile`` and ``dlci.assert_memorizes`` when it exits, raises, dies
or hangs (tests/hostile_targets.py misbehaves where DLCI_HOSTILE points).

- ``sys.exit`` in any call into the target fails with exit 1 and "the target exited before
  a verdict: sys.exit(0) in FILE:LINE (where)", and a failing report;
- an exception of the target's is exit 1 at the user's own line, the user's frames before
  dl-ci's, no traceback; a bug of dl-ci's own stays exit 3 (the controls);
- ``os._exit(0)`` gives exit code 0, but the report written before the target ran says fail;
- a step that hangs past the time cap is ended by the watchdog (partial report, exit 1);
  without the watchdog the same run hangs (the control).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dlci.checks import CHECK_IDS
from dlci.cli import main
from dlci.memorization.request import NO_VERDICT
from dlci.memorization.watchdog import Watchdog
from dlci.training.guard import EXIT_HINT
from dlci.training.stepping import optimizer_hparams

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
HOSTILE = TESTS / "hostile_targets.py"
SHOWN = "tests/hostile_targets.py"  # as dl-ci shows it, relative to the repository's root
SPEC = "hostile_targets:make_target"  # the target's own train_step and eval_step
PLAIN_SPEC = "hostile_targets:make_plain_target"  # dl-ci's standard step: loss_fn is called
TIER = ["--budget", "pr", "--hardware", "cpu"]


def line_of(source: str) -> int:
    """The line of hostile_targets.py whose text (stripped) is ``source``."""
    lines = HOSTILE.read_text(encoding="utf-8").splitlines()
    return next(n for n, text in enumerate(lines, 1) if text.strip() == source)


EXIT_LINE = line_of("sys.exit(0)")
RAISE_SOURCE = 'raise ValueError(f"hostile {place}")'  # as written, braces and all
RAISE_LINE = line_of(RAISE_SOURCE)
HANG_LINE = line_of("time.sleep(0.05)")


def exited(where: str, shown: str = SHOWN) -> str:
    return f"the target exited before a verdict: sys.exit(0) in {shown}:{EXIT_LINE} ({where})"


@pytest.fixture
def at_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The repository's root as the current directory (so dl-ci shows tests/...), the hostile
    module importable and imported afresh, the CPU only, crash logs under tmp_path."""
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.delitem(sys.modules, "hostile_targets", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("DLCI_LOG_DIR", str(tmp_path / "log"))
    monkeypatch.delenv("DLCI_HOSTILE", raising=False)
    monkeypatch.delenv("DLCI_WATCHDOG", raising=False)
    return tmp_path


def memorize(out: Path, spec: str = SPEC) -> int:
    args = ["memorize", "--target", spec, "--out", str(out), *TIER, "--quiet"]
    return main([*args, "--tracker", "none"])


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error: ")]


def report(out: Path, name: str = "memorization.json") -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / name).read_text(encoding="utf-8"))
    return data


# ------------------------------------------------------------------------------------ exits

EXITS = {  # place -> (target, where the message says dl-ci was)
    "import": (SPEC, "importing hostile_targets"),
    "factory": (SPEC, "make_target(), the target's factory"),
    "train_loader": (SPEC, "train_loader"),
    "train_step": (SPEC, "train_step"),
    "loss_fn": (PLAIN_SPEC, "loss_fn"),
}


@pytest.mark.parametrize("place", list(EXITS))
def test_an_exit_in_the_targets_code_fails_memorize_with_where_it_was(
    at_root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], place: str
) -> None:
    spec, where = EXITS[place]
    monkeypatch.setenv("DLCI_HOSTILE", f"{place}:exit0")
    assert memorize(at_root / "out", spec) == 1
    out, err = capsys.readouterr()
    message = exited(where)
    assert error_lines(err) == [f"error: {message}"]
    assert f"error: {message}\n  hint: {EXIT_HINT}\n" in err
    assert "PASS" not in out + err
    data = report(at_root / "out")
    assert (data["verdict"], data["stopped_by"], data["reason"]) == ("fail", "error", message)


def test_control_the_same_target_passes(at_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without DLCI_HOSTILE the hostile targets memorize: the failures above are the exits."""
    assert memorize(at_root / "out") == 0
    assert memorize(at_root / "plain", PLAIN_SPEC) == 0
    assert capsys.readouterr().out.startswith("memorization PASS: loss ")
    assert report(at_root / "out")["verdict"] == "pass"
    assert report(at_root / "plain")["verdict"] == "pass"


# ------------------------------------------------------------------------------- exceptions

RAISES = {  # place -> (target, the message after FILE:LINE, the outermost user frame's function)
    "factory": (
        SPEC,
        "--target hostile_targets:make_target: make_target() raised ValueError: hostile factory",
        "make_target",
    ),
    "train_loader": (SPEC, "train_loader raised ValueError: hostile train_loader", "__iter__"),
    "train_step": (SPEC, "step 1: train_step raised ValueError: hostile train_step", "train_step"),
    "loss_fn": (PLAIN_SPEC, "step 1: loss_fn raised ValueError: hostile loss_fn", "loss_fn"),
}


@pytest.mark.parametrize("place", list(RAISES))
def test_an_exception_in_the_targets_code_is_exit_1_at_the_users_line_first(
    at_root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], place: str
) -> None:
    spec, message, outermost = RAISES[place]
    monkeypatch.setenv("DLCI_HOSTILE", f"{place}:raise")
    assert memorize(at_root / "out", spec) == 1
    out, err = capsys.readouterr()
    assert error_lines(err) == [f"error: {SHOWN}:{RAISE_LINE}: {message}"]
    assert "Traceback" not in out + err
    hint = err.split(f"error: {SHOWN}:{RAISE_LINE}: {message}\n", 1)[1].splitlines()
    assert hint[0] == "  hint: the error is in your code; your code (innermost last):"
    ours = hint.index("  called from dl-ci:")
    users = hint[1:ours]
    assert users and all(line.startswith(f"    {SHOWN}:") for line in users)
    assert f" in {outermost}: " in users[0]
    assert users[-1] == f"    {SHOWN}:{RAISE_LINE} in misbehave: {RAISE_SOURCE}"
    assert hint[ours + 1].startswith("    ") and "dlci" in hint[ours + 1]  # dl-ci's, after
    data = report(at_root / "out")
    assert (data["verdict"], data["stopped_by"]) == ("fail", "error")
    assert data["reason"] == f"{SHOWN}:{RAISE_LINE}: {message}"


def test_control_a_bug_of_dl_ci_inside_a_step_still_exits_3(
    at_root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An exception whose innermost frame is dl-ci's, raised inside the guarded call of the
    model: not blamed on the user, but a bug (exit 3, the traceback in the log)."""
    import dlci.training.stepping as stepping

    monkeypatch.setattr(stepping, "call_model", lambda model, inputs: optimizer_hparams(None))
    assert memorize(at_root / "out", PLAIN_SPEC) == 3
    err = capsys.readouterr().err
    assert (
        "error: dlci memorize failed unexpectedly "
        "(AttributeError: 'NoneType' object has no attribute 'param_groups')." in err
    )
    assert error_lines(err) == [line for line in err.splitlines() if "failed unexpectedly" in line]
    log = (at_root / "log" / "dlci-error.log").read_text(encoding="utf-8")
    assert "Traceback" in log and "in optimizer_hparams" in log
    data = report(at_root / "out")  # the failing report written before the target ran stays
    assert (data["verdict"], data["stopped_by"], data["reason"]) == ("fail", "exited", NO_VERDICT)


def test_control_a_bug_of_dl_ci_outside_the_targets_code_exits_3(
    at_root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import dlci.memorization.engine as engine

    def broken(model: object, optimizer: object) -> list[str]:
        raise RuntimeError("a bug in dl-ci")

    monkeypatch.setattr(engine, "switch_off_regularization", broken)
    assert memorize(at_root / "out") == 3
    err = capsys.readouterr().err
    assert "error: dlci memorize failed unexpectedly (RuntimeError: a bug in dl-ci)." in err
    assert "Traceback" in (at_root / "log" / "dlci-error.log").read_text(encoding="utf-8")


# ----------------------------------------------------------------------------------- doctor


def doctor(out: Path, *extra: str) -> int:
    return main(["doctor", "--target", SPEC, "--out", str(out), *TIER, *extra])


def test_an_exit_in_eval_step_fails_its_doctor_checks_and_the_others_still_run(
    at_root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DLCI_HOSTILE", "eval_step:exit0")
    assert doctor(at_root / "out") == 1
    err = capsys.readouterr().err
    data = report(at_root / "out", "doctor.json")
    checks = {c["id"]: c for c in data["checks"]}
    assert list(checks) == list(CHECK_IDS)  # every check ran
    failed = [c for c in checks.values() if c["status"] == "fail"]
    assert [c["id"] for c in failed] == [  # eval_step's (initial-loss scores through it)
        "initial-loss",
        "train-eval-mode",
        "batch-independence",
        "activations",  # its forward is the eval_step too (a forward(inputs, target))
        "input-dependence",  # a trained copy's outputs read through the eval_step
    ]
    for check in failed:
        cause = exited(f"the {check['id']} check")
        assert (check["measured"], check["cause"]) == ("the process was asked to exit", cause)
        assert check["fix"] == "remove the exit from the target's code (raise an exception instead)"
        assert f"doctor: {cause}\n" in err
    assert checks["memorize"]["status"] == "pass"  # after them
    assert checks["reproducibility"]["status"] == "pass"
    assert data["verdict"] == "fail"


def test_an_exception_in_train_step_fails_its_doctor_check_at_the_users_line(
    at_root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DLCI_HOSTILE", "train_step:raise")
    assert doctor(at_root / "out", "--only", "initial-loss,zero-grad,shuffle") == 1
    err = capsys.readouterr().err
    assert "doctor: zero-grad            fail\n" in err
    assert "Traceback" not in err
    data = report(at_root / "out", "doctor.json")
    checks = {c["id"]: c for c in data["checks"]}
    assert {k: c["status"] for k, c in checks.items()} == {
        "initial-loss": "pass",
        "zero-grad": "fail",
        "shuffle": "pass",  # after the failure
    }
    zero_grad = checks["zero-grad"]
    assert zero_grad["measured"] == "ValueError: hostile train_step"
    assert zero_grad["cause"] == (
        f"the target's code raised an error during this check, at {SHOWN}:{RAISE_LINE}"
    )
    frames = zero_grad["details"]["frames"].splitlines()
    assert frames[0] == "your code (innermost last):"
    ours = frames.index("  called from dl-ci:")  # the user's frames first, then dl-ci's
    assert frames[ours - 1] == f"    {SHOWN}:{RAISE_LINE} in misbehave: {RAISE_SOURCE}"
    assert frames[ours - 2].endswith(' in train_step: misbehave("train_step")')
    assert "dlci" in frames[ours + 1]
    assert data["verdict"] == "fail"


def test_control_a_bug_of_a_check_exits_3(
    at_root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A check whose own code raises is dl-ci's bug, not a failed check of the target:
    status crashed, the other checks still run, exit 3."""
    import dlci.checks.setup as setup

    monkeypatch.setattr(setup, "optimizer_coverage", lambda ctx: optimizer_hparams(None))
    assert doctor(at_root / "out", "--only", "optimizer-coverage,initial-loss") == 3
    err = capsys.readouterr().err
    assert (
        "error: dlci doctor failed unexpectedly "
        "(AttributeError: 'NoneType' object has no attribute 'param_groups')." in err
    )
    data = report(at_root / "out", "doctor.json")  # the whole report, the crash in it
    statuses = [(c["id"], c["status"]) for c in data["checks"]]
    assert statuses == [("optimizer-coverage", "crashed"), ("initial-loss", "pass")]
    assert data["verdict"] == "fail"
    assert data["reason"] == "checks crashed, so they gave no verdict: optimizer-coverage"


# ---------------------------------------------------------------------------------- profile


def profile(out: Path) -> int:
    return main(["profile", "--target", SPEC, "--out", str(out), *TIER, "--quiet"])


def test_an_exit_in_train_step_fails_profile(
    at_root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DLCI_HOSTILE", "train_step:exit0")
    assert profile(at_root / "out") == 1
    err = capsys.readouterr().err
    assert error_lines(err) == [f"error: {exited('train_step')}"]
    assert f"  hint: {EXIT_HINT}" in err
    assert not (at_root / "out" / "trace.json.gz").exists()
    assert not (at_root / "out" / "utilization.json").exists()


def test_an_exception_in_train_step_fails_profile_at_the_users_line(
    at_root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DLCI_HOSTILE", "train_step:raise")
    assert profile(at_root / "out") == 1
    err = capsys.readouterr().err
    message = "step 1: train_step raised ValueError: hostile train_step"
    assert error_lines(err) == [f"error: {SHOWN}:{RAISE_LINE}: {message}"]
    assert "  hint: the error is in your code; your code (innermost last):" in err
    assert "Traceback" not in err


# ------------------------------------------------------------- a process that dies or hangs


def run_dlci(
    args: list[str], env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``python -m dlci ARGS`` at the repository's root, hostile_targets importable."""
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    full = {k: v for k, v in os.environ.items() if k not in ("DLCI_HOSTILE", "DLCI_WATCHDOG")}
    full.update(PYTHONPATH=path, CUDA_VISIBLE_DEVICES="", **env)
    return subprocess.run(
        [sys.executable, "-m", "dlci", *args],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_os_exit_leaves_a_failing_report(tmp_path: Path) -> None:
    """os._exit(0) cannot be caught: the exit code is 0, but the report written before the
    target ran says fail (and is missing, failing this test, if none was written first)."""
    out = tmp_path / "out"
    args = ["memorize", "--target", SPEC, "--out", str(out), *TIER, "--quiet", "--tracker", "none"]
    env = {"DLCI_HOSTILE": "train_step:os_exit0", "DLCI_LOG_DIR": str(tmp_path / "log")}
    done = run_dlci(args, env, timeout=120)
    assert done.returncode == 0, done.stderr
    data = report(out)
    assert (data["verdict"], data["stopped_by"], data["reason"]) == ("fail", "exited", NO_VERDICT)
    assert data["steps"] == 0 and data["losses"] == []


@pytest.fixture
def tiny_cap_ladder(tmp_path: Path) -> Path:
    """The small test ladder with a 0.02 min (1.2 s) time cap and an unreachable loss at
    pr/cpu, so the run trains on until the hang."""
    text = (TESTS / "data" / "ladders" / "small.yaml").read_text(encoding="utf-8")
    row = "cpu: {max_epochs: 100, max_loss: 1.0, time_cap_minutes: 3,"
    assert text.count(row) == 2  # pr and merge
    path = tmp_path / "ladder.yaml"
    tiny = "cpu: {max_epochs: 100, max_loss: 1.0e-9, time_cap_minutes: 0.02,"
    path.write_text(text.replace(row, tiny), encoding="utf-8")
    return path


def hanging_run(out: Path, ladder: Path) -> list[str]:
    return ["memorize", "--target", SPEC, "--ladder", str(ladder), *TIER, "--out", str(out)]


def test_the_watchdog_ends_a_step_that_hangs_past_the_time_cap_with_a_partial_report(
    tmp_path: Path, tiny_cap_ladder: Path
) -> None:
    out = tmp_path / "out"
    args = [*hanging_run(out, tiny_cap_ladder), "--quiet", "--tracker", "none"]
    env = {"DLCI_HOSTILE": "train_step:hang", "DLCI_LOG_DIR": str(tmp_path / "log")}
    done = run_dlci(args, env, timeout=120)
    assert done.returncode == 1, done.stderr
    data = report(out)
    stuck_at = f"{SHOWN}:{HANG_LINE} in misbehave"
    assert (data["verdict"], data["stopped_by"], data["stuck_at"]) == ("fail", "watchdog", stuck_at)
    assert data["steps"] == 2 and len(data["losses"]) == 2  # it hangs from the third call on
    reason = (
        f"the time cap of 0.02 min passed inside step 3; last loss {data['losses'][1]:.4g} at "
        f"step 2; stuck at: {stuck_at}"
    )
    assert data["reason"] == reason
    assert data["stack"][-1] == f"{stuck_at}: time.sleep(0.05)"
    assert data["stack"][-2].endswith(' in train_step: misbehave("train_step")')
    err = done.stderr.splitlines()
    assert f"memorize: memorization FAIL: {reason}" in err
    start = err.index("memorize: the stuck thread's stack (innermost last):")
    assert err[start + 1 :][-2] == f"memorize:   {stuck_at}: time.sleep(0.05)"
    assert err[-1] == f"memorize: partial report {out / 'memorization.json'}"


def test_control_without_the_watchdog_the_same_run_hangs(
    tmp_path: Path, tiny_cap_ladder: Path
) -> None:
    args = [*hanging_run(tmp_path / "out", tiny_cap_ladder), "--quiet", "--tracker", "none"]
    env = {
        "DLCI_HOSTILE": "train_step:hang",
        "DLCI_WATCHDOG": "off",
        "DLCI_LOG_DIR": str(tmp_path / "log"),
    }
    with pytest.raises(subprocess.TimeoutExpired):
        run_dlci(args, env, timeout=20)


# ------------------------------------------------------------------- the watchdog, in-process


def a_step_that_hangs(gate: threading.Lock) -> None:
    gate.acquire(timeout=10)


HANGS_AT = a_step_that_hangs.__code__.co_firstlineno + 1


def test_the_watchdog_fires_past_the_deadline_with_the_stuck_threads_stack() -> None:
    gate = threading.Lock()
    gate.acquire()  # held until the watchdog's exit (a recorder here) releases it
    heard: list[tuple[str, list[str]]] = []
    exits: list[int] = []

    def exit(code: int) -> None:
        exits.append(code)
        gate.release()

    dog = Watchdog(lambda stuck_at, stack: heard.append((stuck_at, stack)), exit=exit)
    started = time.monotonic()
    dog.arm(0.2)
    a_step_that_hangs(gate)
    dog.stop()
    assert time.monotonic() - started < 5  # released by the watchdog, not by the timeout
    assert dog.fired and exits == [1] and len(heard) == 1
    stuck_at, stack = heard[0]
    assert stuck_at.endswith(f"test_user_gates.py:{HANGS_AT} in a_step_that_hangs")
    assert stack[-1] == f"{stuck_at}: gate.acquire(timeout=10)"
    assert any(line.endswith(": a_step_that_hangs(gate)") for line in stack[:-1])


def test_control_a_run_that_ends_in_time_is_not_touched() -> None:
    heard: list[object] = []
    exits: list[int] = []
    dog = Watchdog(lambda stuck_at, stack: heard.append(stuck_at), exit=exits.append)
    dog.arm(0.3)
    dog.arm(0.3)  # armed again, as between set-up and training
    sum(range(1000))  # a step that returns
    dog.stop()
    time.sleep(0.6)  # past the deadline
    assert (dog.fired, heard, exits) == (False, [], [])


# ---------------------------------------------------------------------------- a user's test


def test_an_exit_in_a_users_memorization_test_fails_that_test_and_pytest_goes_on(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dlci.assert_memorizes`` raises the exit as a DlciError (TargetExited): the test fails
    with the message, the session goes on, and ``pytest.raises(DlciError)`` catches it."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("DLCI_HOSTILE", "train_step:exit0")
    pytester.makepyfile(hostile_targets=HOSTILE.read_text(encoding="utf-8"))
    pytester.makepyfile(
        test_model="""
        import pytest
        import dlci
        import hostile_targets
        from dlci.errors import DlciError

        def test_memorizes(dlci_tier):
            dlci.assert_memorizes(hostile_targets.make_target(), tier=dlci_tier)

        def test_the_exit_is_a_dlci_error(dlci_tier):
            with pytest.raises(DlciError, match="the target exited before a verdict"):
                dlci.assert_memorizes(hostile_targets.make_target(), tier=dlci_tier)

        def test_after_them():
            pass
        """
    )
    result = pytester.runpytest_subprocess("--dlci-budget", "pr", "--dlci-hardware", "cpu")
    result.assert_outcomes(failed=1, passed=2)
    message = exited("train_step", shown="hostile_targets.py")
    result.stdout.fnmatch_lines(
        [f"E * dlci.training.guard.TargetExited: {message}", f"E * hint: {EXIT_HINT}"]
    )
    result.stdout.fnmatch_lines(["FAILED test_model.py::test_memorizes - *TargetExited: *"])


def test_an_exception_in_train_step_fails_the_memorize_check_and_the_later_checks_still_run(
    at_root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The memorize check runs the engine, which reports the target's error as a DlciError:
    that check fails, located, and the checks after it (lr-range, ...) still run."""
    monkeypatch.setenv("DLCI_HOSTILE", "train_step:raise")
    assert doctor(at_root / "out") == 1
    assert "Traceback" not in capsys.readouterr().err
    checks = {c["id"]: c for c in report(at_root / "out", "doctor.json")["checks"]}
    from dlci.checks import CHECK_IDS

    assert list(checks) == list(CHECK_IDS)  # every check reported, none skipped by a raise
    memorize = checks["memorize"]
    assert memorize["status"] == "fail"
    assert "train_step raised ValueError: hostile train_step" in memorize["measured"]
    assert memorize["cause"] == (
        f"the target's code failed during this check at {SHOWN}:{RAISE_LINE}"
    )
    assert checks["reproducibility"]["status"] != "skip"
