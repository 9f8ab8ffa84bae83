"""``dlci preflight``: the fork guard, the tier, and the Docker checks with clear messages.

The Docker checks here run against stand-in ``docker`` executables (real processes that
print what a broken engine prints), because each broken state cannot be produced on one
machine; tests/e2e/ checks the real engine.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from dlci.action.host.output import explain_docker_run_failure
from dlci.action.host.preflight import check_docker, fork_guard
from dlci.cli import main
from dlci.errors import DlciError


def event(tmp_path: Path, head: str | None, base: str = "org/repo") -> dict[str, str]:
    payload = {
        "pull_request": {"head": {"repo": {"full_name": head} if head else None}},
        "repository": {"full_name": base},
    }
    path = tmp_path / "event.json"
    path.write_text(json.dumps(payload))
    return {
        "GITHUB_EVENT_NAME": "pull_request",
        "GITHUB_EVENT_PATH": str(path),
        "GITHUB_REPOSITORY": base,
        "RUNNER_ENVIRONMENT": "self-hosted",
    }


def test_a_fork_pull_request_is_refused_on_a_self_hosted_runner(tmp_path: Path) -> None:
    with pytest.raises(DlciError) as info:
        fork_guard(event(tmp_path, "mallory/repo"))
    assert "refusing to run a pull request from a fork (mallory/repo)" in info.value.message
    assert "allow-fork-prs: true" in info.value.hint
    assert "docs/security.md" in info.value.hint


def test_a_deleted_fork_counts_as_a_fork(tmp_path: Path) -> None:
    with pytest.raises(DlciError, match="a deleted fork"):
        fork_guard(event(tmp_path, None))


@pytest.mark.parametrize(
    ("head", "extra", "allow"),
    [
        ("org/repo", {}, False),  # a branch of the same repository
        ("mallory/repo", {"RUNNER_ENVIRONMENT": "github-hosted"}, False),  # not our machine
        ("mallory/repo", {}, True),  # allowed by the workflow
        ("mallory/repo", {"GITHUB_EVENT_NAME": "push"}, False),  # not a pull request
    ],
)
def test_what_the_guard_lets_through(tmp_path: Path, head, extra, allow) -> None:
    env = {**event(tmp_path, head), **extra}
    decision = fork_guard(env, allow=allow)
    assert decision["allowed"] is True


def test_preflight_writes_its_report_and_outputs(tmp_path: Path, monkeypatch, capsys) -> None:
    outputs = tmp_path / "out.txt"
    monkeypatch.setenv("GITHUB_OUTPUT", str(outputs))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    code = main(
        ["preflight", "--no-docker", "--budget", "pr", "--hardware", "cpu", "--out", str(tmp_path)]
    )
    assert code == 0
    report = json.loads((tmp_path / "preflight.json").read_text())
    assert report["passed"] is True and report["gpu"] is False
    assert report["tier"]["hardware_class"] == "cpu"
    text = outputs.read_text()
    assert "hardware-class=cpu" in text and "gpu=false" in text and "budget=pr" in text
    assert "preflight: pr tier on cpu (CPU path)" in capsys.readouterr().out


def test_a_refused_preflight_still_writes_its_report(tmp_path: Path, monkeypatch, capsys) -> None:
    for key, value in event(tmp_path, "mallory/repo").items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("DLCI_ALLOW_FORK_PRS", raising=False)
    assert main(["preflight", "--no-docker", "--out", str(tmp_path)]) == 1
    report = json.loads((tmp_path / "preflight.json").read_text())
    assert report["passed"] is False
    assert "refusing to run a pull request from a fork" in report["error"]["message"]
    assert "refusing" in capsys.readouterr().err
    monkeypatch.setenv("DLCI_ALLOW_FORK_PRS", "true")
    assert main(["preflight", "--no-docker", "--hardware", "cpu", "--out", str(tmp_path)]) == 0


def test_preflight_never_takes_the_torch_probe(tmp_path: Path, capsys) -> None:
    assert main(["preflight", "--no-docker", "--probes", "nvml,torch", "--out", str(tmp_path)]) == 1
    assert "never imports torch" in capsys.readouterr().err


# ---------------------------------------------------------------------------- docker


def test_docker_engine_down(fake_docker) -> None:
    fake_docker(
        "sys.stderr.write('Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
        "Is the docker daemon running?\\n'); sys.exit(1)"
    )
    with pytest.raises(DlciError) as info:
        check_docker(gpu=False)
    assert "the Docker engine is not reachable: Cannot connect" in info.value.message
    assert "systemctl start docker" in info.value.hint


def test_docker_permission_denied(fake_docker) -> None:
    fake_docker("sys.stderr.write('permission denied while trying to connect\\n'); sys.exit(1)")
    with pytest.raises(DlciError) as info:
        check_docker(gpu=False)
    assert "docker group" in info.value.hint


def test_a_hanging_docker_is_stopped_by_the_timeout(fake_docker) -> None:
    fake_docker("time.sleep(60)")
    with pytest.raises(DlciError, match="did not answer within 1 s"):
        check_docker(gpu=False, timeout=1.0)


def test_a_gpu_without_the_nvidia_runtime(fake_docker) -> None:
    fake_docker(
        "print(json.dumps({'ServerVersion': '28.2.2', 'Runtimes': {'runc': {}, 'io.containerd.runc.v2': {}}}))"
    )
    assert check_docker(gpu=False)["nvidia_runtime"] is False  # fine without a GPU
    with pytest.raises(DlciError) as info:
        check_docker(gpu=True)
    assert 'could not select device driver "" with capabilities: [[gpu]]' in info.value.message
    assert "nvidia-ctk runtime configure" in info.value.hint


def test_a_gpu_with_the_nvidia_runtime(fake_docker) -> None:
    fake_docker(
        "print(json.dumps({'ServerVersion': '28.2.2', 'Runtimes': {'nvidia': {}, 'runc': {}}}))"
    )
    assert check_docker(gpu=True) == {
        "server_version": "28.2.2",
        "runtimes": ["nvidia", "runc"],
        "cdi_specs": check_docker(gpu=True)["cdi_specs"],
        "nvidia_runtime": True,
    }


def test_docker_run_errors_are_explained() -> None:
    err = (
        'docker: Error response from daemon: could not select device driver "" with '
        "capabilities: [[gpu]].\n"
    )
    assert "NVIDIA Container Toolkit" in explain_docker_run_failure(err).hint
    assert (
        explain_docker_run_failure("Unable to find image 'x:1' locally\nNo such image") is not None
    )
    assert explain_docker_run_failure("something else") is None


# ---------------------------------------------------------------------------- hostile ladders

SMALL = Path(__file__).parent / "data" / "ladders" / "small.yaml"


def _git(repo: Path, *args: str) -> str:
    import subprocess

    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }
    done = subprocess.run(
        ["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.fixture
def pr_with_a_greedy_ladder(tmp_path: Path, monkeypatch):
    """A repository whose pull request raises the PR tier's time cap from 3 to 600 minutes."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "ladder.yaml").write_text(SMALL.read_text())
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "ladder.yaml")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    (repo / "ladder.yaml").write_text(
        SMALL.read_text().replace("time_cap_minutes: 3", "time_cap_minutes: 600")
    )
    _git(repo, "commit", "-qam", "give me the GPU")
    payload = {
        "pull_request": {"head": {"repo": {"full_name": "org/repo"}}, "base": {"sha": base}},
        "repository": {"full_name": "org/repo"},
    }
    (tmp_path / "event.json").write_text(json.dumps(payload))
    monkeypatch.chdir(repo)
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request")
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(tmp_path / "event.json"))
    monkeypatch.delenv("DLCI_MAX_TIME_CAP_MINUTES", raising=False)
    return repo, payload


