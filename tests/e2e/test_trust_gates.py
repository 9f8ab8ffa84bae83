"""The gates' isolation and the container's workflow commands, attacked from the pull request.

The attacker is a test file in the user's repository (the bundled digits example): it runs in
the tests container before the gates. Real parts: the Docker engine and the kit image, driven
in-process through ``dlci container run`` as the action's step does (act adds a minute per run
and nothing to what is checked here; tests/e2e/test_action.py runs the whole action).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from dlci.action.host.container import run_command
from dlci.cli import main

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BROKEN = "digits_example.broken:make_tiny_lr_target"  # cannot memorize at the pr tier
FORGED = {"max_epochs": 99999, "max_loss": 100.0, "time_cap_minutes": 60.0}

# Rewrites every tier file it can reach, plants a passing memorization report, and a `dlci`
# package in the workspace root that would take over `python -m dlci` in a later step.
ATTACK = f"""
import json, os, pathlib

FORGED = {FORGED!r}


def forge(path):
    try:
        data = json.loads(path.read_text())
        tier = data["tier"] if isinstance(data.get("tier"), dict) else data
        tier.update(FORGED)
        path.write_text(json.dumps(data))
        return "rewritten"
    except Exception as exc:
        return type(exc).__name__


def test_attack():
    done = {{}}
    roots = [pathlib.Path("/workspace/dlci-artifacts"), pathlib.Path("/dlci")]
    for root in roots:
        for path in (root.rglob("*.json") if root.is_dir() else []):
            done[str(path)] = forge(path)
    art = pathlib.Path("/workspace/dlci-artifacts")
    fake = {{"schema_version": 1, "kind": "memorization", "verdict": "pass", "best_loss": 0.01,
            "threshold": 100.0, "tier": {{"budget": "pr", "hardware_class": "cpu", **FORGED}}}}
    (art / "memorization.json").write_text(json.dumps(fake))
    (art / "attack.json").write_text(json.dumps(done))
"""
# Code for the gates' containers, planted by the tests step in the shared workspace: a `dlci`
# package (``python -m dlci``), a `pip` package (``python -m pip`` in the install step), and
# the target's module rewritten to memorize by construction.
SHADOW = """
import pathlib


def test_shadow():
    for name in ("dlci", "pip"):
        pkg = pathlib.Path("/workspace") / name
        pkg.mkdir(exist_ok=True)
        code = "import pathlib\\npathlib.Path('/workspace/shadowed').write_text('imported')\\n"
        (pkg / "__init__.py").write_text(code + "raise SystemExit(0)\\n")
        (pkg / "__main__.py").write_text(code)
    target = pathlib.Path("/workspace/digits_example/broken.py")
    target.write_text(target.read_text() + "\\n# rewritten by the tests step\\n")
"""

COMMANDS = """
import os, pathlib


def test_commands():
    print(flush=True)  # after pytest's progress, each at the start of a line
    for line in ("::error::pwned", "::add-mask::x", "::set-output name=verdict::pass",
                 "::stop-commands::x", "::x::", "::error::after-resume-guess"):
        print(line, flush=True)
    seen = [open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
            for pid in os.listdir("/proc") if pid.isdigit()
            and os.path.exists(f"/proc/{pid}/cmdline")]
    seen += [f"{k}={v}" for k, v in os.environ.items()]
    pathlib.Path("/workspace/dlci-artifacts/seen.txt").write_text("\\n".join(seen))
