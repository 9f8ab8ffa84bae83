"""What to change, from the report's numbers: data loading, syncs, tiny kernels, pageable copies."""

from __future__ import annotations

from dlci.profiling.launches import TINY_KERNEL_US
from dlci.report.fields import Recommendation, Syncs, Utilization

DATA_LOADING_WARN_PCT = 5.0
DATA_LOADING_MIN_US = 1000.0  # a step's data loading below this is never worth workers


def data_loading_share(report: Utilization) -> tuple[float, float | None, str]:
    """Data loading's share of host step time, its time per step (us; None when the trace has
    no steps), and what they are of: the median step when there are three or more (one slow
    step, such as the first batch of a fresh iterator, does not decide it), else the trace.

    >>> from dlci.report.fields import StepEntry
    >>> steps = [StepEntry(step=n, host_duration_us=100.0, phases={"data_loading_us": n})
    ...          for n in (20, 1, 2)]
    >>> data_loading_share(Utilization(per_step=steps, phases={"pct": {"data_loading": 7.7}}))
    (2.0, 2.0, 'median of 3 steps')
    """
    shares, times = [], []
    for step in report.per_step:
        host = step.host_duration_us
        data = step.phases.get("data_loading_us")
        if host > 0 and isinstance(data, int | float):
            shares.append(100.0 * data / host)
            times.append(float(data))
    if len(shares) >= 3:
        middle = len(shares) // 2
        return sorted(shares)[middle], sorted(times)[middle], f"median of {len(shares)} steps"
    whole = float(report.shares("phases").get("data_loading", 0.0))
    return whole, (sorted(times)[len(times) // 2] if times else None), "the trace"


def recommendations(report: Utilization) -> list[Recommendation]:
    """What to change, each with the figures that call for it."""
    recs: list[Recommendation] = []
    data_pct, data_us, of = data_loading_share(report)
    # under a millisecond a step (an in-memory data set), a worker process would cost more to
    # hand a batch over than the loading it takes off the main process
    if data_pct > DATA_LOADING_WARN_PCT and (data_us is None or data_us >= DATA_LOADING_MIN_US):
        recs.append(
            Recommendation(
                id="data-loading",
                finding=f"data loading takes {data_pct:.1f}% of host step time "
                f"({of}; above {DATA_LOADING_WARN_PCT:g}%)"
                + (f", {data_us / 1e3:.1f} ms a step" if data_us is not None else ""),
                advice="raise DataLoader num_workers, set pin_memory=True and "
                "persistent_workers=True, and move decoding and augmentation off the main process",
            )
        )
    syncs = report.syncs or Syncs()
    if syncs.blocking_ops_per_step >= 1 and report.devices:
        recs.append(
            Recommendation(
                id="syncs",
                finding=f"{syncs.blocking_ops_per_step:g} blocking device-to-host reads "
                f"per step (.item(), .tolist(), nonzero...), {syncs.wait_us / 1e3:.2f} ms "
                "of host waiting in all",
                advice="remove .item() and other device-to-host reads from the training "
                "loop: accumulate losses on the GPU and read them every N steps",
            )
        )
    util = report.gpu_utilization_pct
    tiny = report.launches.tiny_kernels_pct
    if util is not None and util < 50.0 and tiny > 50.0:
        recs.append(
            Recommendation(
                id="tiny-kernels",
                finding=f"GPU utilization {util:.1f}% with {tiny:.0f}% "
                f"of kernels shorter than {TINY_KERNEL_US:g} us: launch-bound",
                advice="use a larger batch, fuse small ops (torch.compile), or capture the "
                "step in a CUDA graph",
            )
        )
    for device in report.devices:
        pageable = device.copies.h2d_pageable
        if pageable.count:
            recs.append(
                Recommendation(
                    id="pageable-copies",
                    finding=f"GPU {device.device}: {pageable.count} host-to-device "
                    f"copies from pageable memory ({pageable.bytes / 2**20:.1f} MiB, "
                    f"{pageable.exposed_us / 1e3:.2f} ms not hidden by compute)",
                    advice="pin the host memory (DataLoader(pin_memory=True)) and copy with "
                    ".to(device, non_blocking=True)",
                )
            )
            break
    return recs