def _preflight(out: Path, *extra: str, ladder: str = "ladder.yaml", hw: str = "cpu") -> dict:
    args = ["preflight", "--no-docker", "--ladder", ladder, "--budget", "pr"]
    assert main([*args, "--hardware", hw, "--out", str(out), *extra]) == 0
    return json.loads((out / "preflight.json").read_text())


def test_a_pull_request_cannot_raise_its_own_budget(
    pr_with_a_greedy_ladder, tmp_path: Path
) -> None:
    _repo, payload = pr_with_a_greedy_ladder
    report = _preflight(tmp_path / "out")
    assert report["tier"]["time_cap_minutes"] == 3  # the base branch's value, not 600
    assert report["ladder"]["verified"] is True
    assert "the pull request changes ladder.yaml" in report["ladder"]["notes"][0]
    assert report["ladder"]["used"] == payload["pull_request"]["base"]["sha"][:12] + ":ladder.yaml"
    assert not (tmp_path / "out" / "ladder-from-base.yaml").exists()  # nothing in the workspace


def test_without_the_base_commit_a_ceiling_applies(pr_with_a_greedy_ladder, tmp_path: Path) -> None:
    _repo, payload = pr_with_a_greedy_ladder
    payload["pull_request"]["base"]["sha"] = "0" * 40  # not in this (shallow) checkout
    Path(os.environ["GITHUB_EVENT_PATH"]).write_text(json.dumps(payload))
    report = _preflight(tmp_path / "out")
    assert report["ladder"]["verified"] is False
    assert "is not in this checkout" in report["ladder"]["notes"][0]
    from dlci.ladder.load import load_ladder

    ceiling = load_ladder().budgets["nightly"]["cpu"].time_cap_minutes  # the default's nightly
    assert ceiling < 600
    assert report["tier"]["time_cap_minutes"] == ceiling
    lowered = f"time_cap_minutes 600 lowered to the ceiling {ceiling:g} (default nightly, cpu)"
    assert lowered in report["ladder"]["notes"]
    explicit = _preflight(tmp_path / "out2", "--max-time-cap-minutes", "2")
    assert explicit["tier"]["time_cap_minutes"] == 2