"""


def digits(tmp_path: Path, tests: dict[str, str]) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(
        ROOT / "examples" / "digits",
        ws,
        ignore=shutil.ignore_patterns("dlci-artifacts", "*.egg-info", "__pycache__"),
    )
    for name, text in tests.items():
        (ws / "tests" / name).write_text(text)
    return ws


def host_preflight(ws: Path) -> Path:
    """What preflight writes on the host: the pr tier on the CPU, in the workspace."""
    from dlci.ladder.tiers import choose_tier

    tier = choose_tier(budget="pr", hardware="cpu").to_dict()
    art = ws / "dlci-artifacts"
    art.mkdir()
    path = art / "preflight.json"
    path.write_text(
        json.dumps(
            {"kind": "preflight", "passed": True, "gpu": False, "plan_version": 1, "tier": tier}
        )
    )
    return path


INNER = ["--budget", "pr", "--hardware", "cpu", "--no-doctest", "--no-coverage"]


def host_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the host keeps its record of the job (outside every container's reach)."""
    record = tmp_path / "host" / "record.json"
    record.parent.mkdir()
    monkeypatch.setenv("DLCI_HOST_RECORD", str(record))
    return record


def gate_job(
    kit_image: str, ws: Path, preflight: Path, job: str, attack: str, *extra: str
) -> list[str]:
    """`dlci container run` of the memorize gate on the broken target, after `attack`'s tests."""
    argv = ["container", "run", "--image", kit_image, "--workspace", str(ws), "--job", job]
    argv += ["--", "--out", "/workspace/dlci-artifacts", "--plan", str(preflight), *INNER]
    return [*argv, "--target", BROKEN, "--no-doctor", "--no-profile", "--tests", attack, *extra]


def test_a_test_that_forges_the_tier_and_the_report_cannot_pass_the_gate(
    kit_image: str, tmp_path: Path, monkeypatch
) -> None:
    ws = digits(tmp_path, {"test_zz_attack.py": ATTACK})
    preflight = host_preflight(ws)
    record = host_record(tmp_path, monkeypatch)
    argv = gate_job(kit_image, ws, preflight, "g-tier", "tests/test_zz_attack.py")
    assert main(argv) == 1
    # the attack ran: it rewrote its copy's tier file and could not touch the host's
    done = json.loads((ws / "dlci-artifacts" / "attack.json").read_text())
    assert done["/workspace/dlci-artifacts/preflight.json"] == "rewritten"
    assert done["/dlci/host/plan.json"] == "OSError"  # read-only
    assert json.loads(preflight.read_text())["tier"]["max_loss"] != 100.0  # its own copy only
    # the gate used the host's tier, in its own container, and its report replaced the fake
    report = json.loads((ws / "dlci-artifacts" / "memorization.json").read_text())
    assert report["verdict"] == "fail" and report["threshold"] != 100.0
    assert report["tier"]["max_epochs"] != 99999
    assert not (ws / "shadowed").exists()  # the planted dlci/ package was never imported
    steps = {
        s["name"]: s for s in json.loads((ws / "dlci-artifacts" / "run.json").read_text())["steps"]
    }
    assert steps["tests"]["status"] == "passed" and steps["memorize"]["status"] == "failed"
    assert steps["memorize"]["isolated"] is True
    # the summary takes the tier from the host's record, not the rewritten file
    md = tmp_path / "summary.md"
    argv = ["summary", "--artifacts", str(ws / "dlci-artifacts"), "--markdown", str(md)]
    assert main([*argv, "--host-record", str(record)]) == 1
    text = md.read_text()
    assert "| tier | pr on cpu: up to 1000 epochs to loss at or below 30% of its start" in text
    assert "- step memorize failed" in text
    assert "| verified by the host | the tier (read-only in every container); " in text
    assert "memorization.json from the isolated step directories of memorize" in text


