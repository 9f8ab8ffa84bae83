"""The runner setup (docker/runner/), the scale-set values and the workflows, checked with real tools.

- shellcheck and `bash -n` on the runner scripts; hadolint on the dind sidecar's Dockerfile;
- actionlint and check-jsonschema (GitHub's workflow schema) on every workflow;
- check-jsonschema on the scale-set values against values.schema.json (the chart's published
  schema + Kubernetes' strict PodTemplateSpec, see docker/runner/arc/make_schema.py);
- setup.sh and cleanup-hook.sh run for real, with stand-ins for `nvidia-smi`, `df` and `docker`
  (executable scripts on PATH) where this machine has no GPU; the labels come from the real
  `dlci hardware`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "docker" / "runner"
ARC = RUNNER / "arc"
SCRIPTS = sorted(RUNNER.glob("*.sh"))
VALUES = sorted(ARC.glob("values-*.yaml"))
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml")) + sorted(
    (ROOT / "examples" / "workflows").glob("*.yml")
)
BIN = Path(sys.executable).parent
A100 = "NVIDIA A100-SXM4-80GB"


def tool(name: str) -> str:
    found = shutil.which(name) or str(BIN / name)
    if not Path(found).exists():
        pytest.fail(f"{name} is missing: pip install -e '.[dev]'", pytrace=False)
    return found


def check(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=300)
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout}{done.stderr}"
    return done


def test_the_files_are_there() -> None:
    assert {p.name for p in SCRIPTS} == {"setup.sh", "cleanup-hook.sh"}
    assert {p.name for p in VALUES} == {"values-t4.yaml", "values-a100.yaml", "values-h100.yaml"}
    names = {p.name for p in WORKFLOWS}
    assert {"ci.yml", "self-test.yml", "release.yml", "pr.yml", "nightly.yml"} <= names
    for path in SCRIPTS:
        assert os.access(path, os.X_OK), path


# --- static checks with the real tools


def test_shellcheck_and_bash_n_accept_the_runner_scripts() -> None:
    check(tool("shellcheck"), "--severity=style", "--external-sources", *map(str, SCRIPTS))
    for path in SCRIPTS:
        check("bash", "-n", str(path))


def test_hadolint_accepts_the_dind_dockerfile() -> None:
    check(tool("hadolint"), str(ARC / "Dockerfile.dind"))


def test_actionlint_and_the_workflow_schema_accept_every_workflow() -> None:
    check(tool("actionlint"), *map(str, WORKFLOWS))
    check(
        tool("check-jsonschema"),
        "--builtin-schema",
        "vendor.github-workflows",
        *map(str, WORKFLOWS),
    )


def test_the_scale_set_values_validate_against_the_chart_and_kubernetes_schema() -> None:
    schema = ARC / "values.schema.json"
    check(tool("check-jsonschema"), "--schemafile", str(schema), *map(str, VALUES))


def test_the_values_schema_refuses_a_pod_spec_mistake(tmp_path: Path) -> None:
    """The validation can fail: a misspelt pod field and a wrong resource shape are refused."""
    values = yaml.safe_load((ARC / "values-a100.yaml").read_text())
    values["template"]["spec"]["nodeselector"] = values["template"]["spec"].pop("nodeSelector")
    values["template"]["spec"]["containers"][1]["resources"]["limits"] = ["nvidia.com/gpu"]
    bad = tmp_path / "values-bad.yaml"
    bad.write_text(yaml.safe_dump(values))
    done = subprocess.run(
        [tool("check-jsonschema"), "--schemafile", str(ARC / "values.schema.json"), str(bad)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stdout
    assert "'nodeselector' was unexpected" in done.stdout
    assert "limits" in done.stdout


def test_the_values_schema_is_current() -> None:
    """values.schema.json is what make_schema.py writes from kubernetes-validate's schemas."""
    import kubernetes_validate  # noqa: F401  (dev extra: a missing part fails, never skips)

    committed = (ARC / "values.schema.json").read_bytes()
    try:
        check(sys.executable, str(ARC / "make_schema.py"))
        assert (ARC / "values.schema.json").read_bytes() == committed
    finally:
        (ARC / "values.schema.json").write_bytes(committed)


