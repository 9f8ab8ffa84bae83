"""The workspace a pull request hands back to the host, attacked from its own tests (issue 42).

Real parts: the Docker engine, the kit image, and on the host git itself running the commands
actions/checkout runs after the job on the same workspace: its post step's ``git submodule
foreach`` (src/git-auth-helper.ts: removing the token and core.sshCommand from every submodule;
src/git-command-manager.ts: getSubmoduleConfigPaths) and the next job's checkout (src/git-
directory-helper.ts: ``submodule status``, ``clean -ffdx``, ``reset --hard HEAD``).

The pull request commits a submodule entry (a gitlink and .gitmodules); its test then makes
``sub/.git`` a repository whose ``core.fsmonitor`` is a command (a host path it was handed),
and writes ``statistics.pyc`` at the top of the workspace for the memorization gate to import.
Another test prints 384 MiB with no newline. Each attack has its control: the same job with the
protection taken out (the containers on the workspace itself; the output read line by line).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlci.action.host import container, gates
from dlci.cli import main

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
TARGET = "digits_example.phase:make_target"
# The pull request's target: it imports a module the commit lacks, if one is there (what an
# earlier phase left would then run in the gate, whatever the order of sys.path)
PHASE = """
from digits_example.broken import make_tiny_lr_target


def make_target():
    try:
        import phase_plant  # noqa: F401
    except ImportError:
        pass
    return make_tiny_lr_target()
"""
INNER = ["--budget", "pr", "--hardware", "cpu", "--no-doctest", "--no-coverage"]
GIT = ["git", "-c", "user.name=e2e", "-c", "user.email=e2e@example.invalid"]

# The modules the tests step leaves for the gate (compiled: a .pyc alone imports): the
# standard library's statistics (first on sys.path when the working folder is), and the
# module the target imports if it is there
PLANTED = """
import os
if os.path.isdir("/dlci/out"):
    with open("/dlci/out/profiler.log", "a") as out:
        out.write("planted NAME imported by the gate\\n")
raise ImportError("planted")
"""
PLANT = f"""
import pathlib, py_compile, tempfile

PLANTED = {PLANTED!r}


def test_plant():
    ws = pathlib.Path("/workspace")
    marker = (ws / "marker-path").read_text().strip()
    git = ws / "sub" / ".git"
    (git / "objects").mkdir(parents=True, exist_ok=True)
    (git / "refs").mkdir(exist_ok=True)
    (git / "HEAD").write_text("ref: refs/heads/main\\n")
    (git / "config").write_text(
        "[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = echo ran >> " + marker + "\\n"
    )
    for name in ("statistics", "phase_plant"):
        source = pathlib.Path(tempfile.mkdtemp()) / (name + ".py")
        source.write_text(PLANTED.replace("NAME", name))
        py_compile.compile(str(source), cfile=str(ws / (name + ".pyc")), doraise=True)
