"""Each part on its own copy of the checkout (dlci.action.host.scratch) and the bounded reading
of a container's output (dlci.action.host.container.Output), without Docker: a local process
stands in for each container, given the folder the host would mount at /workspace.
tests/e2e/test_trust_workspace.py plays the same attacks against the real engine and git."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tracemalloc
from pathlib import Path

from dlci.action.host import container, output, scratch
from dlci.action.host.gates import Parts

# The stand-in container: argv[-1] is the folder mounted at /workspace. It notes what it finds
# there (a file an earlier part left?), then plants: a nested repository whose config runs a
# command, a statistics.pyc at the top, a new data file and a rewritten module.
STANDIN = r"""
import json, os, pathlib, sys
ws = pathlib.Path(sys.argv[-1])
log = pathlib.Path(os.environ["SEEN_LOG"])
seen = {"root": str(ws), "pyc": (ws / "statistics.pyc").exists(),
        "nested": (ws / "sub" / ".git").exists(), "data": (ws / "data.bin").exists(),
        "model": (ws / "pkg" / "model.py").read_text()}
with log.open("a") as out:
    out.write(json.dumps(seen) + "\n")
(ws / "sub" / ".git").mkdir(parents=True, exist_ok=True)
(ws / "sub" / ".git" / "config").write_text("[core]\n\tfsmonitor = touch pwned\n")
(ws / "statistics.pyc").write_bytes(b"planted")
(ws / "data.bin").write_bytes(b"planted")
(ws / "pkg" / "model.py").write_text("x = 22\n")
art = ws / "dlci-artifacts"
art.mkdir(exist_ok=True)
(art / "run.json").write_text(json.dumps({"steps": [{"name": "install", "status": "passed"}]}))
(art / "notes.txt").write_text("from the tests")
(art / ".gitmodules").write_text("[submodule x]\n")
"""


def checkout(tmp_path: Path) -> Path:
    """A checkout with a submodule entry (a gitlink and .gitmodules), as the pull request's."""
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "model.py").write_text("x = 1\n")
    (ws / ".gitmodules").write_text('[submodule "sub"]\n\tpath = sub\n\turl = ../sub\n')
    (ws / "sub").mkdir()
    (ws / "dlci-artifacts").mkdir()
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    (ws / ".git" / "config").write_text(
        '[http "https://github.com/"]\n\textraheader = AUTHORIZATION: basic dG9rZW4=\n'
    )
    (ws / ".git-credentials").write_text("https://x:token@github.com\n")  # pragma: allowlist secret
    return ws


def tree(root: Path) -> dict[str, bytes | str]:
    found: dict[str, bytes | str] = {}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            found[rel] = path.read_bytes() if path.is_file() else "dir"
    return found


def play(tmp_path: Path, monkeypatch, *, copies: bool) -> tuple[Path, list[dict], dict, int]:
    ws = checkout(tmp_path)
    monkeypatch.setenv("RUNNER_TEMP", str(tmp_path))
    monkeypatch.setenv("SEEN_LOG", str(tmp_path / "seen.jsonl"))
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    # no install container (install: none): the stand-in plays the tests part and one gate
    inner = ["--no-doctor", "--no-profile", "--install", "none"]
    job = Parts(inner, ws, ".", str(tmp_path / "record.json"))
    mounts = tmp_path / "mounts"
    mounts.mkdir()
    made = []

    def build(*, name: str, inner: list[str], workspace: Path = ws, git_from: Path = ws) -> list:
        made.append((workspace, git_from))
        return [sys.executable, str(script), str(workspace)]

    monkeypatch.setattr(container, "say", lambda message: None)
    hidden = [".git/config", ".git-credentials"]
    copy = container.Copies(ws, mounts, hidden) if copies else None
    before = tree(ws)
    code = container._run_parts(job, build, "job", 1.0, copies=copy)
    record = json.loads((tmp_path / "record.json").read_text())
    seen = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    if copies:
        assert all(w != ws and g == ws for w, g in made)  # never the workspace itself
        assert tree(ws) == {**before, **added(ws, before)}
        assert list(mounts.iterdir()) == []  # every copy removed
    job.close()
    return ws, seen, record, code


def added(ws: Path, before: dict) -> dict:
    """What the host itself writes into the workspace's artifacts (reports, handed back)."""
    return {k: v for k, v in tree(ws).items() if k.startswith("dlci-artifacts") and k not in before}


