"""The container's view, attacked from inside the pull request's code (a test file it adds).

Each test runs ``dlci container run`` in-process against the real Docker engine and the kit
image, with a test file that plays the attacker and records what it found in the workspace;
each has a control that runs the same probe without the protection, so the test can fail:

- the job token that actions/checkout leaves in ``.git/config`` (an ``extraheader``);
- the cache: a pull request plants a file that a later trusted job would read;
- the IPC namespace: the host's, or the container's own;
- a setuid binary in an image the pull request built: root, or not.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlci.cli import main

pytestmark = pytest.mark.e2e

BASE = ["--budget", "pr", "--hardware", "cpu", "--install", "none", "--no-doctest"]
BASE += ["--no-coverage", "--no-memorize", "--no-doctor", "--no-profile"]
FAKE = "ghs_e2eFAKEtoken4242"
BASIC = "eC1hY2Nlc3MtdG9rZW46Z2hzX2UyZUZBS0V0b2tlbjQyNDI="  # pragma: allowlist secret (x-access-token:FAKE, base64)
# what actions/checkout adds to the repository's .git/config with persist-credentials
CHECKOUT = f"""[remote "origin"]
\turl = https://github.com/org/repo
[http "https://github.com/"]
\textraheader = AUTHORIZATION: basic {BASIC}
"""

# The attacker: reads everything it can for the token. Its needles are written reversed, so
# the probe does not find itself.
TOKEN_PROBE = f"""
import json, os, subprocess, sys

NEEDLES = [{BASIC[::-1]!r}[::-1].encode(), {FAKE[::-1]!r}[::-1].encode()]
ROOTS = ["/workspace", "/tmp", os.path.expanduser("~"), "/run", "/etc", "/opt/dlci/etc"]
SINGLE = ["/proc/self/environ", "/proc/1/environ", "/proc/self/cmdline", "/proc/self/mountinfo"]


def probe(out):
    hits, files = [], 0
    paths = [os.path.join(d, n) for r in ROOTS for d, _, ns in os.walk(r) for n in ns]
    for path in paths + SINGLE:
        try:
            with open(path, "rb") as handle:
                data = handle.read(1 << 24)
        except OSError:
            continue
        files += 1
        hits += [path for needle in NEEDLES if needle in data]
    git = subprocess.run(["git", "-C", "/workspace", "config", "--list", "--show-origin"],
                         capture_output=True)
    hits += ["git config" for needle in NEEDLES if needle in git.stdout + git.stderr]
    with open(out, "w") as handle:
        json.dump({{"hits": hits, "files": files}}, handle)


def test_probe():
    probe("/workspace/dlci-artifacts/probe.json")


if __name__ == "__main__":
    probe(sys.argv[1])
"""
PLANT = """
from pathlib import Path

def test_plant():
    poison = Path.home() / ".cache" / "pip" / "wheels" / "dlci-poison.txt"
    poison.parent.mkdir(parents=True, exist_ok=True)
    poison.write_text("planted by a pull request")
"""
LOOK = """
import json
from pathlib import Path

def test_look():
    poison = Path.home() / ".cache" / "pip" / "wheels" / "dlci-poison.txt"
    Path("/workspace/dlci-artifacts/look.json").write_text(json.dumps(poison.exists()))
"""
IPC_PROBE = """
import json, os
from pathlib import Path

def test_ipc():
    shm = os.statvfs("/dev/shm")
    seen = {"ipc": os.readlink("/proc/self/ns/ipc"), "shm": shm.f_blocks * shm.f_frsize}
    Path("/workspace/dlci-artifacts/ipc.json").write_text(json.dumps(seen))
"""
SUID_PROBE = """
import subprocess
from pathlib import Path

def test_suid():
    euid = subprocess.run(["/usr/local/bin/suid-id", "-u"], capture_output=True, text=True)
    Path("/workspace/dlci-artifacts/euid.txt").write_text(euid.stdout.strip())
