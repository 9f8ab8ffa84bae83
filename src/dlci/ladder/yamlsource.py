"""Read YAML keeping the line of every key, so errors can say where a bad value is.

A ladder is outside input (a pull request may write one), so what it may cost is bounded
before a Python object is built: the file is read only if it is a regular file of at most
``LADDER_LIMIT`` bytes (``dlci.fsutil.read_input``), an alias (``*name``) is refused where the
composer meets it (the billion-laughs bomb expands aliases; the format has no use for them),
and so are nesting deeper than ``MAX_DEPTH`` and more than ``MAX_NODES`` keys and values
(pure-Python YAML builds a node per value). What remains is linear in the file's size.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dlci.errors import DlciError
from dlci.fsutil import read_input

KeyPath = tuple[str | int, ...]

LADDER_LIMIT = (
    1 << 20
)  # bytes of one ladder file: the shipped ladder is 4 KiB (docs/budget-ladder.md)
MAX_DEPTH = 20  # nested collections; a ladder needs 4 (budgets.pr.cpu.{...})
MAX_NODES = 20_000  # keys and values: the shipped ladder has 631; a flat 1 MiB list 500 000
PART_LIMIT = 60  # characters of one key shown in a message
MAX_EXTENDS = 16  # files one 'extends' chain may add: 16 MiB at most
_CHAIN_DEPTH = contextvars.ContextVar("dlci_extends_depth", default=0)


def dotted(path: KeyPath) -> str:
    """Render a key path the way error messages and docs write it.

    >>> dotted(("budgets", "pr", "a100", "max_loss"))
    'budgets.pr.a100.max_loss'
    >>> dotted(("classes", "t4", "match", 0))
    'classes.t4.match[0]'
    """
    text = ""
    for part in path:
        if isinstance(part, str) and len(part) > PART_LIMIT:  # a key of a hostile file
            part = part[: PART_LIMIT - 3] + "..."
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


@dataclass
class YamlSource:
    """A parsed YAML document and, for every key path, the file and 1-based line it sits on."""

    data: Any
    file: str
    lines: dict[KeyPath, tuple[str, int]] = field(default_factory=dict)
    files: tuple[str, ...] = ()  # every file behind ``data``, extended ones first
    notes: tuple[str, ...] = ()  # what merging an older format over a newer one changed

    def __post_init__(self) -> None:
        if not self.files:
            self.files = (self.file,)

    def where(self, path: KeyPath) -> tuple[str, int]:
        """The file and line of ``path``, or of its nearest ancestor that has one."""
        for end in range(len(path), -1, -1):
            if path[:end] in self.lines:
                return self.lines[path[:end]]
        return self.file, 1

    def error(self, path: KeyPath, problem: str, hint: str | None = None) -> DlciError:
        """A DlciError located at ``path``: ``file:line: key.path: problem``."""
        file, line = self.where(path)
        message = f"{dotted(path)}: {problem}" if path else problem
        return DlciError(message, hint=hint, file=file, line=line)


@contextlib.contextmanager
def chain_link(source: YamlSource) -> Iterator[None]:
    """Around reading the file ``source`` extends: more than MAX_EXTENDS files in one chain
    is a located error (counted here, so a chain read from a commit is bounded too)."""
    depth = _CHAIN_DEPTH.get()
    if depth >= MAX_EXTENDS:
        raise source.error(
            ("extends",),
            f"more than {MAX_EXTENDS} files in the 'extends' chain",
            hint="extend a ladder that extends 'default' directly",
        )
    token = _CHAIN_DEPTH.set(depth + 1)
    try:
        yield
    finally:
        _CHAIN_DEPTH.reset(token)


class _BoundedLoader(yaml.SafeLoader):
    """The safe loader, refusing aliases and nesting deeper than MAX_DEPTH as it composes."""

    def __init__(self, text: str, display: str) -> None:
        super().__init__(text)  # rejects control characters at once (ReaderError)
        self.display = display
        self.depth = self.nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        line = event.start_mark.line + 1 if event.start_mark else None
        if isinstance(event, yaml.AliasEvent):
            raise DlciError(
                f"aliases (*{str(event.anchor)[:PART_LIMIT]}) are not allowed in a ladder",
                hint="write the value out; to share values between ladders use 'extends'",
                file=self.display,
                line=line,
            )
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise DlciError(
                f"more than {MAX_NODES} keys and values; a ladder has a few hundred",
                hint="see docs/budget-ladder.md for the layout of a ladder",
                file=self.display,
                line=line,
            )
        if self.depth >= MAX_DEPTH:
            raise DlciError(
                f"nested deeper than {MAX_DEPTH} levels; a ladder needs 4",
                hint="see docs/budget-ladder.md for the layout of a ladder",
                file=self.display,
                line=line,
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def load_yaml(path: Path, display: str | None = None) -> YamlSource:
    """Parse one YAML file; malformed YAML or a duplicate key is a located DlciError.

    Only a regular file of at most LADDER_LIMIT bytes is read (``/dev/zero``, a FIFO or a
    50 MB file is refused before it is parsed).
    """
    display = display or str(path)
    blob = read_input(
        path,
        what="ladder file",
        limit=LADDER_LIMIT,
        hint="check the path given to --ladder or to 'extends'",
    )
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DlciError(
            f"not UTF-8 text (byte {exc.start})",
            hint="a ladder is a YAML text file in UTF-8",
            file=display,
        ) from None
    return parse_yaml(text, display)


def parse_yaml(text: str, display: str) -> YamlSource:
    """Parse YAML text named ``display`` in messages (at most LADDER_LIMIT bytes of it)."""
    if len(text) > LADDER_LIMIT or len(text.encode("utf-8", "surrogatepass")) > LADDER_LIMIT:
        raise DlciError(
            f"more than the {LADDER_LIMIT >> 20} MiB dl-ci reads as a ladder file",
            hint="a ladder is a few kilobytes; check the file (docs/budget-ladder.md)",
            file=display,
        )
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text, display)
        node = loader.get_single_node()
        if node is None:
            return YamlSource(data=None, file=display)
        lines: dict[KeyPath, tuple[str, int]] = {}
        _walk(node, (), display, lines)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        column = f" (column {mark.column + 1})" if mark else ""
        problem = exc.problem or exc.context or "cannot be parsed"
        raise DlciError(
            f"malformed YAML: {problem}{column}",
            hint="check the indentation and the quoting on that line",
            file=display,
            line=line,
        ) from None
    except yaml.reader.ReaderError as exc:
        raise DlciError(
            f"malformed YAML: unacceptable character #x{exc.character:04x} at position "
            f"{exc.position}",
            hint="YAML files must be text without control characters",
            file=display,
        ) from None
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as exc:
        # PyYAML raises plain ValueError/TypeError for some values (a date out of range,
        # an unhashable key); report those as malformed YAML too.
        raise DlciError(
            f"malformed YAML: {exc}".strip(),
            hint="check the file against docs/budget-ladder.md",
            file=display,
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    return YamlSource(data=data, file=display, lines=lines)


def _walk(node: yaml.Node, path: KeyPath, file: str, lines: dict[KeyPath, tuple[str, int]]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str):
                continue  # a complex key: the validator reports it by type
            line = key_node.start_mark.line + 1
            if key in seen and key != "<<":
                raise DlciError(
                    f"{dotted((*path, key))}: duplicate key (first on line {seen[key]})",
                    hint="YAML keeps only the last value of a repeated key; remove one",
                    file=file,
                    line=line,
                )
            seen[key] = line
            child: KeyPath = (*path, key)
            lines[child] = (file, line)
            _walk(value_node, child, file, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = (*path, index)
            lines[child] = (file, item.start_mark.line + 1)
            _walk(item, child, file, lines)
