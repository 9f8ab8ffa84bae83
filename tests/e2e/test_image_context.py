"""The hashed build context against what ``docker build`` really sends, and the tag end to end.

A Dockerfile of ``FROM scratch`` and ``COPY . /ctx/`` puts the context the engine received
into an image (no base image, nothing runs); ``docker cp`` reads it back as a tar stream.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlci.action.ignore import rules as context_module
from dlci.action.ignore.rules import context_entries, read_dockerignore
from dlci.cli import main
from dlci.errors import DlciError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_dockerignore import BUILDKIT_ONLY, CASES, make_tree

pytestmark = pytest.mark.e2e

LISTER = "FROM scratch\nCOPY . /ctx/\n"
PROBE_TAG = f"dlci-e2e-context:{uuid.uuid4().hex[:12]}"


def received(docker: str, context: Path) -> tuple[set[str], set[str]] | None:
    """(files and links, folders) that a real build of ``context`` received; None when the
    engine refused to build it."""
    build = subprocess.run(
        [docker, "build", "-q", "-t", PROBE_TAG, str(context)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if build.returncode != 0:
        return None
    created = subprocess.run(
        [docker, "create", "--network", "none", PROBE_TAG, "never-started"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    container = created.stdout.strip()
    try:
        copied = subprocess.run(
            [docker, "cp", f"{container}:/ctx", "-"], capture_output=True, timeout=120, check=True
        )
    finally:
        subprocess.run([docker, "rm", "-f", container], capture_output=True, timeout=120)
        subprocess.run([docker, "rmi", "-f", PROBE_TAG], capture_output=True, timeout=120)
    files, folders = set(), set()
    with tarfile.open(fileobj=io.BytesIO(copied.stdout)) as tar:
        for member in tar.getmembers():
            if member.name != "ctx":
                (folders if member.isdir() else files).add(member.name.removeprefix("ctx/"))
    return files, folders


def hashed(context: Path) -> tuple[set[str], set[str]]:
    entries = context_entries(context)
    files = {e.rel for e in entries if e.kind != "dir"}
    return files, {e.rel for e in entries if e.kind == "dir"}


def parents(paths: set[str]) -> set[str]:
    return {p.rsplit("/", i)[0] for p in paths for i in range(1, p.count("/") + 1)}


@pytest.mark.parametrize("name", [*CASES, *BUILDKIT_ONLY])
def test_the_classic_cases_are_what_the_engine_sends(
    docker_engine: str, tmp_path: Path, name: str
) -> None:
    ignore, expected = {**CASES, **BUILDKIT_ONLY}[name]
    make_tree(tmp_path, ignore=ignore)
    (tmp_path / "Dockerfile").write_text(LISTER)
    got = received(docker_engine, tmp_path)
    assert got is not None
    files = got[0] - {".dockerignore"}
    if name in BUILDKIT_ONLY:  # the legacy builder sends less; the hash covers BuildKit's
        assert files <= expected, files
    else:
        assert files == expected


NAMES = ["a", "b", "src", "A", "x.py", "y.log", "Y.LOG", "keep", "c d", "[x]", "*", "!b", "#h"]
SEGMENTS = [*NAMES[:8], "*", "**", "?", "*.py", "*.log", "[ab]", "[^a]", "[!a]", "\\*", ".", ".."]


@st.composite
def trees(draw: st.DrawFn) -> list[str]:
    paths = draw(st.lists(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3), max_size=10))
    files: list[str] = []
    for rel in sorted({"/".join(parts) for parts in paths}):
        if not any(rel.startswith(f + "/") or f.startswith(rel + "/") for f in files):
            files.append(rel)  # a name is a file or a folder, never both
    return files


@st.composite
def ignore_lines(draw: st.DrawFn) -> str:
    line = "/".join(draw(st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=3)))
    before = draw(st.sampled_from(["", "", "", "!", "/", "! /", "# ", "  ", "  !"]))
    return before + line + draw(st.sampled_from(["", "", "/", " "]))


@settings(
    max_examples=15,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(files=trees(), lines=st.lists(ignore_lines(), min_size=1, max_size=5))
def test_the_hashed_context_is_what_docker_build_receives(
    docker_engine: str, tmp_path_factory: pytest.TempPathFactory, files: list[str], lines: list[str]
) -> None:
    context = make_tree(tmp_path_factory.mktemp("ctx"), tuple(files), ignore=lines)
    (context / "Dockerfile").write_text(LISTER)
    got = received(docker_engine, context)
    try:
        ours = hashed(context)
    except DlciError:
        assert got is None, f"refused a .dockerignore the engine accepts: {lines}"
        return
    if got is None:
        return  # the engine refused a pattern (a stricter syntax check than ours): no build
    files_sent, folders_sent = got
    files_hashed, folders_hashed = ours
    assert files_sent <= files_hashed, f"sent but not hashed: {files_sent - files_hashed}"
    wildcard_exception = any(
        p.exclusion and any(c in p.text for c in "*[]?^\\")
        for p in read_dockerignore(context / ".dockerignore")
    )
    if not wildcard_exception:  # else BuildKit may send more than the legacy builder: a superset
        assert files_hashed == files_sent
        assert folders_sent == folders_hashed | parents(files_hashed)


def test_the_review_s_backtracking_patterns_give_what_the_engine_sends(
    docker_engine: str, tmp_path: Path
) -> None:
    """re took 25 s per path on the first line with these paths; the engine is linear."""
    deep = "/".join(["a"] * 21)
    files = (f"{deep}/y", f"{deep}/x", "a" * 50, "a" * 49 + "b", "aa/" * 29 + "aab", "keep")
    lines = ["**/" * 12 + "x", "*a" * 7 + "*b", "**a" * 5 + "**b", "!" + "**/" * 12 + "y"]
    make_tree(tmp_path, files, ignore=lines)
    (tmp_path / "Dockerfile").write_text(LISTER)
    got = received(docker_engine, tmp_path)
    assert got is not None
    files_hashed = hashed(tmp_path)[0]
    assert got[0] <= files_hashed  # the exception has a wildcard: BuildKit may send more
    assert got[0] - {".dockerignore", "Dockerfile"} == {f"{deep}/y", "a" * 50, "keep"}


# ---------------------------------------------------------------------- the tag, end to end

APP = "FROM scratch\nCOPY requirements.txt /app/\nCOPY src/ /app/src/\n"


def build_tag(context: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    argv = ["container", "build", "--dockerfile", str(context / "Dockerfile")]
    argv += ["--context", str(context), "--repository", "dlci-e2e-context-app"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    return captured.out.strip().splitlines()[-1], captured.err


def in_image(docker: str, tag: str, path: str) -> str:
    created = subprocess.run(
        [docker, "create", "--network", "none", tag, "never-started"],
        capture_output=True,
        text=True,
        check=True,
    )
    try:
        copied = subprocess.run(
            [docker, "cp", f"{created.stdout.strip()}:{path}", "-"], capture_output=True, check=True
        )
    finally:
        subprocess.run([docker, "rm", "-f", created.stdout.strip()], capture_output=True)
    with tarfile.open(fileobj=io.BytesIO(copied.stdout)) as tar:
        handle = tar.extractfile(tar.next())  # type: ignore[arg-type]
        assert handle is not None
        return handle.read().decode()


@pytest.fixture
def app(tmp_path: Path, docker_engine: str):
    """A project whose .dockerignore is ``*`` and ``!src``, ``!requirements.txt``."""
    make_tree(
        tmp_path, ("src/app.py", "README.md", "notes.txt"), ["*", "!src", "!requirements.txt"]
    )
    (tmp_path / "requirements.txt").write_text("numpy==1.0\n")
    (tmp_path / "Dockerfile").write_text(APP)
    yield tmp_path
    listed = subprocess.run(
        [docker_engine, "images", "-q", "dlci-e2e-context-app"], capture_output=True, text=True
    )
    if listed.stdout.split():
        subprocess.run(
            [docker_engine, "rmi", "-f", *set(listed.stdout.split())], capture_output=True
        )


def test_what_reaches_the_image_changes_the_tag_and_rebuilds_and_ignored_files_do_not(
    app: Path, docker_engine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    first, _ = build_tag(app, capsys)
    (app / "README.md").write_text("edited: ignored\n")
    (app / "notes.txt").write_text("edited: ignored\n")
    again, err = build_tag(app, capsys)
    assert again == first and "is up to date" in err
    (app / "src" / "app.py").write_text("print('new')\n")
    second, err = build_tag(app, capsys)
    assert second != first and "built" in err
    assert in_image(docker_engine, second, "/app/src/app.py") == "print('new')\n"
    (app / "requirements.txt").write_text("numpy==2.0\n")  # re-included by a negation
    third, _ = build_tag(app, capsys)
    assert third != second
    assert in_image(docker_engine, third, "/app/requirements.txt") == "numpy==2.0\n"


def _old_reading(monkeypatch) -> None:
    read = context_module.read_dockerignore
    monkeypatch.setattr(
        context_module,
        "read_dockerignore",
        lambda path: [p for p in read(path) if not p.exclusion],  # the old reading's gap
    )


def test_control_without_negations_the_edit_keeps_the_tag_and_the_image_is_stale(
    app: Path, docker_engine: str, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    """The old pipeline: the hash read the rules one way, and Docker, given the folder raw,
    read them its own way."""
    import dlci.action.host.image as image_module

    def raw_build(dockerfile: Path, context: Path, tag: str, *_: object, **__: object) -> None:
        argv = [docker_engine, "build", "-q", "-f", str(dockerfile), "-t", tag, str(context)]
        subprocess.run(argv, capture_output=True, check=True, timeout=300)

    _old_reading(monkeypatch)
    monkeypatch.setattr(image_module, "build", raw_build)
    first, _ = build_tag(app, capsys)
    (app / "src" / "app.py").write_text("print('new')\n")
    again, err = build_tag(app, capsys)
    assert again == first and "is up to date" in err
    assert in_image(docker_engine, again, "/app/src/app.py") == "src/app.py\n"  # stale


def test_with_the_hosts_stream_a_reading_gap_fails_the_build_never_a_stale_image(
    app: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    """The same gap in the rules now shapes the stream that is sent too (issue 35): the
    build lacks what the hash lacks, so it fails where the old one went stale."""
    _old_reading(monkeypatch)
    argv = ["container", "build", "--dockerfile", str(app / "Dockerfile")]
    argv += ["--context", str(app), "--repository", "dlci-e2e-context-app"]
    assert main(argv) == 1
    assert "COPY failed" in capsys.readouterr().err
