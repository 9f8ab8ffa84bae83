"""The kit's action.yml on the Lightning example (examples/lightning), under act, end to end.

The job is the digits self-test's shape (`uses: ./` in dl-ci's own repository, the PR tier on
the CPU) with examples/lightning as the project: the host side, then in the container the
install, the tests, the memorization test and the doctor through Target.from_lightning (the
module's own training_step and configure_optimizers), the profile, cleanup and the summary.
The container is the kit image with dl-ci's lightning extra, ``dl-ci:e2e-lightning``, which
``scripts/e2e_setup.sh lightning`` builds from docker/Dockerfile with ``DLCI_EXTRAS=lightning``:
a second tag rather than lightning in the kit image, so that every other e2e test keeps running
in what the Dockerfile gives by default: no framework.

The control is the example's planted bug (broken.py: a training_step that returns the loss of
a detached output): the same action, memorization only, turns the job red at that gate.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from test_act import ROOT, make_repo
from test_action import act, job, kit_copy, no_job_containers  # noqa: F401 (a fixture)

from conftest import missing, run_setup

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("no_job_containers")]

LIGHTNING_IMAGE = os.environ.get("DLCI_E2E_LIGHTNING_IMAGE", "dl-ci:e2e-lightning")
HAS_LIGHTNING = "import importlib.util as u; print(u.find_spec('lightning') is not None)"


def _docker(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def _layers(image: str) -> list[str]:
    proc = _docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", image)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _has_lightning(image: str) -> bool:
    proc = _docker("run", "--rm", "--network", "none", image, "python", "-c", HAS_LIGHTNING)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip() == "True"


@pytest.fixture(scope="module")
def lightning_image(kit_image: str) -> str:
    """The kit image with the lightning extra, brought up to date by the setup script."""
    if os.environ.get("DLCI_E2E_SKIP_BUILD") != "1":
        proc = run_setup("lightning")
        if proc.returncode != 0:
            missing(f"scripts/e2e_setup.sh lightning failed:\n{proc.stdout[-3000:]}{proc.stderr}")
    if _docker("image", "inspect", LIGHTNING_IMAGE, timeout=60).returncode != 0:
        missing(f"no image {LIGHTNING_IMAGE}")
    return LIGHTNING_IMAGE


def test_the_extra_is_one_layer_over_the_kit_image(kit_image: str, lightning_image: str) -> None:
    """The kit image (no DLCI_EXTRAS) holds no lightning; the lightning image shares every
    layer of it below dl-ci's source, and adds one: the extra's packages."""
    kit, extra = _layers(kit_image), _layers(lightning_image)
    assert not _has_lightning(kit_image)
    assert _has_lightning(lightning_image)
    # the kit image's last two layers are dl-ci's source (COPY src/, its install); the
    # lightning image has the same stack with the extra's layer under its own source
    assert len(extra) == len(kit) + 1
    assert extra[: len(kit) - 2] == kit[:-2]


def test_an_extra_dl_ci_does_not_have_stops_the_build_naming_the_ones_it_has(
    kit_image: str,
) -> None:
    """DLCI_EXTRAS is checked against pyproject.toml before pip runs (pip would only warn).
    The build arguments are the setup script's, so every layer below the extras is cached; the
    same build with DLCI_EXTRAS=lightning is the lightning image (the control)."""
    argv = ["build", "--network", "none", "--force-rm", "--file", "docker/Dockerfile"]
    for name, value in (
        ("BASE_IMAGE", os.environ.get("DLCI_E2E_BASE_IMAGE", "dlci-e2e-base:bookworm")),
        ("PIP_OFFLINE", "1"),
        ("TORCH_SPEC", os.environ.get("TORCH_SPEC", "torch==2.13.0")),
        ("EXTRA_PIP", os.environ.get("DLCI_E2E_EXTRA_PIP", "scikit-learn")),
        ("DLCI_EXTRAS", "lightning, lightnin"),
    ):
        argv += ["--build-arg", f"{name}={value}"]
    proc = subprocess.run(
        ["docker", *argv, "."], cwd=ROOT, capture_output=True, text=True, timeout=1800
    )
    assert proc.returncode != 0
    said = proc.stdout + proc.stderr
    message = "error: DLCI_EXTRAS='lightning, lightnin': dl-ci has no extra 'lightnin'; "
    message += "its extras, comma-separated: "
    assert message in said
    known = said.split(message)[1].split()[0].split(",")
    assert {"lightning", "train", "transformers"} <= set(known)
    # docker's own line for an image built (pip's "Successfully built dl-ci" is not it: with
    # layers not cached the extras' step can come after pip built the wheel)
    assert not re.search(r"^Successfully built [0-9a-f]{12}$", proc.stdout, re.MULTILINE)


def _job(image: str, out: Path, with_lines: str) -> str:
    """`uses: ./` on examples/lightning; the reports are copied to `out` for the test."""
    with_block = "".join(f"    {line}\n" for line in with_lines.strip("\n").splitlines())
    return job(
        f"""
