"""scripts/gpu_acceptance.sh on this machine: the smoke test that keeps the GPU script alive.

The script is meant for a machine with a GPU (docs/gpu.md); here it runs its CPU path with the
interpreter running these tests (``--no-install``) and tiny step counts (``--quick``), and
must say that it found no GPU, in its output and in acceptance.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_acceptance.sh"
STEPS = [
    "hardware",
    "memorize",
    "doctor",
    "profile:digits",
    "memory:digits",
    *(
        f"{kind}:{loop}"
        for loop in ("healthy", "slow_loader", "item_every_step")
        for kind in ("profile", "analyze")
    ),
]


def run_script(out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(
        ["bash", str(SCRIPT), "--no-install", "--quick", "--out", str(out)],
        env={**os.environ, "PATH": path, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_cpu_path_runs_every_step_and_says_no_gpu(tmp_path: Path) -> None:
    gpu = torch.cuda.is_available()
    done = run_script(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    report = json.loads((tmp_path / "acceptance.json").read_text())
    assert report["gpu"] is gpu
    if not gpu:
        assert "no GPU found: running the CPU path" in first
        assert (
            done.stdout.rstrip().splitlines()[-2]
            == "gpu_acceptance: no GPU found: ran the CPU path"
        )
        assert report["message"] == "no GPU found: ran the CPU path"
        assert report["hardware_class"] == "cpu"
    assert report["kind"] == "gpu-acceptance" and report["quick"] is True
    assert report["passed"] is True
    assert report["torch_version"] == torch.__version__
    assert [s["name"] for s in report["steps"]] == STEPS
    for step in report["steps"]:
        assert step["ok"] and not step["timed_out"], step
        assert 0 < step["seconds"] <= step["budget_seconds"]
    # the step budgets and the install's 80 s fit in the 8 minutes
    assert report["step_budgets_seconds"] + 80 <= report["budget_seconds"] == 480
    # the memory figures of the digits profile, and the real run at the estimated batch
    memory = report["steps"][3]["figures"]["memory"]
    assert memory["peak_allocated_bytes"] > 0 and memory["estimate_batch_size"] == 64
    assert memory["device"] == ("cuda:0" if gpu else "cpu")
    batch = report["steps"][4]["figures"]
    assert batch["kind"] == "batch-check" and batch["ran"] and batch["fits"]
    if not gpu:  # the CPU path checks at 16 x the batch, not at the (huge) estimate
        assert batch["size"] == 1024 and batch["capped"] is True
        assert abs(batch["error"]) < 0.10  # the tolerance of test_profile_memory.py
    memorize = report["steps"][1]["figures"]
    assert memorize["verdict"] == "pass"
    assert memorize["relative_loss"] <= memorize["relative_threshold"]
    assert report["steps"][2]["figures"]["counts"]["fail"] == 0
    for name, loop in report["loops"].items():
        trace = tmp_path / loop["trace"]
        assert trace.name == "trace.json.gz" and trace.read_bytes()[:2] == b"\x1f\x8b", name
        assert loop["steps"] == 2 and loop["gate_minimum"] == 50
        if not gpu:  # no GPU work in a CPU trace: the gate cannot pass
            assert loop["gate_passed"] is False and loop["gpu_utilization_pct"] is None
    # on the CPU the slow loader's time goes to data loading, as the recommendation says
    slow = report["loops"]["slow_loader"]
    assert "data-loading" in slow["recommendations"]
    assert slow["data_loading_pct"] > report["loops"]["healthy"]["data_loading_pct"]
    assert {c["name"] for c in report["checks"] if c["ok"]} == {c["name"] for c in report["checks"]}


def test_a_step_over_its_budget_fails_the_run_and_is_recorded(tmp_path: Path) -> None:
    """The control: with every budget cut to 1 s (no step can import torch that fast)."""
    done = run_script(tmp_path, DLCI_ACCEPTANCE_MAX_STEP_S="1")
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads((tmp_path / "acceptance.json").read_text())
    assert report["passed"] is False
    assert [s["name"] for s in report["steps"]] == STEPS
    assert all(s["budget_seconds"] == 1 for s in report["steps"])
    timed_out = [s["name"] for s in report["steps"] if s["timed_out"]]
    assert "memorize" in timed_out and "doctor" in timed_out
    assert report["steps"][1]["figures"] == {}  # no report was written
    assert "BAD check: memorization passed" in done.stdout


@pytest.mark.parametrize(("args", "code"), [(["--help"], 0), (["--frobnicate"], 2)])
def test_usage(args: list[str], code: int) -> None:
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == code
    if code == 0:
        assert "--prepare DIR" in done.stdout and "--no-install" in done.stdout
    else:
        assert "unknown argument: --frobnicate" in done.stderr


def test_the_batch_check_without_an_estimate_says_so(tmp_path: Path) -> None:
    """The control of the memory:digits step: a report without a batch estimate fails it."""
    report = tmp_path / "utilization.json"
    report.write_text(json.dumps({"memory": {"batch_estimate": None}}))
    script = ROOT / "scripts" / "gpu_acceptance.py"
    done = subprocess.run(
        [sys.executable, str(script), "--check-batch", str(report), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "examples" / "digits")},
    )
    assert done.returncode == 1, done.stderr
    assert "did not run: no estimate in the report" in done.stdout
    check = json.loads((tmp_path / "batch-check.json").read_text())
    assert (check["kind"], check["ran"], check["fits"]) == ("batch-check", False, None)