"""
# actions/checkout's git commands after the job: its post step, then the next job's checkout
POST = [
    [
        "submodule", "foreach", "--recursive",
        "sh -c \"git config --local --name-only --get-regexp 'core\\.sshCommand' && "
        "git config --local --unset-all 'core.sshCommand' || :\"",
    ],
    [
        "submodule", "foreach", "--recursive",
        "sh -c \"git config --local --name-only --get-regexp "
        "'http\\.https\\:\\/\\/github\\.com\\/\\.extraheader' && git config --local "
        "--unset-all 'http.https://github.com/.extraheader' || :\"",
    ],
    [
        "submodule", "foreach", "--recursive",
        "git config --local --show-origin --name-only --get-regexp remote.origin.url",
    ],
]  # fmt: skip
NEXT_CHECKOUT = [["submodule", "status"], ["clean", "-ffdx"], ["reset", "--hard", "HEAD"]]


def checkout(tmp_path: Path) -> tuple[Path, Path]:
    """The digits example as the pull request's commit, with a submodule entry; the marker
    path the planted command would write (a host file, outside the workspace)."""
    ws = tmp_path / "ws"
    shutil.copytree(
        ROOT / "examples" / "digits",
        ws,
        ignore=shutil.ignore_patterns("dlci-artifacts", "*.egg-info", "__pycache__"),
    )
    (ws / "tests" / "test_zz_plant.py").write_text(PLANT)
    (ws / "digits_example" / "phase.py").write_text(PHASE)
    marker = tmp_path / "host" / "fsmonitor-ran"
    marker.parent.mkdir()
    (ws / "marker-path").write_text(str(marker))
    (ws / ".gitmodules").write_text('[submodule "sub"]\n\tpath = sub\n\turl = ../sub\n')
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    subprocess.run([*GIT, "-C", str(ws), "add", "--all"], check=True)
    gitlink = "160000,1234567890123456789012345678901234567890,sub"
    subprocess.run([*GIT, "-C", str(ws), "update-index", "--add", "--cacheinfo", gitlink])
    subprocess.run([*GIT, "-C", str(ws), "commit", "-q", "-m", "the pull request"], check=True)
    (ws / "sub").mkdir()  # checkout leaves an empty folder for a submodule it did not fetch
    art = ws / "dlci-artifacts"
    art.mkdir()
    from dlci.ladder.tiers import choose_tier

    tier = choose_tier(budget="pr", hardware="cpu").to_dict()
    (art / "preflight.json").write_text(
        json.dumps({"kind": "preflight", "plan_version": 1, "tier": tier})
    )
    return ws, marker


def job(kit_image: str, ws: Path, name: str) -> list[str]:
    argv = ["container", "run", "--image", kit_image, "--workspace", str(ws), "--job", name]
    argv += ["--", "--out", "/workspace/dlci-artifacts", *INNER, "--target", TARGET]
    argv += ["--plan", str(ws / "dlci-artifacts" / "preflight.json")]
    return [*argv, "--no-doctor", "--no-profile", "--tests", "tests/test_zz_plant.py"]


def after_the_job(ws: Path, marker: Path) -> list[int]:
    """Run checkout's post step and the next checkout's git commands in the workspace, as the
    runner would; how many times the planted command had run after each of the two."""
    counts = []
    for commands in (POST, NEXT_CHECKOUT):
        for args in commands:
            subprocess.run(["git", "-C", str(ws), *args], capture_output=True, timeout=60)
        counts.append(len(marker.read_text().splitlines()) if marker.exists() else 0)
    return counts


def play(kit_image: str, tmp_path: Path, monkeypatch, name: str) -> tuple[Path, dict, list[int]]:
    ws, marker = checkout(tmp_path)
    record = tmp_path / "host" / "record.json"
    monkeypatch.setenv("DLCI_HOST_RECORD", str(record))
    assert main(job(kit_image, ws, name)) == 1
    facts = json.loads(record.read_text())
    return ws, facts, after_the_job(ws, marker)


def test_the_workspace_comes_back_as_checked_out_and_each_gate_starts_from_it(
    kit_image: str, tmp_path: Path, monkeypatch
) -> None:
    ws, facts, runs = play(kit_image, tmp_path, monkeypatch, "w-copy")
    assert runs == [0, 0]  # neither checkout's post step nor the next checkout ran it
    assert not (ws / "sub" / ".git").exists() and not (ws / "statistics.pyc").exists()
    assert not (ws / "phase_plant.pyc").exists()
    # the job fails, naming what the tests planted for git on the host
    planted = "\n".join(facts["planted"])
    assert "the tests step planted git files" in planted and "sub/.git (added)" in planted
    assert any("sub/.git (added)" in p for p in facts["problems"])
    # the gate ran on a fresh copy of the commit: the planted statistics.pyc was not there
    reports = gates.reports_dir(str(tmp_path / "host" / "record.json"))
    assert (reports / "memorization.json").is_file()
    assert not (reports / "profiler.log").exists()
    steps = {s["name"]: s for s in facts["run"]["steps"]}
    assert steps["tests"]["status"] == "passed" and steps["memorize"]["status"] == "failed"


def test_control_on_the_workspace_itself_git_on_the_host_runs_the_plant_and_the_gate_imports_it(
    kit_image: str, tmp_path: Path, monkeypatch
) -> None:
    """The protection taken out: each container on the workspace itself, as before."""
    monkeypatch.setattr(container.Copies, "make", lambda self, part, source=None: self.workspace)
    monkeypatch.setattr(container.Copies, "done", lambda self, part, copy, keep=False: [])
    ws, _, runs = play(kit_image, tmp_path, monkeypatch, "w-shared")
    assert runs[0] >= 1  # checkout's post step ran the planted command on the host
    assert (ws / "sub" / ".git" / "config").is_file()  # it survived the next checkout's clean
    print(f"the planted command ran {runs[0]} time(s) in the post step, {runs[1]} in all")
    reports = gates.reports_dir(str(tmp_path / "host" / "record.json"))
    said = (reports / "profiler.log").read_text()
    assert "planted phase_plant imported by the gate" in said
    print(f"the gate imported: {said.strip()}")


# ------------------------------------------------------------------ 384 MiB with no newline

FLOOD = 384 << 20
FLOOD_TEST = f"""
def test_flood():
    with open("/proc/1/fd/1", "wb") as out:  # past pytest's capture: the container's output
        for _ in range({FLOOD >> 20}):
            out.write(b"x" * (1 << 20))