@pytest.mark.parametrize("path", VALUES, ids=lambda p: p.name)
def test_each_scale_set_is_one_gpu_class(path: Path) -> None:
    cls = path.stem.removeprefix("values-")
    values = yaml.safe_load(path.read_text())
    assert values["runnerScaleSetName"] == f"dlci-{cls}"
    assert 0 <= values["minRunners"] <= values["maxRunners"]
    assert "containerMode" not in values  # the dind pod is written out, with a GPU sidecar
    spec = values["template"]["spec"]
    assert spec["restartPolicy"] == "Never"  # an ephemeral pod: one job, then gone
    assert (
        spec["nodeSelector"]["nvidia.com/gpu.product"].replace("-", " ").upper().find(cls.upper())
        >= 0
    )
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    containers = {c["name"]: c for c in spec["containers"]}
    assert containers["runner"]["command"] == ["/home/runner/run.sh"]
    assert {"name": "DOCKER_HOST", "value": "unix:///var/run/docker.sock"} in containers["runner"][
        "env"
    ]
    assert "nvidia.com/gpu" not in json.dumps(containers["runner"])
    dind = containers["dind"]
    assert dind["securityContext"]["privileged"] is True
    assert int(dind["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    assert "--host=unix:///var/run/docker.sock" in dind["args"]
    mounts = {m["name"] for m in dind["volumeMounts"]}
    assert {"work", "dind-sock", "dind-externals"} <= mounts
    # the class named in the workflows (actionlint's known labels) and the docs
    assert f"dlci-{cls}" in (ROOT / ".github" / "actionlint.yaml").read_text()
    assert f"runs-on: dlci-{cls}" in (ARC / "README.md").read_text()


# --- the workflows: what the issue asks of them


def load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True)  # YAML 1.1 reads the key `on` as true
    return data


def uses_are_pinned(data: dict) -> None:
    for job in data["jobs"].values():
        for step in job.get("steps", []):
            ref = step.get("uses", "")
            if ref and not ref.startswith("./") and not ref.startswith("org/dl-ci@"):
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), ref


def test_the_pr_example_is_a_guarded_status_check() -> None:
    data = load(ROOT / "examples" / "workflows" / "pr.yml")
    # not pull_request_target: no secrets for forks; the default branch runs too, so its
    # newest successful run is a pull request's baseline
    assert list(data["on"]) == ["pull_request", "push"]
    assert data["on"]["push"] == {"branches": ["main"]}
    assert data["permissions"] == {
        "contents": "read",
        "actions": "read",  # baseline: auto reads the base branch's reports
        "pull-requests": "write",  # comment: true (never on a fork's pull request)
    }
    assert data["concurrency"]["cancel-in-progress"] is True
    assert "pull_request.number" in data["concurrency"]["group"]
    job = data["jobs"]["dl-ci"]
    assert job["runs-on"] == ["self-hosted", "gpu"]
    assert 0 < job["timeout-minutes"] <= 60
    dlci = next(s for s in job["steps"] if s.get("uses") == "org/dl-ci@v1")
    assert dlci["with"]["allow-fork-prs"] == "false"
    assert dlci["with"]["budget"] == "pr"
    assert dlci["with"]["image"] == "${{ vars.DLCI_IMAGE }}"
    assert dlci["with"]["baseline"] == "auto" and dlci["with"]["comment"] == "true"
    uses_are_pinned(data)


def test_the_nightly_example_runs_a_matrix_and_compares_with_last_night() -> None:
    data = load(ROOT / "examples" / "workflows" / "nightly.yml")
    assert "schedule" in data["on"]
    # pull-requests: read, the bisect's lookup of a culprit's pull request (never write here)
    assert data["permissions"] == {"contents": "read", "actions": "read", "pull-requests": "read"}
    job = data["jobs"]["nightly"]
    assert "a100" in job["strategy"]["matrix"]["hardware"]
    assert len(job["strategy"]["matrix"]["hardware"]) >= 2
    assert job["strategy"]["fail-fast"] is False
    assert job["runs-on"] == ["self-hosted", "gpu", "${{ matrix.hardware }}"]
    dlci = next(s for s in job["steps"] if s.get("uses") == "org/dl-ci@v1")
    assert dlci["with"]["budget"] == "nightly"
    assert dlci["with"]["bisect"] == "${{ vars.DLCI_BISECT == 'true' }}"  # opt-in
    assert dlci["with"]["artifact-name"] == "nightly"  # + class + job id, by the action
    assert dlci["with"]["baseline"] == "auto"  # last night, through GitHub's API
    history = next(s for s in job["steps"] if s.get("id") == "history")
    assert history["if"].startswith("always()")
    assert "dlci history --previous auto" in history["run"]
    assert "nightly-history-$HARDWARE_CLASS" in history["run"]
    keep = job["steps"][-1]
    assert keep["with"]["name"] == "nightly-history-${{ steps.dlci.outputs.hardware-class }}"
    uses_are_pinned(data)


def test_the_self_test_has_a_job_that_must_pass_and_one_that_must_fail() -> None:
    data = load(ROOT / ".github" / "workflows" / "self-test.yml")
    jobs = data["jobs"]
    for job in jobs.values():
        assert job["runs-on"] == ["self-hosted", "gpu"]
        assert any(s.get("uses") == "./" for s in job["steps"])
    bad = next(s for s in jobs["must-fail"]["steps"] if s.get("uses") == "./")
    assert bad["continue-on-error"] is True
    assert bad["with"]["target"] == "digits_example.broken:make_tiny_lr_target"
    assert 'test "$OUTCOME" = failure' in jobs["must-fail"]["steps"][-1]["run"]
    good = next(s for s in jobs["must-pass"]["steps"] if s.get("uses") == "./")
    assert "continue-on-error" not in good
    assert 'test "$VERDICT" = pass' in jobs["must-pass"]["steps"][-1]["run"]
    uses_are_pinned(data)


