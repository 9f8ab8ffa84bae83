"""A STAND-IN for GitHub's REST API: the few endpoints dl-ci calls, served on 127.0.0.1.

GitHub's servers cannot be reached from these tests, so this local HTTP server answers in
their place. Its answers have the shapes of GitHub's documented responses (REST API version
2022-11-28: "List workflow runs for a workflow", "Get a workflow run", "List workflow run
artifacts", "Download an artifact" with its 302 to a storage URL, the issue-comment
endpoints, "List pull requests associated with a commit", "Compare two commits"), with the
fields dl-ci reads and their usual neighbours; the runs, artifacts, pull requests, comparisons
and comments are whatever a test registers. They were written from GitHub's documentation and
checked against answers recorded from api.github.com (a public client library's test
fixtures): a run's ``event``, ``repository`` and ``head_repository`` (a fork's pull request
names the fork there), lists paged with ``page``/``per_page`` (30 a page unless asked).

Every request is recorded (method, path, query, whether an ``Authorization`` header came),
so a test can check what dl-ci asked and that the token never went to the storage URL.
``fail`` maps a path prefix to an HTTP status, to play GitHub's errors.
"""

from __future__ import annotations

import io
import json
import re
import threading
import urllib.parse
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

REPO = "org/project"
STAMP = "2026-11-30T03:17:{:02d}Z"