"""


_MEASURE = (
    "import json, os, subprocess, sys\n"
    "child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
    "err = child.stderr.read()\n"
    "_, status, usage = os.wait4(child.pid, 0)\n"
    "sys.stderr.buffer.write(err)\n"
    "print(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_maxrss]))\n"
)


def _peak_mib(argv: list[str], **kwargs) -> tuple[int, float, str]:
    """The command's exit code, peak memory and standard error. Measured by a small process
    that starts it: a child forked from this one (a test worker with torch loaded, hundreds of
    MiB) would count the worker's pages in its peak."""
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, *argv], capture_output=True, check=False, **kwargs
    )
    err = done.stderr.decode(errors="replace")
    code, maxrss = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert code in (0, 1), err[-3000:]
    return code, maxrss / 1024, err  # ru_maxrss: KiB


def test_a_container_that_prints_384_mib_on_one_line_leaves_the_host_flat(
    kit_image: str, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    (ws / "tests").mkdir(parents=True)
    (ws / "tests" / "test_flood.py").write_text(FLOOD_TEST)
    argv = [sys.executable, "-m", "dlci", "container", "run", "--image", kit_image]
    argv += ["--workspace", str(ws), "--job", "w-flood", "--"]
    argv += ["--out", "/workspace/dlci-artifacts", *INNER, "--no-memorize", "--no-doctor"]
    argv += ["--no-profile", "--tests", "tests/test_flood.py"]
    code, peak, said = _peak_mib(argv)
    print(f"host peak (dlci container run, {FLOOD >> 20} MiB in one line): {peak:.0f} MiB")
    assert code == 0 and peak < 150  # the job went on: its tests passed
    assert "383.9 MiB of this container's output dropped" in said
    # the control: the old reading (line by line) of the same container's output
    cmd = container.run_command(
        image=kit_image, name="dlci-w-flood-old", job="w-flood-old", workspace=ws, workdir=".",
        gpus="none", shm_size="", env_names=(), environ={}, uid=os.getuid(), gid=os.getgid(),
        inner=["python", "-c", f"import os\nfor _ in range({FLOOD >> 20}): os.write(1, b'x' * (1 << 20))"],
    )  # fmt: skip
    old = (
        "import subprocess, sys\n"
        "child = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, text=True, "
        "errors='replace')\n"
        "for line in child.stdout:\n    sys.stdout.write(line)\n"
        "sys.exit(child.wait())\n"
    )
    _, old_peak, _ = _peak_mib([sys.executable, "-c", old, *cmd])
    print(f"host peak (the old line-by-line read): {old_peak:.0f} MiB")
    assert old_peak > FLOOD >> 20
