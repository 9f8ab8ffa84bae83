"""The image's tag covers what ``docker build`` sends: Docker's .dockerignore rules, no engine.

The expected lists below are what the real engine sends (tests/e2e/test_image_context.py
checks every case of CASES against it, and a property test checks generated ones).
"""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlci.action.host.archive import context_hash as input_hash
from dlci.action.ignore import automaton as automaton_module
from dlci.action.ignore import rules as context_module
from dlci.action.ignore.automaton import ASSERT, CHAR, JMP, MATCH, SPLIT, Automaton
from dlci.action.ignore.rules import ALWAYS_IGNORED, compile_pattern, context_entries
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
    code = f"from dlci.action.host.archive import context_hash as h; from pathlib import Path as P; p = P({str(tmp_path)!r}); print(h(p / 'Dockerfile', p, {{}}))"
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


# ------------------------------------------------- the matcher: re's answers, in linear time

PIECES = ["a", "b", "/", "*", "**", "**/", "?", "[ab]", "[^a]", "[!a]", "[a-c]", "[]a]", "[*]"]
PIECES += ["\\*", "\\d", "\\w", "\\b", "\\B", "\\A", "\\Z", "^", "]", ".", "x.y", "[\\w]"]


@settings(max_examples=300, derandomize=True, deadline=None, database=None)
@given(
    pattern=st.lists(st.sampled_from(PIECES), min_size=1, max_size=6).map("".join),
    paths=st.lists(st.text("ab/A.x!*]_ 1\n", max_size=8), min_size=1, max_size=8),
)
def test_the_automaton_answers_what_re_answered_on_the_same_regex(
    pattern: str, paths: list[str]
) -> None:
    try:
        compiled = compile_pattern(pattern)
    except re.error:
        return  # refused, as before
    if compiled.automaton is None:
        return  # one of the engine's shortcuts, unchanged
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        regex = re.compile(compiled.automaton.source)  # what matched before (short paths)
    for path in paths:
        assert compiled.matches(path) == (regex.match(path) is not None), (pattern, path)


# each pair: a regex context.py builds and the paths where an anchor, "." or a class decides
ANCHORED = {
    r"^a\b[^/]*\Z": ["a", "a b", "ab", "a/b"],
    r"^a\B[^/]*\Z": ["a", "a b", "ab", "a_"],
    r"^\b[^/]*\Z": ["", "a", " a"],
    r"^\B[^/]*\Z": ["", "a", " a"],
    r"^a^b\Z": ["ab", "b"],
    r"^(.*/)?\Ab\Z": ["b", "a/b"],
    r"^a\Zb\Z": ["a", "ab"],
    r"^a.*\Z": ["a", "a/b", "a\nb"],
    r"^[\w-][^a-c]\d\Z": ["-x1", "_b1", "a\u0661", "é\u0661"],
}


@pytest.mark.parametrize("regex", ANCHORED)
def test_anchors_any_and_classes_mean_what_they_meant_to_re(regex: str) -> None:
    automaton = Automaton(regex)
    for path in ANCHORED[regex]:
        assert automaton.matches(path) == (re.match(regex, path) is not None), path


def backtracking_steps(automaton: Automaton, text: str, limit: int) -> int:
    """The steps of a backtracking run of the same program (what ``re`` does: each split
    tries its first branch to the end before the second), stopped at ``limit``."""
    steps = 0

    def run(pc: int, pos: int) -> bool:
        nonlocal steps
        steps += 1
        if steps >= limit:
            return True  # stop: enough to show it
        op, arg = automaton.ops[pc], automaton.args[pc]
        if op == MATCH:
            return True
        if op == CHAR:
            return pos < len(text) and arg(text[pos]) and run(pc + 1, pos + 1)
        if op == SPLIT:
            return run(arg[0], pos) or run(arg[1], pos)
        if op == JMP:
            return run(arg, pos)
        assert op == ASSERT and arg is not None
        at_end = arg is automaton_module.sre.AT_END_STRING
        return (pos == len(text) if at_end else pos == 0) and run(pc + 1, pos)

    run(0, 0)
    return steps