def zipped(files: dict[str, bytes]) -> bytes:
    """An artifact's zip, as upload-artifact makes it: the files at the top level."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _page(items: list[Any], params: dict[str, list[str]]) -> list[Any]:
    """One page of a list, as GitHub pages it (``per_page`` default 30, at most 100)."""
    per_page = min(100, int(params.get("per_page", ["30"])[0]))
    page = int(params.get("page", ["1"])[0])
    return items[(page - 1) * per_page : page * per_page]


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    authorization: str | None
    body: Any = None


@dataclass
class StandIn:
    """The stand-in's state: register runs and artifacts, then ``start()``."""

    token: str
    repo: str = REPO
    runs: list[dict[str, Any]] = field(default_factory=list)
    artifacts: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    # an artifact's zip, or a function that makes it when it is downloaded
    blobs: dict[int, bytes | Callable[[], bytes]] = field(default_factory=dict)
    comments: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    # a commit's pull requests ("List pull requests associated with a commit"), by its sha
    pulls: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # "Compare two commits": BASE...HEAD -> its status (ahead, behind, identical, diverged)
    compare: dict[str, str] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    fail: dict[str, int] = field(default_factory=dict)
    raw: dict[str, bytes] = field(default_factory=dict)  # path prefix -> a body sent as is
    server: ThreadingHTTPServer | None = None

    # -- registering
    def add_run(
        self,
        workflow: str,
        *,
        branch: str = "main",
        conclusion: str = "success",
        event: str = "push",
        run_id: int | None = None,
        head_repository: str | None = None,
        head_sha: str | None = None,
    ) -> dict[str, Any]:
        """A finished run, listed first (the newest). ``head_repository``: where its code came
        from (a fork's ``owner/name`` for a fork's pull request; default: this repository);
        ``head_sha``: the commit it ran (default: one made from its id)."""
        run_id = run_id or 9_000_000_000 + len(self.runs) + 1
        sha = head_sha or f"{run_id:040x}"[-40:]
        base = f"{self.api}/repos/{self.repo}/actions/runs/{run_id}"
        run = {
            "id": run_id,
            "name": "dl-ci",
            "node_id": f"WFR_kwLO{run_id}",
            "head_branch": branch,
            "head_sha": sha,
            "path": f".github/workflows/{workflow}",
            "display_title": "a change",
            "run_number": len(self.runs) + 1,
            "event": event,
            "status": "completed",
            "conclusion": conclusion,
            "workflow_id": 161335,
            "check_suite_id": 42 + len(self.runs),
            "url": base,
            "html_url": f"https://github.com/{self.repo}/actions/runs/{run_id}",
            "pull_requests": [],
            "created_at": STAMP.format(len(self.runs) % 60),
            "updated_at": STAMP.format(len(self.runs) % 60),
            "run_attempt": 1,
            "run_started_at": STAMP.format(len(self.runs) % 60),
            "jobs_url": f"{base}/jobs",
            "logs_url": f"{base}/logs",
            "artifacts_url": f"{base}/artifacts",
            "workflow_url": f"{self.api}/repos/{self.repo}/actions/workflows/161335",
            "head_commit": {"id": sha, "message": "a change", "timestamp": STAMP.format(0)},
            "repository": self._repository(self.repo),
            "head_repository": self._repository(head_repository or self.repo),
        }
        self.runs.insert(0, run)  # GitHub lists the newest first
        return run

    def _repository(self, full_name: str) -> dict[str, Any]:
        """A run's ``repository``/``head_repository`` (a fork: another id, ``fork: true``)."""
        fork = full_name != self.repo
        return {
            "id": 666_000 + len(full_name) if fork else 1296269,
            "name": full_name.split("/")[-1],
            "full_name": full_name,
            "private": False,
            "fork": fork,
        }

    def add_artifact(
        self,
        run: dict[str, Any],
        name: str,
        data: bytes | Callable[[], bytes],
        *,
        expired: bool = False,
    ) -> dict[str, Any]:
        artifact_id = 700_000 + len(self.blobs) + 1
        artifact = {
            "id": artifact_id,
            "node_id": f"MDg6QXJ0aWZhY3Q{artifact_id}",
            "name": name,
            "size_in_bytes": len(data) if isinstance(data, bytes) else 1 << 20,
            "url": f"{self.api}/repos/{self.repo}/actions/artifacts/{artifact_id}",
            "archive_download_url": (
                f"{self.api}/repos/{self.repo}/actions/artifacts/{artifact_id}/zip"
            ),
            "expired": expired,
            "created_at": run["created_at"],
            "updated_at": run["created_at"],
            "expires_at": "2027-02-28T03:17:00Z",
            "workflow_run": {
                "id": run["id"],
                "repository_id": 1296269,
                "head_repository_id": run["head_repository"]["id"],
                "head_branch": run["head_branch"],
                "head_sha": run["head_sha"],
            },
        }
        self.artifacts.setdefault(run["id"], []).append(artifact)
        self.blobs[artifact_id] = data
        return artifact

    # -- serving
    @property
    def api(self) -> str:
        if self.server is None:
            return "http://127.0.0.1:0"
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> StandIn:
        state = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                state._answer(self, "GET")

            def do_POST(self) -> None:
                state._answer(self, "POST")

            def do_PATCH(self) -> None:
                state._answer(self, "PATCH")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def requests(self, method: str = "GET", pattern: str = "") -> list[Seen]:
        return [s for s in self.seen if s.method == method and re.search(pattern, s.path)]

    # -- answering
    def _answer(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        url = urllib.parse.urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        body = json.loads(handler.rfile.read(length)) if length else None
        self.seen.append(
            Seen(
                method,
                url.path,
                urllib.parse.parse_qs(url.query),
                handler.headers.get("Authorization"),
                body,
            )
        )
        status, payload, headers = self._route(method, url.path, url.query, handler, body)
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _route(
        self,
        method: str,
        path: str,
        query: str,
        handler: BaseHTTPRequestHandler,
        body: Any,
    ) -> tuple[int, Any, dict[str, str]]:
        jtype = {"Content-Type": "application/json; charset=utf-8"}
        blob = re.fullmatch(r"/storage/blob/(\d+)", path)
        if blob:  # the storage URL: no token expected, a signature in the query instead
            data = self.blobs.get(int(blob.group(1)))
            if data is None or "sig=" not in query:
                return 404, b"BlobNotFound", {}
            made = data if isinstance(data, bytes) else data()
            return 200, made, {"Content-Type": "application/zip"}
        for prefix, status in self.fail.items():
            if path.startswith(prefix):
                return status, {"message": f"stand-in failure {status}"}, jtype
        for prefix, raw in self.raw.items():
            if path.startswith(prefix):
                return 200, raw, jtype
        if handler.headers.get("Authorization") != f"Bearer {self.token}":
            doc = "https://docs.github.com/rest"
            return 401, {"message": "Bad credentials", "documentation_url": doc}, jtype
        repo = f"/repos/{self.repo}"
        params = urllib.parse.parse_qs(query)
        match = re.fullmatch(rf"{repo}/actions/workflows/([^/]+)/runs", path)
        if match and method == "GET":
            runs = [
                r
                for r in self.runs
                if r["path"].endswith("/" + match.group(1))
                and r["head_branch"] in params.get("branch", [r["head_branch"]])
                # GitHub's status filter takes a status (completed) or a conclusion (success)
                and set(params.get("status", [r["status"]])) & {r["status"], r["conclusion"]}
                and r["event"] in params.get("event", [r["event"]])
            ]
            return 200, {"total_count": len(runs), "workflow_runs": _page(runs, params)}, jtype
        match = re.fullmatch(rf"{repo}/actions/runs/(\d+)", path)
        if match and method == "GET":
            run = next((r for r in self.runs if r["id"] == int(match.group(1))), None)
            return (200, run, jtype) if run else (404, {"message": "Not Found"}, jtype)
        match = re.fullmatch(rf"{repo}/actions/runs/(\d+)/artifacts", path)
        if match and method == "GET":
            found = self.artifacts.get(int(match.group(1)), [])
            return 200, {"total_count": len(found), "artifacts": _page(found, params)}, jtype
        match = re.fullmatch(rf"{repo}/compare/([0-9a-f]{{40}}\.\.\.[0-9a-f]{{40}})", path)
        if match and method == "GET":
            status = self.compare.get(match.group(1))
            return (
                (200, {"status": status}, jtype)
                if status
                else (404, {"message": "Not Found"}, jtype)
            )
        match = re.fullmatch(rf"{repo}/commits/([0-9a-f]{{40}})/pulls", path)
        if match and method == "GET":
            return 200, _page(self.pulls.get(match.group(1), []), params), jtype
        match = re.fullmatch(rf"{repo}/actions/artifacts/(\d+)/zip", path)
        if match and method == "GET":
            where = f"{self.api}/storage/blob/{match.group(1)}?sig=stand-in-signature"
            return 302, b"", {"Location": where}
        return self._comments(method, path, body, jtype)

    def _comments(
        self, method: str, path: str, body: Any, jtype: dict[str, str]
    ) -> tuple[int, Any, dict[str, str]]:
        repo = f"/repos/{self.repo}"
        match = re.fullmatch(rf"{repo}/issues/(\d+)/comments", path)
        if match and method == "GET":
            return 200, self.comments.get(int(match.group(1)), []), jtype
        if match and method == "POST":
            number = int(match.group(1))
            comment = self.comment(number, body["body"], login="github-actions[bot]", kind="Bot")
            return 201, comment, jtype
        match = re.fullmatch(rf"{repo}/issues/comments/(\d+)", path)
        if match and method == "PATCH":
            for comments in self.comments.values():
                for comment in comments:
                    if comment["id"] == int(match.group(1)):
                        comment["body"] = body["body"]
                        return 200, comment, jtype
        return 404, {"message": "Not Found"}, jtype

    def comment(self, number: int, text: str, *, login: str, kind: str) -> dict[str, Any]:
        """Add a comment to pull request ``number`` (as GitHub would answer it)."""
        comment_id = 1_000_000 + sum(len(c) for c in self.comments.values()) + 1
        comment = {
            "id": comment_id,
            "node_id": f"IC_kwDO{comment_id}",
            "url": f"{self.api}/repos/{self.repo}/issues/comments/{comment_id}",
            "html_url": f"https://github.com/{self.repo}/pull/{number}#issuecomment-{comment_id}",
            "body": text,
            "user": {"login": login, "id": 41898282, "type": kind},
            "created_at": STAMP.format(0),
            "updated_at": STAMP.format(0),
            "issue_url": f"{self.api}/repos/{self.repo}/issues/{number}",
            "author_association": "NONE" if kind == "Bot" else "MEMBER",
        }
        self.comments.setdefault(number, []).append(comment)
        return comment