def test_control_the_same_attack_passes_the_gate_in_one_shared_container(
    kit_image: str, tmp_path: Path
) -> None:
    """The old flow (one container, the tier read from the workspace): the attack works."""
    ws = digits(tmp_path, {"test_zz_attack.py": ATTACK + SHADOW})
    host_preflight(ws)
    inner = ["dlci", "run", "--out", "/workspace/dlci-artifacts", *INNER, "--target", BROKEN]
    inner += ["--plan", "/workspace/dlci-artifacts/preflight.json", "--phase", "all"]
    inner += ["--no-doctor", "--no-profile", "--tests", "tests/test_zz_attack.py"]
    cmd = run_command(
        image=kit_image, name="dlci-g-old", job="g-old", workspace=ws, workdir=".",
        gpus="none", shm_size="", env_names=(), environ={}, inner=inner,
        uid=os.getuid(), gid=os.getgid(),
    )  # fmt: skip
    subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    report = json.loads((ws / "dlci-artifacts" / "memorization.json").read_text())
    # the forged tier reached the gate (since issue 28 its loose max_loss alone cannot pass a
    # loss that never fell: the built-in half-way rule holds under any tier)
    assert report["threshold"] == 100.0 and report["tier"]["max_epochs"] == 99999
    # and `python -m dlci` from the workspace runs the planted package
    probe = [*cmd[: cmd.index(kit_image) + 1], "python", "-m", "dlci", "--version"]
    subprocess.run(probe, capture_output=True, timeout=120)
    assert (ws / "shadowed").read_text() == "imported"


def commands_seen(lines: list[str]) -> list[str]:
    """The workflow commands a runner would act on (GitHub's and act's rule, stop-commands
    included): every ``::name ...::`` line unless commands are stopped by a token."""
    seen, resume = [], ""
    for line in lines:
        match = re.match(r"^::([^ :]+)( [^:]*)?::(.*)$", line)
        if not match:
            continue
        name, arg = match.group(1), match.group(3)
        if resume and name != resume:
            continue
        if name == "stop-commands":
            resume = arg
        elif resume and name == resume:
            resume = ""
        seen.append(line)
    return seen