def test_ci_runs_the_gates_the_unit_tests_and_the_e2e() -> None:
    data = load(ROOT / ".github" / "workflows" / "ci.yml")
    runs = "\n".join(s.get("run", "") for j in data["jobs"].values() for s in j["steps"])
    # the README's test command, whole: it runs the gates, the unit and the e2e tests
    assert "bash scripts/test.sh\n" in runs + "\n" and "not e2e" not in runs
    assert "scripts/e2e_setup.sh" in (ROOT / "scripts" / "test.sh").read_text()
    uses_are_pinned(data)


def test_the_release_publishes_an_image_per_cuda_version_and_moves_the_major_tag() -> None:
    data = load(ROOT / ".github" / "workflows" / "release.yml")
    image = data["jobs"]["image"]
    assert image["permissions"]["packages"] == "write"
    assert len({leg["cuda"] for leg in image["strategy"]["matrix"]["include"]}) >= 2
    runs = "\n".join(s.get("run", "") for s in image["steps"])
    assert "ghcr.io/" in runs and "docker push" in runs and "--password-stdin" in runs
    tag = data["jobs"]["major-tag"]
    assert tag["permissions"] == {"contents": "write"} and tag["needs"] == ["image", "pypi"]
    # the package: built once, checked, published through trusted publishing (an OIDC token,
    # no stored secret) only after the images built
    dist = json.dumps(data["jobs"]["dist"])
    assert "python -m build --sdist --wheel" in dist and "dlci/data/ladder.yaml" in dist
    pypi = data["jobs"]["pypi"]
    assert pypi["needs"] == ["dist", "image"] and pypi["permissions"] == {"id-token": "write"}
    assert pypi["environment"]["name"] == "pypi"
    assert pypi["steps"][-1]["uses"].startswith("pypa/gh-action-pypi-publish@")
    assert "with" not in pypi["steps"][-1]  # no password: trusted publishing
    moved = json.dumps(tag)
    # the refs API, not `git push --force`: GITHUB_TOKEN's push of a tag is refused whenever
    # the workflows changed since the tag last moved
    assert "git/refs/tags/$major" in moved and "force=true" in moved
    assert "git push" not in moved
    version = re.search(r"^## \[(\d+\.\d+\.\d+)\]", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert version, "CHANGELOG.md has no released version section"
    uses_are_pinned(data)


# --- setup.sh and the hooks, run for real with stand-ins


def stand_in(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(f"#!/usr/bin/env bash\n# a stand-in for {name} in the tests\n{body}\n")
    path.chmod(0o755)
    return path


def fake_gpu_machine(tmp_path: Path, gpus: list[str]) -> dict[str, str]:
    """PATH with a stand-in nvidia-smi listing these GPUs, and a device folder to match."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    listing = "\n".join(f'echo "GPU {i}: {n} (UUID: GPU-{i}a2b)"' for i, n in enumerate(gpus))
    query = "\n".join(
        f'echo "{i}, GPU-{i}a2b, {n}, 81920, 550.54.15, 8.0"' for i, n in enumerate(gpus)
    )
    none = 'echo "No devices were found"; exit 6' if not gpus else ""
    stand_in(
        bin_,
        "nvidia-smi",
        f"""case "${{1:-}}" in
-L) {none or listing} ;;
--query-gpu=*) {none or query} ;;
*) echo "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 |" ;;
esac""",
    )
    dev = tmp_path / "dev"
    dev.mkdir()
    for i in range(len(gpus)):
        (dev / f"nvidia{i}").touch()
    (dev / "nvidiactl").touch()
    return {
        **os.environ,
        "PATH": f"{bin_}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}",
        "DLCI_PROBES": "nvidia-smi",  # NVML is the real library: absent here, skipped for sure
        "DLCI_NVIDIA_DEV_DIR": str(dev),
        "DLCI": str(BIN / "dlci"),
    }


def setup(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(RUNNER / "setup.sh"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_a100_machine_gets_the_labels_from_dlci_hardware(tmp_path: Path) -> None:
    done = setup(fake_gpu_machine(tmp_path, [A100, A100]), "labels")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "self-hosted,gpu,a100,gpus-2"
    assert "driver: 2 GPU(s)" in done.stderr


def test_the_class_is_dlci_hardware_s_not_the_script_s(tmp_path: Path) -> None:
    done = setup(fake_gpu_machine(tmp_path, ["Tesla T4"]), "labels")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "self-hosted,gpu,t4,gpus-1"


def test_no_gpu_is_a_clear_error(tmp_path: Path) -> None:
    done = setup(fake_gpu_machine(tmp_path, []), "labels")
    assert done.returncode == 1
    assert "runner setup: error: nvidia-smi -L lists no GPU: No devices were found" in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(
    "dlci_body",
    [
        'echo \'{"hardware_class": "cpu", "class_reason": "no GPU found"}\'',  # driver yes, GPU no
        'echo "dlci: crashed" >&2; exit 3',  # dlci itself fails
    ],
)
def test_a_failed_class_stops_setup_instead_of_a_bare_gpu_label(
    tmp_path: Path, dlci_body: str
) -> None:
    env = fake_gpu_machine(tmp_path, [A100])
    stand_in(tmp_path / "bin", "dlci-stand-in", dlci_body)
    env["DLCI"] = str(tmp_path / "bin" / "dlci-stand-in")
    done = setup(env, "labels")
    assert done.returncode == 1, done.stdout
    assert "gpu," not in done.stdout
    assert "runner setup: error:" in done.stderr


def test_no_driver_is_a_clear_error(tmp_path: Path) -> None:
    env = fake_gpu_machine(tmp_path, [A100])
    (tmp_path / "bin" / "nvidia-smi").unlink()
    env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin"
    done = setup(env, "labels")
    assert done.returncode == 1
    assert "nvidia-smi is not installed: install the NVIDIA driver first" in done.stderr


def test_missing_device_nodes_are_an_error(tmp_path: Path) -> None:
    env = fake_gpu_machine(tmp_path, [A100])
    (tmp_path / "dev" / "nvidia0").unlink()
    done = setup(env, "labels")
    assert done.returncode == 1
    assert "device nodes although nvidia-smi answers" in done.stderr


def test_dry_run_prints_the_plan_and_changes_nothing(tmp_path: Path) -> None:
    env = fake_gpu_machine(tmp_path, [A100])
    # a docker stand-in that records its calls: the dry run must not call it
    calls = tmp_path / "docker-calls"
    stand_in(tmp_path / "bin", "docker", f'echo "$*" >> {calls}')
    runner_dir = tmp_path / "runner"
    done = setup(
        env, "--dry-run", "--url", "https://github.com/org/repo", "--dir", str(runner_dir),
        "--name", "gpu-box-1", "--labels", "big-disk",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "==> labels: self-hosted,gpu,a100,gpus-1,big-disk" in out
    assert (
        "would run: docker run --rm --gpus all nvidia/cuda:12.4.1-base-ubuntu22.04 nvidia-smi -L"
        in out
    )
    assert "would run: apt-get install -y nvidia-container-toolkit" in out  # no nvidia-ctk here
    assert "would run: nvidia-ctk runtime configure --runtime=docker" in out
    config = next(line for line in out.splitlines() if "./config.sh" in line)
    for part in (
        "--ephemeral",
        "--unattended",
        "--url https://github.com/org/repo",
        "--name gpu-box-1",
    ):
        assert part in config
    assert "--labels gpu\\,a100\\,gpus-1\\,big-disk" in config
    # the token travels in the environment, never on a command line (ps shows those)
    assert "the token in ACTIONS_RUNNER_INPUT_TOKEN" in config and "--token" not in config
    assert f"ACTIONS_RUNNER_HOOK_JOB_STARTED={runner_dir}/dlci-job-started.sh" in out
    assert f"ACTIONS_RUNNER_HOOK_JOB_COMPLETED={runner_dir}/dlci-job-completed.sh" in out
    assert "DLCI_RUNNER=gpu-box-1" in out  # the hook's containers: this runner's only
    assert "DLCI_RUNNER_GPUS" not in out  # one runner: every GPU is its own
    assert "runs-on: [self-hosted, gpu, a100, gpus-1, big-disk]" in out
    assert not runner_dir.exists()
    assert not calls.exists()


def test_setup_refuses_to_register_without_a_url(tmp_path: Path) -> None:
    done = setup(fake_gpu_machine(tmp_path, [A100]), "--dry-run")
    assert done.returncode == 1
    assert "--url is needed" in done.stderr


def test_an_unknown_argument_is_refused(tmp_path: Path) -> None:
    done = setup(fake_gpu_machine(tmp_path, [A100]), "--ephemeral-please")
    assert done.returncode == 1
    assert "unknown argument '--ephemeral-please'" in done.stderr


# --- the cleanup hook


def hook_env(
    tmp_path: Path, percent: int, *, apps: str = "", smi: bool = True, gpus: int = 1
) -> dict[str, str]:
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    calls = tmp_path / "docker-calls"
    stand_in(
        bin_,
        "docker",
        f"""echo "$*" >> {calls}
