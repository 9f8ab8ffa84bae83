"""``dlci hardware``: detect the GPUs and name the machine's hardware class."""

from __future__ import annotations

from collections.abc import Sequence

from dlci.commands import _common


def main(argv: Sequence[str]) -> int:
    p = _common.parser(
        "hardware",
        "Detect the GPUs (NVML, then nvidia-smi, then torch.cuda) and name the hardware "
        "class from the budget ladder's class table.",
    )
    _common.add_json(p, "the hardware report")
    _common.add_ladder(p)
    _common.add_detection(p)
    args = p.parse_args(list(argv))

    from dlci import hardware
    from dlci.ladder.classes import classify, hardware_report
    from dlci.ladder.load import load_ladder
    from dlci.report.console import print_warning
    from dlci.report.github import write_outputs

    ladder = load_ladder(args.ladder)
    info = hardware.detect(**_common.detection_options(args))
    match = classify(info, ladder)
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
            print(f"hardware class: {match.name} ({match.reason}); report in {args.json}")
        return 0
    _print_table(info, match)
    return 0


def _print_table(info, match) -> None:  # type: ignore[no-untyped-def]
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"hardware class: [bold]{match.name}[/bold]  ({match.reason})")
    if info.gpus:
        table = Table("GPU", "name", "memory", "compute capability", "uuid")
        for gpu in info.gpus:
            memory = f"{gpu.memory_mib / 1024:.1f} GiB" if gpu.memory_mib else "?"
            table.add_row(
                str(gpu.index), gpu.name, memory, gpu.compute_capability or "?", gpu.uuid or ""
            )
        console.print(table)
        console.print(
            f"driver {info.driver_version or '?'}, CUDA {info.cuda_version or '?'}, "
            f"found through {info.source}"
        )
    memory = f"{info.memory_mib / 1024:.1f} GiB" if info.memory_mib else "?"
    console.print(f"CPU: {info.cpu_count} cores, {info.cpu_model or 'unknown model'}, {memory}")
    for line in info.probes:
        console.print(f"  probe {line}", style="dim", highlight=False)
