"""``dlci tier``: select the memorization-test tier for this budget and hardware."""

from __future__ import annotations

from collections.abc import Sequence

from dlci.commands import _common


def main(argv: Sequence[str]) -> int:
    p = _common.parser(
        "tier",
        "Select the memorization-test tier (epochs, loss threshold, time cap, profile steps, "
        "processes) from the budget ladder.",
    )
    _common.add_tier_options(p)
    _common.add_json(p, "the tier")
    _common.add_detection(p)
    p.add_argument(
        "--validate",
        nargs="+",
        metavar="FILE",
        help="only check these ladder files and report every error (for pre-commit)",
    )
    args = p.parse_args(list(argv))
    if args.validate:
        return _validate(args.validate)

    from dlci.ladder.tiers import choose_tier
    from dlci.report.console import print_warning
    from dlci.report.github import write_outputs

    tier = choose_tier(
        budget=args.budget,
        hardware=args.hardware,
        ladder=args.ladder,
        **_common.detection_options(args),
    )
    for warning in tier.warnings:
        print_warning(warning)
    data = tier.to_dict()
    write_outputs(
        {
            "budget": tier.budget,
            "hardware-class": tier.hardware_class,
            "max-epochs": tier.max_epochs,
            "max-loss": tier.max_loss,
            "time-cap-minutes": tier.time_cap_minutes,
            "profile-steps": tier.profile_steps,
            "nproc": tier.nproc,
            "batch-size": tier.batch_size,
            "ladder-revision": tier.ladder_revision,
            "tier-json": _compact(data),
        }
    )
    if args.json:
        _common.emit_json(data, args.json)
        if args.json != "-":
            print(f"tier {tier.budget}/{tier.hardware_class} written to {args.json}")
        return 0
    _print(tier)
    return 0


def _validate(files: list[str]) -> int:
    """Load each ladder file; print every error, not just the first file's."""
    from dlci.errors import DlciError
    from dlci.ladder.load import load_ladder
    from dlci.report.console import print_error

    failed = 0
    for file in files:
        try:
            ladder = load_ladder(file)
        except DlciError as exc:
            print_error(exc)
            failed += 1
            continue
        print(
            f"{file}: ok (version {ladder.version}, {len(ladder.classes)} classes, "
            f"budgets {', '.join(ladder.budgets)})"
        )
    return 1 if failed else 0


def _compact(data: dict) -> str:  # type: ignore[type-arg]
    import orjson

    return orjson.dumps(data).decode()


def _print(tier) -> None:  # type: ignore[no-untyped-def]
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"tier {tier.budget} / {tier.hardware_class}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    table.add_row("max epochs", str(tier.max_epochs))
    table.add_row("loss threshold", f"< {tier.max_loss:g}")
    table.add_row("time cap", f"{tier.time_cap_minutes:g} min")
    table.add_row("profile steps", str(tier.profile_steps))
    table.add_row("processes", str(tier.nproc))
    table.add_row("batch size", str(tier.batch_size))
    table.add_row(
        "ladder", f"{tier.ladder} (version {tier.ladder_version}, revision {tier.ladder_revision})"
    )
    table.add_row("row", tier.row)
    console.print(table)
    for reason in tier.reasons:
        console.print(f"  {reason}", style="dim", highlight=False)
