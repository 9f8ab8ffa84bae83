"""``dlci tier``: select the memorization-test tier for this budget and hardware."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dlci import jsonio
from dlci.commands import _common
from dlci.commands._common import ArgumentParser
from dlci.commands.base import Verb
from dlci.errors import DlciError
from dlci.ladder.load import load_ladder
from dlci.report.console import print_error, print_warning, table_console
from dlci.report.github import write_outputs
from dlci.report.text import clean

if TYPE_CHECKING:
    from dlci.ladder.model import Tier


class TierVerb(Verb):
    """Select the memorization-test tier (epochs, loss threshold, time cap, profile steps,
    processes) from the budget ladder."""

    def add_options(self, p: ArgumentParser) -> None:
        _common.add_tier_options(p)
        _common.add_json(p, "the tier")
        _common.add_detection(p)
        p.add_argument(
            "--validate",
            nargs="+",
            metavar="FILE",
            help="only check these ladder files and report every error (for pre-commit)",
        )

    def run(self, args: argparse.Namespace) -> int:
        if args.validate:
            return _validate(args.validate)
        tier = _common.tier_request(args).choose()
        for warning in tier.warnings:
            print_warning(warning)
        data, relative = tier.to_dict(), tier.max_relative_loss
        write_outputs(
            {
                "budget": tier.budget,
                "hardware-class": tier.hardware_class,
                "max-epochs": tier.max_epochs,
                "max-loss": "" if tier.max_loss is None else tier.max_loss,
                "max-relative-loss": "" if relative is None else relative,
                "criterion": tier.criterion,
                "time-cap-minutes": tier.time_cap_minutes,
                "profile-steps": tier.profile_steps,
                "nproc": tier.nproc,
                "batch-size": tier.batch_size,
                "ladder-revision": tier.ladder_revision,
                "tier-json": jsonio.encode(data, indent=False).decode(),
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


def _print(tier: Tier) -> None:
    """The tier as a table, then each reason once, on its own unwrapped line."""
    from rich.table import Table  # rich: for the table only, off `dlci tier --json`

    title = clean(f"tier {tier.budget} / {tier.hardware_class}")  # a plan may say anything
    table = Table(title=title, show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    table.add_row("max epochs", str(tier.max_epochs))
    table.add_row("loss threshold", clean(tier.criterion))
    table.add_row("time cap", f"{tier.time_cap_minutes:g} min")
    table.add_row("profile steps", str(tier.profile_steps))
    table.add_row("processes", str(tier.nproc))
    table.add_row("batch size", str(tier.batch_size))
    ladder = f"{tier.ladder} (version {tier.ladder_version}, revision {tier.ladder_revision})"
    table.add_row("ladder", clean(ladder))
    table.add_row("row", clean(tier.row))
    table_console().print(table)
    for reason in tier.reasons:
        print(f"  {clean(reason)}")


main = TierVerb("tier").main
