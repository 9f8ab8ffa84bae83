"""The image's tag covers what ``docker build`` sends: Docker's .dockerignore rules, no engine.

The expected lists below are what the real engine sends (tests/e2e/test_image_context.py
checks every case of CASES against it, and a property test checks generated ones).
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlci.action.context import ALWAYS_IGNORED, context_entries, input_hash
from dlci.errors import DlciError

TREE = (
    "src/app.py",
    "src/sub/x.py",
    "requirements.txt",
    "README.md",
    "docs/A.LOG",
    "docs/b.log",
    "a/keep.txt",
    "a/b/keep.txt",
    "foo/bar/baz",
    "x/foo/y",
    "!bang",
    "#hash",
    "*star",
    "Dockerfile",
)
ALL = frozenset(TREE)

# name: (.dockerignore lines, the files the engine sends from TREE)
CASES: dict[str, tuple[list[str], frozenset[str]]] = {
    "star then !src": (["*", "!src"], frozenset({"src/app.py", "src/sub/x.py"})),
    "star, !src, !requirements.txt": (
        ["*", "!src", "!requirements.txt"],
        frozenset({"src/app.py", "src/sub/x.py", "requirements.txt"}),
    ),
    "a folder with a trailing slash": (["docs/"], ALL - {"docs/A.LOG", "docs/b.log"}),
    "a leading slash anchors nothing more": (["/foo"], ALL - {"foo/bar/baz"}),
    "** spans folders": (["**/foo"], ALL - {"foo/bar/baz", "x/foo/y"}),
    "case counts": (["**/*.LOG"], ALL - {"docs/A.LOG"}),
    "[!a] is a class of ! and a": (["docs/[!a]*"], ALL),
    "[^a] negates": (["docs/[^a]*"], ALL - {"docs/A.LOG", "docs/b.log"}),
    "a backslash escapes": (["\\*star", "\\!bang"], ALL - {"*star", "!bang"}),
    "# starts a comment only in the first column": (["#hash", " #hash"], ALL - {"#hash"}),
    "a later line overrides": (["a", "!a/b/keep.txt"], ALL - {"a/keep.txt"}),
    "an earlier exception is overridden": (
        ["!a/b/keep.txt", "a"],
        ALL - {"a/keep.txt", "a/b/keep.txt"},
    ),
    "an exception inside an excluded folder": (["foo", "!foo/bar"], ALL),
    ".. is cleaned away": (["src/../docs"], ALL - {"docs/A.LOG", "docs/b.log"}),
    "a leading ** with no wildcard after it matches any suffix": (
        ["**oo"],
        ALL - {"foo/bar/baz", "x/foo/y"},
    ),
    "the Dockerfile can be ignored": (["Dockerfile", ".dockerignore"], ALL - {"Dockerfile"}),
}
# The legacy builder does not walk into an excluded folder for an exception with a wildcard;
# BuildKit does, and sends a/keep.txt. The hash covers the larger set (a rebuild, never stale).
BUILDKIT_ONLY = {"an exception with a wildcard": (["*", "!*/keep.txt"], frozenset({"a/keep.txt"}))}


def make_tree(root: Path, files: tuple[str, ...] = TREE, ignore: list[str] | None = None) -> Path:
    for rel in files:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{rel}\n")
    if ignore is not None:
        (root / ".dockerignore").write_text("\n".join(ignore) + "\n")
    return root


def sent_files(context: Path) -> set[str]:
    return {e.rel for e in context_entries(context) if e.kind != "dir"} - {".dockerignore"}


@pytest.mark.parametrize("name", [*CASES, *BUILDKIT_ONLY])
def test_the_hashed_files_are_the_ones_docker_sends(tmp_path: Path, name: str) -> None:
    ignore, expected = {**CASES, **BUILDKIT_ONLY}[name]
    assert sent_files(make_tree(tmp_path, ignore=ignore)) == expected


def test_folders_sent_are_hashed_and_parents_of_re_included_files_are_not(tmp_path: Path) -> None:
    make_tree(tmp_path, ignore=["*", "!src", "!a/b/keep.txt"])
    folders = {e.rel for e in context_entries(tmp_path) if e.kind == "dir"}
    assert folders == {"src", "src/sub"}  # "a" and "a/b" are excluded themselves


def tag(context: Path) -> str:
    return input_hash(context / "Dockerfile", context, {})


def test_under_star_and_bang_src_a_source_edit_changes_the_tag_an_ignored_edit_does_not(
    tmp_path: Path,
) -> None:
    make_tree(tmp_path, ignore=["*", "!src"])
    first = tag(tmp_path)
    (tmp_path / "README.md").write_text("edited, ignored\n")
    (tmp_path / "docs" / "b.log").write_text("edited, ignored\n")
    assert tag(tmp_path) == first
    (tmp_path / "src" / "app.py").write_text("print('edited')\n")
    assert tag(tmp_path) != first


def _old_files(context: Path) -> set[str]:
    """The reading this replaced: negations dropped, fnmatch on each path and its parts."""
    patterns = list(ALWAYS_IGNORED)
    for line in (context / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")):
            patterns.append(line.lstrip("/").rstrip("/"))
    found = set()
    for root, _, files in os.walk(context):
        for name in files:
            parts = Path(root, name).relative_to(context).parts
            heads = ["/".join(parts[: i + 1]) for i in range(len(parts))]
            if not any(fnmatch.fnmatch(h, p) for h in heads + list(parts) for p in patterns):
                found.add("/".join(parts))
    return found - {".dockerignore"}


def test_control_the_old_reading_hashed_no_source_under_star_and_bang_src(tmp_path: Path) -> None:
    make_tree(tmp_path, ignore=["*", "!src"])
    assert _old_files(tmp_path) == set()  # src/app.py could change and the tag stayed
    assert sent_files(tmp_path) == CASES["star then !src"][1]


def test_control_the_old_reading_took_bracket_bang_for_a_negation(tmp_path: Path) -> None:
    make_tree(tmp_path, ignore=["docs/[!a]*"])
    assert "docs/b.log" not in _old_files(tmp_path)  # the engine sends it
    assert sent_files(tmp_path) == ALL


def test_the_executable_bit_and_a_link_target_change_the_tag(tmp_path: Path) -> None:
    make_tree(tmp_path, ignore=[])
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "current").symlink_to("src")
    first = tag(tmp_path)
    (tmp_path / "run.sh").chmod(0o755)
    second = tag(tmp_path)
    assert second != first
    (tmp_path / "current").unlink()
    (tmp_path / "current").symlink_to("docs")
    assert tag(tmp_path) != second


def test_an_empty_folder_that_is_sent_changes_the_tag(tmp_path: Path) -> None:
    make_tree(tmp_path, ignore=["build"])
    first = tag(tmp_path)
    (tmp_path / "build").mkdir()
    assert tag(tmp_path) == first  # ignored
    (tmp_path / "data").mkdir()
    assert tag(tmp_path) != first


def test_always_ignored_folders_stay_out_even_when_re_included(tmp_path: Path) -> None:
    make_tree(tmp_path, ignore=["!.git"])
    first = tag(tmp_path)
    for name in ALWAYS_IGNORED:
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text("changes on every run\n")
        (tmp_path / "src" / name).mkdir()
    assert tag(tmp_path) == first


def test_a_dockerfile_s_own_ignore_file_adds_what_buildkit_would_send(tmp_path: Path) -> None:
    make_tree(tmp_path, ignore=["*", "!src"])
    first = tag(tmp_path)
    (tmp_path / "Dockerfile.dockerignore").write_text("*\n!requirements.txt\n")
    with_own = tag(tmp_path)
    (tmp_path / "requirements.txt").write_text("torch==9\n")  # only BuildKit sends it
    assert tag(tmp_path) != with_own
    assert with_own != first  # the file list grew (and the rule file itself is sent)


def test_a_fifo_in_the_context_is_named_never_read(tmp_path: Path) -> None:
    make_tree(tmp_path, ignore=[])
    os.mkfifo(tmp_path / "pipe")
    code = f"from dlci.action.context import input_hash as h; from pathlib import Path as P; p = P({str(tmp_path)!r}); print(h(p / 'Dockerfile', p, {{}}))"
    # a reader of the FIFO would wait for a writer forever: in a child, with a bound
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert len(done.stdout.strip()) == 16


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("src/[ab", "not a pattern docker build accepts"),
        ("!", "not a pattern docker build accepts"),
        ("a\\", "trailing backslash"),
    ],
)
def test_a_pattern_docker_refuses_is_an_error_naming_its_line(
    tmp_path: Path, line: str, message: str
) -> None:
    make_tree(tmp_path, ignore=["# fine", "*.log", line])
    with pytest.raises(DlciError, match=message) as caught:
        tag(tmp_path)
    assert caught.value.location == f"{tmp_path / '.dockerignore'}:3"
    assert caught.value.hint
