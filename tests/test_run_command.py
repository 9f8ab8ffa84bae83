"""``dlci run``: the job's steps in order, each its own process, a record after each step.

Runs real pytest, real coverage and the real memorization test on a tiny project made in a
temporary folder (the digits example's full run is in tests/e2e/).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dlci.cli import main

PROJECT = {
    "pyproject.toml": """
        [tool.dlci]
        target = "tinyproj.target:make_target"
        """,
    "tinyproj/__init__.py": "",
    "tinyproj/maths.py": '''
        def double(x):
            """
            >>> double(2)
            4
            """
            return 2 * x
        ''',
    "tinyproj/target.py": """
        import torch
        import dlci

        def make_target():
            g = torch.Generator().manual_seed(0)
            x, y = torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
            model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
            return dlci.Target(model, lambda p: torch.optim.Adam(p, lr=1e-2), loader,
                               loss_fn=torch.nn.CrossEntropyLoss())
        """,
    "tests/test_maths.py": """
        from tinyproj.maths import double

        def test_double():
            assert double(3) == 6
        """,
}


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    root = tmp_path / "proj"
    for name, text in PROJECT.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    monkeypatch.chdir(root)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    return root


def run_json(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())


def statuses(out: Path) -> dict[str, str]:
    return {s["name"]: s["status"] for s in run_json(out)["steps"]}


BASE = [
    "run",
    "--install",
    "none",
    "--no-doctor",
    "--no-profile",
    "--budget",
    "pr",
    "--hardware",
    "cpu",
]


def test_a_passing_run(project: Path, capsys) -> None:
    out = project / "dlci-artifacts"
    assert main([*BASE, "--out", str(out)]) == 0
    assert statuses(out) == {
        "install": "skipped",
        "tests": "passed",
        "memorize": "passed",
        "doctor": "skipped",
        "profile": "skipped",
    }
    assert run_json(out)["verdict"] == "pass"
    junit = (out / "junit.xml").read_text()
    assert 'tests="2"' in junit  # the test and the doctest
    coverage = (out / "coverage.xml").read_text()
    assert "<source>.</source>" in coverage  # relative, not the container's absolute path
    assert str(project) not in coverage
    assert json.loads((out / "memorization.json").read_text())["verdict"] == "pass"
    assert "dlci run: all steps passed" in capsys.readouterr().out


def test_a_failing_test_fails_the_run_and_the_rest_still_runs(project: Path) -> None:
    (project / "tests" / "test_bad.py").write_text("def test_bad():\n    assert 1 == 2\n")
    out = project / "dlci-artifacts"
    assert main([*BASE, "--out", str(out)]) == 1
    assert statuses(out)["tests"] == "failed"
    assert statuses(out)["memorize"] == "passed"
    record = run_json(out)
    assert record["verdict"] == "fail" and record["failed_steps"] == ["tests"]
    tests = next(s for s in record["steps"] if s["name"] == "tests")
    assert any("1 failed" in line for line in tests["log_tail"])


def test_doctests_come_from_the_package_not_a_training_script_at_the_root(project: Path) -> None:
    """A train.py at the root that exits when imported (it parses sys.argv, downloads data)
    is not imported for doctests; the package's doctest still runs. Control: pytest's own
    collection, the old default (--doctest-modules, now through pytest-args), imports it and
    the tests step fails on it."""
    (project / "train.py").write_text('"""\n>>> 1\n1\n"""\nimport sys\n\nsys.exit(2)\n')
    out = project / "dlci-artifacts"
    args = [*BASE, "--no-memorize", "--no-coverage", "--out", str(out)]
    assert main(args) == 0
    junit = (out / "junit.xml").read_text()
    assert 'tests="2"' in junit and 'name="tinyproj.maths.double"' in junit
    assert "train" not in junit
    tests = next(s for s in run_json(out)["steps"] if s["name"] == "tests")
    assert any("dl-ci doctests: the modules of tinyproj" in line for line in tests["log_tail"])

    assert main([*args, "--pytest-args=--doctest-modules"]) == 1
    tests = next(s for s in run_json(out)["steps"] if s["name"] == "tests")
    assert tests["status"] == "failed"
    assert any("train.py" in line for line in tests["log_tail"]), tests["log_tail"]
    assert any("SystemExit: 2" in line for line in tests["log_tail"]), tests["log_tail"]


def test_a_failed_install_blocks_the_steps_that_need_it(project: Path) -> None:
    out = project / "dlci-artifacts"
    args = [a if a != "none" else "exit 3" for a in BASE]
    assert main([*args, "--out", str(out)]) == 1
    record = run_json(out)
    assert statuses(out)["install"] == "error"
    assert statuses(out)["tests"] == "skipped"
    tests = next(s for s in record["steps"] if s["name"] == "tests")
    assert tests["reason"] == "not run: the install step failed"


@pytest.mark.parametrize("asked", ["3", "auto"])
def test_each_step_gets_the_cpu_threads_and_the_record_says_why(
    project: Path, monkeypatch: pytest.MonkeyPatch, asked: str
) -> None:
    """The install alone (--phase install) as the probe: its shell command writes what its
    process was given. auto on this machine: no quota, every CPU, so nothing is set."""
    from dlci.action.job import threads

    for name in threads.VARIABLES:  # the suite's own settings are not the container's
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "quota_cpus", lambda: None)
    monkeypatch.setattr(threads, "affinity_cpus", lambda: 8)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 8)
    out = project / "dlci-artifacts"
    probe = 'echo "${OMP_NUM_THREADS:-unset} ${MKL_NUM_THREADS:-unset}" > seen.txt'
    argv = ["run", "--install", probe, "--phase", "install", "--cpu-threads", asked]
    assert main([*argv, "--out", str(out)]) == 0
    seen = (project / "seen.txt").read_text().split()
    record = run_json(out)["threads"]
    if asked == "3":
        assert seen == ["3", "3"] and record == {"value": 3, "source": "the input cpu-threads: 3"}
    else:  # control: no limit, so torch's own default stands and the record says so
        assert seen == ["unset", "unset"] and record["value"] is None
    assert main([*argv[:-1], "lots", "--out", str(out)]) == 2  # a bad value: a usage error


def test_the_quota_and_the_affinity_decide_the_threads(tmp_path: Path) -> None:
    from dlci.action.job.threads import decide, quota_cpus

    v1 = tmp_path / "cpu"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("150000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert quota_cpus(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")  # v2 first: no quota
    assert quota_cpus(tmp_path) is None
    env, record = decide("auto", {}, quota=1.5, affinity=16, machine=64)
    assert env["OMP_NUM_THREADS"] == "2" and "quota: 1.5" in record["source"]
    env, record = decide("auto", {}, quota=None, affinity=4, machine=64)  # --cpuset-cpus
    assert env["MKL_NUM_THREADS"] == "4" and "4 of 64" in record["source"]


def test_the_auto_install_command(project: Path) -> None:
    from dlci.action.job.run import install_command

    cmd = install_command("auto")
    assert cmd[-2:] == ["-e", "."] and "--no-build-isolation" in cmd
    (project / "requirements.txt").write_text("")
    assert install_command("auto")[-4:] == ["-r", "requirements.txt", "-e", "."]
    assert install_command("none") is None
    assert install_command("make deps") == "make deps"


def test_a_stopped_job_records_the_interrupted_step(project: Path) -> None:
    """SIGTERM (docker stop, a cancelled job) mid-step: the step is interrupted, the rest skipped."""
    import signal
    import subprocess
    import sys
    import time

    (project / "tests" / "test_slow.py").write_text(
        "import time\n\ndef test_slow():\n    time.sleep(60)\n"
    )
    out = project / "dlci-artifacts"
    child = subprocess.Popen(
        [sys.executable, "-m", "dlci", *BASE, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (out / "run.json").exists() and statuses(out).get("tests") == "running":
            break
        time.sleep(0.2)
    time.sleep(1.0)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=60) == 1
    record = run_json(out)
    assert statuses(out)["tests"] == "interrupted"
    assert statuses(out)["memorize"] == "skipped"
    assert record["verdict"] == "fail"
    memorize = next(s for s in record["steps"] if s["name"] == "memorize")
    assert memorize["reason"] == "not run: the job was stopped"


def test_the_time_cap_stops_memorization_and_keeps_the_partial_report(
    project: Path, tmp_path: Path
) -> None:
    """A tier whose time cap runs out: the step fails with the best loss and the cap, and the
    curve and report of the steps that ran are kept. The tier comes in as the host's record."""
    tier = {
        "budget": "pr", "hardware_class": "cpu", "max_epochs": 10**6, "max_loss": 1e-9,
        "time_cap_minutes": 0.02, "profile_steps": 2, "nproc": 1, "batch_size": 16,
        "ladder": "test", "ladder_version": 1, "ladder_revision": "t", "row": "budgets.pr.cpu",
    }  # fmt: skip
    record = tmp_path / "preflight.json"
    record.write_text(
        json.dumps({"kind": "preflight", "passed": True, "plan_version": 1, "tier": tier})
    )
    out = project / "dlci-artifacts"
    assert main([*BASE, "--out", str(out), "--plan", str(record)]) == 1
    assert statuses(out)["memorize"] == "failed"
    report = json.loads((out / "memorization.json").read_text())
    assert report["stopped_by"] == "time"
    assert report["reason"].startswith("time cap of 0.02 min reached at step")
    assert " at step 1 to at best " in report["reason"] and "loss < 1e-09" in report["reason"]
    assert report["steps"] > 1 and len(report["losses"]) == report["steps"]
    assert (out / "memorization-curve.png").stat().st_size > 0
    (out / "preflight.json").write_text(record.read_text())
    md = tmp_path / "summary.md"
    assert main(["summary", "--artifacts", str(out), "--markdown", str(md)]) == 1
    assert "- step memorize failed" in md.read_text()
    assert "time cap of 0.02 min reached" in md.read_text()


