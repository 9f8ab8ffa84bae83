"""From what the user asked (budget, hardware, ladder) to a Tier: one path for CLI and plugin.

The tier travels as a value. On the runner host ``dlci preflight`` selects it (the ladder from
the base commit on a pull request) and writes it into preflight.json; ``dlci run`` in the
container hands that file to each gate as ``--tier-file``, a :class:`TierRequest` field, and
the gate uses the recorded tier as it is. Nothing here reads the environment to change what
the arguments say: a budget or hardware given beside a tier file is not used, and the tier's
warnings say so.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from dlci import hardware as _hardware
from dlci.errors import DlciError
from dlci.hardware import DEFAULT_TIMEOUT_S, PROBES
from dlci.ladder.classes import ClassMatch, classify
from dlci.ladder.format import suggest
from dlci.ladder.load import check_budget, load_ladder, resolve_budget, select_tier
from dlci.ladder.model import Ladder, Tier


def resolve_class(
    requested: str,
    ladder: Ladder,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    probes: tuple[str, ...] = PROBES,
) -> ClassMatch:
    """``auto`` detects; a class name is taken as is; a GPU name goes through the patterns.

    A name that is neither is an error rather than a guess: a typo such as ``a1000`` must not
    quietly pick another class's budget.

    >>> resolve_class("NVIDIA H100 80GB HBM3", load_ladder()).name
    'h100'
    """
    value = requested.strip()
    if value == "auto":
        match = classify(_hardware.detect(timeout=timeout, probes=probes), ladder)
        return ClassMatch(
            match.name, f"hardware auto: {match.name}, {match.reason}", match.warnings, match.probes
        )
    if value in ladder.classes:
        return ClassMatch(value, f"hardware {value}: given")
    by_name = ladder.classify(value)
    if by_name:
        return ClassMatch(by_name, f"hardware '{value}': matches class {by_name}")
    raise DlciError(
        f"--hardware: unknown hardware class {value!r}",
        hint=suggest(value, ladder.classes, "classes in this ladder")
        + "; or pass auto, or a GPU name that the ladder's patterns match",
    )


# The host's tier file in the container's environment, set by ``dlci run`` for its steps: the
# configuration reads its trusted snapshot from there (dlci.config.resolve), and the pytest
# plugin and assert_memorizes take it as their tier file's default. choose_tier never reads it.
TIER_JSON_VARIABLE = "DLCI_TIER_JSON"


@dataclass(frozen=True)
class TierRequest:
    """What a verb was asked about its tier: a budget, hardware and ladder to select from, or
    the tier the host already selected (``tier_file``: preflight.json or ``dlci tier --json``),
    used as it is. One type for every verb that takes them (memorize, doctor, profile, tier)."""

    budget: str = "auto"
    hardware: str = "auto"
    ladder: str | Ladder | None = None
    tier_file: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    probes: tuple[str, ...] = PROBES

    def choose(self, event_name: str | None = None) -> Tier:
        """The tier, as :func:`choose_tier` selects it from these fields."""
        return choose_tier(
            budget=self.budget,
            hardware=self.hardware,
            ladder=self.ladder,
            tier_file=self.tier_file,
            event_name=event_name,
            timeout=self.timeout,
            probes=self.probes,
        )


def tier_from_file(path: str) -> Tier:
    """The tier recorded in a JSON file: a tier (``dlci tier --json``) or a preflight report.

    ``dlci run`` sets DLCI_TIER_JSON to the preflight's report, so every step in the
    container uses exactly the tier the trusted host selected (ladder from the base branch,
    ceilings applied) instead of selecting again from the pull request's files.
    """
    from dataclasses import MISSING, fields

    from dlci import jsonio
    from dlci.fsutil import read_input

    raw = read_input(path, what="tier file", hint="give dlci tier --json output or preflight.json")
    try:
        data = jsonio.decode(raw)
    except jsonio.DecodeError as exc:
        raise DlciError(f"{path}: not valid JSON ({exc})") from None
    if isinstance(data, dict) and isinstance(data.get("tier"), dict):
        data = data["tier"]
    if not isinstance(data, dict):
        raise DlciError(
            f"{path}: holds no tier", hint="give dlci tier --json output or preflight.json"
        )
    names = {f.name for f in fields(Tier)}
    optional = {f.name for f in fields(Tier) if f.default is not MISSING}  # newer than the file
    missing = sorted(n for n in names - set(data) if n not in optional)
    if missing:
        raise DlciError(f"{path}: the tier lacks {', '.join(missing)}")
    values = {k: v for k, v in data.items() if k in names}
    values["reasons"] = (*tuple(values.get("reasons", ())), f"tier from {path}")
    values["warnings"] = tuple(values.get("warnings", ()))
    return Tier(**values)


def choose_tier(
    *,
    budget: str = "auto",
    hardware: str = "auto",
    ladder: str | Ladder | None = None,
    tier_file: str | None = None,
    event_name: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    probes: tuple[str, ...] = PROBES,
) -> Tier:
    """Load the ladder, resolve budget and hardware, and select the tier.

    ``ladder`` is a file, ``None`` (the default), or a ladder already loaded (the action's
    preflight reads a pull request's from its base commit). With ``tier_file`` (the host's
    preflight.json, handed on by ``dlci run``), the tier recorded there is used as it is, and
    a budget, hardware or ladder given beside it is named in its warnings as not used. A
    budget the ladder lacks is refused before the GPUs are probed.
    """
    if tier_file:
        return _recorded(tier_file, budget, hardware, ladder)
    loaded = ladder if isinstance(ladder, Ladder) else load_ladder(ladder)
    if event_name is None:
        event_name = os.environ.get("GITHUB_EVENT_NAME")
    chosen_budget, budget_reason = resolve_budget(budget, event_name=event_name)
    check_budget(loaded, chosen_budget)
    match = resolve_class(hardware, loaded, timeout=timeout, probes=probes)
    return select_tier(
        loaded,
        budget=chosen_budget,
        hardware_class=match.name,
        reasons=(budget_reason, match.reason, *(f"probe {note}" for note in match.probes)),
        warnings=match.warnings,
    )


def _recorded(path: str, budget: str, hardware: str, ladder: str | Ladder | None) -> Tier:
    """The tier of ``path``, with a warning naming what was given beside it and is not used
    (from an option or its variable, $DLCI_BUDGET and the like)."""
    tier = tier_from_file(path)
    unused = []
    if budget not in ("auto", tier.budget):
        unused.append(f"budget {budget}")
    if hardware not in ("auto", tier.hardware_class):
        unused.append(f"hardware {hardware}")
    if ladder is not None:
        unused.append(f"ladder {ladder.source if isinstance(ladder, Ladder) else ladder}")
    if not unused:
        return tier
    note = (
        f"{', '.join(unused)} not used: the tier is the one recorded in {path} "
        f"({tier.budget} on {tier.hardware_class})"
    )
    return dataclasses.replace(tier, warnings=(*tier.warnings, note))