def test_the_containers_output_cannot_issue_workflow_commands(
    kit_image: str, tmp_path: Path, capsys
) -> None:
    ws = digits(tmp_path, {"test_zz_commands.py": COMMANDS})
    argv = ["container", "run", "--image", kit_image, "--workspace", str(ws), "--job", "g-cmd"]
    argv += [
        "--",
        "--out",
        "/workspace/dlci-artifacts",
        *INNER,
        "--tests",
        "tests/test_zz_commands.py",
    ]
    argv += ["--pytest-args=-s", "--no-memorize", "--no-doctor", "--no-profile"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "::error::pwned" in lines and "::set-output name=verdict::pass" in lines
    acted = commands_seen(lines)
    tokens = [line.split("::")[2] for line in acted if line.startswith("::stop-commands::")]
    assert len(tokens) == 2 and len(set(tokens)) == 2  # the install's container, the tests'
    assert all(re.fullmatch(r"[0-9a-f]{32}", token) for token in tokens)
    assert acted == [f"::stop-commands::{tokens[0]}", f"::{tokens[0]}::",
                     f"::stop-commands::{tokens[1]}", f"::{tokens[1]}::"]  # fmt: skip
    assert lines[-1] == f"::{tokens[1]}::"  # nothing the container printed comes after it
    seen = (ws / "dlci-artifacts" / "seen.txt").read_text()
    assert all(token not in seen for token in tokens)  # not in its argv or environment
    # control: the same output without the host's markers would be acted on
    raw = [line for line in lines if not any(token in line for token in tokens)]
    assert {"::error::pwned", "::add-mask::x", "::set-output name=verdict::pass"} <= set(
        commands_seen(raw)
    )


# The gate's install step (code of the pull request, run in the memorize container): it
# leaves links to host files, a FIFO and a .pth in its report folder, and replaces the
# workspace's dlci-artifacts by a link to a host folder (the host's paths are in
# /proc/self/mountinfo; here the test hands them over in files of the workspace).
PLANT = """if [ -d /dlci/out ]; then
  mkdir -p /dlci/out/leak /dlci/out/tensorboard/run
  ln -s /proc/self/environ /dlci/out/leak/env
  ln -s "$(cat /workspace/secret-path)" /dlci/out/tensorboard/run/config.json
  ln -s "$(cat /workspace/secret-path)" /dlci/out/doctor.md
  mkfifo /dlci/out/utilization.json
  printf 'import os\\n' > /dlci/out/evil.pth
  rm -rf /workspace/dlci-artifacts
  ln -s "$(cat /workspace/victim-path)" /workspace/dlci-artifacts
fi
python -m pip install --no-build-isolation --quiet -e ."""
CANARY = "host-secret-canary-e2e-5a1c"
OK_TEST = "def test_ok():\n    assert True\n"


def _text_under(*folders: Path) -> str:
    found = [
        path.read_bytes().decode(errors="replace")
        for folder in folders
        for path in folder.rglob("*")
        if path.is_file() and not path.is_symlink()
    ]
    return "\n".join(found)


def test_a_gate_cannot_make_the_host_copy_or_write_through_links(
    kit_image: str, tmp_path: Path, monkeypatch
) -> None:
    import dlci.action.host.gates as gates
    from dlci.action.host import installed

    ws = digits(tmp_path, {"test_zz_ok.py": OK_TEST})
    preflight = host_preflight(ws)
    secret = tmp_path / "host-home" / ".docker" / "config.json"
    secret.parent.mkdir(parents=True)
    secret.write_text(json.dumps({"auths": {"ghcr.io": {"auth": CANARY}}}))
    victim = tmp_path / "host-venv" / "site-packages"
    victim.mkdir(parents=True)
    (ws / "secret-path").write_text(str(secret))
    (ws / "victim-path").write_text(str(victim))
    record = host_record(tmp_path, monkeypatch)
    raw = tmp_path / "raw"  # for the control: the gate's folder as its container left it
    collect = gates.Parts.collect

    def keep_raw(self: gates.Parts, part: gates.Part, code: int, copy=None) -> None:
        if part.out is not None:
            shutil.copytree(
                part.out,
                raw / part.name,
                symlinks=True,
                ignore_dangling_symlinks=True,
                ignore=shutil.ignore_patterns("utilization.json"),
            )  # the FIFO
        if copy is not None and part.name == "memorize":  # its copy of the checkout
            raw.mkdir(exist_ok=True)
            (raw / "swapped").write_text(str((copy / "dlci-artifacts").is_symlink()))
        collect(self, part, code, copy)

    monkeypatch.setattr(gates.Parts, "collect", keep_raw)
    # the install in every part (as when the install container cannot be kept as an image):
    # the plant then runs in the gate's own container, with its report folder mounted
    monkeypatch.setattr(installed, "commit", lambda *a: (None, 0.0, "refused by the test"))
    argv = ["container", "run", "--image", kit_image, "--workspace", str(ws), "--job", "g-files"]
    argv += ["--", "--out", "/workspace/dlci-artifacts", "--plan", str(preflight), *INNER]
    argv += ["--target", BROKEN, "--no-doctor", "--no-profile", "--tests", "tests/test_zz_ok.py"]
    argv += ["--install", PLANT]
    started = time.monotonic()
    assert main(argv) == 1  # the broken target fails memorization; the host did not hang
    print(f"gate file attack: {time.monotonic() - started:.1f} s")
    assert (raw / "memorize" / "leak" / "env").is_symlink()  # the attack ran in the gate
    assert (raw / "install" / "leak" / "env").is_symlink()  # and in the install's container,
    assert not (gates.reports_dir(str(record)) / "leak").exists()  # whose run.json alone counts
    assert (raw / "swapped").read_text() == "True"  # in the gate's own copy of the checkout
    assert not (ws / "dlci-artifacts").is_symlink()  # the workspace is never a container's
    assert list(victim.iterdir()) == []  # nothing written through the swapped folder
    host_env = Path("/proc/self/environ").read_bytes().split(b"\0")[0].decode()
    reports = gates.reports_dir(str(record))
    assert (reports / "memorization.json").is_file()
    kept = _text_under(reports)
    assert CANARY not in kept and host_env not in kept
    facts = json.loads(record.read_text())
    said = "\n".join(facts["problems"])
    for name in (
        "doctor.md: is a symbolic link",
        "utilization.json: not a regular file",
        "tensorboard/run/config.json: is a symbolic link",
    ):
        assert name in said
    # the summary fails the job and hands the upload its own folder of regular files
    md = tmp_path / "summary.md"
    out = tmp_path / "outputs"
    monkeypatch.setenv("GITHUB_OUTPUT", str(out))
    argv = ["summary", "--artifacts", str(ws / "dlci-artifacts"), "--markdown", str(md)]
    assert main([*argv, "--host-record", str(record), "--artifact-prefix", "dlci"]) == 1
    found = re.search(r"^artifacts-dir=(.*)$", out.read_text(), re.MULTILINE)
    assert found is not None
    upload = Path(found.group(1))
    assert upload.parent.parent == record.parent and upload.is_dir()
    assert not any(p.is_symlink() for p in upload.rglob("*"))
    assert "evil.pth" not in {p.name for p in upload.rglob("*")}
    uploaded = _text_under(upload)
    assert CANARY not in uploaded and host_env not in uploaded
    # the control: the old handling of the same folder (copytree symlinks=True, then False
    # into the workspace's artifacts) copies the host's files, and writes through the link
    shutil.copytree(raw / "memorize" / "leak", tmp_path / "old" / "leak", symlinks=False)
    shutil.copytree(raw / "memorize" / "tensorboard", tmp_path / "old" / "tb", symlinks=False)
    assert host_env in _text_under(tmp_path / "old" / "leak")
    assert CANARY in _text_under(tmp_path / "old" / "tb")
    # and, on a workspace the containers shared, the write through the swapped folder
    (tmp_path / "old" / "dlci-artifacts").symlink_to(victim)
    shutil.copyfile(raw / "memorize" / "evil.pth", tmp_path / "old" / "dlci-artifacts" / "evil.pth")
    assert (victim / "evil.pth").read_text() == "import os\n"


def test_code_the_tests_step_plants_for_the_gates_stops_them(
    kit_image: str, tmp_path: Path, monkeypatch
) -> None:
    ws = digits(tmp_path, {"test_zz_shadow.py": SHADOW})
    preflight = host_preflight(ws)
    record = host_record(tmp_path, monkeypatch)
    argv = gate_job(kit_image, ws, preflight, "g-shadow", "tests/test_zz_shadow.py")
    assert main(argv) == 1  # the broken target fails memorization, on the commit's code
    assert not (ws / "shadowed").exists()  # no gate ran the planted code
    assert not (ws / "pip").exists() and not (ws / "dlci").exists()  # nor did it come back
    assert "rewritten" not in (ws / "digits_example" / "broken.py").read_text()
    steps = {s["name"]: s for s in json.loads(record.read_text())["run"]["steps"]}
    # the gate ran, on a fresh copy of the checkout: the tests' plants were not in it
    assert steps["tests"]["status"] == "passed" and steps["memorize"]["status"] == "failed"
    # the control: the plant is real, and on a workspace the containers share, `python -m
    # pip` from it runs the plant
    base = dict(
        image=kit_image, workspace=ws, workdir=".", gpus="none", shm_size="", env_names=(),
        environ={}, uid=os.getuid(), gid=os.getgid(),
    )  # fmt: skip
    plant = ["python", "-c", SHADOW + "\ntest_shadow()\n"]
    cmd = run_command(name="dlci-g-shadow-plant", job="g-shadow-old", inner=plant, **base)
    subprocess.run(cmd, capture_output=True, timeout=120, check=True)
    probe = ["python", "-m", "pip", "-V"]
    cmd = run_command(name="dlci-g-shadow-old", job="g-shadow-old", inner=probe, **base)
    subprocess.run(cmd, capture_output=True, timeout=120)
    assert (ws / "shadowed").read_text() == "imported"
