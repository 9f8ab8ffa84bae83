"""The build's inputs: the files ``docker build`` sends (Docker's .dockerignore rules), the hash.

Host-side (the runner), never imports torch. A built image is tagged by a hash of the
Dockerfile, the build arguments and the build context, so the hash must cover exactly what
reaches the build: a file it misses can change while the tag stays, and the job runs on a
stale image. The rules are ported from the code the engine runs (the CLI's reader, moby's
patternmatcher, BuildKit's walk) and checked against a real build by
tests/e2e/test_image_context.py:

- ``.dockerignore`` is read as the Docker CLI reads it: a ``#`` in the first column starts a
  comment (an indented one is a pattern), surrounding spaces go, ``!`` re-includes, each
  pattern is cleaned like Go's ``filepath.Clean`` and loses a leading ``/``;
- a path is matched as moby's patternmatcher does (case-sensitive; ``*`` and ``?`` stop at
  ``/``; ``**`` spans folders; ``[^a]`` negates a class, ``[!a]`` does not; ``\\`` escapes;
  a leading ``**`` without a wildcard after it matches any suffix), later lines overriding
  earlier ones, a folder's verdict passed down to what it holds; the engine's regex runs in
  linear time (``dlci.action.ignore.automaton``), as Go's does, within caps on the file;
- an excluded folder is walked into when an exception could re-include something inside it:
  BuildKit's rule, which walks into more folders than the legacy builder (whenever an
  exception has a wildcard); hashing the larger set costs a rebuild, never a stale image.

The Docker SDK for Python (``docker.utils.build``) was measured against the engine first and
differs on five classes of patterns, three of them in the unsafe direction (docs/container.md),
so it is not used. ``ALWAYS_IGNORED`` folders are left out whatever the file says: out of the
hash and, since the host assembles the context (dlci.action.host.archive), out of the build.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from dlci.action.ignore.automaton import Automaton, Work, WorkLimit
from dlci.errors import DlciError
from dlci.fsutil import read_input

ALWAYS_IGNORED = frozenset(
    {".git", ".venv", "dlci-artifacts", "__pycache__", ".pytest_cache", ".mypy_cache"}
)
IGNORE_FILE_LIMIT = 1 << 20  # bytes; Docker's own reader stops at a line of 64 KiB
MAX_PATTERNS = 10_000  # each path is tested against every pattern: bounded work per path
# Go's unicode.IsSpace, which strings.TrimSpace uses (Python's strip() also takes \x1c-\x1f)
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" + "".join(
    map(chr, range(0x2000, 0x200B))
)
_REGEX_SPECIAL = ".+()|{}$"  # escaped: special in a regex, plain in a Docker pattern
_WILDCARDS = "*[]?^\\"  # an exception with one of these may match inside any folder
_SHORTER = "ignore whole folders (build/) rather than listing their files one by one"


# ---------------------------------------------------------------------------- the patterns


@dataclass(frozen=True)
class Pattern:
    """One cleaned ``.dockerignore`` pattern, compiled the way the engine compiles it."""

    text: str
    exclusion: bool  # a ``!`` line: re-include what matches
    kind: str  # exact, prefix, suffix or regex: the engine's shortcuts, kept for their quirks
    automaton: Automaton | None = None  # the engine's regex, run in linear time

    def matches(self, path: str) -> bool:
        """Whether ``path`` (slash-separated, relative to the context) matches.

        >>> compile_pattern("**/*.log").matches("docs/A.LOG")  # case counts
        False
        >>> compile_pattern("**foo").matches("xfoo"), compile_pattern("**/foo").matches("foo")
        (True, True)
        """
        if self.kind == "exact":
            return path == self.text
        if self.kind == "prefix":
            return path.startswith(self.text[:-2])
        if self.kind == "suffix":
            tail = self.text[2:]
            return path.endswith(tail) or (tail.startswith("/") and path == tail[1:])
        assert self.automaton is not None
        return self.automaton.matches(path)

    def may_reinclude_inside(self, folder: str) -> bool:
        """Whether this exception could match something inside the excluded ``folder``."""
        text = self.text.removesuffix("/**").removesuffix("/*")
        return any(c in text for c in _WILDCARDS) or (text + "/").startswith(folder + "/")


def clean(path: str) -> str:
    """Go's ``filepath.Clean`` on a slash-separated path.

    >>> clean("a//b/./../c/"), clean("../a/.."), clean("/../x"), clean("")
    ('a/c', '..', '/x', '.')
    """
    rooted = path.startswith("/")
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not rooted:
                parts.append(part)
        elif part not in ("", "."):
            parts.append(part)
    body = "/".join(parts)
    return "/" + body if rooted else body or "."


def compile_pattern(line: str, work: Work | None = None) -> Pattern:
    """A pattern as moby's patternmatcher compiles it (its regex, or one of its shortcuts);
    ``re.error`` for one that the engine refuses too. The regex is run by an automaton
    (``dlci.action.ignore.automaton``), never by ``re``, which backtracks on it."""
    text = clean(line.strip(_GO_SPACE))
    exclusion = text.startswith("!")
    if exclusion:
        text = text[1:]
        if not text:
            raise re.error("a '!' with no pattern after it (illegal exclusion pattern)")
    regex, kind, pos, first = ["^"], "exact", 0, True
    while pos < len(text):
        ch, pos = text[pos], pos + 1
        if ch == "*" and text[pos : pos + 1] == "*":
            pos += 2 if text[pos + 1 : pos + 2] == "/" else 1  # "**/" reads as "**"
            if pos < len(text):
                regex.append("(.*/)?")
                kind = "regex"
            elif kind == "exact":
                kind = "prefix"
            else:
                regex.append(".*")
                kind = "regex"
            kind = "suffix" if first else kind
        elif ch in "*?":
            regex.append("[^/]*" if ch == "*" else "[^/]")
            kind = "regex"
        elif ch in _REGEX_SPECIAL:
            regex.append("\\" + ch)
        elif ch == "\\":
            if pos < len(text):
                regex.append("\\" + text[pos])
                pos, kind = pos + 1, "regex"
            else:
                raise re.error("a trailing backslash escapes nothing")
        else:
            regex.append(ch)
            kind = "regex" if ch in "[]" else kind
        first = False
    if kind != "regex":
        return Pattern(text, exclusion, kind)
    source = "".join(regex) + r"\Z"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "possible nested set" on a pattern such as [[]
        re.compile(source)  # what the matcher refused before, it refuses still
        return Pattern(text, exclusion, kind, Automaton(source, work))


def read_dockerignore(path: Path) -> list[Pattern]:
    """An ignore file read as the Docker CLI reads it, compiled; none when there is no file."""
    if not path.exists():
        return []
    data = read_input(path, what="Docker ignore file", limit=IGNORE_FILE_LIMIT, hint=_SHORTER)
    text = data.decode("utf-8", errors="replace").removeprefix("\ufeff")
    patterns: list[Pattern] = []
    work = Work()  # one budget for all the file's patterns
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.removesuffix("\r")
        if line.startswith("#"):
            continue
        line = line.strip(_GO_SPACE)
        invert = line.startswith("!")
        if invert:
            line = line[1:].strip(_GO_SPACE)
        if line:
            line = clean(line)
            line = line[1:] if len(line) > 1 and line.startswith("/") else line
        elif not invert:
            continue
        if len(patterns) == MAX_PATTERNS:
            raise DlciError(
                f"more than {MAX_PATTERNS:,} patterns", file=str(path), line=number, hint=_SHORTER
            )
        try:
            patterns.append(compile_pattern("!" + line if invert else line, work))
        except re.error as exc:
            raise DlciError(
                f"{line!r} is not a pattern docker build accepts: {exc}",
                file=str(path),
                line=number,
                hint="escape a literal [ ] * ? or \\ with a backslash, or remove the line",
            ) from None
    return patterns


def excluded(
    patterns: list[Pattern], path: str, parent: list[bool] | None = None
) -> tuple[bool, list[bool]]:
    """Whether ``path`` is left out, and which patterns matched it (for what it holds).

    moby's ``MatchesUsingParentResults``: a pattern that matched the folder above counts as
    matching; a pattern is skipped when it cannot change the verdict so far, and then counts
    as not matching for the folder's contents (the engine's quirk, kept).

    >>> rules = [compile_pattern("*"), compile_pattern("!src")]
    >>> [excluded(rules, p)[0] for p in ("README.md", "src", "srcs")]
    [True, False, True]
    """
    verdict, matched = False, [False] * len(patterns)
    for i, pattern in enumerate(patterns):
        hit = parent[i] if parent else False
        if not hit:
            if pattern.exclusion != verdict:
                continue
            hit = pattern.matches(path)
        matched[i] = hit
        if hit:
            verdict = not pattern.exclusion
    return verdict, matched


# ---------------------------------------------------------------------------- the walk


@dataclass(frozen=True)
class Entry:
    """One thing the build context sends: a file, a folder or a symbolic link."""

    rel: str  # slash-separated, relative to the context
    kind: str  # file, dir, link, other (a FIFO, a socket, a device: never read)
    path: Path


def context_entries(context: Path, rules: Path | None = None) -> list[Entry]:
    """What ``docker build`` sends from ``context`` under the ignore file ``rules`` (default:
    the context's ``.dockerignore``), less ``ALWAYS_IGNORED``, sorted."""
    rules = rules or context / ".dockerignore"
    patterns = read_dockerignore(rules)
    try:
        return _walk(context, patterns)
    except WorkLimit as exc:
        raise DlciError(
            f"too costly to apply: {exc}", file=str(rules), hint="use fewer wildcards per pattern"
        ) from None


def _walk(context: Path, patterns: list[Pattern]) -> list[Entry]:
    """The walk of ``context_entries``: what each folder sends, and where it walks into."""
    exceptions = [p for p in patterns if p.exclusion]
    found: list[Entry] = []
    pending: list[tuple[Path, str, list[bool] | None]] = [(context, "", None)]
    while pending:
        folder, prefix, parent = pending.pop()
        try:
            children = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue  # docker build fails on it, and says so
        for child in children:
            if child.name in ALWAYS_IGNORED:
                continue
            rel = prefix + child.name
            out, matched = excluded(patterns, rel, parent)
            kind = _kind(child)
            if not out:
                found.append(Entry(rel, kind, Path(child.path)))
            if kind == "dir" and (not out or any(p.may_reinclude_inside(rel) for p in exceptions)):
                pending.append((Path(child.path), rel + "/", matched))
    return sorted(found, key=lambda entry: entry.rel)


def build_entries(dockerfile: Path, context: Path) -> list[Entry]:
    """What the build may receive: under BuildKit a ``<Dockerfile>.dockerignore`` beside the
    Dockerfile replaces the context's ``.dockerignore`` (the legacy builder reads only the
    latter), so with one there the hash covers what either rule file lets through."""
    entries = context_entries(context)
    own = dockerfile.with_name(dockerfile.name + ".dockerignore")
    if own.is_file():
        union = {entry.rel: entry for entry in [*entries, *context_entries(context, own)]}
        entries = [union[rel] for rel in sorted(union)]
    return entries


def _kind(entry: os.DirEntry[str]) -> str:
    if entry.is_symlink():
        return "link"
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    return "file" if entry.is_file(follow_symlinks=False) else "other"
