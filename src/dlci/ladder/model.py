"""The ladder's frozen data: hardware classes, tier rows, the ladder itself and a selected tier."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from dlci.errors import DlciError
from dlci.ladder import patterns
from dlci.ladder.goal import Goal

if TYPE_CHECKING:  # a type only: yaml stays off the readers of a tier (the job plan's)
    from dlci.ladder.yamlsource import KeyPath

CPU_CLASS = "cpu"


@dataclass(frozen=True)
class HardwareClass:
    name: str
    match: tuple[str, ...]
    speed: float
    fallback: str | None = None
    description: str = ""


@dataclass(frozen=True)
class TierRow:
    max_epochs: int
    max_loss: float | None  # absolute; None: not stated (the row is relative)
    time_cap_minutes: float
    profile_steps: int
    nproc: int
    batch_size: int = 16
    max_relative_loss: float | None = None  # share of the starting loss (memorization/goal.py)


@dataclass(frozen=True)
class Ladder:
    source: str  # the file a user named, or "default"
    files: tuple[str, ...]  # every file read, the extended ones first
    version: int
    revision: str
    classes: Mapping[str, HardwareClass]
    budgets: Mapping[str, Mapping[str, TierRow | None]]
    lines: Mapping[KeyPath, tuple[str, int]] = field(
        default_factory=dict, compare=False, repr=False
    )
    notes: tuple[str, ...] = ()  # what reading an older format over a newer one changed

    def where(self, *path: str) -> tuple[str | None, int | None]:
        """The file and line that defined ``path``, for messages about a selected row."""
        found = self.lines.get(tuple(path))
        return found if found else (self.source, None)

    def classify(self, gpu_name: str) -> str | None:
        """The class whose pattern has the longest match in ``gpu_name``, or None.

        >>> from dlci.ladder.load import load_ladder
        >>> load_ladder().classify("NVIDIA A100-SXM4-80GB")
        'a100'
        >>> load_ladder().classify("NVIDIA A10G")
        'a10'
        >>> load_ladder().classify("Matrox G200eW") is None
        True
        """
        best: tuple[int, str] | None = None
        for cls in self.classes.values():
            for pattern in cls.match:
                found = patterns.search(pattern, gpu_name)
                if found and (best is None or len(found.group(0)) > best[0]):
                    best = (len(found.group(0)), cls.name)
        return best[1] if best else None

    def nearest_gpu_class(self, speed: float) -> str:
        """The GPU class nearest to ``speed`` on a log scale; ties go to the slower class."""
        gpus = [c for c in self.classes.values() if c.name != CPU_CLASS]
        if not gpus:
            raise DlciError(
                "the ladder declares no GPU class",
                hint="add GPU classes under 'classes'",
                file=self.source,
            )
        return min(gpus, key=lambda c: (abs(math.log(c.speed / speed)), c.speed)).name


@dataclass(frozen=True)
class Tier:
    """The selected memorization budget: what ``dlci tier`` prints and ``dlci run`` reads."""

    budget: str
    hardware_class: str
    max_epochs: int
    max_loss: float | None
    time_cap_minutes: float
    profile_steps: int
    nproc: int
    batch_size: int
    ladder: str
    ladder_version: int
    ladder_revision: str
    row: str  # the key path of the row used, e.g. budgets.pr.t4
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    max_relative_loss: float | None = None

    @property
    def criterion(self) -> str:
        """What memorised means at this tier, in words (memorization/goal.py).

        >>> from dlci.ladder.load import load_ladder, select_tier
        >>> select_tier(load_ladder(), budget="pr", hardware_class="cpu").criterion
        'loss at or below 30% of its start'
        """
        return Goal(self.max_loss, self.max_relative_loss).describe()

    @property
    def threshold_form(self) -> str:
        """``relative``, ``absolute`` or ``both``: which thresholds the row states."""
        if self.max_loss is None:
            return "relative"
        return "absolute" if self.max_relative_loss is None else "both"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of ``dlci tier --json``."""
        data = asdict(self)
        data["reasons"] = list(self.reasons)
        data["warnings"] = list(self.warnings)
        data["criterion"] = self.criterion  # in words, for reports that render it
        return {"schema_version": 1, **data}