NO_GATES = [*BASE, "--no-memorize", "--no-doctest", "--no-coverage"]


def step_of_tests(out: Path) -> dict:
    return next(s for s in run_json(out)["steps"] if s["name"] == "tests")


def test_no_tests_collected_is_a_failure(project: Path, capsys) -> None:
    """pytest's exit code 5: a -k that deselects every test is not a pass."""
    out = project / "dlci-artifacts"
    assert main([*NO_GATES, "--out", str(out), "--pytest-args", "-k no_such_test"]) == 1
    step = step_of_tests(out)
    assert step["status"] == "failed" and step["exit_code"] == 5
    assert step["reason"].startswith("no tests were collected: pytest exited 5")
    assert "dlci run: tests: no tests were collected" in capsys.readouterr().out
    # a tests path without tests, too
    (project / "empty").mkdir()
    assert main([*NO_GATES, "--out", str(out), "--tests", "empty"]) == 1
    assert step_of_tests(out)["status"] == "failed"


def test_control_a_k_that_selects_a_test_passes(project: Path) -> None:
    out = project / "dlci-artifacts"
    assert main([*NO_GATES, "--out", str(out), "--pytest-args", "-k double"]) == 0
    assert step_of_tests(out)["status"] == "passed"


@pytest.mark.parametrize("flag", ["--allow-no-tests", "--allow-no-tests=true"])
def test_allow_no_tests_passes_when_none_are_collected(project: Path, flag: str) -> None:
    out = project / "dlci-artifacts"
    argv = [*NO_GATES, "--out", str(out), "--pytest-args", "-k no_such_test", flag]
    assert main(argv) == 0
    step = step_of_tests(out)
    assert (
        step["status"] == "passed" and step["reason"] == "no tests were collected (allow-no-tests)"
    )


