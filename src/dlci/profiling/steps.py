"""Where each step's time goes: the device/host breakdown and the forward/backward/optimizer/
data-loading phases, per step and summed."""

from __future__ import annotations

from typing import Any

import numpy as np

from dlci.profiling import intervals as iv
from dlci.profiling.columns import KERNEL, MEMCPY, MEMSET, Columns
from dlci.profiling.names import DATA_PATTERNS, NCCL, PHASES, NameMasks
from dlci.profiling.timeline import Window
from dlci.profiling.units import pct, us
from dlci.report.fields import Device, StepEntry


def per_step(
    cols: Columns,
    names: NameMasks,
    windows: list[Window],
    host: Any,
    primary: Device | None,
) -> list[StepEntry]:
    """Each step's window, GPU utilization, breakdown (device work over host work, in
    priority order) and phases (host time by annotation)."""
    if not windows:
        return []
    if primary is not None:
        on = cols.dev_device == primary.device
    else:
        on = np.zeros(cols.dev_kind.size, dtype=bool)
    ordered = _breakdown_sets(cols, names, on, host)
    phases_in = phase_sets(cols, names, host)

    numbers = [w[0] for w in windows]
    lo = np.array([w[1] for w in windows])
    hi = np.array([w[2] for w in windows])
    cpu_hi = np.array([w[3] for w in windows])
    breakdown = iv.priority_lengths(lo, hi, ordered)
    breakdown["other_us"] = breakdown.pop("other")
    phases = iv.priority_lengths(lo, np.maximum(cpu_hi, lo), phases_in)
    phases["other_us"] = phases.pop("other")
    kernel_starts, kernel_ends = dict(ordered)["kernel_us"]
    kernel_time = iv.clipped_lengths(kernel_starts, kernel_ends, lo, hi)
    out = []
    for i, number in enumerate(numbers):
        out.append(
            StepEntry(
                step=number,
                start_us=us(lo[i] - lo[0]),
                duration_us=us(hi[i] - lo[i]),
                host_duration_us=us(max(cpu_hi[i] - lo[i], 0.0)),
                gpu_utilization_pct=pct(kernel_time[i], hi[i] - lo[i]) if primary else None,
                breakdown={k: us(v[i]) for k, v in breakdown.items()},
                phases={k: us(v[i]) for k, v in phases.items()},
            )
        )
    return out


def phase_sets(cols: Columns, names: NameMasks, host: Any) -> list[tuple[str, iv.Pair]]:
    """The host time of each phase (``data_loading_us``, then the others), merged sets.

    Data loading first; among the others the innermost wins: a forward and backward run by
    Optimizer.step (a closure: Lightning's automatic optimisation, LBFGS) are forward and
    backward time, an optimizer step inside a training_step (manual optimisation) is
    optimizer time.
    """
    raw = {}
    for phase, patterns in PHASES.items():
        mask = host & names.mask(cols.op_name, *patterns)
        raw[f"{phase}_us"] = (cols.op_ts[mask], cols.op_end[mask])
    data = raw.pop("data_loading_us")
    return [("data_loading_us", iv.merge(*data)), *iv.innermost(raw).items()]


def sum_over_steps(per_step: list[StepEntry], part: str, total_key: str) -> dict[str, Any]:
    """Sum one split (``breakdown`` or ``phases``) over the steps, with shares of the total."""
    if not per_step:
        return {}
    total = sum(getattr(s, total_key) for s in per_step)
    splits = [getattr(s, part) for s in per_step]
    sums = {k: sum(split[k] for split in splits) for k in splits[0]}
    return {
        "total_us": us(total),
        **{k: us(v) for k, v in sums.items()},
        "pct": {k.removesuffix("_us"): pct(v, total) for k, v in sums.items()},
    }


def _breakdown_sets(
    cols: Columns, names: NameMasks, on: Any, host: Any
) -> list[tuple[str, iv.Pair]]:
    """The breakdown's interval sets, in priority order: device work first, then the host."""
    kind = cols.dev_kind
    nccl = names.mask(cols.dev_name, NCCL)
    sets = {
        "kernel_us": iv.merge(
            cols.dev_ts[on & (kind == KERNEL) & ~nccl], cols.dev_end[on & (kind == KERNEL) & ~nccl]
        ),
        "memcpy_us": iv.merge(
            cols.dev_ts[on & (kind == MEMCPY)], cols.dev_end[on & (kind == MEMCPY)]
        ),
        "memset_us": iv.merge(
            cols.dev_ts[on & (kind == MEMSET)], cols.dev_end[on & (kind == MEMSET)]
        ),
        "communication_us": iv.merge(
            cols.dev_ts[on & (kind == KERNEL) & nccl], cols.dev_end[on & (kind == KERNEL) & nccl]
        ),
    }
    sets["runtime_us"] = iv.merge(cols.rt_ts, cols.rt_end)
    data_mask = host & names.mask(cols.op_name, *DATA_PATTERNS)
    sets["data_loading_us"] = iv.merge(cols.op_ts[data_mask], cols.op_end[data_mask])
    cpu_mask = host & ~cols.op_annotation
    sets["cpu_exec_us"] = iv.merge(cols.op_ts[cpu_mask], cols.op_end[cpu_mask])
    return list(sets.items())
