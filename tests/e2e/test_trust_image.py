"""The job's image, attacked from a pull request's own files (issue 35).

One module-scoped run builds, with ``dlci container build`` against the real engine and a
Dockerfile whose usual line is ``COPY . /opt/project/``:

- the pull request's tree, on a ``pull_request`` event: the base tree plus a file planted under
  ``.venv/`` (a folder the tag's hash leaves out), and a ``.git/config`` holding the job token
  as actions/checkout persists it;
- then the base tree on a ``push`` to the default branch (a trusted job), as the next job on
  the runner would;
- the control: the pull request's tree sent raw, as ``docker build DIR`` (the old build) sends
  it, while the old hash (the context's entries, which leave ``.venv`` out) is the same for
  both trees: the trusted job would have reused the pull request's image, and the image holds
  the plant and the token.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dlci.action.host.archive import context_hash
from dlci.action.ignore.rules import context_entries
from dlci.cli import main

pytestmark = pytest.mark.e2e

TOKEN = "ghs_e2eIMAGEtoken4242"
CHECKOUT = f'[http "https://github.com/"]\n\textraheader = AUTHORIZATION: basic {TOKEN}\n'
DOCKERFILE = "FROM scratch\nCOPY . /opt/project/\n"


def tree(root: Path, *, planted: bool) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print('app')\n")
    (root / "Dockerfile").write_text(DOCKERFILE)
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text(CHECKOUT)
    if planted:
        (root / ".venv" / "lib").mkdir(parents=True)
        (root / ".venv" / "lib" / "planted.py").write_text("print('planted by a pull request')\n")
    return root


def files_of(docker: str, tag: str) -> dict[str, bytes]:
    """Every regular file of the image, by path, read from ``docker export`` (never started)."""
    made = subprocess.run(
        [docker, "create", "--network", "none", tag, "never-started"],
        capture_output=True,
        text=True,
        check=True,
    )
    cid = made.stdout.strip()
    try:
        exported = subprocess.run([docker, "export", cid], capture_output=True, check=True)
    finally:
        subprocess.run([docker, "rm", "-f", cid], capture_output=True, check=False)
    found = {}
    with tarfile.open(fileobj=io.BytesIO(exported.stdout)) as tar:
        for member in tar:
            handle = tar.extractfile(member) if member.isfile() else None
            if handle is not None:
                found[member.name] = handle.read()
    return found


@dataclass
class Built:
    tag: str
    err: str
    files: dict[str, bytes]


@dataclass
class Builds:
    pull_request: Built
    push: Built
    control: Built
    same_old_hash: bool
    stream_hash: str  # the hash of the pull request's context stream, computed again here


def dlci_build(ctx: Path, repository: str, event: str, docker: str) -> Built:
    env = {"GITHUB_EVENT_NAME": event, "GITHUB_REF": "refs/heads/main"}
    env["DLCI_DEFAULT_BRANCH"] = "main"
    out, err = io.StringIO(), io.StringIO()
    argv = ["container", "build", "--dockerfile", str(ctx / "Dockerfile"), "--context", str(ctx)]
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        patch.delenv("DLCI_NETWORK", raising=False)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([*argv, "--repository", repository])
    assert code == 0, err.getvalue()
    tag = out.getvalue().strip().splitlines()[-1]
    return Built(tag, err.getvalue(), files_of(docker, tag))


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory, docker_engine: str) -> Iterator[Builds]:
    repository = f"dlci-e2e-image-{uuid.uuid4().hex[:8]}"
    base = tree(tmp_path_factory.mktemp("base"), planted=False)
    pr = tree(tmp_path_factory.mktemp("pr"), planted=True)
    tags: list[str] = []
    pull = dlci_build(pr, repository, "pull_request", docker_engine)
    tags.append(pull.tag)
    push = dlci_build(base, repository, "push", docker_engine)
    tags.append(push.tag)
    control_tag = f"{repository}:control"
    subprocess.run(
        [docker_engine, "build", "-q", "-t", control_tag, str(pr)],
        capture_output=True,
        check=True,
        timeout=300,
    )
    tags.append(control_tag)
    try:
        same = _old_entries(base) == _old_entries(pr)
        control = Built(control_tag, "", files_of(docker_engine, control_tag))
        yield Builds(pull, push, control, same, context_hash(pr / "Dockerfile", pr, {}))
    finally:
        subprocess.run([docker_engine, "image", "rm", "-f", *tags], capture_output=True)


def _old_entries(ctx: Path) -> list[tuple[str, str, bytes]]:
    """What the old hash covered: the entries, less the always-ignored folders."""
    return [
        (e.rel, e.kind, e.path.read_bytes() if e.kind == "file" else b"")
        for e in context_entries(ctx)
    ]


def _has(files: dict[str, bytes], needle: bytes) -> list[str]:
    return [path for path, data in files.items() if needle in data]


def test_control_the_old_build_puts_the_plant_and_the_token_into_an_image_of_the_same_hash(
    builds: Builds,
) -> None:
    assert builds.same_old_hash  # the old tag: the trusted job would have reused this image
    assert "opt/project/.venv/lib/planted.py" in builds.control.files
    assert _has(builds.control.files, TOKEN.encode()) == ["opt/project/.git/config"]


def test_a_pull_requests_image_is_never_the_one_a_trusted_job_reuses(builds: Builds) -> None:
    pr, push = builds.pull_request, builds.push
    assert pr.tag.split(":")[1].startswith("untrusted-")
    assert push.tag.split(":")[1].startswith("trusted-")
    assert "built " in push.err and "is up to date" not in push.err  # its own build
    assert pr.tag.split(":")[1].removeprefix("untrusted-") == push.tag.split(":")[1].removeprefix(
        "trusted-"
    )  # the same inputs hash the same: only the trust level keeps the tags apart
    for built in (pr, push):
        assert not [p for p in built.files if ".venv" in p]  # the always-ignored are never sent


def test_the_job_token_in_git_config_never_reaches_the_image(builds: Builds) -> None:
    for built in (builds.pull_request, builds.push):
        assert "opt/project/src/app.py" in built.files  # COPY . did copy the project
        assert not [p for p in built.files if "/.git" in p]
        assert _has(built.files, TOKEN.encode()) == []
        assert ".dlci-dockerfile" not in " ".join(built.files)  # the stream's own files


def test_the_tag_is_the_hash_of_the_stream_docker_received(builds: Builds) -> None:
    assert "the host's stream of it" in builds.pull_request.err
    assert builds.pull_request.tag.endswith(f":untrusted-{builds.stream_hash}")


# ------------------------------------------------------------- a Dockerfile that is a link (42)

CREDENTIALS = "runner-credentials-canary-e2e-42"


def _build_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd) -> tuple[int, str]:
    """``dlci container build`` of a pull request whose Dockerfile is a link to a host file
    (a stand-in for the runner's .credentials), on a pull_request event; all it printed."""
    host = tmp_path / "runner" / ".credentials"
    host.parent.mkdir(parents=True)
    host.write_text(f"{CREDENTIALS} is not a Dockerfile instruction\n")
    ws = tree(tmp_path / "ws", planted=False)
    (ws / "Dockerfile").unlink()
    (ws / "Dockerfile").symlink_to(host)
    monkeypatch.chdir(ws)
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request")
    monkeypatch.delenv("DLCI_NETWORK", raising=False)
    argv = ["container", "build", "--dockerfile", "Dockerfile", "--context", "."]
    code = main([*argv, "--repository", f"dlci-e2e-link-{uuid.uuid4().hex[:8]}"])
    out, err = capfd.readouterr()  # the builder's own output too (the engine's parse error)
    return code, out + err


def test_a_dockerfile_linked_to_a_host_file_is_refused_before_a_byte_is_read(
    tmp_path: Path, docker_engine: str, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    code, said = _build_link(tmp_path, monkeypatch, capfd)
    assert code == 1 and "Dockerfile is a symbolic link" in said
    assert CREDENTIALS.upper() not in said.upper()


def test_control_through_the_link_the_builder_prints_the_host_file(
    tmp_path: Path, docker_engine: str, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    """The old reads (no check of the path, ``Path.read_bytes``): the engine's parse error of
    the first line puts the host file into the job's log."""
    import dlci.action.host.archive as archive
    import dlci.action.host.image as image

    monkeypatch.setattr(image, "refuse_links", lambda path, what: None)
    monkeypatch.setattr(
        archive, "read_beneath", lambda root, name, **kw: (root / name).read_bytes()
    )
    code, said = _build_link(tmp_path, monkeypatch, capfd)
    assert code == 1 and CREDENTIALS.upper() in said.upper()  # the legacy builder: upper case