"""


def workspace(tmp_path: Path, name: str, test_file: str) -> Path:
    ws = tmp_path / name
    (ws / "tests").mkdir(parents=True)
    (ws / "tests" / "test_attack.py").write_text(test_file)
    return ws


def job(image: str, ws: Path, name: str, *options: str) -> int:
    argv = ["container", "run", "--image", image, "--workspace", str(ws), "--job", name]
    return main([*argv, *options, "--", "--out", "/workspace/dlci-artifacts", *BASE])


def artifact(ws: Path, name: str) -> object:
    return json.loads((ws / "dlci-artifacts" / name).read_text())


@pytest.fixture
def cache(docker_engine: str) -> Iterator[str]:
    """A cache-volume prefix of this test's own; its volumes are removed afterwards."""
    prefix = f"dlci-e2e-{uuid.uuid4().hex[:10]}"
    yield prefix
    volumes = [f"{prefix}-trusted", f"{prefix}-untrusted"]
    subprocess.run([docker_engine, "volume", "rm", "-f", *volumes], capture_output=True)


def test_the_checkout_token_never_reaches_the_container(
    kit_image: str, cache: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request")
    monkeypatch.setenv("GITHUB_TOKEN", FAKE)  # a secret in the job's environment, too
    ws = workspace(tmp_path, "ws", TOKEN_PROBE)
    subprocess.run(["git", "init", "-q", str(ws)], check=True)  # a real repository, as checked out
    with (ws / ".git" / "config").open("a") as config:
        config.write(CHECKOUT)
    assert job(kit_image, ws, f"t-token-{cache}", "--cache-volume", cache) == 0
    err = capsys.readouterr().err
    assert "credentials in .git/config hidden from the container: 1 extraheader" in err
    found = artifact(ws, "probe.json")
    assert isinstance(found, dict) and found["files"] > 100  # it did read the filesystem
    assert found["hits"] == []
    assert BASIC in (ws / ".git" / "config").read_text()  # the host's file is untouched

    # the control: the same probe, the workspace mounted as it was before (no sanitised view)
    user = f"{os.getuid()}:{os.getgid()}"
    probe = ["python", "/workspace/tests/test_attack.py", "/workspace/dlci-artifacts/control.json"]
    subprocess.run(
        ["docker", "run", "--rm", "--user", user, "-v", f"{ws}:/workspace", kit_image, *probe],
        capture_output=True,
        check=True,
        timeout=120,
    )
    control = artifact(ws, "control.json")
    assert isinstance(control, dict)
    assert "/workspace/.git/config" in control["hits"] and "git config" in control["hits"]


def test_a_pull_request_cannot_poison_the_trusted_cache(
    docker_engine: str, kit_image: str, cache: str, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request")
    planter = workspace(tmp_path, "planter", PLANT)
    assert job(kit_image, planter, f"t-plant-{cache}", "--cache-volume", cache) == 0
    assert (planter / "dlci-artifacts" / "run.json").exists()

    monkeypatch.setenv("GITHUB_EVENT_NAME", "push")  # a later push to main: trusted
    monkeypatch.setenv("GITHUB_REF", "refs/heads/main")
    monkeypatch.setenv("DLCI_DEFAULT_BRANCH", "main")
    trusted = workspace(tmp_path, "trusted", LOOK)
    assert job(kit_image, trusted, f"t-look-{cache}", "--cache-volume", cache) == 0
    assert artifact(trusted, "look.json") is False

    # the control: another pull request shares the untrusted cache, and finds the file
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request")
    other = workspace(tmp_path, "other", LOOK)
    assert job(kit_image, other, f"t-look2-{cache}", "--cache-volume", cache) == 0
    assert artifact(other, "look.json") is True

    for trust in ("trusted", "untrusted"):  # the labels the runner's prune hook goes by
        labels = json.loads(
            subprocess.run(
                [
                    docker_engine,
                    "volume",
                    "inspect",
                    "--format={{json .Labels}}",
                    cache + "-" + trust,
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        assert labels["dlci.cache"] == trust and int(labels["dlci.cache.created"]) > 0


def test_the_container_has_its_own_ipc_namespace(
    kit_image: str, cache: str, tmp_path: Path
) -> None:
    host = os.readlink("/proc/self/ns/ipc")
    ws = workspace(tmp_path, "private", IPC_PROBE)
    assert job(kit_image, ws, f"t-ipc-{cache}", "--cache-volume", cache) == 0
    seen = artifact(ws, "ipc.json")
    assert isinstance(seen, dict) and seen["ipc"] != host
    assert seen["shm"] == 2 << 30  # the 2g default, not Docker's 64 MB

    # the control: asked for the host's namespace, the same probe sees it
    ws = workspace(tmp_path, "host", IPC_PROBE)
    assert job(kit_image, ws, f"t-ipch-{cache}", "--cache-volume", cache, "--ipc", "host") == 0
    seen = artifact(ws, "ipc.json")
    assert isinstance(seen, dict) and seen["ipc"] == host


@pytest.fixture
def suid_image(docker_engine: str, kit_image: str) -> Iterator[str]:
    """The kit image with a setuid-root ``id``: what a pull request's Dockerfile could add."""
    tag = f"dlci-e2e-suid:{uuid.uuid4().hex[:10]}"
    dockerfile = f"FROM {kit_image}\nUSER 0\n"
    dockerfile += "RUN cp /usr/bin/id /usr/local/bin/suid-id && chmod 4755 /usr/local/bin/suid-id\n"
    dockerfile += "USER dlci\n"
    subprocess.run(
        [docker_engine, "build", "--network", "none", "-q", "-t", tag, "-"],
        input=dockerfile,
        text=True,
        capture_output=True,
        check=True,
        timeout=300,
    )
    yield tag
    subprocess.run([docker_engine, "rmi", "-f", tag], capture_output=True)


def test_a_setuid_binary_does_not_make_the_job_root(
    suid_image: str, cache: str, tmp_path: Path, monkeypatch
) -> None:
    ws = workspace(tmp_path, "suid", SUID_PROBE)
    ws.chmod(0o777)  # the runner's user here is root: the job runs as another uid
    monkeypatch.setattr(os, "getuid", lambda: 12345)
    monkeypatch.setattr(os, "getgid", lambda: 12345)
    assert job(suid_image, ws, f"t-suid-{cache}", "--cache-volume", cache) == 0
    assert (ws / "dlci-artifacts" / "euid.txt").read_text() == "12345"
    monkeypatch.undo()

    # the control: the same binary in a container without no-new-privileges is root
    done = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--user",
            "12345:12345",
            suid_image,
            "/usr/local/bin/suid-id",
            "-u",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert done.stdout.strip() == "0"


# The attacker moves .git away, so that the next container's cover over .git/config lands on
# a new empty path and the real config (with the token) sits at .gitx/config.
MOVE_GIT = """
import errno, json, os
from pathlib import Path

def test_move():
    found = {}
    for name, act in (("rename", lambda: os.rename("/workspace/.git", "/workspace/.gitx")),
                      ("write", lambda: Path("/workspace/.git/HEAD").write_text("x"))):
        try:
            act()
            found[name] = "done"
        except OSError as exc:
            found[name] = errno.errorcode.get(exc.errno, str(exc.errno))
    Path("/workspace/dlci-artifacts/move.json").write_text(json.dumps(found))
"""


def test_moving_git_away_does_not_uncover_the_token(
    kit_image: str, cache: str, tmp_path: Path, capsys
) -> None:
    ws = workspace(tmp_path, "move", MOVE_GIT)
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    with (ws / ".git" / "config").open("a") as config:
        config.write(CHECKOUT)
    assert job(kit_image, ws, f"t-move-{cache}", "--cache-volume", cache) == 0
    assert artifact(ws, "move.json") == {"rename": "EBUSY", "write": "EROFS"}
    assert (ws / ".git" / "config").is_file() and not (ws / ".gitx").exists()
    # the next job on the same workspace still finds no token
    (ws / "tests" / "test_attack.py").write_text(TOKEN_PROBE)
    assert job(kit_image, ws, f"t-move2-{cache}", "--cache-volume", cache) == 0
    found = artifact(ws, "probe.json")
    assert isinstance(found, dict) and found["hits"] == []

    # the control: the flags before .git had a mount of its own (the workspace and the cover
    # only): the move succeeds, and the next container reads the token at .gitx/config
    from dlci.action.host.container import _identity, check_hidden
    from dlci.errors import DlciError

    pins = {".git/config": _identity(ws / ".git" / "config")}
    cover = tmp_path / "cover"
    cover.write_text("")
    user = f"{os.getuid()}:{os.getgid()}"
    old = ["docker", "run", "--rm", "--user", user, "-v", f"{ws}:/workspace"]
    old += ["-v", f"{cover}:/workspace/.git/config:ro", kit_image]
    mover = [*old, "python", "/workspace/tests/test_move.py"]
    (ws / "tests" / "test_move.py").write_text(MOVE_GIT + "\ntest_move()\n")
    subprocess.run(mover, capture_output=True, check=True, timeout=120)
    moved = artifact(ws, "move.json")
    assert isinstance(moved, dict) and moved["rename"] == "done"
    reader = [*old, "cat", "/workspace/.gitx/config"]
    seen = subprocess.run(reader, capture_output=True, text=True, check=True, timeout=120)
    assert BASIC in seen.stdout
    # and the host's check before each container would have stopped the next one
    with pytest.raises(DlciError, match="moved or replaced"):
        check_hidden(ws, pins)


# ------------------------------------------------- the host's services and the runner's share


def bridge_gateway(docker: str, image: str) -> str:
    """The default bridge's gateway as a container sees it, its default route (read from a
    container of the bridge: this engine's IPAM config names no gateway)."""
    route = subprocess.run(
        [docker, "run", "--rm", image, "cat", "/proc/net/route"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.splitlines()
    hexed = next(line.split()[2] for line in route[1:] if line.split()[1] == "00000000")
    return ".".join(str(b) for b in reversed(bytes.fromhex(hexed)))


# The attacker: fetches what the runner's host serves on the docker bridge's gateway (its own
# default route), and reads the limits of its cgroup.
BRIDGE_PROBE = """
import json, urllib.request
from pathlib import Path

def first(*paths):
    for path in paths:
        try:
            return Path(path).read_text().strip()
        except OSError:
            pass
    return None

def test_bridge():
    try:
        got = urllib.request.urlopen("http://{host}:{port}/", timeout=5).read().decode()
    except OSError as exc:
        got = "refused: " + type(exc).__name__ + ": " + str(exc)
    seen = {{
        "got": got,
        "memory": first("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        "pids": first("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"),
    }}
    Path("/workspace/dlci-artifacts/bridge.json").write_text(json.dumps(seen))
"""
SERVED = "a runner host's service on the bridge"


@pytest.fixture(scope="module")
def bridge_jobs(
    docker_engine: str, kit_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, dict[str, object]]]:
    """One pull request's job and one trusted job (the control), both with the ``network``
    input's default, against an HTTP service on the bridge's gateway address of this engine."""
    import http.server
    import threading

    gateway = bridge_gateway(docker_engine, kit_image)

    class Serve(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = SERVED.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((gateway, 0), Serve)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    prefix = f"dlci-e2e-{uuid.uuid4().hex[:10]}"
    probe = BRIDGE_PROBE.format(host=gateway, port=server.server_address[1])
    seen: dict[str, dict[str, object]] = {}
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.delenv("DLCI_NETWORK", raising=False)
            patch.setenv("GITHUB_REF", "refs/heads/main")
            patch.setenv("DLCI_DEFAULT_BRANCH", "main")
            for event in ("pull_request", "push"):
                patch.setenv("GITHUB_EVENT_NAME", event)
                ws = workspace(tmp_path_factory.mktemp(event), "ws", probe)
                assert (
                    job(kit_image, ws, f"t-bridge-{event}-{prefix}", "--cache-volume", prefix) == 0
                )
                found = artifact(ws, "bridge.json")
                assert isinstance(found, dict)
                seen[event] = found
        yield seen
    finally:
        server.shutdown()
        volumes = [f"{prefix}-trusted", f"{prefix}-untrusted"]
        subprocess.run([docker_engine, "volume", "rm", "-f", *volumes], capture_output=True)


def test_control_a_trusted_job_reaches_the_hosts_service_on_the_bridge(bridge_jobs) -> None:
    assert bridge_jobs["push"]["got"] == SERVED  # the probe works; trusted jobs keep the bridge


def test_a_pull_requests_container_cannot_reach_the_hosts_services(bridge_jobs) -> None:
    assert str(bridge_jobs["pull_request"]["got"]).startswith("refused: ")


def test_a_pull_request_runs_under_memory_and_pids_limits(bridge_jobs) -> None:
    pr, trusted = bridge_jobs["pull_request"], bridge_jobs["push"]
    assert pr["pids"] == "8192" and trusted["pids"] == "32768"
    total = next(
        int(line.split()[1]) * 1024
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    assert int(str(pr["memory"])) == (int(total // 1024 * 0.75) // 1024) << 20
    # the control: a trusted job has no memory limit (cgroup v1: a huge number; v2: "max")
    assert trusted["memory"] == "max" or int(str(trusted["memory"])) > total
