"""A pull request is the attacker (docs/security.md): configuration files that once cost
minutes and gigabytes or crashed with a traceback, and working trees laid out to make the
base commit's configuration unreadable (its gates then fell to their defaults: none).

Each case is real files and real git repositories; each protection has its control.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest

from dlci.config import Config, resolve
from dlci.config.source import LINE_PARTS, from_text, key_lines
from dlci.config.trust import trusted_config
from dlci.errors import DlciError

DEEP = "a key of more than 32 dotted parts"


def load(text: str) -> DlciError | None:
    """The DlciError that reading ``text`` as dlci.toml raises, None when it loads."""
    try:
        from_text("dlci.toml", text, "dlci.toml")
    except DlciError as exc:
        return exc
    return None


@pytest.mark.parametrize(
    "key",
    [
        # basic strings with escaped quotes: 40 000 parts took 27 s and 6 GB
        ".".join(['"\\""'] * 40) + " = 1",
        "x = {" + ".".join(["a"] * 40) + " = 1}",  # in an inline table: quadratic too
        "x = {y = 1, " + ".".join(["a"] * 40) + " = 1}",  # after a comma
        "x = [\n{" + ".".join(["a"] * 40) + " = 1}]",  # an inline table in an array
    ],
    ids=["escaped-quotes", "inline-table", "after-a-comma", "in-an-array"],
)
def test_a_deep_key_anywhere_is_refused_before_the_toml_reader(key: str) -> None:
    found = load(key + "\n")
    assert found is not None and DEEP in found.message
    control = key.replace(".".join(["a"] * 40), ".".join(["a"] * 32))  # 32 parts: read
    control = control.replace(".".join(['"\\""'] * 40), ".".join(['"\\""'] * 32))
    assert load(control + "\n") is None


def test_the_line_scan_stays_small_and_right_in_arrays_and_nested_tables() -> None:
    # a table in an array belongs to the array's key: the last key once grew with every element
    # (80 000 elements: the process was killed for memory)
    lines = key_lines("x = [{a = 1}, {b = 1},\n {c = {d = 1}}]\n")
    assert lines[("x", "b")] == 1 and lines[("x", "c", "d")] == 2
    assert ("x", "a", "b") not in lines
    deep = "x = " + "{" + " = {".join([".".join(["k"] * 30)] * 20) + " = 1" + "}" * 20 + "\n"
    assert max(len(path) for path in key_lines(deep)) == LINE_PARTS  # not 20 x 30 parts
    assert key_lines("[tool.dlci]\nmin-gpu-util = 40\n")[("tool", "dlci", "min-gpu-util")] == 2


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("min-gpu-util = 1" + "0" * 400, "must be from 0 to 100"),  # no float: OverflowError
        ("max-utilization-drop = 1" + "0" * 400, "must be 0 or more"),
        ("[doctor.checks.shuffle]\nfail-mix = 1" + "0" * 400, "must be a finite number, got a 401"),
        ("min-gpu-util = 1" + "0" * 5000, "malformed TOML"),  # past Python's 4300 digits
    ],
)
def test_a_huge_integer_is_a_located_error_not_a_traceback(
    tmp_path: Path, text: str, words: str
) -> None:
    (tmp_path / "dlci.toml").write_text(text + "\n")
    with pytest.raises(DlciError) as info:
        resolve(cwd=tmp_path, env={})
    assert words in info.value.message and "dlci.toml" in info.value.location
    (tmp_path / "dlci.toml").write_text("min-gpu-util = 100\n")  # the control
    assert resolve(cwd=tmp_path, env={}).get("min-gpu-util") == 100.0


def test_a_snapshot_with_a_huge_threshold_is_one_error(tmp_path: Path) -> None:
    good = Config({}, {}).to_json()
    good["policy"]["thresholds"] = {"shuffle.fail-mix": 0.25}
    assert resolve(cwd=tmp_path, env={}, trusted=good).policy.thresholds == {
        "shuffle.fail-mix": 0.25
    }
    bad = copy.deepcopy(good)
    bad["policy"]["thresholds"] = {"shuffle.fail-mix": 10**400}
    with pytest.raises(DlciError, match=r"policy\.thresholds\.shuffle\.fail-mix"):
        resolve(cwd=tmp_path, env={}, trusted=bad)


@pytest.mark.parametrize("reason", ["\\u200b", "\\u00a0", " - "])
def test_a_reason_needs_a_letter_or_a_digit(tmp_path: Path, reason: str) -> None:
    table = '[doctor.checks.shuffle]\nwaive = "skip"\nreason = "{}"\n'
    (tmp_path / "dlci.toml").write_text(table.format(reason))
    with pytest.raises(DlciError, match="a waiver needs a reason"):
        resolve(cwd=tmp_path, env={})
    (tmp_path / "dlci.toml").write_text(table.format("sorted by design: see #12"))  # control
    assert resolve(cwd=tmp_path, env={}).policy.waivers[0].reason == "sorted by design: see #12"


# --------------------------------------------------------------------------- the working tree


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture
def base(tmp_path: Path) -> tuple[Path, str]:
    """A repository whose project in ml/ gates on 40% utilization with a ladder; its commit."""
    repo = tmp_path / "repo"
    (repo / "ml" / "ci").mkdir(parents=True)
    (repo / "ml" / "dlci.toml").write_text("min-gpu-util = 40\nladder = 'ci/ladder.yaml'\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    return repo, git(repo, "rev-parse", "HEAD")


def test_a_pull_request_cannot_lay_its_folder_out_as_a_git_repository(base) -> None:
    repo, commit = base
    assert trusted_config(commit, cwd=repo / "ml", env={}).get("min-gpu-util") == 40.0  # control
    (repo / "ml" / "HEAD").write_text("ref: refs/heads/main\n")
    for folder in ("objects", "refs"):
        (repo / "ml" / folder).mkdir()
        (repo / "ml" / folder / "keep").write_text("")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "git takes ml/ for a bare repository")
    # before: the base was unreadable ("must be run in a work tree") and the gate was dropped
    with pytest.raises(DlciError, match="laid out as a git repository"):
        trusted_config(commit, cwd=repo / "ml", env={})


@pytest.mark.parametrize("link", ["ml2", "."])
def test_a_pull_request_cannot_point_its_folder_elsewhere_with_a_link(base, link: str) -> None:
    repo, commit = base
    git(repo, "mv", "ml", "ml2")
    (repo / "ml").symlink_to(link)  # the workflow's working-directory, ml, now leads elsewhere
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "move the project and link its old name")
    # before: the base's ml2/ (or top) had no configuration: no gate, and no note said so
    with pytest.raises(DlciError, match=f"passes through a symbolic link \\(ml -> {link}\\)"):
        trusted_config(commit, cwd=repo / "ml", env={})
    config = trusted_config(commit, cwd=repo / "ml2", env={})  # the real folder is no trick
    assert config.get("min-gpu-util") is None and "min-gpu-util" in " ".join(config.notes)


def test_a_link_above_the_checkout_is_the_runner_s_own_and_fine(base, tmp_path: Path) -> None:
    repo, commit = base
    (tmp_path / "work").symlink_to(repo)
    config = trusted_config(commit, cwd=tmp_path / "work" / "ml", env={})
    assert config.get("min-gpu-util") == 40.0


def test_the_base_ladder_of_a_project_in_a_folder_is_the_working_tree_s_path(base) -> None:
    repo, commit = base
    pushed = resolve(cwd=repo / "ml", env={}).get("ladder")
    pulled = trusted_config(commit, cwd=repo / "ml", env={})
    # before: the base's ladder read 'ci/ladder.yaml', relative to no folder at all, and the
    # pull request was told it changed the ladder when it had not
    assert pulled.get("ladder") == pushed == str(repo / "ml" / "ci" / "ladder.yaml")
    assert not any("ladder" in note for note in pulled.notes)


def test_a_file_of_thousands_of_mistakes_prints_the_first_twenty_and_a_count(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """Every mistake is found, but a file of 2,000 wrong keys prints 20 of them (each located,
    each an annotation in Actions) and the count of the rest, not 2,000 of each."""
    from dlci.cli import main

    keys = "".join(f"k{i} = 1\n" for i in range(2000))
    (tmp_path / "pyproject.toml").write_text("[tool.dlci]\n" + keys)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    assert main(["config"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: pyproject.toml:2: k0: unknown key\n")
    assert "pyproject.toml:21: k19: unknown key" in err and "k20:" not in err
    assert "error: and 1980 more problems" in err
    assert err.count("::error") == 20
