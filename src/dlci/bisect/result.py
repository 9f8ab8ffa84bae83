"""The bisect's answer: the first bad commit (or the range), the last good one, every tested
commit's verdict and runs, the cost spent, and, with a GitHub token, each suspect's pull
request and author. It is an :class:`AnswerShape` from the bisect that builds it
(:func:`result`) to every reader: an answer read back from a file (the action's container
wrote it) is checked against the same class (:func:`read_answer`) before anything renders it,
and the renderers (dlci.bisect.render) read its attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from dlci import jsonio
from dlci.action.github.api import ApiError
from dlci.bisect import git
from dlci.bisect.search import Answer, Search
from dlci.errors import DlciError
from dlci.fsutil import read_input

ANSWER_LIMIT = 16 << 20  # bytes: thousands of tested commits fit
MAX_COMMITS = 2000  # tested commits and candidates an answer may list
Sha = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{40}\\Z")]  # \Z: no newline after it
Short = Annotated[str, msgspec.Meta(max_length=2000)]
Verdict = Literal["pass", "fail", "skip"]


class PullShape(msgspec.Struct, kw_only=True):
    """A suspect's pull request and its author, as GitHub listed it."""

    number: int | None
    title: Short = ""
    url: Short = ""
    author: Short | None = None
    merged_at: Short | None = None


class CommitShape(msgspec.Struct, kw_only=True):
    """A commit, as dlci.bisect.git.Commit.to_dict writes it."""

    sha: Sha
    subject: Short
    author: Short
    date: Short
    pull_number: int | None = None  # the number its subject names (``(#12)``)


class SuspectShape(CommitShape, kw_only=True):
    """The first bad commit, or one of the commits it may be: with its pull request (null
    when none was looked up or found)."""

    pull: PullShape | None = None


class RunShape(msgspec.Struct, kw_only=True):
    """One gate run of a tested commit (its first, a re-run or a confirmation)."""

    purpose: Literal["test", "recheck", "confirm"]
    seeds: Annotated[list[int], msgspec.Meta(max_length=50)]
    verdicts: Annotated[list[Verdict], msgspec.Meta(max_length=50)]
    near: bool = False
    figures: dict[str, Any] = {}  # the gate's figures: an open table (dlci.bisect.gates)
    reason: Short = ""
    exit_code: int | None = None
    seconds: float = 0.0


class TestedShape(msgspec.Struct, kw_only=True):
    """A tested commit: its place in the chain, the commit, its verdict and runs."""

    __test__ = False  # not a test class, for pytest given this module's path (its doctests)
    index: int
    sha: Sha
    subject: Short
    author: Short
    date: Short
    pull_number: int | None = None
    verdict: Verdict | None
    runs: Annotated[list[RunShape], msgspec.Meta(min_length=1, max_length=50)]


class CostShape(msgspec.Struct, kw_only=True):
    """The bound printed before the bisect started, and what it spent."""

    candidates: int = 0
    bisection_runs: int = 0
    max_runs: int
    time_cap_minutes: float
    run_timeout_minutes: float | UnsetType = UNSET  # UNSET: an answer from before them
    reruns: int | UnsetType = UNSET
    gate_runs: int
    seed_runs: int
    wall_s: float
    workdir: Short | None = None


class AnswerShape(msgspec.Struct, kw_only=True):
    """The answer (bisect.json): everything it holds and the renderers (dlci.bisect.render)
    read, in the order the bisect writes it."""

    schema_version: Literal[1] = 1
    kind: Literal["bisect"]
    status: Literal["found", "range", "not-reproduced", "unfinished"]
    message: Short
    gate: Short
    install: Short = "path"
    good: CommitShape
    bad: CommitShape
    last_good: CommitShape
    first_bad: SuspectShape | None
    candidates: Annotated[list[SuspectShape], msgspec.Meta(max_length=MAX_COMMITS)]
    tested: Annotated[list[TestedShape], msgspec.Meta(max_length=MAX_COMMITS)]
    cost: CostShape


def read_answer(path: str | Path) -> AnswerShape:
    """The answer in ``path``, checked against AnswerShape: every key the renderers read is
    there with its declared type (defaults filled), nothing undeclared is kept. A file that
    does not hold one is a DlciError naming the file and what is wrong."""
    try:
        data = read_input(path, what="bisect answer", limit=ANSWER_LIMIT)
    except OSError as exc:  # a folder the container made unreadable
        raise DlciError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        answer = msgspec.convert(jsonio.decode(data), AnswerShape, strict=True)
    except msgspec.ValidationError as exc:  # before DecodeError, its base class
        raise DlciError(f"{path}: not a bisect answer: {str(exc)[:300]}") from None
    except (jsonio.DecodeError, RecursionError) as exc:
        raise DlciError(f"{path}: not JSON ({str(exc)[:200]})") from None
    if (answer.status == "found") != (answer.first_bad is not None):
        raise DlciError(f"{path}: not a bisect answer: status {answer.status!r} with first_bad")
    return answer


