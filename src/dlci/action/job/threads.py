"""CPU threads from the container's quota: torch's and OpenMP's, for every step of the job.

Runs in the container, never imports torch. torch starts one intra-op thread per physical core
of the machine, whatever the container may use: with several runners on one machine (or a
quota of 2 CPUs on a 64-core host) every step oversubscribes, and CPU steps ran 10 to 50 times
slower than with one thread each. So each step's process gets ``OMP_NUM_THREADS`` (which torch
reads for its intra-op pool), ``MKL_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` set to what the
container may really use: its CPU quota (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``),
else the CPUs it may run on (its affinity, ``docker run --cpuset-cpus``), rounded up, at least
one. Without either limit nothing is set (torch's own default stands). A value the job's
environment already sets wins, and so does the action's input ``cpu-threads`` (a number, or
``auto``). What was set, and why, goes into run.json.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
CGROUP = Path("/sys/fs/cgroup")


def quota_cpus(root: Path = CGROUP) -> float | None:
    """The CPU quota in CPUs (2.5 for ``250000 100000``), None without one.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = (Path(d) / "cpu.max").write_text("250000 100000\\n")
    ...     quota_cpus(Path(d))
    2.5
    """
    for quota_file, period_file in (
        (root / "cpu.max", None),
        (root / "cpu" / "cpu.cfs_quota_us", root / "cpu" / "cpu.cfs_period_us"),
    ):
        try:
            words = quota_file.read_text(encoding="ascii").split()
            if period_file is not None:
                words += period_file.read_text(encoding="ascii").split()
        except (OSError, UnicodeDecodeError):
            continue
        if len(words) < 2 or words[0] in ("max", "-1"):
            return None
        try:
            quota, period = int(words[0]), int(words[1])
        except ValueError:
            return None
        return quota / period if quota > 0 and period > 0 else None
    return None


def affinity_cpus() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def decide(
    asked: str, environ: dict[str, str], *, quota: float | None, affinity: int | None,
    machine: int | None,
) -> tuple[dict[str, str], dict[str, Any]]:  # fmt: skip
    """(the variables to set for each step, the record for run.json).

    >>> decide("auto", {}, quota=2.0, affinity=16, machine=16)[0]["OMP_NUM_THREADS"]
    '2'
    >>> decide("auto", {}, quota=None, affinity=16, machine=16)
    ({}, {'value': None, 'source': 'not set: no CPU quota or affinity limit (torch decides)'})
    >>> decide("auto", {"OMP_NUM_THREADS": "3"}, quota=2.0, affinity=16, machine=16)[1]
    {'value': 3, 'source': "the job's environment: OMP_NUM_THREADS=3"}
    """
    if asked not in ("", "auto"):
        value = int(asked)
        return _set(value), {"value": value, "source": f"the input cpu-threads: {value}"}
    given = environ.get("OMP_NUM_THREADS", "").strip()
    if given:
        value_given = int(given) if given.isdigit() else given
        record = {"value": value_given, "source": f"the job's environment: OMP_NUM_THREADS={given}"}
        return {}, record
    if quota is not None:
        value = max(1, math.ceil(quota - 1e-9))
        if affinity:
            value = min(value, affinity)
        return _set(value), {"value": value, "source": f"the container's CPU quota: {quota:g}"}
    if affinity and machine and affinity < machine:
        source = f"the CPUs the container may run on: {affinity} of {machine}"
        return _set(affinity), {"value": affinity, "source": source}
    source = "not set: no CPU quota or affinity limit (torch decides)"
    return {}, {"value": None, "source": source}


def _set(value: int) -> dict[str, str]:
    return dict.fromkeys(VARIABLES, str(value))


def from_container(asked: str) -> tuple[dict[str, str], dict[str, Any]]:
    """:func:`decide` on this container's own limits and environment."""
    return decide(
        asked, dict(os.environ), quota=quota_cpus(), affinity=affinity_cpus(),
        machine=os.cpu_count(),
    )  # fmt: skip


def argument(value: str) -> str:
    """``check`` as an argparse type (dlci run's --cpu-threads)."""
    import argparse

    try:
        return check(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def check(value: str) -> str:
    """The input's value: ``auto`` or a whole number of threads from 1 to 1024."""
    text = value.strip().lower() or "auto"
    if text == "auto" or (text.isdigit() and 1 <= int(text) <= 1024):
        return text
    raise ValueError(f"expected auto or a number of threads from 1 to 1024, got {value!r}")
