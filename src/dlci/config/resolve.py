"""The resolved configuration: every key from its layers by one rule, and where it came from.

Precedence, the same for every key (:func:`pick`): the command line, then the action's input
(``DLCI_INPUT_<KEY>``), then the environment (``DLCI_<KEY>``), then the configuration file,
then the default. Inside the action's containers a snapshot made on the host (the job plan's
``config``, from the file that ``--plan`` names: dlci.ladder.plan) decides the trusted keys and
the doctor's policy; only the command line overrides it, so nothing a pull request's code sets
in the container can.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlci.config.keys import KEYS
from dlci.config.snapshot import check_snapshot
from dlci.config.source import find_source
from dlci.config.validate import Values, read_table
from dlci.errors import DlciError
from dlci.ladder.plan import read_plan
from dlci.policy import Policy

SCHEMA_VERSION = 1
COMMAND_LINE, ACTION_INPUT, ENVIRONMENT, DEFAULT = (
    "command line",
    "action input",
    "environment",
    "default",
)
HOST = "host (preflight)"


@dataclass
class Config:
    """Every key's value and source, the doctor's policy, and notes for the reader."""

    values: dict[str, Any]
    sources: dict[str, str]
    policy: Policy = field(default_factory=lambda: Policy(origin=DEFAULT))
    notes: list[str] = field(default_factory=list)
    file: str | None = None  # the configuration file read, as messages name it

    def get(self, key: str) -> Any:
        """The value of ``key`` (None when unset); KeyError for a key the table lacks."""
        if key not in KEYS:
            raise KeyError(key)
        return self.values.get(key)

    def source(self, key: str) -> str:
        """Where the value of ``key`` came from: "command line", "pyproject.toml:21", ..."""
        if key not in KEYS:
            raise KeyError(key)
        return self.sources.get(key, DEFAULT)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "config",
            "values": {k: self.values.get(k) for k in KEYS},
            "sources": {k: self.source(k) for k in KEYS},
            "policy": self.policy.to_json(),
            "notes": list(self.notes),
            "file": self.file,
        }

    @classmethod
    def from_json(cls, data: Any, where: str = "configuration snapshot") -> Config:
        """A snapshot read back, checked; a bad one is a DlciError naming the key."""
        values, sources, policy, notes, file = check_snapshot(data, where)
        return cls(values, sources, policy, notes, file)


def pick(layers: Sequence[tuple[str, Any]]) -> tuple[Any, str]:
    """The one precedence rule: the first layer that gives a value, with its name; when none
    does, None and the last layer's name.

    >>> pick([("command line", None), ("environment", 3.0), ("default", None)])
    (3.0, 'environment')
    >>> pick([("command line", None), ("default", None)])
    (None, 'default')
    """
    for name, value in layers:
        if value is not None:
            return value, name
    return None, layers[-1][0]


def resolve(
    cli: Mapping[str, Any] | None = None,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    trusted: Mapping[str, Any] | None = None,
    plan: str | None = None,
) -> Config:
    """The configuration of the project in ``cwd`` (default: the current directory).

    ``cli``: what the command line gave (None values ignored). ``trusted``: a
    :meth:`Config.to_json` snapshot from the host; ``plan``: the job plan's file, whose
    ``config`` is that snapshot (a plan of a tier alone has none).
    """
    env = os.environ if env is None else env
    where = "configuration snapshot"
    if plan:
        trusted, where = read_plan(plan).config, f"{plan}: config"
    snapshot = Config.from_json(trusted, where) if trusted is not None else None
    file_values, policy, file = read_project(cwd)
    return combine(cli, env, file_values, policy, file=file, snapshot=snapshot)


def read_project(cwd: Path | None) -> tuple[Values, Policy, str | None]:
    """The working tree's configuration file: its values, its policy, its name."""
    folder = "" if cwd is None or str(cwd) in ("", ".") else f"{cwd}{os.sep}"
    source = find_source(cwd or Path("."), folder)
    if source is None:
        return {}, Policy(origin=DEFAULT), None
    values, policy = read_table(source, os.path.dirname(source.display))
    return values, policy, source.display


def combine(
    cli: Mapping[str, Any] | None,
    env: Mapping[str, str],
    file_values: Values,
    policy: Policy,
    *,
    file: str | None,
    snapshot: Config | None = None,
    notes: Sequence[str] = (),
) -> Config:
    """Every key through :func:`pick`; with a ``snapshot``, its trusted keys and policy."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, key in KEYS.items():
        given = (cli or {}).get(name)
        layers: list[tuple[str, Any]] = [(COMMAND_LINE, _from_cli(name, given))]
        if snapshot is not None and key.trusted:
            layers.append((snapshot.sources.get(name) or HOST, snapshot.get(name)))
        else:
            in_file, where = file_values.get(name, (None, ""))
            layers += [
                (ACTION_INPUT, from_variable(name, key.input_env, env)),
                (ENVIRONMENT, from_variable(name, key.env, env)),
                (where, in_file),
                (DEFAULT, key.default),
            ]
        values[name], sources[name] = pick(layers)
    all_notes = list(notes)
    if snapshot is not None:
        policy = snapshot.policy
        all_notes = [*snapshot.notes, *all_notes]
        all_notes.append(
            "trusted keys and the doctor's policy from the host's snapshot (the job plan)"
        )
    return Config(values, sources, policy, all_notes, file)


def _from_cli(name: str, value: Any) -> Any:
    if value is None:
        return None
    key = KEYS[name]
    try:
        return key.from_text(value) if isinstance(value, str) else key.check(value)
    except ValueError as exc:
        raise DlciError(f"--{name}: {exc}", hint=key.hint) from None


def from_variable(name: str, variable: str, env: Mapping[str, str]) -> Any:
    """The value of an environment variable for key ``name``; empty is not given."""
    text = env.get(variable, "")
    if not text.strip():
        return None
    key = KEYS[name]
    try:
        return key.from_text(text)
    except ValueError as exc:
        what = f"the action's input {name}" if variable == key.input_env else "the environment"
        raise DlciError(f"{variable}: {exc}", hint=f"{key.hint} (set by {what})") from None
