"""The host side of the gates' isolation (dlci.action.host.gates) and of the workflow-command stop
around the container's output (dlci.action.host.container.watch), without Docker: the container
is stood in for by a local process. tests/e2e/test_trust_gates.py attacks the real thing."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import msgspec
import pytest

from dlci.action.host import container
from dlci.action.host.gates import HOST_MOUNT, OUT_MOUNT, Parts
from dlci.errors import DlciError

PRINTS = "print('::error::pwned'); print('::add-mask::x', flush=True)"


def markers(out: str) -> tuple[str, list[str]]:
    lines = out.splitlines()
    start = re.fullmatch(r"::stop-commands::([0-9a-f]{32})", lines[0])
    assert start, lines[0]
    return start.group(1), lines


@pytest.mark.parametrize("exit_code", [0, 3])
def test_the_output_sits_between_stop_commands_and_its_token(capsys, exit_code: int) -> None:
    cmd = [sys.executable, "-c", f"import sys; {PRINTS}; sys.exit({exit_code})"]
    code, tail = container.watch(cmd, "unused", 1.0)
    assert code == exit_code
    token, lines = markers(capsys.readouterr().out)
    # the resume line starts a line of its own, after a newline of the host's
    assert lines[1:] == ["::error::pwned", "::add-mask::x", "", f"::{token}::"]
    assert tail == ["::error::pwned\n", "::add-mask::x\n"]


def test_each_run_has_a_new_token(capsys) -> None:
    for _ in range(2):
        container.watch([sys.executable, "-c", "pass"], "unused", 1.0)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6 and lines[0].split("::")[2] != lines[3].split("::")[2]


def test_commands_resume_after_a_timeout(capsys, monkeypatch) -> None:
    monkeypatch.setattr(container, "_kill", lambda name: None)  # no docker here: it ends itself
    cmd = [sys.executable, "-c", f"import time; {PRINTS}; time.sleep(2)"]
    with pytest.raises(DlciError, match="ran past timeout-minutes"):
        container.watch(cmd, "unused", 0.005)
    token, lines = markers(capsys.readouterr().out)
    assert lines[-1] == f"::{token}::" and "::error::pwned" in lines


def test_control_without_the_host_the_lines_are_commands(capfd) -> None:
    import subprocess

    subprocess.run([sys.executable, "-c", PRINTS], check=True)
    assert capfd.readouterr().out.splitlines()[0] == "::error::pwned"  # a command, unwrapped


def parts(tmp_path: Path, inner: list[str], monkeypatch, *, install: bool = False) -> Parts:
    """The job's parts; without ``install``, as with the input install: none (no install
    container: the tests container installs, as every part did before install-once)."""
    monkeypatch.setenv("RUNNER_TEMP", str(tmp_path))
    ws = tmp_path / "ws"
    (ws / "dlci-artifacts").mkdir(parents=True, exist_ok=True)
    return Parts([*inner, *([] if install else ["--install", "none"])], ws, ".",
                 str(tmp_path / "record.json"))  # fmt: skip


def host_tier(tmp_path: Path) -> Path:
    from dlci.ladder.tiers import choose_tier

    path = tmp_path / "preflight.json"
    tier = choose_tier(budget="pr", hardware="cpu").to_dict()
    path.write_text(json.dumps({"passed": True, "plan_version": 1, "tier": tier}))
    return path


def test_the_plan_mounts_the_tier_read_only_and_one_out_per_gate(tmp_path, monkeypatch) -> None:
    inner = ["--out", "/workspace/dlci-artifacts", "--plan", str(host_tier(tmp_path))]
    job = parts(tmp_path, [*inner, "--no-doctor", "--phase", "all"], monkeypatch, install=True)
    plan = job.plan()
    assert [p.name for p in plan] == ["install", "tests", "memorize", "profile"]
    install, tests, memorize = plan[0], plan[1], plan[2]
    assert tests.argv == [
        "--no-doctor", "--out", "/workspace/dlci-artifacts",
        "--plan", f"{HOST_MOUNT}/plan.json", "--phase", "tests",
    ]  # fmt: skip
    assert install.argv[-2:] == ["--phase", "install"] and install.out is not None
    assert install.flags[-1] == f"{install.out}:{OUT_MOUNT}"  # its run.json, out of reach
    # control: with the input install: none there is no install container
    none = parts(tmp_path / "none", [*inner, "--no-doctor"], monkeypatch).plan()
    assert [p.name for p in none] == ["tests", "memorize", "profile"]
    assert tests.flags[-1].endswith(f":{HOST_MOUNT}:ro") and OUT_MOUNT not in " ".join(tests.flags)
    assert memorize.flags[-1] == f"{memorize.out}:{OUT_MOUNT}"
    assert memorize.argv[-2:] == ["--phase", "memorize"] and "--out" in memorize.argv
    assert memorize.argv[memorize.argv.index("--out") + 1] == OUT_MOUNT
    assert str(tmp_path / "ws") not in str(memorize.out)  # outside the workspace


def test_finish_replaces_planted_reports_and_records_what_it_copied(tmp_path, monkeypatch) -> None:
    job = parts(tmp_path, ["--plan", str(host_tier(tmp_path)), "--no-doctor"], monkeypatch)
    plan = job.plan()
    art = tmp_path / "ws" / "dlci-artifacts"
    steps = [{"name": "install", "status": "passed"},
             {"name": "tests", "status": "passed", "exit_code": 0}]  # fmt: skip
    (art / "run.json").write_text(json.dumps({"steps": steps}))
    junit(art, 2)
    (art / "memorization.json").write_text('{"verdict": "pass"}')  # planted by the tests
    (art / "utilization.json").write_text('{"planted": true}')
    job.collect(plan[0], 0)
    assert plan[1].out is not None
    (plan[1].out / "memorization.json").write_text('{"verdict": "fail"}')
    gate_steps = [{"name": "install", "status": "passed"}, {"name": "memorize", "status": "failed"}]
    (plan[1].out / "run.json").write_text(json.dumps({"steps": gate_steps}))
    job.collect(plan[1], 1)
    (plan[1].out / "memorization.json").write_text('{"verdict": "pass"}')  # too late: copied
    record = msgspec.to_builtins(job.finish(plan))  # the profile gate never ran (stopped)
    assert json.loads((art / "memorization.json").read_text()) == {"verdict": "fail"}
    assert not (art / "utilization.json").exists()
    digest = hashlib.sha256(b'{"verdict": "fail"}').hexdigest()
    assert record["reports"] == {"memorization.json": {"part": "memorize", "sha256": digest}}
    assert record["tier"]["max_relative_loss"] == 0.3 and record["exit_codes"] == {
        "tests": 0,
        "memorize": 1,
    }
    run = json.loads((art / "run.json").read_text())
    status = {s["name"]: s["status"] for s in run["steps"]}
    assert status == {
        "install": "passed", "tests": "passed", "memorize": "failed", "doctor": "skipped",
        "profile": "skipped",
    }  # fmt: skip
    assert run["failed_steps"] == ["memorize"] and run["verdict"] == "fail"
    assert json.loads((tmp_path / "record.json").read_text())["run"] == run
    job.close()


TESTS_PASSED = {"name": "tests", "status": "passed", "exit_code": 0}


@pytest.mark.parametrize(
    ("claims", "code", "why"),
    [
        ([TESTS_PASSED], 0, ""),  # the control: pytest's exit code, junit.xml agrees
        ([{"name": "tests", "status": "passed"}], 1, "with no exit code of pytest"),
        ([], 1, "it records no tests step"),
        ([{"name": "tests", "status": "skipped"}], 1, "its container skipped it"),
        ([{"name": "tests", "status": "PASSED", "exit_code": 0}], 1, "never writes"),
        ([TESTS_PASSED], 1, "its container exited 1"),
    ],
)
def test_a_tests_container_cannot_pass_by_what_it_leaves_out(
    tmp_path, monkeypatch, claims: list[dict], code: int, why: str
) -> None:
    """The tests step passes on pytest's exit code, the container's and junit.xml together;
    a record that leaves its tests step out, gives no exit code, skips it after a passed
    install or names a status dl-ci never writes is an error (each passed the job before)."""
    job = parts(tmp_path, ["--no-doctor", "--no-profile", "--no-memorize"], monkeypatch)
    plan = job.plan()
    art = tmp_path / "ws" / "dlci-artifacts"
    steps = [{"name": "install", "status": "passed"}, *claims]
    (art / "run.json").write_text(json.dumps({"steps": steps}))
    junit(art, 3)
    job.collect(plan[0], code)
    run = job.finish(plan).run
    tests = run.step("tests")
    assert tests is not None
    if not why:
        assert (tests.status, run.verdict) == ("passed", "pass")
        return
    assert tests.status == "error" and why in str(tests.reason), tests
    assert run.verdict == "fail"


@pytest.mark.parametrize(
    ("claims", "install"),
    [
        ([{"name": "tests", "status": "skipped"}], None),  # no install step: every gate blocked
        ([{"name": "install", "status": "passed"}, TESTS_PASSED], {"status": "ok"}),
        ([{"name": "install", "status": "error"}, {"name": "tests", "status": "skipped"}], None),
    ],
)
def test_a_job_whose_records_hide_a_failure_does_not_pass(
    tmp_path, monkeypatch, claims: list[dict], install: dict | None
) -> None:
    """A tests container whose record leaves its install step out (so the host blocks every
    gate, and its tests' skip stood: the job passed with junit.xml counting failures), or an
    install container that gives a status dl-ci never writes: the job fails, named. The
    third case is honest, the control: an install that failed skips the tests, and the job
    fails on the install step."""
    job = parts(tmp_path, ["--no-doctor", "--no-profile"], monkeypatch, install=install is not None)
    plan = job.plan()
    art = tmp_path / "ws" / "dlci-artifacts"
    if install is not None:
        assert plan[0].name == "install" and plan[0].out is not None
        (plan[0].out / "run.json").write_text(
            json.dumps({"steps": [{"name": "install", **install}]})
        )
        job.collect(plan[0], 0)
        plan = plan[1:]
    (art / "run.json").write_text(json.dumps({"steps": claims}))
    junit(art, 3, failures=3)
    job.collect(plan[0], 0)
    run = job.finish(plan).run
    status = {s.name: s.status for s in run.steps}
    assert run.verdict == "fail", status
    if install is not None:
        assert status["install"] == "error"
    elif claims[0]["name"] == "tests":
        assert status["install"] == "error" and status["memorize"] == "skipped"
    else:
        assert (status["install"], status["tests"], status["memorize"]) == (
            "error",
            "skipped",
            "skipped",
        )


@pytest.mark.parametrize("status", ["skipped", "ok", "passed"])
def test_a_gate_container_cannot_drop_its_gate_by_its_status(tmp_path, monkeypatch, status) -> None:
    """A planned gate's container runs its gate: a claim that it skipped it, or a status dl-ci
    never writes, is an error whatever the exit code (a memorization that failed, claimed
    skipped, passed the job before). Control: an honest "passed" with exit 0 and its report."""
    job = parts(tmp_path, ["--no-doctor", "--no-profile"], monkeypatch)
    plan = job.plan()
    art = tmp_path / "ws" / "dlci-artifacts"
    (art / "run.json").write_text(json.dumps({"steps": [TESTS_PASSED]}))
    junit(art, 3)
    job.collect(plan[0], 0)
    assert plan[1].out is not None
    verdict = "pass" if status == "passed" else "fail"
    (plan[1].out / "memorization.json").write_text(json.dumps({"verdict": verdict}))
    gate = [{"name": "memorize", "status": status, "exit_code": 0 if verdict == "pass" else 1}]
    (plan[1].out / "run.json").write_text(json.dumps({"steps": gate}))
    job.collect(plan[1], 0 if verdict == "pass" else 1)
    memorize = job.finish(plan).run.step("memorize")
    assert memorize is not None
    if status == "passed":
        assert memorize.status == "passed"
        return
    assert memorize.status == "error" and "its container" in str(memorize.reason)


def test_a_gate_whose_install_failed_is_an_error(tmp_path, monkeypatch) -> None:
    job = parts(tmp_path, ["--no-doctor", "--no-profile"], monkeypatch)
    plan = job.plan()
    job.collect(plan[0], 0)
    assert plan[1].out is not None
    steps = [{"name": "install", "status": "error"}, {"name": "memorize", "status": "skipped"}]
    (plan[1].out / "run.json").write_text(json.dumps({"steps": steps}))
    job.collect(plan[1], 1)
    memorize = job.finish(plan).run.step("memorize")
    assert memorize.status == "error" and "install step failed" in memorize.reason


# The step rule: a step passes only on the report it wrote itself, whatever its exit code
# (dlci.action.host.gates.judge, used by dlci run in the container and by the host on the copies).

REPORTS = {
    "memorize": {"memorization.json": {"verdict": "pass", "stopped_by": "threshold"}},
    "doctor": {"doctor.json": {"verdict": "pass", "checks": [{"id": "a", "status": "pass"}]}},
    "profile": {"utilization.json": {"gpu_utilization_pct": None}, "trace.json.gz": ""},
}
FAILING = {
    "memorize": {"verdict": "fail", "stopped_by": "epochs", "reason": "loss 2 >= 1"},
    "doctor": {"verdict": "fail", "checks": [{"id": "a", "status": "fail"}]},
}


def write_reports(folder: Path, gate: str, **changes: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in {**REPORTS[gate], **changes}.items():
        text = value if isinstance(value, str) else json.dumps(value)
        (folder / name).write_text(text)
    return folder


def status_of(gate: str, code: int, folder: Path, **rules: bool) -> tuple[str, str]:
    from dlci.action.host.gates import judge
    from dlci.action.job.run import classify

    record = classify(gate, code, False, "")
    record.update(judge(gate, code, record["status"], folder, **rules))
    return record["status"], record.get("reason", "")


@pytest.mark.parametrize("gate", ["memorize", "doctor", "profile"])
def test_exit_0_without_a_report_fails_and_says_so(tmp_path: Path, gate: str) -> None:
    status, reason = status_of(gate, 0, tmp_path)
    assert status == "failed"
    missing = (
        "trace.json.gz" if gate == "profile" else f"{gate.replace('memorize', 'memorization')}.json"
    )
    assert reason == f"the target exited before a verdict: {gate} exited 0 without {missing}"


@pytest.mark.parametrize("gate", ["memorize", "doctor", "profile"])
def test_exit_0_with_a_passing_report_passes(tmp_path: Path, gate: str) -> None:
    assert status_of(gate, 0, write_reports(tmp_path, gate)) == ("passed", "")


@pytest.mark.parametrize("gate", ["memorize", "doctor", "profile"])
def test_control_the_exit_code_alone_would_pass_a_step_without_its_report(
    tmp_path: Path, gate: str
) -> None:
    from dlci.action.job.run import classify

    assert classify(gate, 0, False, "") == {"status": "passed"}  # the rule is what fails it


@pytest.mark.parametrize("gate", ["memorize", "doctor"])
def test_exit_0_with_a_failing_report_fails(tmp_path: Path, gate: str) -> None:
    name = "memorization.json" if gate == "memorize" else "doctor.json"
    folder = write_reports(tmp_path, gate, **{name: FAILING[gate]})
    status, reason = status_of(gate, 0, folder)
    assert status == "failed"
    assert reason.startswith(f"no positive verdict: {gate} exited 0 but {name} says fail")


def test_exit_0_with_a_failing_gpu_gate_fails_and_without_the_gate_passes(tmp_path: Path) -> None:
    gate = {"passed": False, "message": "GPU utilization 3.0% is below the minimum of 50%"}
    folder = write_reports(tmp_path, "profile", **{"utilization.json": {"gate": gate}})
    status, reason = status_of("profile", 0, folder, gpu_gate=True)
    assert status == "failed" and reason.endswith("is below the minimum of 50%")
    assert status_of("profile", 0, write_reports(tmp_path, "profile"), gpu_gate=True)[0] == "failed"
    assert status_of("profile", 0, folder)[0] == "passed"  # control: no --min-gpu-util


@pytest.mark.parametrize(
    ("stopped_by", "extra", "words"),
    [
        ("exited", {}, "(exited): the run ended before a verdict"),
        ("watchdog", {"stuck_at": "t.py:9 in step"}, "(watchdog): cap passed; stuck at: t.py:9"),
        ("error", {}, "(error): the run ended before a verdict"),
    ],
)
def test_a_partial_memorization_report_is_named_with_its_reason(
    tmp_path: Path, stopped_by: str, extra: dict, words: str
) -> None:
    reason = "cap passed" if stopped_by == "watchdog" else "the run ended before a verdict"
    report = {"verdict": "fail", "stopped_by": stopped_by, "reason": reason, **extra}
    folder = write_reports(tmp_path, "memorize", **{"memorization.json": report})
    status, said = status_of("memorize", 0, folder)
    assert status == "failed"
    assert said.startswith("the target exited before a verdict: memorize exited 0 with a partial")
    assert words in said


def test_a_partial_doctor_report_is_named(tmp_path: Path) -> None:
    report = {"verdict": "fail", "checks": [], "reason": "the doctor ended before a verdict"}
    folder = write_reports(tmp_path, "doctor", **{"doctor.json": report})
    status, said = status_of("doctor", 0, folder)
    assert status == "failed"
    assert said.endswith(
        "with a partial doctor.json (no checks ran): the doctor ended before a verdict"
    )


@pytest.mark.parametrize("gate", ["memorize", "doctor", "profile"])
def test_exit_1_with_a_passing_report_fails(tmp_path: Path, gate: str) -> None:
    status, reason = status_of(gate, 1, write_reports(tmp_path, gate))
    assert status == "failed" and f"{gate} exited 1 although" in reason


def test_exit_1_without_a_report_names_the_missing_report(tmp_path: Path) -> None:
    assert status_of("memorize", 1, tmp_path) == (
        "failed",
        "memorize exited 1 without memorization.json",
    )


def junit(folder: Path, tests: int, failures: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "junit.xml").write_text(
        f'<testsuites><testsuite tests="{tests}" failures="{failures}" errors="0" skipped="0">'
        "</testsuite></testsuites>"
    )
    return folder


def test_pytest_exit_5_fails_unless_the_user_allows_no_tests(tmp_path: Path) -> None:
    status, reason = status_of("tests", 5, junit(tmp_path, 0))
    assert status == "failed" and reason.startswith("no tests were collected: pytest exited 5")
    assert "allow-no-tests: true" in reason
    assert status_of("tests", 5, tmp_path, allow_no_tests=True)[0] == "passed"


def test_the_tests_pass_only_on_a_junit_file_that_agrees(tmp_path: Path) -> None:
    assert status_of("tests", 0, junit(tmp_path / "ok", 3)) == ("passed", "")
    status, reason = status_of("tests", 0, tmp_path / "none")
    assert (status, reason) == (
        "failed",
        "the tests exited before a verdict: pytest exited 0 without junit.xml",
    )
    assert status_of("tests", 0, junit(tmp_path / "bad", 3, failures=1))[0] == "failed"
    assert status_of("tests", 0, junit(tmp_path / "zero", 0))[0] == "failed"  # no tests ran
    assert status_of("tests", 0, tmp_path / "zero", allow_no_tests=True)[0] == "passed"
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "junit.xml").write_text("<testsuite")
    assert "unreadable junit.xml" in status_of("tests", 0, tmp_path / "broken")[1]


STAND_IN = (
    "import json, pathlib, sys; out = pathlib.Path(sys.argv[1]); "
    "[(out / n).write_text(json.dumps(v)) for n, v in json.loads(sys.argv[2]).items()]; "
    "sys.exit(int(sys.argv[3]))"
)


def step_record(out: Path, gate: str, code: int, writes: dict) -> dict:
    from dlci.action.job.run import Runner

    runner = Runner(out)
    try:
        command = [sys.executable, "-c", STAND_IN, str(out), json.dumps(writes), str(code)]
        runner.step(gate, command)
    finally:
        runner.finish()
    return msgspec.to_builtins(runner.steps[-1])  # as run.json holds it


def test_dlci_run_deletes_a_stale_report_before_the_step(tmp_path: Path) -> None:
    out = write_reports(tmp_path / "out", "memorize")  # an earlier run's passing report
    record = step_record(out, "memorize", 0, {})  # this one exits 0 and writes nothing
    assert record["status"] == "failed"
    assert record["reason"].endswith("memorize exited 0 without memorization.json")
    # control: the same step writing its own passing report passes
    passing = REPORTS["memorize"]
    assert step_record(out, "memorize", 0, passing)["status"] == "passed"


def test_control_a_stale_report_left_in_place_would_count(tmp_path: Path) -> None:
    from dlci.action.host.gates import judge

    out = write_reports(tmp_path / "out", "memorize")
    assert judge("memorize", 0, "passed", out) == {}  # hence the deletion before the step


def test_the_host_decides_a_gate_from_the_report_it_copied(tmp_path, monkeypatch) -> None:
    def gate_status(code: int, claim: str, report: dict | None, name: str) -> dict:
        job = parts(tmp_path / name, ["--no-doctor", "--no-profile"], monkeypatch)
        plan = job.plan()
        job.collect(plan[0], 0)
        assert plan[1].out is not None
        steps = [{"name": "install", "status": "passed"}, {"name": "memorize", "status": claim}]
        (plan[1].out / "run.json").write_text(json.dumps({"steps": steps}))
        if report is not None:
            (plan[1].out / "memorization.json").write_text(json.dumps(report))
        job.collect(plan[1], code)
        run = msgspec.to_builtins(job.finish(plan))["run"]
        job.close()
        return next(s for s in run["steps"] if s["name"] == "memorize")

    passing, failing = REPORTS["memorize"]["memorization.json"], FAILING["memorize"]
    step = gate_status(0, "passed", None, "none")  # the claim says passed: no report
    assert step["status"] == "failed"
    assert (
        step["reason"]
        == "the target exited before a verdict: memorize's container exited 0 without "
        "memorization.json"
    )
    assert gate_status(0, "passed", failing, "failing")["status"] == "failed"
    step = gate_status(1, "passed", passing, "exit1")
    assert step["status"] == "failed"
    assert (
        step["reason"] == "memorize's container exited 1 although memorization.json says it passed"
    )
    assert gate_status(0, "passed", passing, "ok")["status"] == "passed"  # control


def test_the_host_holds_the_tests_claim_against_junit(tmp_path, monkeypatch) -> None:
    job = parts(tmp_path, ["--no-memorize", "--no-doctor", "--no-profile"], monkeypatch)
    plan = job.plan()
    art = tmp_path / "ws" / "dlci-artifacts"
    steps = [
        {"name": "install", "status": "passed"},
        {"name": "tests", "status": "passed", "exit_code": 0},
    ]
    (art / "run.json").write_text(json.dumps({"steps": steps}))
    job.collect(plan[0], 0)
    tests = job.finish(plan).run.step("tests")
    assert tests.status == "failed" and "without junit.xml" in tests.reason
    junit(art, 2)  # control: the same claim with a junit.xml that agrees
    (art / "run.json").write_text(json.dumps({"steps": steps}))
    job.collect(plan[0], 0)  # the host copies the tests' files when their container has gone
    assert job.finish(plan).run.step("tests").status == "passed"
    job.close()


@pytest.mark.parametrize(
    ("args", "allow"),
    [
        ([], False),
        (["--allow-no-tests"], True),
        (["--allow-no-tests", "--no-doctor"], True),
        (["--allow-no-tests=false"], False),
        (["--allow-no-tests=True"], True),
        (["--allow-no-tests", "false"], False),
        (["--allow-no-tests=maybe"], False),
    ],
)
def test_the_host_reads_allow_no_tests(tmp_path, monkeypatch, args: list, allow: bool) -> None:
    job = parts(tmp_path, args, monkeypatch)
    assert job.rules()["allow_no_tests"] is allow
    job.close()


def test_junit_is_read_as_a_stream_with_the_failed_cases_capped(tmp_path: Path) -> None:
    from dlci.action.host.testfiles import MAX_FAILED_CASES, junit_counts

    cases = "".join(
        f'<testcase classname="t" name="c{i}"><failure message="m{i}"/></testcase>'
        for i in range(MAX_FAILED_CASES + 50)
    )
    (tmp_path / "junit.xml").write_text(
        f'<testsuites><testsuite tests="{MAX_FAILED_CASES + 50}" failures="{MAX_FAILED_CASES + 50}"'
        f' errors="0" skipped="0">{cases}</testsuite>'
        '<testsuite tests="2" failures="0" errors="1" skipped="1"/></testsuites>'
    )
    counts = junit_counts(tmp_path / "junit.xml")
    assert counts is not None
    assert counts["tests"] == MAX_FAILED_CASES + 52 and counts["errors"] == 1
    assert counts["passed"] == 0 and len(counts["failed_cases"]) == MAX_FAILED_CASES
    assert counts["failed_cases"][0] == {"name": "t::c0", "file": "", "line": "", "message": "m0"}


# The host's file handling (issue 13's review): a container can leave links, FIFOs, devices,
# folders and sparse giants where the host reads and writes. Each test plays the container's
# part with the files it could leave, and its control shows what the old handling did.

CANARY = "host-secret-canary-8f2e"


def secret_file(tmp_path: Path) -> Path:
    """A host file the container must never get into the artifacts (~/.docker/config.json)."""
    secret = tmp_path / "host-home" / "config.json"
    secret.parent.mkdir(parents=True)
    secret.write_text(json.dumps({"auth": CANARY}))
    return secret


def plant_in_gate_out(out: Path, secret: Path) -> None:
    """What a gate's code can leave in /dlci/out: links to host files, a FIFO, a sparse giant,
    a name no gate writes."""
    import os

    (out / "leak").mkdir()
    (out / "leak" / "env").symlink_to("/proc/self/environ")
    (out / "memorization.json").symlink_to(secret)
    (out / "tensorboard" / "run").mkdir(parents=True)
    (out / "tensorboard" / "run" / "events.out.tfevents.1").write_bytes(b"ok")
    (out / "tensorboard" / "run" / "config.json").symlink_to(secret)
    (out / "tensorboard" / "home").symlink_to(secret.parent)
    os.mkfifo(out / "doctor.json")
    with (out / "trace.json.gz").open("wb") as giant:
        giant.truncate((1 << 30) + 1)  # sparse: costs no disk, a GiB to read
    (out / "evil.pth").write_text("import os; os.system('touch /tmp/pwned')\n")
    (out / "utilization.json").write_text('{"gpu_utilization_pct": null}')
    # the doctor's figures: a PNG one level down is kept; anything else under figures/ is not
    (out / "figures" / "deep").mkdir(parents=True)
    (out / "figures" / "lr-range.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (out / "figures" / "report.html").write_text("<script>alert(1)</script>")
    (out / "figures" / "deep" / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (out / "figures" / "link.png").symlink_to(secret)


def everything_under(*folders: Path) -> str:
    text = []
    for folder in folders:
        for path in folder.rglob("*") if folder.is_dir() else ():
            if path.is_file() and not path.is_symlink():
                text.append(path.read_bytes().decode(errors="replace"))
    return "\n".join(text)


def host_env() -> str:
    """A line of the host process's own /proc/self/environ (what a link to it would leak)."""
    return Path("/proc/self/environ").read_bytes().split(b"\0")[0].decode(errors="replace")


def test_the_host_copies_only_regular_files_of_the_gates_names(tmp_path, monkeypatch) -> None:
    secret = secret_file(tmp_path)
    job = parts(tmp_path, ["--no-doctor", "--no-memorize"], monkeypatch)
    plan = job.plan()
    (tmp_path / "ws" / "dlci-artifacts" / "run.json").write_text(json.dumps({"steps": []}))
    job.collect(plan[0], 0)
    assert plan[1].out is not None
    plant_in_gate_out(plan[1].out, secret)
    job.collect(plan[1], 0)  # finishes: the FIFO is never opened for a blocking read
    record = msgspec.to_builtins(job.finish(plan))
    art = tmp_path / "ws" / "dlci-artifacts"
    assert CANARY not in everything_under(job.reports, art)
    assert host_env() not in everything_under(job.reports, art)
    kept = sorted(p.relative_to(job.reports).as_posix() for p in job.reports.rglob("*"))
    assert kept == [
        "figures", "figures/lr-range.png", "run.json", "tensorboard", "tensorboard/run",
        "tensorboard/run/events.out.tfevents.1", "utilization.json",
    ]  # fmt: skip
    assert "figures/link.png: is a symbolic link" in "\n".join(record["refused"])
    assert not any(p.is_symlink() for p in [*job.reports.rglob("*"), *art.rglob("*")])
    refused = "\n".join(record["refused"])
    for name in ("leak", "evil.pth", "memorization.json", "doctor.json", "trace.json.gz"):
        assert f"profile: {name}" in refused
    assert "memorization.json: is a symbolic link" in refused
    assert "doctor.json: not a regular file (a FIFO)" in refused
    assert "trace.json.gz: 1 GiB, more than" in refused
    assert "tensorboard/run/config.json: is a symbolic link" in refused
    assert "tensorboard/home: is a symbolic link" in refused
    assert any("evil.pth" in p for p in record["refused"])
    assert not any("evil.pth" in p for p in record["problems"])  # an unknown name: a note
    assert any("memorization.json: is a symbolic link" in p for p in record["problems"])
    job.close()


def test_control_the_old_copies_follow_the_gates_links_into_the_host(tmp_path) -> None:
    """What Parts.collect and finish did before: copytree(symlinks=True), then (symlinks=False)."""
    import shutil

    out, kept, art = tmp_path / "out", tmp_path / "kept", tmp_path / "art"
    out.mkdir()
    (out / "leak").mkdir()
    (out / "leak" / "env").symlink_to("/proc/self/environ")
    (out / "leak" / "docker.json").symlink_to(secret_file(tmp_path))
    shutil.copytree(out, kept, symlinks=True)
    shutil.copytree(kept / "leak", art / "leak", symlinks=False)
    assert host_env() in (art / "leak" / "env").read_bytes().decode(errors="replace")
    assert CANARY in (art / "leak" / "docker.json").read_text()


def swap_artifacts_for_a_link(ws: Path, victim: Path) -> None:
    """What a gate's install step can do: /workspace/dlci-artifacts -> a host folder (its path
    is in /proc/self/mountinfo), e.g. the host venv's site-packages."""
    import shutil

    shutil.rmtree(ws / "dlci-artifacts")
    (ws / "dlci-artifacts").symlink_to(victim)


def test_the_host_never_writes_through_a_swapped_artifacts_folder(tmp_path, monkeypatch) -> None:
    victim = tmp_path / "host-venv" / "site-packages"
    victim.mkdir(parents=True)
    job = parts(tmp_path, ["--no-doctor", "--no-profile"], monkeypatch)
    plan = job.plan()
    ws = tmp_path / "ws"
    steps = [{"name": "install", "status": "passed"}, {"name": "tests", "status": "passed"}]
    (ws / "dlci-artifacts" / "run.json").write_text(json.dumps({"steps": steps}))
    job.collect(plan[0], 0)
    assert plan[1].out is not None
    (plan[1].out / "memorization.json").write_text('{"verdict": "pass"}')
    (plan[1].out / "evil.pth").write_text("import os\n")
    swap_artifacts_for_a_link(ws, victim)
    job.collect(plan[1], 0)
    record = msgspec.to_builtins(job.finish(plan))
    assert list(victim.iterdir()) == []  # nothing written through the link
    assert (ws / "dlci-artifacts").is_symlink()
    assert any("is a symbolic link" in p for p in record["problems"])
    assert (job.reports / "memorization.json").is_file()  # the host's own folder has them
    # the summary fails the job, and its upload folder is the host's, not the link
    from dlci.action.host.summary import summarize

    summary = summarize(ws / "dlci-artifacts", host_record=tmp_path / "record.json")
    assert summary.verdict == "fail"
    assert any("symbolic link" in a[1] for a in summary.annotations)
    upload = Path(summary.outputs["artifacts-dir"])
    assert upload.parent.parent == tmp_path and not upload.is_symlink()
    assert "evil.pth" not in [p.name for p in upload.rglob("*")]
    job.close()


def test_control_writing_into_the_swapped_folder_lands_in_the_host(tmp_path) -> None:
    """The old finish: mkdir(exist_ok) and copyfile into the artifacts path follow the link."""
    import shutil

    victim = tmp_path / "site-packages"
    victim.mkdir()
    ws = tmp_path / "ws"
    (ws / "dlci-artifacts").mkdir(parents=True)
    swap_artifacts_for_a_link(ws, victim)
    (ws / "dlci-artifacts").mkdir(parents=True, exist_ok=True)
    (tmp_path / "evil.pth").write_text("import os\n")
    shutil.copyfile(tmp_path / "evil.pth", ws / "dlci-artifacts" / "evil.pth")
    assert (victim / "evil.pth").read_text() == "import os\n"


def test_the_upload_folder_holds_only_regular_files_the_host_wrote(tmp_path, monkeypatch) -> None:
    """dlci-artifacts committed as a link (or holding links): upload-artifact would follow them;
    the action uploads the summary's own folder instead."""
    import os

    from dlci.action.host.summary import summarize

    secret = secret_file(tmp_path)
    ws = tmp_path / "ws"
    (ws / "dlci-artifacts").mkdir(parents=True)
    art = ws / "dlci-artifacts"
    (art / "preflight.json").write_text(json.dumps({"passed": True, "tier": {"budget": "pr"}}))
    (art / "cleanup.json").symlink_to(secret)
    (art / "junit.xml").symlink_to(secret)
    (art / "docker").symlink_to(secret.parent)
    os.mkfifo(art / "run.json")
    record = tmp_path / "temp" / "record.json"
    record.parent.mkdir()
    summary = summarize(art, host_record=record, artifact_prefix="dlci")
    upload = Path(summary.outputs["artifacts-dir"])
    assert upload.name == "dlci-artifacts" and upload.parent.parent == record.parent
    # the host's own files only: the copied report, and the job's page it rendered from them
    assert sorted(p.name for p in upload.iterdir()) == ["preflight.json", "report.html"]
    assert CANARY not in everything_under(upload)
    assert summary.verdict == "fail"
    said = " ".join(a[1] for a in summary.annotations)
    assert "cleanup.json: is a symbolic link" in said and "run.json: not a regular file" in said
    # control: the workspace's folder, which the upload step took before, reaches the secret
    assert CANARY in (art / "docker" / "config.json").read_text()


@pytest.mark.parametrize("name", ["run.json", "preflight.json", "cleanup.json"])
def test_a_fifo_at_a_file_the_host_reads_does_not_hang_it(tmp_path, monkeypatch, name) -> None:
    import os
    import threading

    from dlci.action.host.summary import summarize

    job = parts(tmp_path, ["--no-memorize", "--no-doctor", "--no-profile"], monkeypatch)
    art = tmp_path / "ws" / "dlci-artifacts"
    os.mkfifo(art / name)
    done: list[object] = []

    def host() -> None:
        plan = job.plan()
        job.collect(plan[0], 0)
        job.finish(plan)
        done.append(summarize(art, host_record=tmp_path / "record.json"))

    thread = threading.Thread(target=host, daemon=True)
    thread.start()
    thread.join(30)
    assert done, "the host blocked on the FIFO"
    job.close()


def test_control_a_plain_read_of_the_fifo_blocks(tmp_path) -> None:
    import os
    import threading

    fifo = tmp_path / "run.json"
    os.mkfifo(fifo)
    thread = threading.Thread(target=fifo.read_bytes, daemon=True)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive()  # blocked, waiting for a writer
    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # release it
    thread.join(5)


def test_a_folder_planted_at_a_report_name_does_not_crash_finish(tmp_path, monkeypatch) -> None:
    job = parts(tmp_path, ["--no-doctor", "--no-profile"], monkeypatch)
    plan = job.plan()
    art = tmp_path / "ws" / "dlci-artifacts"
    (art / "junit.xml").mkdir()
    (art / "memorization.json").mkdir()
    (art / "memorization.json" / "x").write_text("x")
    job.collect(plan[0], 0)
    assert plan[1].out is not None
    (plan[1].out / "memorization.json").write_text('{"verdict": "fail"}')
    job.collect(plan[1], 1)
    record = msgspec.to_builtins(job.finish(plan))
    assert any("memorization.json" in p for p in record["problems"])
    assert (job.reports / "memorization.json").read_text() == '{"verdict": "fail"}'
    job.close()


def test_git_is_mounted_read_only_under_the_covers_and_a_moved_one_stops_the_job(
    tmp_path: Path,
) -> None:
    """`mv /workspace/.git /workspace/.gitx` in one container, and the next one's cover over
    .git/config would land on a new empty path: .git is a read-only mount of its own, and the
    host checks the covered files before each container (the e2e test moves it for real)."""
    import os

    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / ".git" / "config").write_text("[core]\n")
    cover = tmp_path / "cover"
    cover.write_text("")
    cmd = container.run_command(
        image="img", name="n", job="j", workspace=ws, workdir=".", gpus="none", shm_size="",
        env_names=(), environ={}, inner=["true"], uid=1, gid=1,
        hidden_files=[(cover, ".git/config")],
    )  # fmt: skip
    mounts = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "-v"]
    assert mounts[:3] == [
        f"{ws.resolve()}:/workspace",
        f"{ws.resolve() / '.git'}:/workspace/.git:ro",
        f"{cover}:/workspace/.git/config:ro",
    ]
    pins = {".git/config": container._identity(ws / ".git" / "config")}
    container.check_hidden(ws, pins)  # unchanged: the next container may run
    os.rename(ws / ".git", ws / ".gitx")  # what the mount stops in the container
    with pytest.raises(DlciError, match="moved or replaced"):
        container.check_hidden(ws, pins)
    (ws / ".git").mkdir()
    (ws / ".git" / "config").write_text("")  # an empty stand-in: another inode
    with pytest.raises(DlciError, match="moved or replaced"):
        container.check_hidden(ws, pins)


