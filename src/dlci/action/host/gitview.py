"""The container's view of ``.git``: the credentials a checkout left there, hidden.

actions/checkout (``persist-credentials``, its default) writes the job's token into
``.git/config`` as ``http.https://github.com/.extraheader = AUTHORIZATION: basic ...``; newer
versions write it to a file under ``$RUNNER_TEMP`` that ``.git/config`` includes. The container
mounts the workspace with its ``.git`` and runs the pull request's code, so the host writes a
sanitised copy of every git config file in ``.git`` (submodules' and worktrees' too) into a
host folder, and the container sees that copy, read-only, in the original's place. Files that
hold credentials themselves (``.git-credentials``, a helper's ``--file``, an included file
inside the workspace) are covered by an empty file. Host-side, never imports torch.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dlci.action.host.image import say

CONFIG_NAMES = ("config", "config.worktree")
CREDENTIAL_FILES = (".git-credentials",)  # at the workspace's root and in .git
# folders of a git directory that hold no config file (objects can be large: never walked)
NOT_CONFIG = frozenset({"objects", "refs", "logs", "hooks", "lfs", "info", "rr-cache"})

_HEADER = re.compile(r'\s*\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\\n]|\\.)*)")?\s*\]')
_KEY = re.compile(r"\s*([A-Za-z][A-Za-z0-9-]*)\s*(?:=(.*))?$", re.DOTALL)
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^/@\s]*)@")
_AUTH = re.compile(r"authorization\s*:|\bbearer\s|\bbasic\s+[A-Za-z0-9+/=]{8}", re.IGNORECASE)
_HELPER_FILE = re.compile(r"--file(?:=|\s+)(\S+)")


@dataclass
class Sanitised:
    """A git config's text without credentials, and what was taken out."""

    text: str
    hidden: list[str] = field(default_factory=list)  # kinds: extraheader, credential helper, ...
    names: list[str] = field(default_factory=list)  # the keys, e.g. http.<url>.extraheader
    files: list[str] = field(default_factory=list)  # include paths and helpers' --file paths


def _secret_userinfo(match: re.Match[str]) -> bool:
    scheme, info = match.group(1).lower(), match.group(2)
    return ":" in info or scheme.startswith("http")  # ssh://git@host is a user name, no secret


def _strip_userinfo(value: str) -> str:
    return _USERINFO.sub(lambda m: m.group(1) if _secret_userinfo(m) else m.group(0), value)


def _why(section: str, sub: str | None, key: str, value: str) -> str | None:
    """The kind of credential a ``section.sub.key = value`` line holds, or None."""
    if section == "credential":
        return "credential helper" if key == "helper" else "credential setting"
    if section in ("include", "includeif"):
        return "include"
    if key == "extraheader":
        return "extraheader"
    if section == "url" and sub and any(_secret_userinfo(m) for m in _USERINFO.finditer(sub)):
        return "url with userinfo"
    if _AUTH.search(value):
        return "authorization header"
    return None


def _logical_lines(text: str) -> Iterator[str]:
    """git's lines: one ending in a backslash goes on with the next."""
    pending = ""
    for line in text.splitlines(keepends=True):
        pending += line
        if not pending.rstrip("\r\n").endswith("\\"):
            yield pending
            pending = ""
    if pending:
        yield pending


def sanitise(text: str) -> Sanitised:
    """``text`` without credentials; a line it cannot read is dropped too (fail closed).

    >>> s = sanitise('[http "https://github.com/"]\\n\\textraheader = AUTHORIZATION: basic eA==\\n')
    >>> s.hidden, s.text
    (['extraheader'], '[http "https://github.com/"]\\n')
    """
    out: list[str] = []
    result = Sanitised("")
    section, sub = "", None
    for raw in _logical_lines(text):
        line = raw
        header = _HEADER.match(line)
        if header:
            name, quoted = header.group(1).lower(), header.group(2)
            section, _, old_sub = name.partition(".")
            sub = quoted if quoted is not None else (old_sub or None)
            if _why(section, sub, "", "") is None:  # not a section of credentials only
                out.append(_strip_userinfo(line[: header.end()]) + "\n")
            line = line[header.end() :]
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            if stripped:
                out.append(line)
            continue
        match = _KEY.match(line)
        if match is None or not section:
            result.hidden.append("unreadable line")
            continue
        key, value = match.group(1).lower(), match.group(2) or ""
        kind = _why(section, sub, key, value)
        dotted = ".".join(p for p in (section, sub, key) if p)
        if kind is None:
            clean = _strip_userinfo(line)
            if clean != line:
                result.hidden.append("url with userinfo")
                result.names.append(dotted)
            out.append(clean)
            continue
        result.hidden.append(kind)
        result.names.append(dotted)
        if kind == "include" and key == "path":
            result.files.append(value.strip().strip('"'))
        helper = _HELPER_FILE.search(value) if kind == "credential helper" else None
        if helper:
            result.files.append(helper.group(1).strip('"'))
    result.text = "".join(out)
    return result


