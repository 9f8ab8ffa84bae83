"""Console output: one place that prints errors and warnings, for people and for CI logs."""

from __future__ import annotations

import sys

from dlci.errors import DlciError
from dlci.report.github import annotation, in_github_actions


def print_error(exc: DlciError) -> None:
    """Write a user mistake to stderr, and as an ``::error`` annotation inside GitHub Actions."""
    print(f"error: {exc}", file=sys.stderr)
    if in_github_actions():
        message = exc.message + (f" (hint: {exc.hint})" if exc.hint else "")
        print(
            annotation("error", message, title="dl-ci", file=exc.file or "", line=exc.line),
            file=sys.stderr,
        )


def print_warning(message: str) -> None:
    """Write a warning to stderr, and as a ``::warning`` annotation inside GitHub Actions."""
    print(f"warning: {message}", file=sys.stderr)
    if in_github_actions():
        print(annotation("warning", message, title="dl-ci"), file=sys.stderr)
