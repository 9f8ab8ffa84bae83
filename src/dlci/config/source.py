"""The configuration file: dlci.toml, else ``[tool.dlci]`` in pyproject.toml, read and located.

A configuration file is outside input (a pull request may write one): only a regular file of
at most ``CONFIG_LIMIT`` bytes is read, and it is parsed by the standard library's TOML
reader. That reader keeps no line numbers, so :func:`key_lines` scans the text once for the
line of every key (table headers, dotted keys, keys of inline tables), skipping strings and
comments; an error names ``file:line`` where the line is known, else the file and key path.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlci.errors import DlciError
from dlci.fsutil import read_input

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

CONFIG_LIMIT = 1 << 20  # bytes (a ladder's limit too): a configuration is a few hundred
MAX_KEY_PARTS = 32  # parts of one dotted key: dl-ci's deepest is 5 (tool.dlci.doctor.checks.x)
# a dotted key (or table header) of more than MAX_KEY_PARTS parts where a key may start (a
# line, a table header, an inline table's "{" or ","): the standard library's reader takes
# time and memory quadratic in the parts (20 000 parts: 10 s). A basic string part may hold
# escaped quotes ("a\"b"): a pattern without them let a 200 kB key through (27 s, 6 GB).
_DEEP_KEY = re.compile(
    r"(?:^[ \t]*(?:\[\[?[ \t]*)?|[{,][ \t]*)"  # no two parts match the same text: linear
    r"(?:(?:[A-Za-z0-9_-]+|\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*')[ \t]*\.[ \t]*)"
    + f"{{{MAX_KEY_PARTS}}}",
    re.MULTILINE,
)
LINE_PARTS = 8  # key paths deeper than this get the line of their ancestor at this depth
DLCI_TOML, PYPROJECT = "dlci.toml", "pyproject.toml"
PREFIX = {DLCI_TOML: (), PYPROJECT: ("tool", "dlci")}
KeyPath = tuple[str, ...]


@dataclass
class TomlSource:
    """One configuration file parsed: its dl-ci table, and the line of every key path."""

    display: str  # the file as messages name it: "pyproject.toml", "1a2b3c4d5e6f:ci/dlci.toml"
    data: dict[str, Any]  # the dl-ci table: dlci.toml's top level, or [tool.dlci]
    prefix: KeyPath = ()  # where that table sits in the file: ("tool", "dlci") in pyproject
    lines: dict[KeyPath, int] = field(default_factory=dict)  # full key path -> 1-based line

    def line(self, path: KeyPath) -> int | None:
        """The line of ``path`` (under the dl-ci table), or of its nearest ancestor."""
        full = self.prefix + path
        for end in range(len(full), 0, -1):
            if full[:end] in self.lines:
                return self.lines[full[:end]]
        return None

    def where(self, path: KeyPath) -> str:
        """``file:line`` of ``path``, as a source of a value."""
        line = self.line(path)
        return f"{self.display}:{line}" if line else self.display

    def error(self, path: KeyPath, problem: str, hint: str | None = None) -> DlciError:
        """A DlciError at ``path``: ``file:line: key.path: problem``."""
        name = ".".join(_part(p) for p in path)
        return DlciError(
            f"{name}: {problem}" if path else problem, hint=hint, file=self.display,
            line=self.line(path),
        )  # fmt: skip


def _part(key: str) -> str:
    """A key as TOML would write it in a dotted path (quoted when not bare), cut when long.

    >>> _part("min-gpu-util"), _part("a b")
    ('min-gpu-util', '"a b"')
    """
    key = key if len(key) <= 60 else key[:57] + "..."
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else '"' + key.replace('"', '\\"') + '"'


def parse_toml(text: str, display: str) -> dict[str, Any]:
    """TOML text parsed; malformed TOML is a DlciError with tomllib's line and column."""
    if len(text.encode("utf-8", "surrogatepass")) > CONFIG_LIMIT:
        raise DlciError(
            f"more than the {CONFIG_LIMIT >> 20} MiB dl-ci reads as a configuration file",
            hint="a configuration is a few hundred bytes; check the file",
            file=display,
        )
    deep = _DEEP_KEY.search(text)
    if deep:
        raise DlciError(
            f"a key of more than {MAX_KEY_PARTS} dotted parts; a configuration needs 5",
            hint="see docs/configuration.md for the layout of the file",
            file=display,
            line=text.count("\n", 0, deep.start()) + 1,
        )
    try:
        data: dict[str, Any] = tomllib.loads(text)
        return data
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = re.search(r"\(at line (\d+), column (\d+)\)", message)
        line = int(found.group(1)) if found else max(1, len(text.splitlines()))
        raise DlciError(
            f"malformed TOML: {message[:300]}",
            hint="check the quoting and the brackets on that line (https://toml.io)",
            file=display,
            line=line,
        ) from None
    except RecursionError:
        raise DlciError("malformed TOML: nested too deeply", file=display) from None
    except ValueError as exc:  # an integer of more digits than Python converts (4300)
        raise DlciError(
            f"malformed TOML: {str(exc)[:200]}",
            hint="a configuration's numbers are short; check the file",
            file=display,
        ) from None


