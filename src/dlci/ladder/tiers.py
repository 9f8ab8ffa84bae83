"""From what the user asked (budget, hardware, ladder) to a Tier: one path for CLI and plugin.

The tier travels as a value. On the runner host ``dlci preflight`` selects it (the ladder from
the base commit on a pull request) and writes it into the job plan (dlci.ladder.plan); ``dlci
run`` in the container hands the plan to each gate as ``--plan``, a :class:`TierRequest` field,
and the gate uses the plan's tier as it is. Nothing here reads the environment to change what
the arguments say: a budget or hardware given beside a plan is not used, and the tier's
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
from dlci.ladder.plan import read_plan


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


@dataclass(frozen=True)
class TierRequest:
    """What a verb was asked about its tier: a budget, hardware and ladder to select from, or
    the tier the host already selected (``plan``: the job plan's file, dlci.ladder.plan),
    used as it is. One type for every verb that takes them (memorize, doctor, profile, tier)."""

    budget: str = "auto"
    hardware: str = "auto"
    ladder: str | Ladder | None = None
    plan: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    probes: tuple[str, ...] = PROBES

    def choose(self, event_name: str | None = None) -> Tier:
        """The tier, as :func:`choose_tier` selects it from these fields."""
        return choose_tier(
            budget=self.budget,
            hardware=self.hardware,
            ladder=self.ladder,
            plan=self.plan,
            event_name=event_name,
            timeout=self.timeout,
            probes=self.probes,
        )


def choose_tier(
    *,
    budget: str = "auto",
    hardware: str = "auto",
    ladder: str | Ladder | None = None,
    plan: str | None = None,
    event_name: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    probes: tuple[str, ...] = PROBES,
) -> Tier:
    """Load the ladder, resolve budget and hardware, and select the tier.

    ``ladder`` is a file, ``None`` (the default), or a ladder already loaded (the action's
    preflight reads a pull request's from its base commit). With ``plan`` (the job plan's
    file, handed on by ``dlci run``), the plan's tier is used as it is, and a budget,
    hardware or ladder given beside it is named in its warnings as not used. A
    budget the ladder lacks is refused before the GPUs are probed.
    """
    if plan:
        return _recorded(plan, budget, hardware, ladder)
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
    tier = read_plan(path).tier
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
