"""The host side of the gates' isolation (dlci.action.gates) and of the workflow-command stop
around the container's output (dlci.action.container._watch), without Docker: the container
is stood in for by a local process. tests/e2e/test_trust_gates.py attacks the real thing."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import pytest

from dlci.action import container
from dlci.action.gates import HOST_MOUNT, OUT_MOUNT, Parts
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
    code, tail = container._watch(cmd, "unused", 1.0)
    assert code == exit_code
    token, lines = markers(capsys.readouterr().out)
    assert lines[1:] == ["::error::pwned", "::add-mask::x", f"::{token}::"]
    assert tail == ["::error::pwned\n", "::add-mask::x\n"]


def test_each_run_has_a_new_token(capsys) -> None:
    for _ in range(2):
        container._watch([sys.executable, "-c", "pass"], "unused", 1.0)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[0].split("::")[2] != lines[2].split("::")[2]


def test_commands_resume_after_a_timeout(capsys, monkeypatch) -> None:
    monkeypatch.setattr(container, "_kill", lambda name: None)  # no docker here: it ends itself
    cmd = [sys.executable, "-c", f"import time; {PRINTS}; time.sleep(2)"]
    with pytest.raises(DlciError, match="ran past timeout-minutes"):
        container._watch(cmd, "unused", 0.005)
    token, lines = markers(capsys.readouterr().out)
    assert lines[-1] == f"::{token}::" and "::error::pwned" in lines


def test_control_without_the_host_the_lines_are_commands(capfd) -> None:
    import subprocess

    subprocess.run([sys.executable, "-c", PRINTS], check=True)
    assert capfd.readouterr().out.splitlines()[0] == "::error::pwned"  # a command, unwrapped


def parts(tmp_path: Path, inner: list[str], monkeypatch) -> Parts:
    monkeypatch.setenv("RUNNER_TEMP", str(tmp_path))
    ws = tmp_path / "ws"
    (ws / "dlci-artifacts").mkdir(parents=True, exist_ok=True)
    return Parts(inner, ws, ".", str(tmp_path / "record.json"))


def host_tier(tmp_path: Path) -> Path:
    from dlci.ladder.tiers import choose_tier

    path = tmp_path / "preflight.json"
    tier = choose_tier(budget="pr", hardware="cpu").to_dict()
    path.write_text(json.dumps({"passed": True, "tier": tier}))
    return path


def test_the_plan_mounts_the_tier_read_only_and_one_out_per_gate(tmp_path, monkeypatch) -> None:
    inner = ["--out", "/workspace/dlci-artifacts", "--tier-json", str(host_tier(tmp_path))]
    plan = parts(tmp_path, [*inner, "--no-doctor", "--phase", "all"], monkeypatch).plan()
    assert [p.name for p in plan] == ["tests", "memorize", "profile"]
    tests, memorize = plan[0], plan[1]
    assert tests.argv == [
        "--no-doctor", "--out", "/workspace/dlci-artifacts",
        "--tier-json", f"{HOST_MOUNT}/tier.json", "--phase", "tests",
    ]  # fmt: skip
    assert tests.flags[-1].endswith(f":{HOST_MOUNT}:ro") and OUT_MOUNT not in " ".join(tests.flags)
    assert memorize.flags[-1] == f"{memorize.out}:{OUT_MOUNT}"
    assert memorize.argv[-2:] == ["--phase", "memorize"] and "--out" in memorize.argv
    assert memorize.argv[memorize.argv.index("--out") + 1] == OUT_MOUNT
    assert str(tmp_path / "ws") not in str(memorize.out)  # outside the workspace


def test_finish_replaces_planted_reports_and_records_what_it_copied(tmp_path, monkeypatch) -> None:
    job = parts(tmp_path, ["--tier-json", str(host_tier(tmp_path)), "--no-doctor"], monkeypatch)
    plan = job.plan()
    art = tmp_path / "ws" / "dlci-artifacts"
    steps = [{"name": "install", "status": "passed"}, {"name": "tests", "status": "passed"}]
    (art / "run.json").write_text(json.dumps({"steps": steps}))
    (art / "memorization.json").write_text('{"verdict": "pass"}')  # planted by the tests
    (art / "utilization.json").write_text('{"planted": true}')
    job.collect(plan[0], 0)
    assert plan[1].out is not None
    (plan[1].out / "memorization.json").write_text('{"verdict": "fail"}')
    gate_steps = [{"name": "install", "status": "passed"}, {"name": "memorize", "status": "failed"}]
    (plan[1].out / "run.json").write_text(json.dumps({"steps": gate_steps}))
    job.collect(plan[1], 1)
    (plan[1].out / "memorization.json").write_text('{"verdict": "pass"}')  # too late: copied
    record = job.finish(plan)  # the profile gate never ran (stopped)
    assert json.loads((art / "memorization.json").read_text()) == {"verdict": "fail"}
    assert not (art / "utilization.json").exists()
    digest = hashlib.sha256(b'{"verdict": "fail"}').hexdigest()
    assert record["reports"] == {"memorization.json": {"part": "memorize", "sha256": digest}}
    assert record["tier"]["max_loss"] == 1.0 and record["exit_codes"] == {"tests": 0, "memorize": 1}
    run = json.loads((art / "run.json").read_text())
    status = {s["name"]: s["status"] for s in run["steps"]}
    assert status == {
        "install": "passed", "tests": "passed", "memorize": "failed", "doctor": "skipped",
        "profile": "skipped",
    }  # fmt: skip
    assert run["failed_steps"] == ["memorize"] and run["verdict"] == "fail"
    assert json.loads((tmp_path / "record.json").read_text())["run"] == run
    job.close()


def test_a_gate_whose_install_failed_is_an_error(tmp_path, monkeypatch) -> None:
    job = parts(tmp_path, ["--no-doctor", "--no-profile"], monkeypatch)
    plan = job.plan()
    job.collect(plan[0], 0)
    assert plan[1].out is not None
    steps = [{"name": "install", "status": "error"}, {"name": "memorize", "status": "skipped"}]
    (plan[1].out / "run.json").write_text(json.dumps({"steps": steps}))
    job.collect(plan[1], 1)
    memorize = next(s for s in job.finish(plan)["run"]["steps"] if s["name"] == "memorize")
    assert memorize["status"] == "error" and "install step failed" in memorize["reason"]