def from_text(name: str, text: str, display: str) -> TomlSource | None:
    """The dl-ci table of a file named ``name`` (dlci.toml or pyproject.toml), or None when a
    pyproject.toml has no ``[tool.dlci]``."""
    data = parse_toml(text, display)
    prefix = PREFIX[name]
    table: Any = data
    for part in prefix:
        table = table.get(part) if isinstance(table, dict) else None
    if table is None and prefix:
        return None
    source = TomlSource(display, {}, prefix, key_lines(text))
    if not isinstance(table, dict):
        raise source.error((), "[tool.dlci] must be a table", hint="write [tool.dlci] as a table")
    source.data = table
    return source


def read_text(path: Path, display: str) -> str:
    """The text of a configuration file: a regular file under the cap, UTF-8."""
    blob = read_input(path, what="configuration file", limit=CONFIG_LIMIT)
    try:
        return blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DlciError(
            f"not UTF-8 text (byte {exc.start})", hint="TOML files are UTF-8", file=display
        ) from None


def find_source(folder: Path, display_folder: str = "") -> TomlSource | None:
    """The configuration of the project in ``folder``: dlci.toml, else pyproject.toml's
    ``[tool.dlci]``; both with dl-ci settings is an error naming both; neither is None."""
    found: dict[str, TomlSource] = {}
    for name in (DLCI_TOML, PYPROJECT):
        path = folder / name
        if path.exists() or path.is_symlink():
            display = f"{display_folder}{name}"
            source = from_text(name, read_text(path, display), display)
            if source is not None:
                found[name] = source
    if len(found) == 2:
        raise DlciError(
            f"both {found[DLCI_TOML].display} and {found[PYPROJECT].display} ([tool.dlci]) "
            "configure dl-ci",
            hint="keep one: move [tool.dlci]'s keys into dlci.toml, or delete dlci.toml",
            file=found[DLCI_TOML].display,
        )
    return next(iter(found.values()), None)


# --------------------------------------------------------------------------- line scanning

_BARE = re.compile(r"[A-Za-z0-9_-]+")
_SPECIAL = re.compile(r"[\n#\"'{}\[\],=]")


def key_lines(text: str) -> dict[KeyPath, int]:
    """The 1-based line of every key path of a TOML text (first occurrence).

    >>> lines = key_lines('[tool.dlci]\\nmin-gpu-util = 40\\n[tool.dlci.doctor.checks."shuffle"]\\n'
    ...                   'waive = "skip"\\nx = { y.z = 1 }\\n')
    >>> checks = ("tool", "dlci", "doctor", "checks")
    >>> lines[("tool", "dlci", "min-gpu-util")], lines[(*checks, "shuffle", "waive")]
    (2, 4)
    >>> lines[("tool", "dlci", "doctor", "checks", "shuffle", "x", "y", "z")]
    5
    """
    return _Scanner(text).run()