# A ladder in ci/ that extends a parent in another folder; the pull request edits only the
# parent, raising every value it can (and adding a class of its own).
CHILD = "version: 1\nextends: ../ladders/base.yaml\nrevision: child\n"
GREEDY = {"max_epochs": 100000, "max_loss": 100, "time_cap_minutes": 600}
HOG = {**GREEDY, "profile_steps": 999, "nproc": 64, "batch_size": 4096}


def _greedy(text: str) -> str:
    for key, value in GREEDY.items():
        text = re.sub(rf"{key}: [0-9.]+", f"{key}: {value}", text)
    hog = ", ".join(f"{k}: {v}" for k, v in HOG.items())
    text = text.replace(
        "  t4: {match", "  l40s: {match: ['L40S'], speed: 3.0, fallback: t4}\n  t4: {match"
    )
    return text.replace("  merge:", f"    l40s: {{{hog}}}\n  merge:")


def _pull_request(tmp_path: Path, monkeypatch, base: dict[str, str], head: dict[str, str]):
    """A repository with a base commit and a pull request's commit; the PR event set up."""
    repo = tmp_path / "repo"
    for files, message in ((base, "base"), (head, "pull request")):
        for name, text in files.items():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / name).write_text(text)
        if message == "base":
            _git(repo, "init", "-q", "-b", "main")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-qm", message)
        sha = _git(repo, "rev-parse", "HEAD~1" if message != "base" else "HEAD")
    payload = {
        "pull_request": {"head": {"repo": {"full_name": "org/repo"}}, "base": {"sha": sha}},
        "repository": {"full_name": "org/repo"},
    }
    (tmp_path / "event.json").write_text(json.dumps(payload))
    monkeypatch.chdir(repo)
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request")
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(tmp_path / "event.json"))
    monkeypatch.delenv("DLCI_MAX_TIME_CAP_MINUTES", raising=False)
    return sha


def _values(report: dict) -> tuple:
    tier = report["tier"]
    return tuple(tier[k] for k in ("max_epochs", "max_loss", "time_cap_minutes"))