def test_a_container_record_of_the_wrong_types_is_an_error_named_never_a_crash(
    tmp_path, monkeypatch
) -> None:
    """Each container's run.json is its claim, read into its classes (report/fields.py): a
    step that is no object (which crashed the host) or a field of a wrong type makes that
    part's step an error that names the field; the control, the same record well typed."""
    job = parts(tmp_path, ["--no-doctor", "--no-profile"], monkeypatch)
    plan = job.plan()
    art = tmp_path / "ws" / "dlci-artifacts"
    (art / "run.json").write_text(json.dumps({"steps": [7, {"name": "tests"}]}))
    job.collect(plan[0], 0)
    assert plan[1].out is not None
    steps = [{"name": "install", "status": "passed"}, {"name": "memorize", "status": 0}]
    (plan[1].out / "run.json").write_text(json.dumps({"steps": steps}))
    write_reports(plan[1].out, "memorize")
    job.collect(plan[1], 0)
    run = job.finish(plan).run
    tests, memorize = run.step("tests"), run.step("memorize")
    assert tests.status == "error" and tests.reason == (
        "its container's record cannot be read (exit code 0): run.json: steps[0] is a number, "
        "expected an object"
    )
    assert memorize.status == "error" and memorize.reason.endswith(
        "run.json: steps[1].status is a number, expected text"
    )
    assert not job.installed()  # the tests container's install step is unread: not installed
    steps[1]["status"] = "passed"  # control: the gate's record well typed passes
    (plan[1].out / "run.json").write_text(json.dumps({"steps": steps}))
    job.collect(plan[1], 0)
    assert job.finish(plan).run.step("memorize").status == "passed"
    job.close()
