"""The bisect's answer as one JSON-able dict: the first bad commit (or the range), the last
good one, every tested commit's verdict and runs, the cost spent, and, with a GitHub token,
each suspect's pull request and author.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dlci.action.github.api import ApiError
from dlci.bisect import git
from dlci.bisect.search import Answer, Search

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
    log: dict[int, list[dict[str, Any]]],
    cost: dict[str, Any],
    spent: dict[str, Any],
    say: Callable[[str], None],
) -> dict[str, Any]:
    pulls = _pulls(github, [commits[i] for i in answer.candidates], say)
    tested = [
        {
            "index": index,
            **commits[index].to_dict(),
            "verdict": search.verdict(index),
            "runs": log[index],
        }
        for index in sorted(log)
    ]
    return {
        "schema_version": 1,
        "kind": "bisect",
        "status": answer.status,
        "message": message(answer, commits),
        **setup,
        "good": commits[0].to_dict(),
        "bad": commits[-1].to_dict(),
        "last_good": commits[answer.lo].to_dict(),
        "first_bad": (
            {**commits[answer.hi].to_dict(), "pull": pulls.get(commits[answer.hi].sha)}
            if answer.first_bad is not None
            else None
        ),
        "candidates": [
            {**commits[i].to_dict(), "pull": pulls.get(commits[i].sha)} for i in answer.candidates
        ],
        "tested": tested,
        "cost": {**{k: v for k, v in cost.items() if k != "text"}, **spent},
    }


def _pulls(
    github: Any, commits: list[git.Commit], say: Callable[[str], None]
) -> dict[str, dict[str, Any] | None]:
    """Each commit's pull request and its author, from GitHub's "list pull requests associated
    with a commit"; a failed lookup is a line said, never a failed bisect."""
    if github is None:
        return {}

    found: dict[str, dict[str, Any] | None] = {}
    for commit in commits[:MAX_LOOKUPS]:
        try:
            answer = github.get(f"/repos/{{repo}}/commits/{commit.sha}/pulls", per_page=10)
        except ApiError as exc:
            say(f"pull request of {commit.short}: not looked up: {exc}")
            continue
        found[commit.sha] = _pull(answer, commit)
    return found


def _pull(answer: Any, commit: git.Commit) -> dict[str, Any] | None:
    """The merged pull request that brought ``commit`` (else the first listed)."""
    pulls = [p for p in (answer if isinstance(answer, list) else []) if isinstance(p, dict)]
    merged = [p for p in pulls if p.get("merged_at")]
    number = commit.pull_number
    named = [p for p in pulls if p.get("number") == number]
    choices = named or merged or pulls
    if not choices:
        return None
    chosen = choices[0]
    raw_user = chosen.get("user")
    user: dict[str, Any] = raw_user if isinstance(raw_user, dict) else {}
    number = chosen.get("number")
    return {
        "number": number if isinstance(number, int) and not isinstance(number, bool) else None,
        "title": str(chosen.get("title") or "")[:300],
        "url": str(chosen.get("html_url") or "")[:500],
        "author": str(user.get("login") or "")[:100] or None,
        "merged_at": str(chosen.get("merged_at") or "")[:40] or None,
    }