def test_a_pull_request_cannot_raise_its_budget_through_the_parent_of_extends(
    tmp_path: Path, monkeypatch
) -> None:
    small = SMALL.read_text()
    base = {"ci/ladder.yaml": CHILD, "ladders/base.yaml": small}
    sha = _pull_request(tmp_path, monkeypatch, base, {"ladders/base.yaml": _greedy(small)})
    report = _preflight(tmp_path / "pr", ladder="ci/ladder.yaml")
    # the whole chain came from the base commit, the relative extends resolved there
    assert _values(report) == (100, 1.0, 3)
    assert report["ladder"]["verified"] is True
    assert report["ladder"]["used"] == f"{sha[:12]}:ci/ladder.yaml"
    assert "the pull request changes ladders/base.yaml" in report["ladder"]["notes"][0]
    capped = _preflight(tmp_path / "cap", "--max-time-cap-minutes", "2", ladder="ci/ladder.yaml")
    assert capped["tier"]["time_cap_minutes"] == 2  # the input still caps a verified ladder
    # control: on a push (trusted) the same files give the edited values: the edit is effective
    monkeypatch.setenv("GITHUB_EVENT_NAME", "push")
    trusted = _preflight(tmp_path / "push", ladder="ci/ladder.yaml")
    assert _values(trusted) == (100000, 100, 600)
    assert trusted["ladder"]["verified"] is True and not trusted["ladder"]["notes"]


def test_a_ladder_new_in_the_pull_request_is_capped_in_every_value_and_class(
    tmp_path: Path, monkeypatch
) -> None:
    from dlci.ladder.load import load_ladder

    small = SMALL.read_text()
    head = {"ci/ladder.yaml": CHILD, "ladders/base.yaml": _greedy(small)}
    _pull_request(tmp_path, monkeypatch, {"README": "x\n"}, head)
    report = _preflight(tmp_path / "cpu", ladder="ci/ladder.yaml")
    default = load_ladder()
    nightly = default.budgets["nightly"]["cpu"]
    assert report["ladder"]["verified"] is False
    assert (
        "ladders/base.yaml" in report["ladder"]["notes"][0]
        or "ci/ladder.yaml" in (report["ladder"]["notes"][0])
    )
    # the default states no absolute threshold since ladder version 2: the PR's 100 stays, and
    # the default's relative one is added, so the looser loss buys nothing
    assert _values(report) == (nightly.max_epochs, 100.0, nightly.time_cap_minutes)
    assert report["tier"]["max_relative_loss"] == default.budgets["pr"]["cpu"].max_relative_loss
    note = f"max_epochs 100000 lowered to the ceiling {nightly.max_epochs} (default nightly, cpu)"
    assert note in report["ladder"]["notes"]
    assert (
        "max_relative_loss 0.3 added from the ceiling (default pr, cpu)"
        in report["ladder"]["notes"]
    )
    # a class only the pull request's ladder has gets the strictest default row
    tier = _preflight(tmp_path / "l40s", ladder="ci/ladder.yaml", hw="l40s")["tier"]
    rows = [r for r in default.budgets["nightly"].values() if r]
    for key in ("max_epochs", "time_cap_minutes", "profile_steps", "nproc", "batch_size"):
        assert tier[key] == min(getattr(r, key) for r in rows), key
    relative = [r.max_relative_loss for r in default.budgets["pr"].values() if r]
    assert tier["max_relative_loss"] == min(v for v in relative if v is not None)
    # control: the same ladder on a push is taken as it is
    monkeypatch.setenv("GITHUB_EVENT_NAME", "push")
    pushed = _preflight(tmp_path / "push", ladder="ci/ladder.yaml", hw="l40s")["tier"]
    assert {k: pushed[k] for k in HOG} == HOG


