"""The few GitHub REST API calls the action makes, with the job's token, bounded.

Host-side, standard library only (urllib). The base URL is ``$GITHUB_API_URL`` (GitHub sets
it; GitHub Enterprise Server and the e2e tests' stand-in server set their own). The token is
sent only to that host: an artifact download answers with a redirect to a storage URL, and
the ``Authorization`` header is added as an *unredirected* header, so it never follows the
redirect. Nothing here prints or returns the token; every failure is one :class:`ApiError`
whose message names the request and GitHub's answer, never a header.
"""

from __future__ import annotations

import os
import re
import time
import urllib.error
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlci import jsonio

if TYPE_CHECKING:
    import urllib.request

API_VERSION = "2022-11-28"
MAX_JSON = 8 << 20  # bytes of one JSON answer
TIMEOUT_S = 30.0  # per connection and per read
MAX_SECONDS = 600.0  # for a whole answer: a server that drips bytes is cut off
REPOSITORY = re.compile(r"[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}")
TOKEN = re.compile(r"[\x21-\x7e]{1,1000}")  # printable ASCII, no space: every GitHub token


class ApiError(Exception):
    """A request that did not give what was asked: the message is safe to print."""


@dataclass(frozen=True)
class GitHub:
    """A repository's REST API at ``api_url``, called with ``token``."""

    api_url: str
    repository: str
    token: str = field(repr=False)
    timeout: float = TIMEOUT_S

    @classmethod
    def from_environment(cls, token: str, repository: str | None = None) -> GitHub:
        """``$GITHUB_API_URL`` and ``$GITHUB_REPOSITORY`` (or ``repository``), checked."""
        api_url = os.environ.get("GITHUB_API_URL") or "https://api.github.com"
        repo = repository or os.environ.get("GITHUB_REPOSITORY") or ""
        scheme = urllib.parse.urlsplit(api_url).scheme
        if scheme not in ("http", "https"):
            raise ApiError(f"GITHUB_API_URL is not an http(s) URL: {api_url[:100]!r}")
        if not repo:
            raise ApiError("GITHUB_REPOSITORY is not set (GitHub Actions sets it)")
        if not REPOSITORY.fullmatch(repo):
            raise ApiError(f"not a repository name (owner/name): {repo[:100]!r}")
        token = token.strip()  # a secret saved with its newline
        if not token:
            raise ApiError("no token: pass the job's token (github-token: ${{ github.token }})")
        if not TOKEN.fullmatch(token):  # never quoted: it is a secret
            raise ApiError("the token holds spaces or control characters no GitHub token has")
        return cls(api_url.rstrip("/"), repo, token)

    def url(self, path: str, params: dict[str, Any] | None = None) -> str:
        """The full URL of ``path`` (``{repo}`` stands for the repository) with ``params``.

        >>> GitHub("https://api.github.com", "o/r", "t").url("/repos/{repo}/x", {"a": "b c"})
        'https://api.github.com/repos/o/r/x?a=b+c'
        """
        full = self.api_url + path.replace("{repo}", self.repository)
        query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None})
        return f"{full}?{query}" if query else full

    def _request(self, method: str, url: str, body: bytes | None = None) -> urllib.request.Request:
        # urllib.request brings http.client, email and ssl (tens of ms): loaded when a request
        # is made, not by the host's verbs that make none (dlci history --previous none)
        import urllib.request

        request = urllib.request.Request(url, data=body, method=method)  # noqa: S310 (http(s) only)
        request.add_header("Accept", "application/vnd.github+json")
        request.add_header("X-GitHub-Api-Version", API_VERSION)
        request.add_header("User-Agent", "dl-ci")
        if body is not None:
            request.add_header("Content-Type", "application/json")
        # unredirected: never sent on to the host a redirect points at (artifact storage)
        request.add_unredirected_header("Authorization", f"Bearer {self.token}")
        return request

    def call(
        self,
        method: str,
        path: str,
        params: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
    ) -> Any:
        """One JSON request and its decoded answer (at most MAX_JSON bytes)."""
        url = self.url(path, params)
        data = None if body is None else jsonio.encode(body, indent=False)
        where = f"{method} {urllib.parse.urlsplit(url).path}"
        blob = self._open(self._request(method, url, data), where, MAX_JSON, None)
        try:
            return jsonio.decode(blob)
        except (jsonio.DecodeError, RecursionError):
            raise ApiError(f"{where}: the answer is not JSON") from None

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params)

    def download(self, path: str, dest: Path, *, limit: int) -> int:
        """GET ``path`` (following redirects) into ``dest``; refused past ``limit`` bytes."""
        url = self.url(path)
        where = f"GET {urllib.parse.urlsplit(url).path}"
        with open(dest, "wb") as handle:
            self._open(self._request("GET", url), where, limit, handle)
        return dest.stat().st_size

    def _open(self, request: urllib.request.Request, where: str, limit: int, sink: Any) -> bytes:
        """Send ``request``; the body (or, with ``sink``, written there), at most ``limit``."""
        import http.client  # as urllib.request below
        import urllib.request  # as in _request

        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:  # noqa: S310
                return _read(answer, where, limit, sink)
        except urllib.error.HTTPError as exc:
            raise ApiError(f"{where}: HTTP {exc.code} ({_message(exc)})") from None
        except ValueError:  # urllib's words quote the header: the token must not reach a log
            raise ApiError(f"{where}: the request could not be sent (a header holds a "
                           "character HTTP refuses: check the token)") from None  # fmt: skip
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise ApiError(f"{where}: {str(reason)[:200]}") from None


def _read(answer: Any, where: str, limit: int, sink: Any) -> bytes:
    chunks: list[bytes] = []
    size = 0
    deadline = time.monotonic() + MAX_SECONDS
    while True:
        if time.monotonic() > deadline:
            raise ApiError(f"{where}: the answer took longer than {MAX_SECONDS:g} s")
        chunk = answer.read(1 << 16)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise ApiError(f"{where}: the answer is larger than {limit:,} bytes")
        if sink is None:
            chunks.append(chunk)
        else:
            sink.write(chunk)


def _message(error: urllib.error.HTTPError) -> str:
    """GitHub's own ``message`` from an error's JSON body, else the HTTP reason."""
    try:
        data = jsonio.decode(error.read(64 << 10))
    except (jsonio.DecodeError, RecursionError, OSError):  # no JSON: the reason will do
        data = None
    message = data.get("message") if isinstance(data, dict) else None
    return str(message or error.reason)[:200]