def test_each_part_runs_on_a_fresh_copy_and_the_checkout_comes_back_as_it_was(
    tmp_path: Path, monkeypatch
) -> None:
    ws, seen, record, code = play(tmp_path, monkeypatch, copies=True)
    assert len(seen) == 2  # the tests, then the memorize gate
    for part in seen:  # each started from the checkout: nothing an earlier part left
        assert part == {**part, "pyc": False, "nested": False, "data": False, "model": "x = 1\n"}
    assert seen[0]["root"] != seen[1]["root"]
    assert not (ws / "sub" / ".git").exists() and not (ws / "statistics.pyc").exists()
    assert (ws / "pkg" / "model.py").read_text() == "x = 1\n"
    # the job fails, naming what each part planted for git on the host
    planted = [p for p in record["problems"] if "planted git files" in p]
    assert len(planted) == 2 and "sub/.git (added)" in planted[0]
    assert record["planted"] == planted and code == 1
    # the tests' own files come back into the artifacts, never a git file
    assert (ws / "dlci-artifacts" / "notes.txt").read_text() == "from the tests"
    assert not (ws / "dlci-artifacts" / ".gitmodules").exists()


def test_control_on_the_shared_workspace_the_plants_reach_the_next_part_and_the_host(
    tmp_path: Path, monkeypatch
) -> None:
    ws, seen, record, _ = play(tmp_path, monkeypatch, copies=False)
    assert seen[1]["pyc"] and seen[1]["nested"] and seen[1]["model"] == "x = 22\n"
    assert "fsmonitor" in (ws / "sub" / ".git" / "config").read_text()
    assert record["planted"] == []


def test_a_copy_follows_no_link_reads_no_fifo_and_hides_the_credentials(tmp_path: Path) -> None:
    ws = checkout(tmp_path)
    secret = tmp_path / "host-secret"
    secret.write_text("host secret")
    (ws / "link").symlink_to(secret)
    (ws / "dirlink").symlink_to(tmp_path)
    os.mkfifo(ws / "fifo")
    (ws / "run.sh").write_text("#!/bin/sh\n")
    (ws / "run.sh").chmod(0o755)
    copy = tmp_path / "copy"
    notes = scratch.make_copy(ws, copy, empty=[".git-credentials", ".git/config"])
    assert os.readlink(copy / "link") == str(secret)  # a link stays a link
    assert os.readlink(copy / "dirlink") == str(tmp_path)
    assert not (copy / "fifo").exists() and notes.left_out == [
        "fifo: not a regular file, folder or link"
    ]
    assert (copy / ".git-credentials").read_text() == ""
    assert list((copy / ".git").iterdir()) == []  # the mount point of the read-only .git
    assert os.stat(copy / "run.sh").st_mode & stat.S_IXUSR
    assert (copy / "pkg" / "model.py").read_text() == "x = 1\n"
    # what a container can leave does not keep the copy from going
    (copy / "locked" / "inner").mkdir(parents=True)
    (copy / "locked" / "inner" / "f").write_text("x")
    (copy / "locked" / "inner").chmod(0)
    (copy / "locked").chmod(0o500)
    assert scratch.remove_copy(copy) and secret.read_text() == "host secret"


def test_planted_names_added_changed_and_removed_git_files(tmp_path: Path) -> None:
    ws = checkout(tmp_path)
    before = scratch.git_files(ws)
    assert ".gitmodules" in before and ".git/config" not in before  # the mount: read-only
    (ws / "a" / "b" / ".git" / "hooks").mkdir(parents=True)
    (ws / "a" / "b" / ".git" / "hooks" / "post-checkout").write_text("x")
    (ws / ".gitmodules").write_text("changed")
    (ws / "c").mkdir()
    (ws / "c" / ".GIT").write_text("gitdir: /elsewhere")
    assert scratch.planted(before, ws) == [".gitmodules (changed)", "a/b/.git (added)", "c/.GIT (added)"]  # fmt: skip
    assert scratch.planted(scratch.git_files(ws), ws) == []


# ------------------------------------------------------------------ the container's output


