"""``dlci hardware``: detect the GPUs and name the machine's hardware class."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dlci.commands import _common
from dlci.commands._common import ArgumentParser
from dlci.commands.base import Verb
from dlci.ladder.classes import detect_class, hardware_report
from dlci.report.console import print_warning, table_console
from dlci.report.github import write_outputs
from dlci.report.text import clean

if TYPE_CHECKING:
    from dlci.hardware import HardwareInfo
    from dlci.ladder.classes import ClassMatch


class HardwareVerb(Verb):
    """Detect the GPUs (NVML, then nvidia-smi, then torch.cuda) and name the hardware class
    from the budget ladder's class table."""

    def add_options(self, p: ArgumentParser) -> None:
        _common.add_json(p, "the hardware report")
        _common.add_ladder(p)
        _common.add_detection(p)

    def run(self, args: argparse.Namespace) -> int:
        options = _common.detection_options(args)
        info, match = detect_class(args.ladder, **options)
        for warning in match.warnings:
            print_warning(warning)
        write_outputs(
            {
                "hardware-class": match.name,
                "gpu-count": len(info.gpus),
                "gpu-name": info.gpus[0].name if info.gpus else "",
            }
        )
        if args.json:
            _common.emit_json(hardware_report(info, match), args.json)
            if args.json != "-":
                print(
                    f"hardware class: {match.name} ({clean(match.reason)}); report in {args.json}"
                )
            return 0
        _print(info, match)
        return 0


def _print(info: HardwareInfo, match: ClassMatch) -> None:
    """Plain lines, and a table of the GPUs; each probe's answer is printed once."""
    from rich.table import Table  # rich: for the table only, off `dlci hardware --json`

    print(f"hardware class: {match.name} ({clean(match.reason)})")
    if info.gpus:
        table = Table("GPU", "name", "memory", "compute capability", "uuid")
        for gpu in info.gpus:
            memory = f"{gpu.memory_mib / 1024:.1f} GiB" if gpu.memory_mib else "?"
            capability = gpu.compute_capability or "?"
            table.add_row(
                str(gpu.index), clean(gpu.name), memory, capability, clean(gpu.uuid or "")
            )
        table_console().print(table)
        print(
            f"driver {clean(info.driver_version or '?')}, CUDA {clean(info.cuda_version or '?')}, "
            f"found through {info.source}"
        )
    memory = f"{info.memory_mib / 1024:.1f} GiB" if info.memory_mib else "?"
    print(f"CPU: {info.cpu_count} cores, {clean(info.cpu_model or 'unknown model')}, {memory}")
    for note in info.probes:
        print(f"  probe {clean(note)}")


main = HardwareVerb("hardware").main