case "$1 ${{2:-}}" in
"info --format") echo {tmp_path} ;;
"ps --all") case "$*" in
  *label=dlci.runner=*) echo "c0ffee1" ;;  # the engine's filter: this runner's own
  *) echo "c0ffee1 deadbee2" ;;
  esac ;;
esac""",
    )
    stand_in(
        bin_,
        "df",
        f"""echo "Filesystem 1024-blocks Used Available Capacity Mounted on"
echo "/dev/sda1 1000 {percent * 10} {1000 - percent * 10} {percent}% /" """,
    )
    if smi:
        stand_in(
            bin_,
            "nvidia-smi",
            f"""case "$1" in
--query-gpu=*) for i in $(seq 0 {gpus - 1}); do echo "GPU-${{i}}a2b, $i, {A100}, 3, 35"; done ;;
--query-compute-apps=*) printf '%s' "{apps}" ;;
esac""",
        )
    path = f"{bin_}{os.pathsep}/usr/bin{os.pathsep}/bin"
    return {**os.environ, "PATH": path, "DLCI_DISK_THRESHOLD": "80"}


def hook(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(RUNNER / "cleanup-hook.sh"), *args], env=env, capture_output=True, text=True
    )


def docker_calls(tmp_path: Path) -> str:
    calls = tmp_path / "docker-calls"
    return calls.read_text() if calls.exists() else ""


def test_a_full_disk_prunes_old_images(tmp_path: Path) -> None:
    done = hook(hook_env(tmp_path, 91), "disk")
    assert done.returncode == 0, done.stderr
    assert (
        "is 91% full (threshold 80%): pruning unused images created more than 72h ago "
        "(not labelled dlci.keep)" in done.stdout
    )
    calls = docker_calls(tmp_path)
    assert "image prune --all --force --filter until=72h --filter label!=dlci.keep" in calls


def test_a_disk_below_the_threshold_is_left_alone(tmp_path: Path) -> None:
    done = hook(hook_env(tmp_path, 79), "disk")
    assert done.returncode == 0, done.stderr
    assert "is 79% full (threshold 80%): nothing to prune" in done.stdout
    assert "prune" not in docker_calls(tmp_path)


def test_a_bad_threshold_is_refused(tmp_path: Path) -> None:
    env = hook_env(tmp_path, 50)
    env["DLCI_DISK_THRESHOLD"] = "80%"
    done = hook(env, "disk")
    assert done.returncode == 2
    assert "must be a whole percent" in done.stderr


def test_job_completed_removes_stale_containers_and_checks_the_gpu(tmp_path: Path) -> None:
    done = hook(hook_env(tmp_path, 20), "completed")
    assert done.returncode == 0, done.stderr
    calls = docker_calls(tmp_path)
    assert "ps --all --quiet --filter label=dlci.job" in calls
    assert "rm --force c0ffee1 deadbee2" in calls
    assert "container prune --force --filter until=1h" in calls
    assert f"gpu: GPU-0a2b, 0, {A100}, 3, 35" in done.stdout


def test_the_hook_takes_its_mode_from_its_name(tmp_path: Path) -> None:
    """The runner runs a hook with no arguments: dlci-job-started.sh is the started hook."""
    env = hook_env(tmp_path, 20, apps="GPU-0a2b, 4242, python, 1024 MiB")
    started = tmp_path / "dlci-job-started.sh"
    shutil.copy2(RUNNER / "cleanup-hook.sh", started)
    done = subprocess.run(["bash", str(started)], env=env, capture_output=True, text=True)
    assert done.returncode == 1
    assert (
        "processes still hold memory on this runner's GPUs between jobs: "
        "GPU-0a2b, 4242, python, 1024 MiB" in done.stdout
    )
    assert "refusing the job" in done.stderr
    assert docker_calls(tmp_path) == ""  # the started hook cleans nothing


def test_a_healthy_gpu_lets_the_job_start(tmp_path: Path) -> None:
    done = hook(hook_env(tmp_path, 20), "started")
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_hung_nvidia_smi_refuses_the_job(tmp_path: Path) -> None:
    env = hook_env(tmp_path, 20)
    stand_in(tmp_path / "bin", "nvidia-smi", "sleep 5")
    env["DLCI_GPU_TIMEOUT"] = "1"
    done = hook(env, "started")
    assert done.returncode == 1
    assert "nvidia-smi failed or hung for 1s" in done.stdout


def test_a_bad_cache_limit_is_refused(tmp_path: Path) -> None:
    env = hook_env(tmp_path, 20)
    env["DLCI_CACHE_MAX_GB"] = "50GB"
    done = hook(env, "caches")
    assert done.returncode == 2
    assert "the trusted cache's maximum size must be a number of GB, not '50GB'" in done.stderr
    env = {**hook_env(tmp_path, 20), "DLCI_UNTRUSTED_CACHE_MAX_AGE_DAYS": "1.5"}
    done = hook(env, "caches")
    assert done.returncode == 2
    assert "maximum age must be a whole number of days, not '1.5'" in done.stderr


def test_job_completed_prunes_caches_untrusted_first(tmp_path: Path) -> None:
    """The order of the prune (the real engine's verdicts: tests/e2e/test_container_commands.py)."""
    done = hook(hook_env(tmp_path, 20), "completed")
    assert done.returncode == 0, done.stderr
    calls = docker_calls(tmp_path).splitlines()
    untrusted = "volume ls --quiet --filter label=dlci.cache=untrusted --filter dangling=true"
    trusted = "volume ls --quiet --filter label=dlci.cache=trusted --filter dangling=true"
    assert calls.index(untrusted) < calls.index(trusted)


def test_a_full_disk_removes_every_unused_untrusted_cache_first(tmp_path: Path) -> None:
    done = hook(hook_env(tmp_path, 91), "disk")
    assert done.returncode == 0, done.stderr
    assert "removing every unused untrusted cache volume" in done.stdout
    calls = docker_calls(tmp_path)
    assert calls.index("label=dlci.cache=untrusted") < calls.index("image prune")


# --- setup.sh verifies the runner tarball's SHA-256 before unpacking it

MACHINE = {"x86_64": "linux-x64", "aarch64": "linux-arm64"}.get(os.uname().machine, "linux-x64")
OTHER = "linux-arm64" if MACHINE == "linux-x64" else "linux-x64"


def fake_github(tmp_path: Path, release: dict | None) -> tuple[dict[str, str], str]:
    """PATH with a stand-in curl serving a runner tarball and a release's JSON; the sha256."""
    import hashlib
    import io
    import tarfile

    served = tmp_path / "served"
    served.mkdir()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        script = b"#!/bin/sh\necho configured\n"
        info = tarfile.TarInfo("config.sh")
        info.size, info.mode = len(script), 0o755
        tar.addfile(info, io.BytesIO(script))
    (served / "runner.tar.gz").write_bytes(buffer.getvalue())
    if release is not None:
        (served / "release.json").write_text(json.dumps(release))
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    stand_in(
        bin_,
        "curl",
        f"""out=""; url=""
while [ "$#" -gt 0 ]; do
  case $1 in -o) out=$2 && shift ;; -*) ;; *) url=$1 ;; esac
  shift
done
echo "$url" >> {tmp_path / "curl-calls"}
case $url in
https://api.github.com/repos/actions/runner/releases/*)
  [ -f {served / "release.json"} ] || exit 22
  cat {served / "release.json"} ;;
https://github.com/actions/runner/releases/download/*) cp {served / "runner.tar.gz"} "$out" ;;
*) exit 22 ;;
esac""",
    )
    env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}"}
    env.pop("DLCI_RUNNER_SHA256", None)
    return env, hashlib.sha256(buffer.getvalue()).hexdigest()


