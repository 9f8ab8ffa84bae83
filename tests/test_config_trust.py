"""A pull request's configuration: trusted keys and the policy from its base commit (real git)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dlci.cli import main
from dlci.config import resolve
from dlci.config.trust import trusted_config

HEAD = '[project]\nname = "p"\n\n[tool.dlci]\ntarget = "{target}"\nmin-gpu-util = {util}\n'
WAIVER = (
    "\n[tool.dlci.doctor.checks.activations]\n"
    "waive = 'warn-only'\nreason = 'GELU units saturate by design'\nuntil = 2999-01-31\n"
)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text, encoding="utf-8")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q")
    return path


def test_a_pull_request_cannot_waive_its_own_failure(repo: Path) -> None:
    base = commit(repo, {"pyproject.toml": HEAD.format(target="a:base", util=40)}, "base")
    commit(repo, {"pyproject.toml": HEAD.format(target="a:head", util=40) + WAIVER}, "head")
    config = trusted_config(base, cwd=repo, env={})
    assert config.policy.waivers == ()
    assert config.policy.origin == f"base commit {base[:12]}:pyproject.toml"
    assert "the pull request adds a waiver for activations: it takes effect once merged" in (
        config.notes
    )
    assert config.get("target") == "a:head"  # untrusted: the working tree's
    control = trusted_config(None, cwd=repo, env={})  # a push: the working tree as it is
    assert [w.check for w in control.policy.waivers] == ["activations"]


def test_a_waiver_in_the_base_commit_applies(repo: Path) -> None:
    base = commit(repo, {"pyproject.toml": HEAD.format(target="a:b", util=40) + WAIVER}, "base")
    commit(repo, {"src/x.py": "x = 1\n"}, "head")
    config = trusted_config(base, cwd=repo, env={})
    (waiver,) = config.policy.waivers
    assert (waiver.check, waiver.mode) == ("activations", "warn-only")
    assert waiver.source == f"base commit {base[:12]}:pyproject.toml:9"
    assert config.notes == []
    # the pull request changing the waiver's expiry does not renew it before it is merged
    commit(repo, {"pyproject.toml": HEAD.format(target="a:b", util=40) + WAIVER.replace("2999", "3000")}, "renew")  # fmt: skip
    config = trusted_config(base, cwd=repo, env={})
    assert config.policy.waivers[0].until.year == 2999
    assert "the pull request changes the waiver for activations: it takes effect once merged" in (
        config.notes
    )


def test_trusted_keys_come_from_the_base_and_the_change_is_a_note(repo: Path) -> None:
    base = commit(repo, {"pyproject.toml": HEAD.format(target="a:b", util=40)}, "base")
    commit(repo, {"pyproject.toml": HEAD.format(target="a:b", util=0)}, "head")
    config = trusted_config(base, cwd=repo, env={})
    assert config.get("min-gpu-util") == 40.0
    assert config.source("min-gpu-util") == f"base commit {base[:12]}:pyproject.toml:6"
    assert config.notes == [
        "the pull request changes min-gpu-util from 40 to 0: it takes effect once merged"
    ]
    assert resolve(cwd=repo, env={}).get("min-gpu-util") == 0.0  # the control: the head's
    # the workflow's own input still applies above the file (the ladder input's boundary)
    with_input = trusted_config(base, cwd=repo, env={"DLCI_INPUT_MIN_GPU_UTIL": "10"})
    assert (with_input.get("min-gpu-util"), with_input.source("min-gpu-util")) == (
        10.0,
        "action input",
    )


def test_a_project_in_a_folder_reads_the_base_s_file_at_that_folder(repo: Path) -> None:
    toml = (
        "min-gpu-util = 30\n[doctor.checks.shuffle]\nwaive = 'skip'\nreason = 'sorted on purpose'\n"
    )
    base = commit(repo, {"ml/dlci.toml": toml}, "base")
    commit(repo, {"ml/dlci.toml": "min-gpu-util = 5\n"}, "head")
    config = trusted_config(base, cwd=repo / "ml", env={})
    assert config.get("min-gpu-util") == 30.0
    assert config.source("min-gpu-util") == f"base commit {base[:12]}:ml/dlci.toml:1"
    # removing a waiver only makes the doctor stricter: applied at once
    assert config.policy.waivers == ()
    assert any(n.startswith("the pull request removes the waiver for shuffle: applied now") for n in config.notes)  # fmt: skip


def test_an_expired_waiver_can_be_removed_by_the_pull_request_but_not_renewed(
    repo: Path,
) -> None:
    expired = WAIVER.replace("2999-01-31", "2020-01-31")
    base = commit(repo, {"pyproject.toml": HEAD.format(target="a:b", util=40) + expired}, "base")
    commit(repo, {"pyproject.toml": HEAD.format(target="a:b", util=40) + WAIVER}, "renew")
    renewed = trusted_config(base, cwd=repo, env={})
    (waiver,) = renewed.policy.waivers  # the renewal waits for the merge: still expired
    assert waiver.expired() and waiver.until is not None and waiver.until.year == 2020
    commit(repo, {"pyproject.toml": HEAD.format(target="a:b", util=40)}, "remove")
    assert trusted_config(base, cwd=repo, env={}).policy.waivers == ()


def test_a_configuration_new_in_the_pull_request_takes_effect_once_merged(repo: Path) -> None:
    base = commit(repo, {"README": "x\n"}, "base")
    commit(repo, {"dlci.toml": "max-gpu-memory = 99\n" + WAIVER.replace("tool.dlci.", "")}, "head")
    config = trusted_config(base, cwd=repo, env={})
    assert (config.get("max-gpu-memory"), config.policy.waivers) == (None, ())
    assert len(config.notes) == 2 and all(n.endswith("once merged") for n in config.notes)


def test_without_the_base_commit_no_waiver_applies_and_the_gates_are_the_working_tree_s(
    repo: Path, tmp_path: Path
) -> None:
    base = commit(repo, {"pyproject.toml": HEAD.format(target="a:b", util=40) + WAIVER}, "base")
    commit(repo, {"pyproject.toml": HEAD.format(target="a:b", util=40) + WAIVER + "\n"}, "head")
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow))
    config = trusted_config(base, cwd=shallow, env={})
    # the gate the pull request keeps applies (it could only switch it off, as the defaults
    # do); its waiver does not
    assert (config.get("min-gpu-util"), config.policy.waivers) == (40.0, ())
    assert config.source("min-gpu-util").endswith("shallow/pyproject.toml:6")
    (note,) = config.notes
    assert "not in this checkout (a shallow clone?)" in note and "fetch-depth: 2 (or 0)" in note
    assert trusted_config(base, cwd=repo, env={}).get("min-gpu-util") == 40.0  # the control
    for bad in ("--upload-pack=x", "0" * 40):
        assert trusted_config(bad, cwd=repo, env={}).policy.waivers == ()


def test_a_base_configuration_that_does_not_load_is_read_as_unreadable(repo: Path) -> None:
    base = commit(repo, {"pyproject.toml": HEAD.format(target="a:b", util=400)}, "base")
    commit(repo, {"pyproject.toml": HEAD.format(target="a:b", util=40)}, "head")
    config = trusted_config(base, cwd=repo, env={})
    assert config.get("min-gpu-util") == 40.0  # the working tree's, as without a base commit
    assert "it does not load" in config.notes[0] and "must be from 0 to 100" in config.notes[0]


def test_dlci_config_shows_what_a_pull_request_gets(repo: Path, capsys) -> None:
    base = commit(repo, {"pyproject.toml": HEAD.format(target="a:b", util=40)}, "base")
    commit(repo, {"pyproject.toml": HEAD.format(target="a:b", util=40) + WAIVER}, "head")
    here = os.getcwd()
    try:
        os.chdir(repo)
        assert main(["config", "--base-commit", base]) == 0
    finally:
        os.chdir(here)
    out = capsys.readouterr().out
    assert "waivers (base commit" in out and "  none" in out
    assert "the pull request adds a waiver for activations" in out


def test_a_pull_request_cannot_point_the_ladder_key_at_another_ladder(repo: Path) -> None:
    base = commit(repo, {"dlci.toml": "ladder = 'ci/strict.yaml'\n"}, "base")
    commit(repo, {"dlci.toml": "ladder = 'ci/lenient.yaml'\n"}, "head")
    config = trusted_config(base, cwd=repo, env={})
    assert str(config.get("ladder")).endswith("ci/strict.yaml")
    assert any(n.startswith("the pull request changes ladder") for n in config.notes)
    assert str(resolve(cwd=repo, env={}).get("ladder")).endswith("ci/lenient.yaml")  # control
