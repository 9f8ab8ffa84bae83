"""``dlci container build / run / cleanup`` and ``dlci preflight`` against the real Docker engine."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from dlci.action.host.cleanup import foreign_files
from dlci.cli import main

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
# The build arguments scripts/e2e_setup.sh builds the kit image with: same inputs, same layers.
E2E_BUILD = [
    "--base-image",
    "dlci-e2e-base:bookworm",
    "--build-arg",
    "PIP_OFFLINE=1",
    "--build-arg",
    "TORCH_SPEC=torch==2.13.0",
    "--build-arg",
    "EXTRA_PIP=scikit-learn",
]


def test_preflight_sees_the_real_engine(docker_engine: str, tmp_path: Path) -> None:
    assert main(["preflight", "--budget", "pr", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "preflight.json").read_text())
    assert report["docker"]["server_version"]
    assert "runc" in report["docker"]["runtimes"]
    assert report["gpu"] is False  # no GPU here: the CPU path, allowed by the PR budget


def test_build_by_input_hash_then_cached(kit_image: str, tmp_path: Path, capsys) -> None:
    out_file = tmp_path / "out"
    start = time.perf_counter()
    assert main(["container", "build", "--kit", str(ROOT), *E2E_BUILD]) == 0
    first = time.perf_counter() - start
    tag = capsys.readouterr().out.strip().splitlines()[-1]
    assert tag.startswith("dlci-local:")
    start = time.perf_counter()
    assert main(["container", "build", "--kit", str(ROOT), *E2E_BUILD]) == 0
    second = time.perf_counter() - start
    captured = capsys.readouterr()
    assert captured.out.strip() == tag
    assert "is up to date" in captured.err
    print(f"kit image by input hash: first {first:.1f} s (layers cached), then {second:.2f} s")
    del out_file
    subprocess.run(["docker", "rmi", tag], capture_output=True, check=False)


def test_a_prebuilt_image_that_does_not_exist(docker_engine: str, capsys) -> None:
    assert main(["container", "build", "--image", "dlci-e2e-missing:0"]) == 1
    err = capsys.readouterr().err
    assert "dlci-e2e-missing:0" in err and "Traceback" not in err


def test_run_in_the_container_and_cleanup(kit_image: str, tmp_path: Path, capsys) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(ROOT / "examples" / "digits", ws / "project")
    inner = ["--out", "/workspace/dlci-artifacts", "--budget", "pr", "--hardware", "cpu"]
    inner += ["--install", "none", "--no-memorize", "--no-doctor", "--no-profile", "--no-doctest"]
    inner += ["--pytest-args", "-k 'not memoriz and not doctor'"]
    argv = ["container", "run", "--image", kit_image, "--workspace", str(ws)]
    argv += ["--workdir", "project", "--job", "e2e-run", "--", *inner]
    assert main(argv) == 0
    record = json.loads((ws / "dlci-artifacts" / "run.json").read_text())
    assert record["verdict"] == "pass"
    assert record["cwd"] == "/workspace/project"

    # a container left running by a killed job: cleanup removes it by its label
    subprocess.run(
        ["docker", "run", "-d", "--label", "dlci.job=e2e-stale", kit_image, "sleep", "300"],
        capture_output=True,
        check=True,
    )
    out = tmp_path / "out"
    assert (
        main(
            [
                "container",
                "cleanup",
                "--job",
                "e2e-stale",
                "--workspace",
                str(ws),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads((out / "cleanup.json").read_text())
    assert report["containers_removed"] == 1
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=dlci.job=e2e-stale"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert left.stdout.strip() == ""


def test_a_failing_job_in_the_container_is_exit_1(kit_image: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "tests").mkdir(parents=True)
    (ws / "tests" / "test_bad.py").write_text("def test_bad():\n    assert False\n")
    inner = ["--out", "/workspace/dlci-artifacts", "--budget", "pr", "--hardware", "cpu"]
    inner += ["--install", "none", "--no-memorize", "--no-doctor", "--no-profile"]
    argv = ["container", "run", "--image", kit_image, "--workspace", str(ws), "--job", "e2e-bad"]
    assert main([*argv, "--", *inner]) == 1
    record = json.loads((ws / "dlci-artifacts" / "run.json").read_text())
    assert record["failed_steps"] == ["tests"]


def test_foreign_files_are_found_and_given_back(root: None, tmp_path: Path, monkeypatch) -> None:
    """A root runner gives files back on the host itself (os.lchown), with no container."""
    (tmp_path / "ok.txt").write_text("x")
    (tmp_path / "root.txt").write_text("x")
    os.chown(tmp_path / "root.txt", 4321, 4321)
    assert foreign_files(tmp_path, 0) == [str(tmp_path / "root.txt")]
    monkeypatch.setenv("DLCI_JOB_ID", "")
    assert (
        main(["container", "cleanup", "--workspace", str(tmp_path), "--out", str(tmp_path / "o")])
        == 0
    )
    assert (tmp_path / "root.txt").stat().st_uid == 0
    assert foreign_files(tmp_path, 0) == []
    report = json.loads((tmp_path / "o" / "cleanup.json").read_text())
    assert report["ownership_method"] == "root" and report["ownership_restored"] == 1


# --- cleanup never runs the pull request's image as root (issue 13, item 7)

RUNNER_UID = 23456  # a runner user that is not root: cleanup cannot lchown on the host
STRANGER_UID = 4321  # the owner of the files the job left behind
MARKER = "PWNED-BY-CHOWN"


@pytest.fixture
def evil_image(kit_image: str, tmp_path_factory: pytest.TempPathFactory):
    """A job image, as a pull request's Dockerfile could make it: its `chown` writes a marker.

    The marker lands in the mounted workspace, owned by whoever ran it (uid 0 = root).
    """
    context = tmp_path_factory.mktemp("evil")
    chown = context / "chown"
    chown.write_text(f"#!/bin/sh\nid -u > /w/{MARKER}\nexit 0\n")
    chown.chmod(0o755)
    (context / "Dockerfile").write_text(
        "FROM dlci-e2e-base:bookworm\nCOPY chown /usr/local/bin/chown\n"
    )
    tag = "dlci-e2e-evil-chown:latest"
    subprocess.run(["docker", "build", "-q", "-t", tag, str(context)], check=True, timeout=300)
    yield tag
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


def _workspace_with_foreign_files(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "build").mkdir(parents=True)
    for path in (ws / "build" / "a.bin", ws / "build" / "b.bin", ws / "mine.txt"):
        path.write_text("x")
    for path in [ws, ws / "mine.txt"]:
        os.chown(path, RUNNER_UID, RUNNER_UID)
    for path in [ws / "build", ws / "build" / "a.bin", ws / "build" / "b.bin"]:
        os.chown(path, STRANGER_UID, STRANGER_UID)
    return ws


def _cleanup_as_runner(ws: Path, out: Path, monkeypatch, *extra: str) -> dict:
    monkeypatch.setattr(os, "getuid", lambda: RUNNER_UID)
    monkeypatch.setattr(os, "getgid", lambda: RUNNER_UID)
    monkeypatch.setenv("DLCI_JOB_ID", "")
    argv = ["container", "cleanup", "--workspace", str(ws), "--out", str(out), *extra]
    assert main(argv) == 0
    return json.loads((out / "cleanup.json").read_text())


def test_cleanup_never_runs_the_job_image_as_root(
    root: None, evil_image: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    """The job's image (built from the PR's Dockerfile) is not used to give files back."""
    ws = _workspace_with_foreign_files(tmp_path)
    monkeypatch.delenv("DLCI_CLEANUP_IMAGE", raising=False)
    report = _cleanup_as_runner(ws, tmp_path / "out", monkeypatch, "--image", evil_image)
    assert not (ws / MARKER).exists()  # the image's chown never ran
    assert report["ownership_method"] == "none"
    assert report["foreign_files"] == 3 and report["foreign_left"] == 3
    assert report["ownership_restored"] == 0
    assert report["foreign_sample"] == ["build", "build/a.bin", "build/b.bin"]
    err = capsys.readouterr().err
    assert "note: --image is no longer used by cleanup" in err
    assert "3 file(s) in the workspace are owned by another user and were left" in err
    assert "DLCI_CLEANUP_IMAGE" in err
    assert (ws / "build" / "a.bin").stat().st_uid == STRANGER_UID  # left, not given back


def test_control_the_old_cleanup_ran_the_job_image_s_chown_as_root(
    root: None, evil_image: str, tmp_path: Path
) -> None:
    """Control: the old cleanup's command line runs the PR's `chown` as root; the marker appears."""
    ws = _workspace_with_foreign_files(tmp_path)
    old = ["docker", "run", "--rm", "--user", "0:0", "-v", f"{ws}:/w", "--entrypoint", "chown"]
    old += [evil_image, "-R", f"{RUNNER_UID}:{RUNNER_UID}", "/w"]
    subprocess.run(old, check=True, capture_output=True, timeout=120)
    assert (ws / MARKER).read_text().strip() == "0"  # the PR's code ran as root


def test_a_trusted_cleanup_image_gives_files_back(
    root: None, evil_image: str, tmp_path: Path, monkeypatch
) -> None:
    """DLCI_CLEANUP_IMAGE (the runner's admin's image) restores ownership; --image stays unused."""
    ws = _workspace_with_foreign_files(tmp_path)
    (ws / "build" / "link").symlink_to("/etc/hostname")  # -h: the link, never its target
    os.lchown(ws / "build" / "link", STRANGER_UID, STRANGER_UID)
    monkeypatch.setenv("DLCI_CLEANUP_IMAGE", "dlci-e2e-base:bookworm")
    report = _cleanup_as_runner(ws, tmp_path / "out", monkeypatch, "--image", evil_image)
    assert not (ws / MARKER).exists()
    assert report["ownership_method"] == "image"
    assert report["foreign_files"] == 4 and report["ownership_restored"] == 4
    assert report["foreign_left"] == 0
    assert all(p.lstat().st_uid == RUNNER_UID for p in [ws, *ws.rglob("*")])


# --- the job-completed hook prunes dl-ci's cache volumes (issue 13, item 2)

DAY = 86400


def _cache_volume(name: str, trust: str, age_days: float, select: str) -> None:
    created = int(time.time() - age_days * DAY)
    argv = ["docker", "volume", "create", "--label", f"dlci.cache={trust}"]
    argv += ["--label", f"dlci.cache.created={created}", "--label", select, name]
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


def test_the_hook_prunes_old_and_large_cache_volumes_untrusted_first(
    kit_image: str, tmp_path: Path
) -> None:
    """Real volumes, real engine: which dl-ci caches the job-completed hook's prune removes."""
    run = uuid.uuid4().hex[:8]
    select = f"dlci.e2e.t4prune={run}"  # only this test's volumes are candidates
    want = {  # name: (trust, age in days, megabytes written, removed?)
        "untrusted-2d": ("untrusted", 2, 0, True),  # untrusted: 1 day is enough
        "untrusted-fresh": ("untrusted", 0, 0, False),
        "untrusted-big": ("untrusted", 0, 3, True),  # over the untrusted size limit
        "trusted-8d": ("trusted", 8, 0, True),  # over DLCI_CACHE_MAX_AGE_DAYS
        "trusted-2d": ("trusted", 2, 0, False),  # what removes an untrusted one keeps it
        "trusted-big": ("trusted", 0, 3, True),  # over DLCI_CACHE_MAX_GB
        "trusted-fresh": ("trusted", 0, 1, False),  # control: fresh, under the limits
        "trusted-8d-in-use": ("trusted", 8, 0, False),  # a container still uses it
    }
    names = {key: f"dlci-e2e-{run}-{key}" for key in want}
    user = None
    try:
        for key, (trust, age, mb, _) in want.items():
            _cache_volume(names[key], trust, age, select)
            if mb:
                fill = ["docker", "run", "--rm", "--user", "0:0", "--entrypoint", "sh"]
                fill += ["-v", f"{names[key]}:/c", kit_image, "-c"]
                subprocess.run(
                    [*fill, f"head -c {mb * 1_000_000} /dev/urandom > /c/blob"],
                    check=True,
                    capture_output=True,
                    timeout=120,
                )
        user = subprocess.run(
            ["docker", "create", "-v", f"{names['trusted-8d-in-use']}:/c", kit_image, "true"],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
        env = {
            **os.environ,
            "DLCI_CACHE_SELECT": f"label={select}",
            "DLCI_CACHE_MAX_GB": "0.0025",  # 2.5 MB: the 3 MB caches are over it, 1 MB is not
            "DLCI_UNTRUSTED_CACHE_MAX_GB": "0.0025",
        }
        hook = ROOT / "docker" / "runner" / "cleanup-hook.sh"
        start = time.perf_counter()
        done = subprocess.run(
            ["bash", str(hook), "caches"], env=env, capture_output=True, text=True, timeout=300
        )
        print(f"cache prune: {time.perf_counter() - start:.1f} s")
        assert done.returncode == 0, done.stdout + done.stderr
        left = subprocess.run(
            ["docker", "volume", "ls", "--quiet", "--filter", f"label={select}"],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.split()
        removed = {key for key, name in names.items() if name not in left}
        assert removed == {key for key, spec in want.items() if spec[3]}, done.stdout
        out = done.stdout
        assert (
            f"removed the untrusted cache volume {names['untrusted-2d']} (created 2 day(s)" in out
        )
        assert f"{names['trusted-big']} (3MB used, limit 0.0025GB)" in out
        assert out.index("untrusted cache volume") < out.index("the trusted cache volume")
    finally:
        if user:
            subprocess.run(["docker", "rm", "-f", user], capture_output=True, timeout=60)
        subprocess.run(
            ["docker", "volume", "rm", "-f", *names.values()], capture_output=True, timeout=60
        )


# ------------------------------------------------------------------- the network input

# What a container can reach: its interfaces, and a TCP connection to a port the host listens
# on at the bridge's gateway (the host as a container on Docker's default network sees it).
NET_PROBE = """
import errno, json, socket, sys
names = sorted(name for _, name in socket.if_nameindex())
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10).close()
    reached = "connected"
except OSError as exc:
    reached = errno.errorcode.get(exc.errno, str(exc))
print(json.dumps({"interfaces": names, "host_port": reached}))
"""


def test_the_bridge_gateway_is_read_whatever_the_engine_reports(monkeypatch) -> None:
    """Engines describe the default bridge differently; the host's address is found in each."""
    import importlib.util

    # by path: under pytest-xdist "conftest" in sys.modules can be another folder's
    spec = importlib.util.spec_from_file_location(
        "e2e_conftest", Path(__file__).with_name("conftest.py")
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(__import__("sys").modules, "e2e_conftest", module)  # for its dataclass
    spec.loader.exec_module(module)
    bridge_gateway = module.bridge_gateway

    def no_interface(name: str) -> None:
        return None

    packaged = {
        "Name": "bridge",
        "IPAM": {"Config": [{"Subnet": "172.17.0.0/16", "Gateway": "172.17.0.1"}]},
    }
    assert bridge_gateway(packaged, no_interface) == "172.17.0.1"
    # a dockerd started by hand (scripts/e2e_setup.sh): the subnet only, no Gateway key
    by_hand = {
        "Name": "bridge",
        "IPAM": {"Config": [{"Subnet": "172.18.0.0/16"}]},
        "Options": {"com.docker.network.bridge.name": "docker0"},
    }
    seen = []
    assert bridge_gateway(by_hand, lambda name: seen.append(name) or "172.18.5.1") == "172.18.5.1"
    assert seen == ["docker0"]  # the bridge interface's own address comes first
    assert bridge_gateway(by_hand, no_interface) == "172.18.0.1"  # else the subnet's first host
    # an IPv6 entry first is passed over; a gateway given with a prefix length loses it
    dual = {
        "IPAM": {
            "Config": [
                {"Subnet": "fd00::/64"},
                {"Subnet": "10.9.0.0/24", "Gateway": "10.9.0.254/24"},
            ]
        }
    }
    assert bridge_gateway(dual, no_interface) == "10.9.0.254"


@pytest.fixture
def host_port(default_bridge_gateway: str):
    """(the default bridge's gateway, a port the host listens on there)."""
    import socket

    with socket.socket() as server:
        server.bind((default_bridge_gateway, 0))  # the host's side of the bridge only
        server.listen(8)
        yield default_bridge_gateway, server.getsockname()[1]


@pytest.mark.parametrize("network", ["none", "default"])
def test_the_job_s_docker_run_gives_the_network_the_input_asks_for(
    kit_image: str, tmp_path: Path, host_port: tuple[str, int], network: str
) -> None:
    from dlci.action.host.container import run_command

    cmd = run_command(
        image=kit_image,
        name=f"dlci-e2e-net-{uuid.uuid4().hex[:8]}",
        job="e2e-net",
        workspace=tmp_path,
        workdir=".",
        gpus="none",
        shm_size="",
        env_names=[],
        environ={},
        inner=["python", "-c", NET_PROBE, host_port[0], str(host_port[1])],
        uid=os.getuid(),
        gid=os.getgid(),
        network=network,
    )
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    if network == "none":
        assert seen == {"interfaces": ["lo"], "host_port": "ENETUNREACH"}
    else:  # the control: Docker's default network reaches the host
        assert "eth0" in seen["interfaces"] and seen["host_port"] == "connected"


def test_a_whole_job_with_network_none_runs_its_tests_with_no_network(
    kit_image: str, tmp_path: Path, host_port: tuple[str, int]
) -> None:
    from dlci.action.host.container import RunRequest, run

    ws = tmp_path / "ws"
    (ws / "tests").mkdir(parents=True)
    address, port = host_port
    (ws / "tests" / "test_net.py").write_text(
        "import errno, socket\n\n\n"
        "def test_the_job_has_no_network():\n"
        "    assert [name for _, name in socket.if_nameindex()] == ['lo']\n"
        "    try:\n"
        f"        socket.create_connection(({address!r}, {port}), timeout=10).close()\n"
        "    except OSError as exc:\n"
        "        assert exc.errno == errno.ENETUNREACH\n"
        "    else:\n"
        "        raise AssertionError('reached the host')\n"
    )
    inner = ["--out", "/workspace/dlci-artifacts", "--budget", "pr", "--hardware", "cpu"]
    inner += ["--install", "none", "--no-memorize", "--no-doctor", "--no-profile", "--no-doctest"]
    request = RunRequest(image=kit_image, workspace=str(ws), job="e2e-net", inner=inner)
    assert run(dataclasses.replace(request, network="none")) == 0
    record = json.loads((ws / "dlci-artifacts" / "run.json").read_text())
    assert record["verdict"] == "pass"
