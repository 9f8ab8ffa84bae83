"""``dlci tier``: select the memorization-test tier for this budget and hardware."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dlci.commands import _common

if TYPE_CHECKING:
    from dlci.ladder.model import Tier


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
    from dlci.report.console import print_warning
    from dlci.report.github import write_outputs

    tier = _common.tier_request(args).choose()
    for warning in tier.warnings:
        print_warning(warning)
    data = tier.to_dict()
    write_outputs(
        {
            "budget": tier.budget,
            "hardware-class": tier.hardware_class,
            "max-epochs": tier.max_epochs,
            "max-loss": "" if tier.max_loss is None else tier.max_loss,
            "max-relative-loss": "" if tier.max_relative_loss is None else tier.max_relative_loss,
            "criterion": tier.criterion,
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


def _compact(data: dict[str, Any]) -> str:
    from dlci import jsonio

    return jsonio.encode(data, indent=False).decode()


def _print(tier: Tier) -> None:
    """The tier as a table, then each reason once, on its own unwrapped line."""
    from rich.table import Table

    from dlci.report.console import table_console
    from dlci.report.text import clean

    table = Table(title=f"tier {tier.budget} / {tier.hardware_class}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    table.add_row("max epochs", str(tier.max_epochs))
    table.add_row("loss threshold", tier.criterion)
    table.add_row("time cap", f"{tier.time_cap_minutes:g} min")
    table.add_row("profile steps", str(tier.profile_steps))
    table.add_row("processes", str(tier.nproc))
    table.add_row("batch size", str(tier.batch_size))
    ladder = f"{tier.ladder} (version {tier.ladder_version}, revision {tier.ladder_revision})"
    table.add_row("ladder", clean(ladder))
    table.add_row("row", tier.row)
    table_console().print(table)
    for reason in tier.reasons:
        print(f"  {clean(reason)}")