- uses: actions/checkout@v4
- id: dlci
  uses: ./
  with:
    budget: pr
    working-directory: examples/lightning
    image: {image}
    upload-artifacts: "false"
{with_block}- if: always()
  run: cp -r "$GITHUB_WORKSPACE/dlci-artifacts" {out}
"""
    )


def _kit_repo(tmp_path: Path, workflow: str) -> Path:
    repo = kit_copy(tmp_path / "repo")
    (repo / ".github" / "workflows").mkdir(parents=True, exist_ok=True)
    for old in (repo / ".github" / "workflows").iterdir():
        old.unlink()
    (repo / ".github" / "workflows" / "e2e.yml").write_text(workflow)
    return make_repo(repo, {})


def test_the_action_runs_the_lightning_example(
    tmp_path: Path, lightning_image: str, act_bin: Path
) -> None:
    """Every gate on: the target from [tool.dlci] in examples/lightning/pyproject.toml."""
    out = tmp_path / "artifacts"
    # the example's own memorization tests run in the unit tests' job: here its other tests,
    # and the action's gates
    workflow = _job(lightning_image, out, 'pytest-args: -k "not memoriz"')
    run = act(act_bin, tmp_path, _kit_repo(tmp_path, workflow))
    assert run.returncode == 0, run.explain()
    assert run.job_result() == "success", run.explain()
    outputs = run.outputs("dlci")
    assert outputs["memorization-passed"] == "true"
    assert outputs["verdict"] == "pass"
    memorization = json.loads((out / "memorization.json").read_text())
    assert memorization["verdict"] == "pass", memorization
    assert memorization["config"]["target"] == "lightning_example.target:make_target"
    doctor = json.loads((out / "doctor.json").read_text())
    assert doctor["verdict"] == "pass", doctor
    summary = "".join(run.summaries())
    assert "## ✅ dl-ci: passed" in summary
    assert "### ✅ Memorization test: pass" in summary
    assert "Debugging checks: 0 failed" in summary
    assert {"junit.xml", "trace.json.gz", "utilization.json"} <= {p.name for p in out.iterdir()}
    print(f"uses: ./ PR-tier job on the Lightning example: {run.seconds:.1f} s")


def test_a_detached_training_step_turns_the_job_red_at_the_memorization_gate(
    tmp_path: Path, lightning_image: str, act_bin: Path
) -> None:
    """The control: broken.py's training_step returns the loss of a detached output.

    Memorization only: the other gates are off, and the tests step collects nothing (an empty
    file, allowed), so the job's one failure is the memorization gate's."""
    out = tmp_path / "artifacts"
    workflow = _job(
        lightning_image,
        out,
        """
target: lightning_example.broken:make_detached_target
doctor: "false"
profile: "false"
doctest: "false"
coverage: "false"
tests: lightning_example/__init__.py
allow-no-tests: "true"
""",
    )
    run = act(act_bin, tmp_path, _kit_repo(tmp_path, workflow))
    assert run.returncode != 0
    assert run.job_result() == "failure", run.explain()
    outputs = run.outputs("dlci")
    assert outputs["memorization-passed"] == "false"
    assert outputs["verdict"] == "fail"
    memorization = json.loads((out / "memorization.json").read_text())
    assert memorization["verdict"] == "fail", memorization
    summary = "".join(run.summaries())
    assert "## ❌ dl-ci: FAILED" in summary
    assert "- step memorize failed" in summary
    assert "- step tests failed" not in summary
    assert "::error title=memorization::" in run.log
    assert "the model's output is detached from its parameters" in run.log  # the cause's hint
    print(f"uses: ./ memorization-only job on the detached Lightning step: {run.seconds:.1f} s")