def test_output_cuts_long_lines_and_the_total_and_says_what_it_dropped() -> None:
    written: list[str] = []
    out = output.Output(written.append, line_limit=10, limit=40)
    out.feed(b"short\n" + b"x" * 25)
    out.feed(b"y" * 5 + b"\nnext\n")
    out.feed(b"z" * 100 + b"\n::error::late\n")
    said = out.close()
    text = "".join(written)
    assert text.startswith("short\nxxxxxxxxxx [... 20 bytes of this line dropped]\nnext\n")
    assert "::error::late" not in text and len(text.replace(" [...", "").split("\n")) <= 6
    assert said.startswith("dl-ci: ") and "output dropped" in said
    assert out.tail[:2] == ["short\n", "xxxxxxxxxx\n"]


def test_output_keeps_a_character_split_across_chunks() -> None:
    written: list[str] = []
    out = output.Output(written.append)
    data = "größe ✓\n".encode()
    for index in range(len(data)):
        out.feed(data[index : index + 1])
    assert "".join(written) == "größe ✓\n" and out.close() == ""


SIZE = 96 << 20  # no newline: the attack's 384 MiB, scaled down


def test_a_container_that_prints_a_giant_line_costs_the_host_no_memory(capsys) -> None:
    cmd = [sys.executable, "-c", f"import os; os.write(1, b'a' * {SIZE})"]
    tracemalloc.start()
    try:
        code, _ = container.watch(cmd, "unused", 1.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    printed = capsys.readouterr().out
    assert code == 0 and len(printed) < output.LINE_LIMIT + 200
    assert peak < 8 << 20, peak  # a few chunks, whatever the container writes
    print(f"host peak while reading {SIZE >> 20} MiB in one line: {peak / 2**20:.1f} MiB")


def test_control_reading_by_lines_holds_the_whole_line(capsys) -> None:
    """The old reading (``for line in child.stdout``) holds the container's line whole."""
    cmd = [sys.executable, "-c", f"import os; os.write(1, b'a' * {SIZE})"]
    tracemalloc.start()
    try:
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, errors="replace")
        assert child.stdout is not None
        longest = max(len(line) for line in child.stdout)
        child.wait()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert longest == SIZE and peak > SIZE


def test_many_lines_past_the_total_are_counted_not_printed(capsys) -> None:
    script = "import sys\nfor i in range(200000): sys.stdout.write('%0500d\\n' % i)\n"
    code, _ = container.watch([sys.executable, "-c", script], "unused", 1.0)
    printed = capsys.readouterr()
    assert code == 0 and len(printed.out) <= output.OUTPUT_LIMIT + 1000
    assert "output dropped" in printed.err


def test_a_checkout_that_cannot_be_copied_is_one_error_with_a_hint(tmp_path: Path) -> None:
    from dlci.errors import DlciError

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "unreadable").write_text("x")
    mounts = tmp_path / "mounts"
    mounts.mkdir()
    copies = container.Copies(ws, mounts)

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(ws / "unreadable"))

    import pytest

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scratch, "_copy_file", refuse)
        with pytest.raises(DlciError, match="could not be copied for the tests step") as caught:
            copies.make("tests")
    assert "readable by the runner's user" in (caught.value.hint or "")
    assert list(mounts.iterdir()) == []


def test_an_installed_checkout_is_measured_before_it_is_copied_again(tmp_path: Path) -> None:
    """What the install container wrote becomes the source of every later copy: a sparse
    file (2 GiB of holes would be written out in full, per part), too many bytes or files,
    or folders nested past the copy's recursion are refused; control: a plain tree passes."""
    root = tmp_path / "installed"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "m.py").write_text("x = 1\n")
    assert scratch.measure(root, limit_bytes=1 << 20, limit_files=10) is None
    with (root / "hole.bin").open("wb") as f:
        f.truncate(64 << 20)  # 64 MiB apparent, nothing on disk
    assert "hole.bin is sparse" in (
        scratch.measure(root, limit_bytes=1 << 30, limit_files=10) or ""
    )
    (root / "hole.bin").unlink()
    (root / "big.bin").write_bytes(b"x" * (2 << 20))
    assert "more than 1 MiB" in (scratch.measure(root, limit_bytes=1 << 20, limit_files=10) or "")
    (root / "big.bin").unlink()
    deep = root
    for _ in range(scratch.MAX_DEPTH + 2):
        deep = deep / "d"
    deep.mkdir(parents=True)
    assert "nested deeper" in (scratch.measure(root, limit_bytes=1 << 20, limit_files=10) or "")
