"""One sticky comment per pull request: the comparison, posted once and then updated in place.

Needs the token's ``pull-requests: write``. Never on a fork's pull request (its token cannot
write, and its code must not steer what the base repository says). The comment is found
again by the marker it starts with, among the comments that a bot wrote (the job token's own
first); nothing here fails the job.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dlci import jsonio
from dlci.action.github.api import ApiError, GitHub
from dlci.errors import DlciError
from dlci.fsutil import read_input

MAX_BODY = 60_000  # characters; GitHub refuses comments over 65536
MAX_PAGES = 10
ACTIONS_BOT = "github-actions[bot]"  # who a job's GITHUB_TOKEN comments as


def pull_request(environ: dict[str, str] | os._Environ[str]) -> tuple[int | None, str]:
    """This run's pull request number, or None with the reason there is none to comment on."""
    if environ.get("GITHUB_EVENT_NAME") not in ("pull_request", "pull_request_target"):
        return None, "not a pull request"
    try:
        event = jsonio.decode(read_input(Path(environ.get("GITHUB_EVENT_PATH", "")), what="event"))
    except (DlciError, jsonio.DecodeError, RecursionError, OSError):
        return None, "the event payload is unreadable"
    pr = event.get("pull_request") if isinstance(event, dict) else None
    if not isinstance(pr, dict) or not isinstance(pr.get("number"), int):
        return None, "the event payload names no pull request"
    head = _path(pr, "head", "repo", "full_name")
    base = _path(pr, "base", "repo", "full_name") or _path(event, "repository", "full_name")
    if head is None or head != base:
        return None, f"a fork's pull request ({str(head)[:100]})"
    return int(pr["number"]), ""


def _path(data: Any, *keys: str) -> Any:
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def find_comment(api: GitHub, number: int, marker: str) -> int | None:
    """The id of dl-ci's own comment on pull request ``number``: a bot's comment that starts
    with ``marker`` (another bot quoting it does not start so), the job token's own
    (ACTIONS_BOT; an app token posts as another bot) first, else the oldest."""
    found: list[tuple[bool, int]] = []
    for page in range(1, MAX_PAGES + 1):
        comments = api.get(f"/repos/{{repo}}/issues/{number}/comments", per_page=100, page=page)
        if not isinstance(comments, list):
            raise ApiError(f"pull request {number}: the answer is not a list of comments")
        found += [
            (_path(comment, "user", "login") == ACTIONS_BOT, int(comment["id"]))
            for comment in comments
            if isinstance(comment, dict)
            and isinstance(comment.get("id"), int)
            and _path(comment, "user", "type") == "Bot"
            and str(comment.get("body", "")).startswith(marker)
        ]
        if len(comments) < 100:
            break
    ours = [cid for own, cid in found if own] or [cid for _, cid in found]
    return ours[0] if ours else None


def sticky_comment(
    api: GitHub, body: str, marker: str, environ: dict[str, str] | os._Environ[str] = os.environ
) -> str:
    """Post the comment, or update the one already there; what was done, in a line."""
    number, why = pull_request(environ)
    if number is None:
        return f"no comment: {why}"
    if len(body) > MAX_BODY:
        body = body[:MAX_BODY] + "\n\n(cut short: the full comparison is in the job summary)\n"
    return post_or_update(api, number, body, marker)


def post_or_update(api: GitHub, number: int, body: str, marker: str) -> str:
    """Post ``body`` on pull request ``number``, or update dl-ci's comment there that starts
    with ``marker``; what was done, in a line (a failure too: never raised)."""
    try:
        existing = find_comment(api, number, marker)
        if existing is None:
            api.call("POST", f"/repos/{{repo}}/issues/{number}/comments", body={"body": body})
            return f"commented on pull request {number}"
        api.call("PATCH", f"/repos/{{repo}}/issues/comments/{existing}", body={"body": body})
        return f"updated the comment on pull request {number}"
    except ApiError as exc:
        return f"no comment: {exc} (the token needs pull-requests: write)"
