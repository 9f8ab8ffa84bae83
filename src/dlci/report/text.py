"""Text that came from outside, made safe once, at the edge where it leaves the program.

Names inside ladders, traces, reports and test results (a ladder key, a kernel name, a GPU
name, a test id) are hostile input. Each medium has one function here, and every renderer
calls it on outside text and on nothing else:

- ``clean``: a log line or a terminal (stderr, the console tables, annotations' text);
- ``md``: Markdown prose and table cells (the job summary, the pull request's comment, the
  history and baseline tables, the reports' .md files): no markup, no HTML, and nothing
  GitHub turns into a notification or a link after rendering (``@mentions``, ``#123``
  references, bare URLs);
- ``md_code``: an inline code span in Markdown;
- ``label``: a matplotlib label in a PNG.

``table`` is the one Markdown table builder; its cells are Markdown already, so a caller
passes outside text through ``md`` or ``md_code`` first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

# C0 and C1 controls, DEL, and the Unicode line and paragraph separators and bidi overrides
# that can rewrite what a reader sees on a terminal or in a log viewer.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\x1b"}
# what can start markup inside a line; "<", ">" and "&" go through _HTML
_MD_SPECIAL = re.compile(r"([\\`*\[\]|#~$])")  # "$": GitHub renders $x$ as math
# "_" opens emphasis only at a word's edge (GFM), so snake_case names stay readable in the .md
_MD_UNDERSCORE = re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}
# GitHub links @user, @org/team, #123 and bare URLs in the rendered text, where a backslash
# or an entity is already gone (issue 35: a pull request's report pinged a team through the
# bot's comment); a zero-width space after "@", "#", ":" before "//" and "www" breaks each
ZWSP = "\u200b"
_LINKISH = re.compile(r"@(?=[0-9A-Za-z])|#(?=[0-9])|:(?=//)|(?i:www)(?=\.)")


def _escape_control(match: re.Match[str]) -> str:
    char = match.group(0)
    return _NAMED.get(char) or (
        f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
    )


def clean(text: object, *, limit: int | None = None) -> str:
    """One line of outside text for a log or a terminal: controls shown as escapes.

    A leading ``::`` is shown as ``\\x3a:`` so that the line can never be read as a GitHub
    workflow command, wherever the caller puts it.

    >>> clean("a100\\x1b[31m\\n::error::pwned")
    'a100\\\\x1b[31m\\\\n::error::pwned'
    >>> clean("::add-mask::x")
    '\\\\x3a:add-mask::x'
    >>> clean("x" * 10, limit=6)
    'xxx...'
    """
    result = _CONTROL.sub(_escape_control, str(text))
    stripped = result.lstrip()
    if stripped.startswith("::"):
        result = result[: len(result) - len(stripped)] + "\\x3a" + stripped[1:]
    if limit is not None and len(result) > limit:
        result = result[: max(limit - 3, 0)] + "..."
    return result


def md(text: object, *, limit: int | None = None) -> str:
    """Outside text for Markdown prose or a table cell: no markup, no HTML, one line.

    >>> md("test_zz_hog.py _x_")
    'test_zz_hog.py \\\\_x\\\\_'
    >>> md("| # <script>alert(1)</script> **x**")
    '\\\\| \\\\# &lt;script&gt;alert(1)&lt;/script&gt; \\\\*\\\\*x\\\\*\\\\*'
    >>> md("@org/team, #12: see https://x.io ![i](www.x.io)").replace(ZWSP, "~")
    '@~org/team, \\\\#~12: see https:~//x.io !\\\\[i\\\\](www~.x.io)'
    """
    unlinked = _LINKISH.sub(lambda m: m.group(0) + ZWSP, clean(text, limit=limit))
    escaped = _MD_SPECIAL.sub(r"\\\1", unlinked)
    escaped = _MD_UNDERSCORE.sub(r"\\_", escaped)
    return "".join(_HTML.get(char, char) for char in escaped)


def md_code(text: object, *, limit: int | None = None) -> str:
    """Outside text as an inline code span: backticks cannot close it, pipes cannot split a row.

    >>> md_code("aten::mm")
    '`aten::mm`'
    >>> md_code("a`b|c")
    "`a'b\\\\|c`"
    """
    body = clean(text, limit=limit).replace("`", "'").replace("|", "\\|")
    body = "".join(_HTML.get(char, char) for char in body)
    return f"`{body}`"


def label(text: object, *, limit: int | None = 60) -> str:
    """Outside text for a matplotlib label: no mathtext (``$``), one line.

    >>> label("cost $5 and \\n more")
    'cost \\\\$5 and \\\\n more'
    """
    return clean(text, limit=limit).replace("$", r"\$")


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, align: str = "") -> list[str]:
    """A Markdown table; ``align`` has one letter per column: l, r or c (default l).

    Cells are Markdown already: pass outside text through ``md`` or ``md_code`` first.
    A ``|`` that a caller left unescaped in a cell is escaped here, so a row keeps its columns.

    >>> print("\\n".join(table(["check", "ms"], [["`zero-grad`", "1.5"]], align="lr")))
    | check | ms |
    |:---|---:|
    | `zero-grad` | 1.5 |
    """
    marks = {"l": ":---", "r": "---:", "c": ":---:"}
    rule = [marks[align[i]] if i < len(align) else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(rule) + "|"]
    for row in rows:
        cells = [re.sub(r"(?<!\\)\|", r"\\|", cell).replace("\n", " ") for cell in row]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def bullets(items: Iterable[str]) -> list[str]:
    """A Markdown list; items are Markdown already.

    >>> bullets(["one", "two"])
    ['- one', '- two']
    """
    return [f"- {item}" for item in items]


def criterion(record: dict[str, object], legacy_key: str = "max_loss") -> str:
    """What memorised means, as a tier or a memorization report records it (``criterion``);
    for one written before the criterion was recorded, its absolute threshold
    (``legacy_key``). Not escaped.

    >>> criterion({"criterion": "loss at or below 30% of its start"})
    'loss at or below 30% of its start'
    >>> criterion({"threshold": 1.0}, "threshold")
    'loss < 1.0'
    """
    return str(record.get("criterion") or f"loss < {record.get(legacy_key)}")


def shown(largest: object, confidence: object) -> str:
    """The largest batch as it may be quoted: two significant figures at low confidence, three
    at medium, with "about"; the report's JSON keeps the computed number.

    >>> shown(283117, "low"), shown(283117, "medium"), shown(12, "low"), shown(None, "none")
    ('about 280,000', 'about 283,000', 'about 12', 'no estimate')
    """
    if not isinstance(largest, int) or isinstance(largest, bool):
        return "no estimate"
    digits = 2 if confidence == "low" else 3
    if largest >= 10**digits:
        scale = 10 ** (len(str(largest)) - digits)
        largest = round(largest / scale) * scale
    return f"about {largest:,}"