def test_the_base_chain_follows_symlinks_and_stays_in_the_repository(
    tmp_path: Path, monkeypatch
) -> None:
    from dlci.ladder.trust import ladder_at_commit
    from dlci.trust.basecommit import Unverifiable

    small = SMALL.read_text()
    base = {"ladders/base.yaml": small, "ci/ladder.yaml": CHILD}
    sha = _pull_request(tmp_path, monkeypatch, base, {"ladders/base.yaml": _greedy(small)})
    os.symlink("ladder.yaml", "ci/link.yaml")  # extends resolves from the link's folder
    _git(Path.cwd(), "add", "ci/link.yaml")
    _git(Path.cwd(), "commit", "-qm", "a link")
    ladder, changed = ladder_at_commit("ci/link.yaml", _git(Path.cwd(), "rev-parse", "HEAD"))
    assert ladder.budgets["pr"]["cpu"].time_cap_minutes == 600  # HEAD has the greedy parent
    assert changed == []
    with pytest.raises(Unverifiable, match="not in the base commit"):
        ladder_at_commit("ci/link.yaml", sha)  # the link is new: not in the base commit
    Path("ci/escape.yaml").write_text("version: 1\nextends: ../../outside.yaml\n")
    _git(Path.cwd(), "add", "-A")
    _git(Path.cwd(), "commit", "-qm", "escape")
    with pytest.raises(Unverifiable, match="leaves the repository"):
        ladder_at_commit("ci/escape.yaml", _git(Path.cwd(), "rev-parse", "HEAD"))
    Path("ci/bad.yaml").write_text("version: 3\n")
    _git(Path.cwd(), "add", "-A")
    _git(Path.cwd(), "commit", "-qm", "bad")
    with pytest.raises(Unverifiable, match=r"does not load: .*unsupported ladder version 3"):
        ladder_at_commit("ci/bad.yaml", _git(Path.cwd(), "rev-parse", "HEAD"))
    with pytest.raises(Unverifiable, match="not a file"):
        ladder_at_commit("ci", sha)
    with pytest.raises(Unverifiable, match="not a commit id"):
        ladder_at_commit("ci/ladder.yaml", "--output=/dev/null")
    # the project's folder reached through a link inside the checkout would let the pull
    # request choose which base-commit ladder judges it: refused, as for the configuration
    os.symlink("ci", "linked")
    with pytest.raises(DlciError, match="passes through a symbolic link"):
        ladder_at_commit("ladder.yaml", sha, cwd=Path("linked"))
    assert ladder_at_commit("ladder.yaml", sha, cwd=Path("ci"))[0]  # control: the real folder


def test_the_container_uses_the_tier_the_host_selected(tmp_path: Path, monkeypatch) -> None:
    from dlci.ladder.plan import read_plan
    from dlci.ladder.tiers import choose_tier

    tier = {
        "budget": "pr",
        "hardware_class": "cpu",
        "max_epochs": 7,
        "max_loss": 4.5,
        "time_cap_minutes": 2,
        "profile_steps": 2,
        "nproc": 1,
        "batch_size": 8,
        "ladder": "x",
        "ladder_version": 1,
        "ladder_revision": "r",
        "row": "budgets.pr.cpu",
    }
    path = tmp_path / "preflight.json"
    path.write_text(json.dumps({"kind": "preflight", "plan_version": 1, "tier": tier}))
    chosen = choose_tier(budget="nightly", hardware="a100", plan=str(path))
    assert (chosen.max_epochs, chosen.max_loss, chosen.batch_size) == (7, 4.5, 8)
    assert chosen.reasons[-1] == f"tier from {path}"
    # the options given beside the file are not used, and the tier says so (never silently)
    assert chosen.warnings[-1] == (
        f"budget nightly, hardware a100 not used: the tier is the one recorded in {path} "
        "(pr on cpu)"
    )
    assert choose_tier(budget="pr", hardware="cpu", plan=str(path)).warnings == ()
    from dlci.cli import main

    assert main(["memorize", "--plan", " "]) == 1  # an empty path is refused, not ignored
    # the old names of the hand-off are gone: a usage error, never silently ignored
    assert main(["run", "--tier-json", str(path)]) == 2
    assert main(["memorize", "--tier-file", str(path)]) == 2
    # no environment variable carries the plan: only the argument does
    monkeypatch.setenv("DLCI_TIER_JSON", str(path))
    assert choose_tier(budget="pr", hardware="cpu").max_epochs != 7
    path.write_text(json.dumps({"plan_version": 1, "tier": {"budget": "pr"}}))
    with pytest.raises(DlciError, match="the tier lacks"):
        read_plan(str(path))


