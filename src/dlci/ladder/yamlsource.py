"""Read YAML keeping the line of every key, so errors can say where a bad value is."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dlci.errors import DlciError

KeyPath = tuple[str | int, ...]


def dotted(path: KeyPath) -> str:
    """Render a key path the way error messages and docs write it.

    >>> dotted(("budgets", "pr", "a100", "max_loss"))
    'budgets.pr.a100.max_loss'
    >>> dotted(("classes", "t4", "match", 0))
    'classes.t4.match[0]'
    """
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


@dataclass
class YamlSource:
    """A parsed YAML document and, for every key path, the file and 1-based line it sits on."""

    data: Any
    file: str
    lines: dict[KeyPath, tuple[str, int]] = field(default_factory=dict)
    files: tuple[str, ...] = ()  # every file behind ``data``, extended ones first

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


def load_yaml(path: Path, display: str | None = None) -> YamlSource:
    """Parse one YAML file; malformed YAML or a duplicate key is a located DlciError."""
    display = display or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DlciError(
            f"{display}: no such file", hint="check the path given to --ladder"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DlciError(f"{display}: cannot read the file ({exc})") from None
    return parse_yaml(text, display)


def parse_yaml(text: str, display: str) -> YamlSource:
    """Parse YAML text named ``display`` in messages."""
    loader: yaml.SafeLoader | None = None
    try:
        loader = yaml.SafeLoader(text)  # rejects control characters at once (ReaderError)
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
