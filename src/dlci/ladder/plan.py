"""The job plan: what the trusted host decided before any of the pull request's code runs.

``dlci preflight`` writes it once, on the runner host, into preflight.json (``plan_version``,
``tier``, ``config``): the tier from the base commit's ladder, and the trusted configuration
with the gates' policy (the doctor's waivers and thresholds, min-gpu-util, max-gpu-memory).
Every later step reads it through :func:`read_plan` from one flag, ``--plan FILE``: ``dlci
run`` and each gate's verb in the containers, the pytest plugin's ``--dlci-plan``, the host's
bookkeeping of the gates. No environment variable carries it. ``dlci tier --json`` output is
a plan of a tier alone (no configuration). Host-side and in the plugin: imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

from dlci import jsonio, schema
from dlci.errors import DlciError
from dlci.fsutil import read_input
from dlci.ladder.format import TierFields
from dlci.ladder.model import Tier

PLAN_VERSION = 1
PLAN_LIMIT = 4 << 20  # bytes: a plan is a few kilobytes; a hostile one is refused unread
ROW_FIELDS = tuple(f.name for f in schema.fields(TierFields))
HINT = "give the preflight.json that dlci preflight wrote, or dlci tier --json output"
TIER_FIELDS = frozenset(f.name for f in fields(Tier))
REQUIRED = frozenset(f.name for f in fields(Tier) if f.default is MISSING)
# The JSON type of each Tier field by its annotation (reasons and warnings: lists of words)
KINDS = {"int": "an integer", "float": "a number", "float | None": "a number or null",
         "str": "a string"}  # fmt: skip
FIELD_KINDS = {f.name: KINDS[str(f.type)] for f in fields(Tier) if str(f.type) in KINDS}


@dataclass(frozen=True)
class JobPlan:
    """The tier and the trusted configuration (a ``Config.to_json()`` snapshot, None for a
    tier alone), as the host decided them; ``source`` is the file it was read from."""

    tier: Tier
    config: Mapping[str, Any] | None = None
    source: str = ""
    version: int = PLAN_VERSION

    def to_json(self) -> dict[str, Any]:
        """The plan's fields of preflight.json.

        >>> from dlci.ladder.tiers import choose_tier
        >>> sorted(JobPlan(choose_tier(budget="pr", hardware="cpu")).to_json())
        ['config', 'plan_version', 'tier']
        """
        config = None if self.config is None else dict(self.config)
        return {"plan_version": self.version, "tier": self.tier.to_dict(), "config": config}


def read_plan(path: str) -> JobPlan:
    """The plan in ``path``: preflight.json's plan, or a tier alone (``dlci tier --json``).

    Every way the file can be wrong is one DlciError naming it, with a hint.
    """
    if not path.strip():
        raise DlciError("--plan: an empty path", hint=HINT)
    return parse_plan(decode_plan(path), path)


def decode_plan(path: str) -> Any:
    """The plan file's JSON (the host keeps it whole for its record); located errors."""
    raw = read_input(path, what="job plan", hint=HINT, limit=PLAN_LIMIT)
    try:
        return jsonio.decode(raw)
    except jsonio.DecodeError as exc:
        raise DlciError(f"not valid JSON ({exc})", hint=HINT, file=path) from None
    except RecursionError:
        raise DlciError("JSON nested too deep to be a job plan", hint=HINT, file=path) from None


def parse_plan(data: Any, path: str) -> JobPlan:
    """The plan in the decoded JSON of ``path`` (named in every error)."""
    if not isinstance(data, dict):
        raise DlciError("holds no job plan (not a JSON object)", hint=HINT, file=path)
    if "plan_version" not in data:
        if "tier" in data:
            raise DlciError(
                "holds no plan_version: a preflight report of an older dl-ci",
                hint="run dlci preflight of this dl-ci again",
                file=path,
            )
        return JobPlan(tier_from_mapping(data, path), None, path)  # dlci tier --json
    version = data["plan_version"]
    if type(version) is not int or version != PLAN_VERSION:  # true == 1 in Python, not here
        raise DlciError(
            f"plan_version {version!r:.40} is not supported (this dl-ci reads {PLAN_VERSION})",
            hint="run dlci preflight and the job with the same dl-ci version",
            file=path,
        )
    tier, config = data.get("tier"), data.get("config")
    if not isinstance(tier, dict):
        raise DlciError("tier: expected an object", hint=HINT, file=path)
    if config is not None and not isinstance(config, dict):
        raise DlciError("config: expected an object or null", hint=HINT, file=path)
    return JobPlan(tier_from_mapping(tier, path), config, path)


# The plan of this pytest session, given to the pytest plugin as --dlci-plan (dlci run passes
# it to the tests step): assert_memorizes() without a tier takes its tier from there.
_SESSION: dict[str, str | None] = {"plan": None}


def use_in_tests(path: str | None) -> None:
    """Make ``path`` (None: none) the plan of the users' tests in this process."""
    _SESSION["plan"] = path or None


def session_plan() -> str | None:
    """The plan the pytest plugin was given (``--dlci-plan``), None outside one."""
    return _SESSION["plan"]


def tier_from_mapping(data: Mapping[str, Any], path: str) -> Tier:
    """A Tier from its JSON fields (``Tier.to_dict``); fields newer than the file default."""
    missing = sorted(REQUIRED - set(data))
    if missing:
        raise DlciError(f"the tier lacks {', '.join(missing)}", hint=HINT, file=path)
    for name, kind in FIELD_KINDS.items():
        if name in data and not _is(data[name], kind):
            got = type(data[name]).__name__
            raise DlciError(f"tier.{name}: expected {kind}, got {got}", hint=HINT, file=path)
    # the ladder row's own bounds (a time cap above 0, at least one epoch and one process...):
    # a plan holds what a ladder could say, or a mistake is named here, not in a gate's run
    row = {k: data[k] for k in ROW_FIELDS if data.get(k) is not None}
    schema.raise_all(
        [
            DlciError(f"tier.{problem.path[-1]}: {problem.message}", hint=problem.hint, file=path)
            for problem in schema.check(TierFields, row)[1]
        ]
    )
    values = {k: v for k, v in data.items() if k in TIER_FIELDS}
    values["reasons"] = (*_words(values.get("reasons")), f"tier from {path}")
    values["warnings"] = _words(values.get("warnings"))
    return Tier(**values)


def _is(value: Any, kind: str) -> bool:
    """Whether a JSON value is of ``kind`` (a KINDS value); a bool is not a number.

    >>> _is(3, "a number"), _is(True, "an integer"), _is(None, "a number or null")
    (True, False, True)
    """
    if kind == "a string":
        return isinstance(value, str)
    if kind == "a number or null" and value is None:
        return True
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and (kind != "an integer" or isinstance(value, int))


def _words(value: Any, most: int = 50) -> tuple[str, ...]:
    """A tier's reasons or warnings: the first ``most`` lines of at most 400 characters (a
    ladder gives a handful; a hostile plan, millions)."""
    if not isinstance(value, list | tuple):
        return ()
    return tuple(str(v)[:400] for v in value[:most])