def test_allow_no_tests_false_and_a_bad_value(project: Path, capsys) -> None:
    out = project / "dlci-artifacts"
    argv = [*NO_GATES, "--out", str(out), "--pytest-args", "-k no_such_test"]
    assert main([*argv, "--allow-no-tests=false"]) == 1
    assert main([*argv, "--allow-no-tests=maybe"]) == 2
    assert "expected true or false, got 'maybe'" in capsys.readouterr().err


def test_a_target_that_exits_0_fails_the_memorize_step(project: Path) -> None:
    """os._exit(0) in the target's factory: exit 0, a partial report, a failed step."""
    (project / "tinyproj" / "quits.py").write_text(
        "import os\n\ndef make_target():\n    os._exit(0)\n"
    )
    out = project / "dlci-artifacts"
    argv = [*BASE, "--out", str(out), "--no-doctest", "--no-coverage"]
    assert main([*argv, "--target", "tinyproj.quits:make_target"]) == 1
    memorize = next(s for s in run_json(out)["steps"] if s["name"] == "memorize")
    assert memorize["exit_code"] == 0 and memorize["status"] == "failed"
    assert memorize["reason"].startswith(
        "the target exited before a verdict: memorize exited 0 with a partial memorization.json"
    )


def test_the_run_records_where_the_images_torch_came_from(tmp_path: Path) -> None:
    from dlci.action.job.run import image_torch

    record = tmp_path / "torch.json"
    record.write_text('{"torch": "2.13.0+cpu", "cuda": null, "source": "base", "file": "/x"}')
    assert image_torch(str(record)) == {
        "torch": "2.13.0+cpu", "cuda": None, "source": "base", "file": "/x"
    }  # fmt: skip
    assert image_torch(str(tmp_path / "missing.json")) is None  # outside dl-ci's image
    os.mkfifo(tmp_path / "fifo")
    assert image_torch(str(tmp_path / "fifo")) is None  # never blocks on what it reads