def test_a_committed_artifacts_link_is_not_written_through(tmp_path, monkeypatch, capsys) -> None:
    """A pull request that commits dlci-artifacts as a link to a host folder does not get the
    host's preflight.json (or cleanup.json) written there."""
    from dlci.cli import main

    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "dlci-artifacts").symlink_to(victim)
    assert main(["preflight", "--out", str(tmp_path / "dlci-artifacts")]) == 1
    assert "is a symbolic link; refusing to write through it" in capsys.readouterr().err
    assert main(["container", "cleanup", "--out", str(tmp_path / "dlci-artifacts")]) == 1
    assert list(victim.iterdir()) == []
    # the control: a real folder gets the report
    (tmp_path / "real").mkdir()
    main(["preflight", "--out", str(tmp_path / "real")])
    assert (tmp_path / "real" / "preflight.json").exists()


# ------------------------------------------- one machine, several runners (issue 51)

EIGHT_GPUS = """#!/bin/sh
# a stand-in nvidia-smi: eight A100s; a neighbour runner's process on GPU 5
case "$*" in
  *--query-gpu=*) for i in 0 1 2 3 4 5 6 7; do
      echo "$i, GPU-${i}a2b, NVIDIA A100-SXM4-80GB, 81920, 550.54.15, 8.0"; done ;;
  *--query-compute-apps=*) echo "GPU-5a2b, 777, 30000" ;;
  *) echo "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 |" ;;
esac
"""


@pytest.fixture
def eight_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(EIGHT_GPUS)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_a_pinned_runner_s_preflight_counts_its_gpus(eight_gpus, monkeypatch, tmp_path) -> None:
    from dlci.action.host.preflight import PreflightRequest, runner_gpus

    request = PreflightRequest(out=tmp_path, probes=("nvidia-smi",))
    pin = [f"GPU-{i}a2b" for i in range(4, 8)]
    monkeypatch.setenv("DLCI_RUNNER_GPUS", ",".join(pin))
    assert runner_gpus(request, {"nproc": 4}) == {"pinned": pin, "found": pin}
    with pytest.raises(DlciError) as info:  # a nightly row of 8 processes on a 4-GPU runner
        runner_gpus(request, {"nproc": 8})
    assert "the tier runs 8 processes, one per GPU, but this runner has 4 GPU(s)" in str(
        info.value.message
    )
    assert "gpus-8" in (info.value.hint or "")
    monkeypatch.setenv("DLCI_RUNNER_GPUS", "GPU-9a2b")  # a GPU the machine no longer has
    with pytest.raises(DlciError) as info:
        runner_gpus(request, {"nproc": 1})
    assert "pinned to GPU(s) GPU-9a2b" in info.value.message and "none was found" in (
        info.value.message
    )


def test_cleanup_reports_gpu_processes_on_the_runner_s_own_gpus(eight_gpus, monkeypatch) -> None:
    from dlci.action.host.cleanup import gpu_processes
    from dlci.report.fields import GpuProcess

    monkeypatch.setenv("DLCI_RUNNER_GPUS", "GPU-0a2b,GPU-1a2b,GPU-2a2b,GPU-3a2b")
    assert gpu_processes() == []  # the neighbour's training on GPU 5 is not this job's
    monkeypatch.setenv("DLCI_RUNNER_GPUS", "GPU-4a2b,GPU-5a2b")  # the control: its own GPU
    assert gpu_processes() == [GpuProcess(pid=777, used_memory_mib=30000, gpu_uuid="GPU-5a2b")]
