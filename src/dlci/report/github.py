"""GitHub Actions plumbing: step outputs and workflow-command annotations, injection-safe."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path

from dlci.report.text import clean


def in_github_actions() -> bool:
    """True when running as a GitHub Actions (or act) step."""
    return os.environ.get("GITHUB_ACTIONS") == "true"


def escape_data(text: str) -> str:
    """Escape a workflow-command message so it cannot end the command or start another.

    >>> escape_data("loss 5%\\n::set-output name=x::1")
    'loss 5%25%0A::set-output name=x::1'
    """
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """Escape a workflow-command property value (``file=...``), where ``,`` and ``:`` end it.

    >>> escape_property("a,b:c")
    'a%2Cb%3Ac'
    """
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(
    level: str, message: str, *, title: str = "", file: str = "", line: int | None = None
) -> str:
    """Format an ``::error``/``::warning``/``::notice`` workflow command line.

    Newlines stay line breaks of the annotation (``%0A``); other control characters, such
    as a terminal escape, are shown as escapes.

    >>> annotation("error", "loss 2.1 > 1.0", title="dl-ci", file="ladder.yaml", line=3)
    '::error file=ladder.yaml,line=3,title=dl-ci::loss 2.1 > 1.0'
    >>> annotation("warning", "gpu \\x1b[31mA100\\n::error::x")
    '::warning::gpu \\\\x1b[31mA100%0A::error::x'
    """
    props = []
    if file:
        props.append(f"file={_safe(escape_property(file))}")
    if file and line:
        props.append(f"line={line}")
    if title:
        props.append(f"title={_safe(escape_property(title))}")
    head = f"::{level}" + (" " + ",".join(props) if props else "")
    return f"{head}::{_safe(escape_data(message))}"


def _safe(escaped: str) -> str:
    # after escape_data no newline is left; clean() shows the other controls as escapes, and
    # its guard against a leading "::" is not needed mid-line, so a leading ":" is kept as is
    return ":" + clean(escaped[1:]) if escaped.startswith(":") else clean(escaped)


def format_outputs(values: Mapping[str, object]) -> str:
    """Render step outputs in the GITHUB_OUTPUT file format.

    A value with a newline uses the heredoc form with a random delimiter, so a value
    cannot smuggle in another output.

    >>> format_outputs({"tier": "pr", "max-loss": 1.0})
    'tier=pr\\nmax-loss=1.0\\n'
    """
    lines = []
    for key, value in values.items():
        if not key or any(c in key for c in "=\n\r"):
            raise ValueError(f"invalid output name {key!r}")
        text = _as_text(value)
        if "\n" in text or "\r" in text:
            delimiter = f"ghadelimiter_{uuid.uuid4()}"
            lines.append(f"{key}<<{delimiter}\n{text}\n{delimiter}")
        else:
            lines.append(f"{key}={text}")
    return "".join(line + "\n" for line in lines)


def _as_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def write_outputs(values: Mapping[str, object]) -> Path | None:
    """Append step outputs to $GITHUB_OUTPUT when it is set; return the file written."""
    target = os.environ.get("GITHUB_OUTPUT")
    if not target:
        return None
    path = Path(target)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(format_outputs(values))
    return path