def test_the_plan_reaches_the_tests_where_the_project_turns_plugin_autoloading_off(
    project: Path, tmp_path: Path, monkeypatch
) -> None:
    """``dlci run`` loads the plugin by name (``-p dlci``) with ``--dlci-plan``: a project
    that sets PYTEST_DISABLE_PLUGIN_AUTOLOAD still gets the plan's tier in ``dlci_tier``, and
    one that turns the plugin off (``-p no:dlci``) gets no option it cannot parse."""
    tier = {"budget": "pr", "hardware_class": "cpu", "max_epochs": 7, "max_loss": 0.5,
            "time_cap_minutes": 1, "profile_steps": 2, "nproc": 1, "batch_size": 16,
            "ladder": "test", "ladder_version": 1, "ladder_revision": "t", "row": "budgets.pr.cpu",
            }  # fmt: skip
    plan = tmp_path / "preflight.json"
    plan.write_text(
        json.dumps({"kind": "preflight", "passed": True, "plan_version": 1, "tier": tier})
    )
    (project / "tests" / "test_tier.py").write_text(
        "def test_tier(dlci_tier):\n    assert dlci_tier.max_epochs == 7\n"
    )
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    out = project / "dlci-artifacts"
    assert main([*NO_GATES, "--out", str(out), "--plan", str(plan)]) == 0
    assert step_of_tests(out)["status"] == "passed"
    (project / "tests" / "test_tier.py").unlink()
    argv = [*NO_GATES, "--out", str(out), "--plan", str(plan), "--pytest-args", "-p no:dlci"]
    assert main(argv) == 0
    # control: the option alone, with autoloading off, is a usage error (pytest's exit 4)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--dlci-plan={plan}", "tests"],
        capture_output=True, text=True, cwd=project,
    )  # fmt: skip
    assert done.returncode == 4, done.stdout + done.stderr


TRAIN = """
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=500)
args = parser.parse_args()
g = torch.Generator().manual_seed(0)
x, y = torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(args.epochs):
    for xb, yb in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
"""


def test_a_training_command_as_the_target_runs_the_gates_in_script_mode(project: Path) -> None:
    """``target: python train.py --epochs 500`` (the action's input, or the configuration's
    key): each gate gets the command after ``--``, as ``dlci memorize -- python ...`` runs it;
    a ``module:function`` stays a Target."""
    from dlci.action.job.options import JobOptions
    from dlci.action.job.run import _dlci_steps

    (project / "train.py").write_text(TRAIN)
    command = "python train.py --epochs 500"
    out = project / "dlci-artifacts"
    argv = [*BASE, "--no-doctest", "--no-coverage", "--out", str(out), "--target", command]
    assert main(argv) == 0
    assert statuses(out)["memorize"] == "passed"
    report = json.loads((out / "memorization.json").read_text())
    assert report["verdict"] == "pass" and report["config"]["target"] == command
    steps = _dlci_steps(JobOptions(out=out, target=command))
    for name in ("memorize", "doctor", "profile"):
        assert steps[name][-5:] == ["--", "python", "train.py", "--epochs", "500"], name
        assert "--target" not in steps[name]
    # control: a Target's spec is passed as --target, with nothing after --
    steps = _dlci_steps(JobOptions(out=out, target="tinyproj.target:make_target"))
    assert "--" not in steps["memorize"] and "--target" in steps["memorize"]