# the review's cases: 2.2 s (31 characters), 7.4 s (37) and 25.6 s (43) for one path with re
HOSTILE = {
    "**/ x 12, then x": ("**/" * 12 + "x", "/".join(["a"] * 21) + "/y"),
    "*a x 7, then *b": ("*a" * 7 + "*b", "a" * 50),
    "**a x 5, then **b": ("**a" * 5 + "**b", "/".join(["aa"] * 30)),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_match_takes_at_most_one_pass_over_the_program_per_character(name: str) -> None:
    pattern, path = HOSTILE[name]
    automaton = compile_pattern(pattern).automaton
    assert automaton is not None
    bound = (len(path) + 1) * (len(automaton.ops) + 1)
    assert not automaton.matches(path)
    assert automaton.steps <= bound
    before = automaton.steps
    assert not automaton.matches(path)
    assert automaton.steps - before == len(path)  # the states are built: a step a character
    # control: backtracking over the same program, as re did, takes far more than the bound
    assert backtracking_steps(automaton, path, limit=100 * bound) >= 100 * bound


def test_a_pattern_that_needs_a_back_reference_is_refused_as_the_engine_refuses_it(
    tmp_path: Path,
) -> None:
    make_tree(tmp_path, ignore=["**/a\\1"])  # re took \1 for its group; Go has no such thing
    with pytest.raises(DlciError, match="back-reference") as caught:
        tag(tmp_path)
    assert caught.value.location == f"{tmp_path / '.dockerignore'}:1"


def test_more_patterns_than_the_cap_is_an_error_naming_the_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(context_module, "MAX_PATTERNS", 3)
    make_tree(tmp_path, ignore=["# a comment is no pattern", "a", "b", "c"])
    tag(tmp_path)  # control: 3 patterns
    (tmp_path / ".dockerignore").write_text("a\nb\n\nc\n!d\n")
    with pytest.raises(DlciError, match="more than 3 patterns") as caught:
        tag(tmp_path)
    assert caught.value.location == f"{tmp_path / '.dockerignore'}:5"
    assert caught.value.hint


def test_an_ignore_file_over_the_size_cap_is_an_error_naming_the_file_and_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(context_module, "IGNORE_FILE_LIMIT", 64)
    make_tree(tmp_path, ignore=["x" * 60])
    tag(tmp_path)  # control: 61 bytes
    (tmp_path / ".dockerignore").write_text("x" * 65)
    with pytest.raises(DlciError, match="more than the 64 bytes") as caught:
        tag(tmp_path)
    assert str(tmp_path / ".dockerignore") in str(caught.value)


def test_patterns_that_need_more_work_than_the_budget_are_an_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = ["*a" * 8 + "*b" + str(i) for i in range(20)]
    files = tuple("a" * n + "/f" for n in range(1, 30))
    make_tree(tmp_path, files, ignore=lines)  # about 13,000 steps to build the states
    monkeypatch.setattr(automaton_module, "STEP_LIMIT", 5_000)
    with pytest.raises(DlciError, match="more than 5,000 steps") as caught:
        context_entries(tmp_path)
    assert caught.value.location == str(tmp_path / ".dockerignore")
    assert caught.value.hint
    monkeypatch.setattr(automaton_module, "STEP_LIMIT", 50_000)
    assert len(context_entries(tmp_path)) == 2 * len(files) + 1  # control: a larger budget


def test_cached_states_stay_under_the_bound_and_answers_do_not_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    paths = ["".join(chr(0x400 + 20 * i + k) for k in range(20)) + "/ab" for i in range(60)]
    paths += [p.replace("/ab", "/ba") for p in paths]
    free = compile_pattern("**/a*b")
    monkeypatch.setattr(automaton_module, "CACHE_LIMIT", 50)
    bounded = compile_pattern("**/a*b")
    assert free.automaton is not None and bounded.automaton is not None
    one_match = (len(paths[0]) + 1) * (len(bounded.automaton.ops) + 1)  # what one adds at most
    for path in paths:
        assert bounded.matches(path) == free.matches(path) == path.endswith("ab")
        assert bounded.automaton.work.cached <= 50 + one_match
    assert free.automaton.work.cached > 50 + one_match  # control: without the bound
