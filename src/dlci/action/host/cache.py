"""The cache volume of a job, chosen by trust: a pull request never writes what a push reads.

Host-side, never imports torch. The host decides trust from the event (and, for a push, its
ref and actor); the runner's job-completed hook prunes the volumes by their labels.
"""

from __future__ import annotations

import re
from pathlib import Path

from dlci import jsonio
from dlci.errors import DlciError
from dlci.fsutil import read_input

CONTAINER_HOME = "/home/dlci"
# pip, torch hub, datasets: a volume that survives between jobs on one runner, one per trust
# level (dlci-cache-trusted, dlci-cache-untrusted): a pull request never writes what a push reads
CACHE_PREFIX = "dlci-cache"
CACHE_LABEL = "dlci.cache"  # trusted | untrusted, for the runner's prune hook
CACHE_CREATED_LABEL = "dlci.cache.created"  # epoch seconds when the volume was made
TRUSTED, UNTRUSTED = "trusted", "untrusted"
# Events whose code someone with write access merged or chose to run. push and
# workflow_dispatch count only on the default branch (or a ref in DLCI_TRUSTED_REFS): a push to
# any other branch (a bot's update branch, an unreviewed feature branch) runs unreviewed code. Every
# other event (pull_request, pull_request_target, issue_comment, workflow_run, ...) is untrusted.
TRUSTED_EVENTS = frozenset({"push", "schedule", "workflow_dispatch", "merge_group", "release"})
REF_BOUND_EVENTS = frozenset({"push", "workflow_dispatch"})
UNTRUSTED_ACTORS = frozenset({"dependabot[bot]", "renovate[bot]"})


def cache_mount(trust: str, prefix: str = CACHE_PREFIX, created: int = 0) -> str:
    """The ``--mount`` of the cache volume for this trust level, labelled when Docker makes it.

    >>> cache_mount("untrusted", created=5)  # doctest: +NORMALIZE_WHITESPACE
    'type=volume,src=dlci-cache-untrusted,dst=/home/dlci/.cache,volume-label=dlci.cache=untrusted,volume-label=dlci.cache.created=5'
    """
    if trust not in (TRUSTED, UNTRUSTED):
        raise DlciError(f"--trust {trust!r}: expected trusted or untrusted")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", prefix):
        raise DlciError(f"--cache-volume {prefix!r}: not a volume name")
    volume = f"{prefix}-{trust}"
    labels = f"volume-label={CACHE_LABEL}={trust},volume-label={CACHE_CREATED_LABEL}={created}"
    return f"type=volume,src={volume},dst={CONTAINER_HOME}/.cache,{labels}"


def decide_trust(asked: str, environ: dict[str, str]) -> str:
    """trusted or untrusted: from GITHUB_EVENT_NAME, unless asked; never raised on a PR.

    >>> decide_trust("", {"GITHUB_EVENT_NAME": "schedule"}), decide_trust("", {})
    ('trusted', 'untrusted')
    """
    event = environ.get("GITHUB_EVENT_NAME", "")
    decided = TRUSTED if event in TRUSTED_EVENTS and _trusted_ref(event, environ) else UNTRUSTED
    if asked in ("", "auto"):
        return decided
    if asked not in (TRUSTED, UNTRUSTED):
        raise DlciError(f"--trust {asked!r}: expected trusted, untrusted or auto")
    if asked == TRUSTED and decided == UNTRUSTED and environ.get("GITHUB_ACTIONS") == "true":
        raise DlciError(
            f"--trust trusted on a {event or 'unknown'} event: that job runs code nobody has "
            "merged, and what it writes to the cache would be read by trusted jobs",
            hint="leave --trust out (decided from GITHUB_EVENT_NAME) or pass untrusted",
        )
    return asked


def _trusted_ref(event: str, environ: dict[str, str]) -> bool:
    """Whether the event's ref and actor let it write the trusted cache.

    >>> env = {"GITHUB_REF": "refs/heads/main", "GITHUB_ACTOR": "alice"}
    >>> _trusted_ref("push", {**env, "DLCI_DEFAULT_BRANCH": "main"})
    True
    >>> _trusted_ref("push", {**env, "GITHUB_REF": "refs/heads/dependabot/pip/x"})
    False
    """
    if environ.get("GITHUB_ACTOR", "") in UNTRUSTED_ACTORS:
        return False
    if event not in REF_BOUND_EVENTS:
        return True
    refs = {r.strip() for r in environ.get("DLCI_TRUSTED_REFS", "").split(",") if r.strip()}
    default = environ.get("DLCI_DEFAULT_BRANCH") or _default_branch(environ)
    if default:
        refs.add(f"refs/heads/{default}")
    return environ.get("GITHUB_REF", "") in refs


def _default_branch(environ: dict[str, str]) -> str:
    """The repository's default branch, from the event payload GitHub writes for the job."""
    path = environ.get("GITHUB_EVENT_PATH", "")
    if not path:
        return ""

    try:
        payload = jsonio.decode(read_input(Path(path), what="the event payload", limit=16 << 20))
    except (DlciError, jsonio.DecodeError):
        return ""
    repository = payload.get("repository") if isinstance(payload, dict) else None
    branch = repository.get("default_branch") if isinstance(repository, dict) else None
    return branch if isinstance(branch, str) else ""