# ----------------------------------------------------------------- the workspace's view


@dataclass
class GitView:
    """Files to mount read-only over the workspace, and what they hide."""

    mounts: list[tuple[Path, str]] = field(default_factory=list)  # host file, relative path
    hidden: dict[str, list[str]] = field(default_factory=dict)  # relative path -> kinds

    def lines(self) -> list[str]:
        """One console line per file, e.g. ``... .git/config ...: 1 extraheader``."""
        said = []
        for rel, kinds in self.hidden.items():
            counts = ", ".join(f"{n} {kind}" for kind, n in Counter(kinds).items())
            said.append(f"credentials in {rel} hidden from the container: {counts}")
        return said


def _git_dir(workspace: Path) -> Path | None:
    """The workspace's git directory when it lies inside the workspace; a ``.git`` file
    (a worktree, a submodule) names it with ``gitdir:``."""
    dot_git = workspace / ".git"
    if dot_git.is_file():
        first = dot_git.read_text(errors="replace").partition("\n")[0]
        if not first.startswith("gitdir:"):
            return None
        dot_git = (workspace / first[len("gitdir:") :].strip()).resolve()
    if not dot_git.is_dir() or not _inside(dot_git, workspace):
        return None
    return dot_git


def _inside(path: Path, workspace: Path) -> bool:
    return path.resolve().is_relative_to(workspace.resolve())


def config_files(git_dir: Path) -> Iterator[Path]:
    """Every git config file of a git directory: its own, submodules', worktrees'."""
    for folder, dirs, files in os.walk(git_dir):
        if "HEAD" in files:  # a git directory: skip what holds no config
            dirs[:] = [d for d in dirs if d not in NOT_CONFIG]
        for name in files:
            if name in CONFIG_NAMES:
                yield Path(folder) / name


def git_view(workspace: Path, into: Path) -> GitView:
    """Sanitised copies of the workspace's git config files, written under ``into``."""
    workspace = workspace.resolve()
    view = GitView()
    covered: set[Path] = set()

    def cover(host: Path, rel: str, text: str, kinds: list[str]) -> None:
        copy = into / f"{len(view.mounts)}-{host.name}"
        copy.write_text(text, errors="surrogateescape")
        view.mounts.append((copy, rel))
        view.hidden.setdefault(rel, []).extend(kinds)
        covered.add(host.resolve())

    git_dir = _git_dir(workspace)
    suspects = [workspace / name for name in CREDENTIAL_FILES]
    for config in config_files(git_dir) if git_dir else ():
        rel = config.relative_to(workspace).as_posix()
        if config.is_symlink():  # never read through a link the container's code may have made
            cover(config, rel, "", ["symbolic link"])
            continue
        clean = sanitise(config.read_text(errors="surrogateescape"))
        if clean.hidden:
            cover(config, rel, clean.text, clean.hidden)
        for name in clean.files:
            suspects.append(config.parent / os.path.expanduser(name))
    if git_dir:
        suspects += [git_dir / name for name in CREDENTIAL_FILES]
    for path in suspects:
        if path.is_file() and _inside(path, workspace) and path.resolve() not in covered:
            real = path.resolve()
            cover(real, real.relative_to(workspace).as_posix(), "", ["credential file"])
    return view


def host_temp(environ: dict[str, str]) -> tempfile.TemporaryDirectory[str]:
    """A folder for files the container mounts: under RUNNER_TEMP when there is one (an ARC
    runner shares its work volume, not /tmp, with the Docker engine), removed afterwards."""
    runner_temp = environ.get("RUNNER_TEMP", "")
    return tempfile.TemporaryDirectory(
        prefix="dlci-view-", dir=runner_temp if os.path.isdir(runner_temp) else None
    )


def hide_credentials(workspace: Path, into: Path) -> list[tuple[Path, str]]:
    """git_view's files to mount, what they hide said on the console."""
    view = git_view(workspace, into)
    for line in view.lines():
        say(line)
    return view.mounts


def scan(workspace: Path) -> dict[str, list[str]]:
    """What the container's view hides, by file (for preflight's report); nothing stays."""
    with tempfile.TemporaryDirectory(prefix="dlci-scan-") as tmp:
        return git_view(workspace, Path(tmp)).hidden