def release_notes(version: str, shas: dict[str, str]) -> dict:
    """A release as GitHub's API gives it: the checksums between markers in the notes' body."""
    lines = [f"Commit 0123{'9' * 60} fixes a bug"]  # another 64-digit hex string, not a checksum
    for platform, sha in shas.items():
        name = f"actions-runner-{platform}-{version}.tar.gz"
        lines.append(f"- {name} <!-- BEGIN SHA {platform} -->{sha}<!-- END SHA {platform} -->")
    return {"tag_name": f"v{version}", "body": "\n".join(lines)}


def download(env: dict[str, str], runner: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return setup(env, "download", "--dir", str(runner), *args)


def test_a_runner_whose_checksum_matches_the_release_notes_is_unpacked(tmp_path: Path) -> None:
    env, sha = fake_github(tmp_path, None)
    release = release_notes("2.999.0", {OTHER: "f" * 64, MACHINE: sha})
    (tmp_path / "served" / "release.json").write_text(json.dumps(release))
    runner = tmp_path / "runner"
    done = download(env, runner, "--runner-version", "2.999.0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SHA-256 {sha} matches the release notes of v2.999.0" in done.stdout
    assert sorted(p.name for p in runner.iterdir()) == ["config.sh"]  # unpacked, tarball gone
    calls = (tmp_path / "curl-calls").read_text().split()
    assert calls[0].endswith("/releases/tags/v2.999.0")


def test_latest_takes_the_version_and_checksum_from_the_latest_release(tmp_path: Path) -> None:
    env, sha = fake_github(tmp_path, None)
    release = release_notes("2.999.1", {MACHINE: sha})
    (tmp_path / "served" / "release.json").write_text(json.dumps(release))
    done = download(env, tmp_path / "runner", "--runner-version", "latest")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"actions-runner-{MACHINE}-2.999.1.tar.gz SHA-256 {sha} matches" in done.stdout
    assert (tmp_path / "curl-calls").read_text().split()[0].endswith("/releases/latest")


def test_control_a_mismatching_checksum_is_refused_and_nothing_unpacked(tmp_path: Path) -> None:
    """Control: the same download with a checksum the tarball does not have is refused."""
    env, sha = fake_github(tmp_path, release_notes("2.999.0", {MACHINE: "a" * 64}))
    runner = tmp_path / "runner"
    done = download(env, runner, "--runner-version", "2.999.0")
    assert done.returncode == 1
    assert (
        f"runner setup: error: the runner tarball actions-runner-{MACHINE}-2.999.0.tar.gz has "
        f"SHA-256 {sha}, but the release notes of v2.999.0 gives {'a' * 64}: refusing to unpack "
        "it (deleted; a corrupted or tampered download)" in done.stderr
    )
    assert list(runner.iterdir()) == []


def test_the_pinned_version_is_checked_against_the_pinned_table(tmp_path: Path) -> None:
    """The default version's checksum is setup.sh's own: the release notes are not asked, and a
    tarball that is not the real 2.329.0 (this test's) is refused."""
    env, sha = fake_github(tmp_path, release_notes("2.329.0", {MACHINE: "0" * 64}))
    runner = tmp_path / "runner"
    done = download(env, runner)
    assert done.returncode == 1
    assert f"has SHA-256 {sha}, but setup.sh's pinned table gives" in done.stderr
    assert list(runner.iterdir()) == []
    calls = (tmp_path / "curl-calls").read_text().split()
    assert calls == [
        "https://github.com/actions/runner/releases/download/v2.329.0/"
        f"actions-runner-{MACHINE}-2.329.0.tar.gz"
    ]
    # the admin's override is the one way past a table entry
    done = download({**env, "DLCI_RUNNER_SHA256": sha.upper()}, runner)
    assert done.returncode == 0, done.stderr
    assert f"SHA-256 {sha} matches DLCI_RUNNER_SHA256" in done.stdout


@pytest.mark.parametrize("served", ["no-markers", "no-release", "not-json"])
def test_a_missing_checksum_is_refused_unless_the_admin_sets_one(
    tmp_path: Path, served: str
) -> None:
    release = None if served == "no-release" else {"tag_name": "v2.999.0", "body": "notes"}
    env, sha = fake_github(tmp_path, release)
    if served == "not-json":
        (tmp_path / "served" / "release.json").write_text("<html>rate limited</html>")
    runner = tmp_path / "runner"
    done = download(env, runner, "--runner-version", "2.999.0")
    assert done.returncode == 1
    assert (
        f"no SHA-256 is known for actions-runner-{MACHINE}-2.999.0.tar.gz (not pinned in "
        "setup.sh, and the release notes of v2.999.0 give none or could not be read): "
        "refusing to unpack an unverified runner; set DLCI_RUNNER_SHA256" in done.stderr
    )
    assert not runner.exists() or list(runner.iterdir()) == []
    assert "releases/download" not in (tmp_path / "curl-calls").read_text()  # not even fetched
    done = download({**env, "DLCI_RUNNER_SHA256": sha}, runner, "--runner-version", "2.999.0")
    assert done.returncode == 0, done.stderr
    assert (runner / "config.sh").exists()


def test_the_pinned_table_holds_real_looking_checksums_for_both_platforms() -> None:
    text = (RUNNER / "setup.sh").read_text()
    version = re.search(r"^runner_version=(\S+)", text, re.M)
    assert version
    for platform in ("linux-x64", "linux-arm64"):
        row = re.search(
            rf"^  {re.escape(version[1])}-{platform}\) echo ([0-9a-f]{{64}}) ;;$", text, re.M
        )
        assert row, platform


# --- one machine, several runners: each pinned to its GPUs (issue 51)

EIGHT = [f"GPU-{i}a2b" for i in range(8)]


def runner_plan(out: str) -> dict[str, dict[str, str]]:
    """What the dry run of --gpus-per-runner says of each runner: its .env lines and its
    config.sh line, by runner name."""
    plan: dict[str, dict[str, str]] = {}
    current = ""
    for line in out.splitlines():
        if line.startswith("==> runner "):
            current = line.split()[2].rstrip(":")
            plan[current] = {"env": "", "config": ""}
        elif line.startswith("    ") and "=" in line and current:
            plan[current]["env"] += line.strip() + "\n"
        elif "./config.sh" in line and current:
            plan[current]["config"] = line
    return plan


def test_eight_gpus_two_runners_of_four_each_pinned_to_its_own(tmp_path: Path) -> None:
    """Each runner's environment, labels, folder and service name only its four GPUs, by UUID;
    the docker run arguments `gpus: auto` gives a job there name them and no other."""
    from dlci.action.host.container import resolve_gpus, run_command

    env = fake_gpu_machine(tmp_path, [A100] * 8)
    runner_dir = tmp_path / "runner"
    done = setup(
        env, "--dry-run", "--url", "https://github.com/org/repo", "--dir", str(runner_dir),
        "--name", "box", "--gpus-per-runner", "4",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = runner_plan(done.stdout)
    assert set(plan) == {"box-1", "box-2"}
    for k, mine, theirs in ((1, EIGHT[:4], EIGHT[4:]), (2, EIGHT[4:], EIGHT[:4])):
        runner = plan[f"box-{k}"]
        assert f"DLCI_RUNNER_GPUS={','.join(mine)}\n" in runner["env"]
        assert f"DLCI_RUNNER=box-{k}\n" in runner["env"]
        assert f"{runner_dir}/runner-{k}/dlci-job-started.sh" in runner["env"]
        assert "--labels gpu\\,a100\\,gpus-4" in runner["config"]
        assert f"--name box-{k}" in runner["config"]
        assert not [uuid for uuid in theirs if uuid in runner["env"] + runner["config"]]
        # the job's containers on this runner: its GPUs, by UUID, and nothing else
        pinned = runner["env"].split("DLCI_RUNNER_GPUS=")[1].split()[0].split(",")
        gpus = resolve_gpus("auto", True, pinned)
        argv = run_command(
            image="img", name="c", job="j", workspace=tmp_path, workdir=".", gpus=gpus,
            shm_size="", env_names=[], environ={"NVIDIA_VISIBLE_DEVICES": "all"}, inner=[],
            uid=1, gid=1, visible_devices=gpus.removeprefix("device="),
        )  # fmt: skip
        assert argv[argv.index("--gpus") + 1] == f'"device={",".join(mine)}"'
        assert f"NVIDIA_VISIBLE_DEVICES={','.join(mine)}" in argv
        assert "NVIDIA_VISIBLE_DEVICES" not in argv  # the job's own value (all) is not passed
        assert not [uuid for uuid in theirs if uuid in " ".join(argv)]
    assert f"{runner_dir}/runner-2/.env" in done.stdout
    assert "/etc/systemd/system/dlci-runner-2.service" in done.stdout
    # the control: one runner (the default) has every GPU and no pin
    whole = setup(
        env, "--dry-run", "--url", "https://github.com/org/repo", "--dir", str(runner_dir)
    )
    assert whole.returncode == 0, whole.stderr
    assert "DLCI_RUNNER_GPUS" not in whole.stdout
    assert "--labels gpu\\,a100\\,gpus-8" in whole.stdout


def test_each_runner_s_class_is_its_own_gpus(tmp_path: Path) -> None:
    """A machine with four A100s and four T4s: the runners' labels differ, so `dlci hardware`
    counted only the runner's own GPUs (the whole machine's class would be t4 for both)."""
    env = fake_gpu_machine(tmp_path, [A100] * 4 + ["Tesla T4"] * 4)
    done = setup(env, "labels", "--gpus-per-runner", "4")
    assert done.returncode == 0, done.stderr
    hostname = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    assert done.stdout.splitlines() == [
        f"{hostname}-1 self-hosted,gpu,a100,gpus-4 DLCI_RUNNER_GPUS={','.join(EIGHT[:4])}",
        f"{hostname}-2 self-hosted,gpu,t4,gpus-4 DLCI_RUNNER_GPUS={','.join(EIGHT[4:])}",
    ]
    whole = setup(env, "labels")  # the control: the machine as one runner takes the slowest
    assert whole.stdout.strip() == "self-hosted,gpu,t4,gpus-8"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("two", "--gpus-per-runner must be a whole number of GPUs, not 'two'"),
        ("09", "--gpus-per-runner must be a whole number of GPUs, not '09'"),
        ("16", "--gpus-per-runner 16: this machine has 8 GPU(s)"),
    ],
)
def test_a_bad_gpus_per_runner_is_refused(tmp_path: Path, value: str, message: str) -> None:
    done = setup(fake_gpu_machine(tmp_path, [A100] * 8), "labels", "--gpus-per-runner", value)
    assert done.returncode == 1
    assert message in done.stderr


def pinned_hook_env(tmp_path: Path, apps: str, pinned: list[str] = EIGHT[:4]) -> dict[str, str]:
    env = hook_env(tmp_path, 20, apps=apps, gpus=8)
    return {**env, "DLCI_RUNNER_GPUS": ",".join(pinned), "DLCI_RUNNER": "box-1"}


def test_a_neighbour_s_process_on_another_gpu_does_not_refuse_the_job(tmp_path: Path) -> None:
    neighbour = "GPU-5a2b, 777, python, 30000 MiB"
    done = hook(pinned_hook_env(tmp_path, neighbour), "started")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "GPU-5a2b" not in done.stdout  # nor is the neighbour's GPU looked at
    assert f"gpu: GPU-0a2b, 0, {A100}, 3, 35;GPU-1a2b, 1, {A100}, 3, 35;" in done.stdout
    # the control: the same process on one of this runner's GPUs refuses the job ...
    done = hook(pinned_hook_env(tmp_path, "GPU-2a2b, 777, python, 30000 MiB"), "started")
    assert done.returncode == 1
    assert "this runner's GPUs between jobs: GPU-2a2b, 777, python" in done.stdout
    # ... and so does the neighbour's process on a runner with every GPU (no pin)
    done = hook(hook_env(tmp_path, 20, apps=neighbour, gpus=8), "started")
    assert done.returncode == 1


def test_a_pinned_gpu_that_is_gone_refuses_the_job(tmp_path: Path) -> None:
    env = pinned_hook_env(tmp_path, "", pinned=["GPU-0a2b", "GPU-9a2b"])
    done = hook(env, "started")
    assert done.returncode == 1
    assert "this runner's GPU GPU-9a2b (DLCI_RUNNER_GPUS) is not listed" in done.stdout


def test_job_completed_removes_only_its_own_runner_s_containers(tmp_path: Path) -> None:
    """The engine's label filter (the stand-in's: the real engine's is in the e2e test) picks
    the runner's own containers; a neighbour's, running a job now, are left alone."""
    done = hook(pinned_hook_env(tmp_path, ""), "completed")
    assert done.returncode == 0, done.stderr
    calls = docker_calls(tmp_path)
    assert "ps --all --quiet --filter label=dlci.job --filter label=dlci.runner=box-1" in calls
    assert "rm --force c0ffee1\n" in calls and "deadbee2" not in calls