def add_pulls(answer: AnswerShape, github: Any, say: Callable[[str], None]) -> AnswerShape:
    """A checked answer (read_answer's) whose pull requests are the ones looked up now, for
    an answer made where no token was (the action's container): what the answer itself said
    of pull requests is dropped, the first bad commit is always looked up, and a number is
    kept only when GitHub gave it."""
    first = [answer.first_bad] if answer.first_bad else []
    entries = [*first, *answer.candidates]
    commits = {e.sha: git.Commit(e.sha, e.subject, e.author, e.date) for e in entries}
    found = pulls(github, list(commits.values()), say)
    for entry in entries:
        entry.pull = found.get(entry.sha)
        entry.pull_number = None  # the subject's number: the container's words
    return answer


MAX_LOOKUPS = 10  # pull requests looked up for one answer (a range of skipped commits)


def message(answer: Answer, commits: list[git.Commit]) -> str:
    """The answer in one line."""
    if answer.status == "found":
        commit = commits[answer.hi]
        return f"first bad commit: {commit.short} {commit.subject}"
    if answer.status == "not-reproduced":
        return "the bad commit passed when run again: the red run was not reproduced"
    names = ", ".join(commits[i].short for i in answer.candidates)
    if answer.status == "range":
        return (
            f"the first bad commit is one of {len(answer.candidates)}: {names} "
            "(commits that could not be run lie between the last good and the first bad)"
        )
    return f"unfinished: the first bad commit is one of {len(answer.candidates)}: {names}"


def result(
    setup: dict[str, str],
    github: Any,
    commits: list[git.Commit],
    search: Search,
    answer: Answer,
    log: dict[int, list[RunShape]],
    cost: dict[str, Any],
    spent: dict[str, Any],
    say: Callable[[str], None],
) -> AnswerShape:
    """The answer: ``setup`` (the gate in words, the install), the commits, every tested one
    with its runs (``log``), the cost bound (``cost``, less its text) and what was spent."""
    looked_up = pulls(github, [commits[i] for i in answer.candidates], say)
    tested = [
        _shaped(
            TestedShape, commits[index], index=index, verdict=search.verdict(index),
            runs=log[index],
        )
        for index in sorted(log)
    ]  # fmt: skip

    def suspect(commit: git.Commit) -> SuspectShape:
        return _shaped(SuspectShape, commit, pull=looked_up.get(commit.sha))

    return AnswerShape(
        schema_version=1,
        kind="bisect",
        status=answer.status,  # type: ignore[arg-type]  # one of the four: search.Answer
        message=message(answer, commits),
        **setup,
        good=_shaped(CommitShape, commits[0]),
        bad=_shaped(CommitShape, commits[-1]),
        last_good=_shaped(CommitShape, commits[answer.lo]),
        first_bad=suspect(commits[answer.hi]) if answer.first_bad is not None else None,
        candidates=[suspect(commits[i]) for i in answer.candidates],
        tested=tested,
        cost=CostShape(**{k: v for k, v in cost.items() if k != "text"}, **spent),
    )


Shaped = TypeVar("Shaped", CommitShape, SuspectShape, TestedShape)


def _shaped(cls: type[Shaped], commit: git.Commit, **more: Any) -> Shaped:
    """``commit`` as one of the shapes that hold a commit, with the shape's other fields."""
    return cls(
        sha=commit.sha, subject=commit.subject, author=commit.author, date=commit.date,
        pull_number=commit.pull_number, **more,
    )  # fmt: skip


def pulls(
    github: Any, commits: list[git.Commit], say: Callable[[str], None]
) -> dict[str, PullShape | None]:
    """Each commit's pull request and its author, from GitHub's "list pull requests associated
    with a commit"; a failed lookup is a line said, never a failed bisect."""
    if github is None:
        return {}

    found: dict[str, PullShape | None] = {}
    for commit in commits[:MAX_LOOKUPS]:
        try:
            answer = github.get(f"/repos/{{repo}}/commits/{commit.sha}/pulls", per_page=10)
        except ApiError as exc:
            say(f"pull request of {commit.short}: not looked up: {exc}")
            continue
        found[commit.sha] = _pull(answer, commit)
    return found


def _pull(answer: Any, commit: git.Commit) -> PullShape | None:
    """The merged pull request that brought ``commit`` (else the first listed)."""
    listed = [p for p in (answer if isinstance(answer, list) else []) if isinstance(p, dict)]
    merged = [p for p in listed if p.get("merged_at")]
    number = commit.pull_number
    named = [p for p in listed if p.get("number") == number]
    choices = named or merged or listed
    if not choices:
        return None
    chosen = choices[0]
    raw_user = chosen.get("user")
    user: dict[str, Any] = raw_user if isinstance(raw_user, dict) else {}
    number = chosen.get("number")
    return PullShape(
        number=number if isinstance(number, int) and not isinstance(number, bool) else None,
        title=str(chosen.get("title") or "")[:300],
        url=str(chosen.get("html_url") or "")[:500],
        author=str(user.get("login") or "")[:100] or None,
        merged_at=str(chosen.get("merged_at") or "")[:40] or None,
    )