class _Scanner:
    """A TOML tokenizer just deep enough to know where each key starts."""

    def __init__(self, text: str) -> None:
        self.text, self.i, self.line = text, 0, 1
        self.table: KeyPath = ()
        self.stack: list[tuple[str, KeyPath]] = []  # open "{" / "[" and the key they belong to
        self.lines: dict[KeyPath, int] = {}

    def run(self) -> dict[KeyPath, int]:
        expect_key = True
        pending: KeyPath = ()
        text, n = self.text, len(self.text)
        while self.i < n:
            c = text[self.i]
            if c in " \t\r":
                self.i += 1
            elif c == "\n":
                self.line, self.i = self.line + 1, self.i + 1
                expect_key = expect_key or not self.stack
            elif c == "#":
                end = text.find("\n", self.i)
                self.i = n if end < 0 else end
            elif expect_key and c == "[" and not self.stack:
                self._header()
                expect_key = False
            elif expect_key and (c in "\"'" or _BARE.match(text, self.i)):
                pending = self._key()
                expect_key = False
            elif c in "\"'":
                self._string()
            elif c in "{[":  # in an array, a table belongs to the array's key, not the last key
                inside_array = bool(self.stack) and self.stack[-1][0] == "["
                self.stack.append((c, self.stack[-1][1] if inside_array else pending))
                self.i += 1
                expect_key = c == "{"
            elif c in "}]":
                if self.stack:
                    self.stack.pop()
                self.i += 1
            elif c == ",":
                expect_key = bool(self.stack) and self.stack[-1][0] == "{"
                self.i += 1
            else:
                expect_key = False
                found = _SPECIAL.search(text, self.i + 1)
                self.i = found.start() if found else n
        return self.lines

    def _header(self) -> None:
        self.i += 2 if self.text.startswith("[[", self.i) else 1
        self.table = tuple(self._parts())[:LINE_PARTS]
        self.lines.setdefault(self.table, self.line)
        for end in range(1, len(self.table)):
            self.lines.setdefault(self.table[:end], self.line)
        end = self.text.find("]", self.i)
        self.i = len(self.text) if end < 0 else end + 1

    def _key(self) -> KeyPath:
        base = self.stack[-1][1] if self.stack else self.table
        full = (base + tuple(self._parts()))[:LINE_PARTS]  # bounded: nesting cannot grow it
        for end in range(len(base) + 1, len(full) + 1):
            self.lines.setdefault(full[:end], self.line)
        return full

    def _parts(self) -> Iterator[str]:
        text = self.text
        while self.i < len(text):
            while self.i < len(text) and text[self.i] in " \t":
                self.i += 1
            if self.i < len(text) and text[self.i] in "\"'":
                start = self.i
                self._string()
                raw = text[start + 1 : self.i - 1]
                yield _unescape(raw) if text[start] == '"' else raw
            else:
                bare = _BARE.match(text, self.i)
                if not bare:
                    return
                self.i = bare.end()
                yield bare.group()
            while self.i < len(text) and text[self.i] in " \t":
                self.i += 1
            if not text.startswith(".", self.i):
                return
            self.i += 1

    def _string(self) -> None:
        text, quote = self.text, self.text[self.i]
        triple = text.startswith(quote * 3, self.i)
        self.i += 3 if triple else 1
        while self.i < len(text):
            c = text[self.i]
            if c == "\\" and quote == '"':
                self.i += 2
                continue
            if c == "\n":
                if not triple:
                    return  # an unterminated string: the parser has refused it already
                self.line += 1
            if text.startswith(quote * 3 if triple else quote, self.i):
                self.i += 3 if triple else 1
                while triple and text.startswith(quote, self.i):  # up to two more quotes
                    self.i += 1
                return
            self.i += 1


def _unescape(raw: str) -> str:
    """A basic string's escapes decoded, as far as a key name needs (\\" and \\\\)."""
    return re.sub(r"\\(.)", r"\1", raw)
