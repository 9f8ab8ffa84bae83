"""The answer of verbs that are planned but not built yet: a clear error, never a fake pass."""

from __future__ import annotations

from collections.abc import Sequence

from dlci import __version__
from dlci.cli import VERBS
from dlci.errors import DlciError


def not_yet(verb: str, argv: Sequence[str]) -> int:
    """Refuse to run, so that no CI job mistakes a missing gate for a passing one."""
    if any(a in ("-h", "--help") for a in argv):
        print(f"usage: dlci {verb} ...\n\n{VERBS[verb]}.\n\nNot available in dl-ci {__version__}.")
        return 0
    raise DlciError(
        f"dlci {verb} is not available in dl-ci {__version__} yet",
        hint="see docs/architecture.md for what this release contains",
    )
