"""Console output: one place that prints errors, warnings and tables, for people and CI logs.

Text from outside (file names, GPU names, ladder keys) is escaped here with
``dlci.report.text.clean``, and nothing printed here is wrapped at a console width: a CI
log is not a terminal, and a message cut mid-phrase is hard to read and to search.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

from dlci.errors import SHOWN, DlciError
from dlci.report.github import annotation, in_github_actions
from dlci.report.text import clean

if TYPE_CHECKING:
    from rich.console import Console

LOG_WIDTH = 1000  # columns of a console that is not a terminal: wide enough never to wrap


def error_text(exc: DlciError) -> str:
    """The lines of a user mistake (each of them, for a file with several): the message on
    one line, the hint's own lines kept.

    >>> print(error_text(DlciError("bad\\nvalue", hint="fix:\\n  here", file="a.yaml")))
    error: a.yaml: bad\\nvalue
      hint: fix:
      here
    """
    every = exc.every()
    lines = [_one_error(each) for each in every[:SHOWN]]
    if len(every) > SHOWN:  # a file of thousands of mistakes: the first ones and a count
        lines.append(f"error: and {len(every) - SHOWN} more problems")
    return "\n".join(lines)


def _one_error(exc: DlciError) -> str:
    message = clean(exc.message)
    text = f"error: {clean(exc.location)}: {message}" if exc.location else f"error: {message}"
    if exc.hint:
        text += "\n  hint: " + "\n".join(clean(line) for line in exc.hint.split("\n"))
    return text


def print_error(exc: DlciError) -> None:
    """Write a user mistake to stderr, and as ``::error`` annotations inside GitHub Actions."""
    print(error_text(exc), file=sys.stderr)
    if in_github_actions():
        for each in exc.every()[:SHOWN]:  # the count of the rest is in the text above
            message = each.message + (f" (hint: {each.hint})" if each.hint else "")
            print(
                annotation("error", message, title="dl-ci", file=each.file or "", line=each.line),
                file=sys.stderr,
            )


def print_warning(message: str) -> None:
    """Write a warning to stderr, and as a ``::warning`` annotation inside GitHub Actions."""
    print(f"warning: {clean(message)}", file=sys.stderr)
    if in_github_actions():
        print(annotation("warning", message, title="dl-ci"), file=sys.stderr)


def table_console(file: TextIO | None = None) -> Console:
    """A rich console for tables: no markup or highlighting of outside text, and, when the
    output is not a terminal, so wide that no line is wrapped."""
    from rich.console import Console

    stream = file or sys.stdout
    width = None if stream.isatty() else LOG_WIDTH
    return Console(
        file=stream, width=width, markup=False, emoji=False, highlight=False, soft_wrap=True
    )
