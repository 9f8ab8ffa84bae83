"""What to change, from the report's numbers: data loading, syncs, tiny kernels, pageable copies."""

from __future__ import annotations

from typing import Any

from dlci.profiling.launches import TINY_KERNEL_US

DATA_LOADING_WARN_PCT = 5.0


def recommendations(report: dict[str, Any]) -> list[dict[str, str]]:
    recs: list[dict[str, str]] = []
    phases = report.get("phases", {}).get("pct", {})
    data_pct = phases.get("data_loading", 0.0)
    if data_pct > DATA_LOADING_WARN_PCT:
        recs.append(
            {
                "id": "data-loading",
                "finding": f"data loading takes {data_pct:.1f}% of host step time "
                f"(above {DATA_LOADING_WARN_PCT:g}%)",
                "advice": "raise DataLoader num_workers, set pin_memory=True and "
                "persistent_workers=True, and move decoding and augmentation off the main process",
            }
        )
    syncs = report.get("syncs", {})
    if syncs.get("blocking_ops_per_step", 0) >= 1 and report.get("devices"):
        recs.append(
            {
                "id": "syncs",
                "finding": f"{syncs['blocking_ops_per_step']:g} blocking device-to-host reads "
                f"per step (.item(), .tolist(), nonzero...), {syncs['wait_us'] / 1e3:.2f} ms "
                "of host waiting in all",
                "advice": "remove .item() and other device-to-host reads from the training "
                "loop: accumulate losses on the GPU and read them every N steps",
            }
        )
    util = report.get("gpu_utilization_pct")
    launches = report.get("launches", {})
    if util is not None and util < 50.0 and launches.get("tiny_kernels_pct", 0.0) > 50.0:
        recs.append(
            {
                "id": "tiny-kernels",
                "finding": f"GPU utilization {util:.1f}% with {launches['tiny_kernels_pct']:.0f}% "
                f"of kernels shorter than {TINY_KERNEL_US:g} us: launch-bound",
                "advice": "use a larger batch, fuse small ops (torch.compile), or capture the "
                "step in a CUDA graph",
            }
        )
    for device in report.get("devices", []):
        pageable = device["copies"]["h2d_pageable"]
        if pageable["count"]:
            recs.append(
                {
                    "id": "pageable-copies",
                    "finding": f"GPU {device['device']}: {pageable['count']} host-to-device "
                    f"copies from pageable memory ({pageable['bytes'] / 2**20:.1f} MiB, "
                    f"{pageable['exposed_us'] / 1e3:.2f} ms not hidden by compute)",
                    "advice": "pin the host memory (DataLoader(pin_memory=True)) and copy with "
                    ".to(device, non_blocking=True)",
                }
            )
            break
    return recs
