"""``dlci config``: the resolved configuration, and where each value came from."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dlci.commands import _common
from dlci.commands._common import ArgumentParser
from dlci.commands.base import Verb
from dlci.config import keys, render, trust
from dlci.errors import DlciError
from dlci.report.console import print_error


class ConfigVerb(Verb):
    """Print the resolved configuration: each key's value and where it came from (command
    line > action input > environment > dlci.toml or [tool.dlci] > default), the doctor's
    waivers and thresholds. Exit 1 when the file is invalid or a waiver has expired."""

    def add_options(self, p: ArgumentParser) -> None:
        _common.add_json(p, "the configuration")
        p.add_argument(
            "--schema", action="store_true", help="print the configuration's JSON schema and exit"
        )
        p.add_argument(
            "--dir", default=".", metavar="DIR", help="the project's directory (default: .)"
        )
        p.add_argument(
            "--base-commit",
            default=None,
            metavar="SHA",
            help="show what a pull request with this base commit gets: the trusted keys and "
            "the policy from that commit's configuration file",
        )

    def run(self, args: argparse.Namespace) -> int:
        if args.schema:
            sys.stdout.write(keys.render_schema())
            return 0
        directory = Path(args.dir)
        if not directory.is_dir():
            raise DlciError(f"--dir {args.dir}: not a directory", hint="give the project's folder")
        config = trust.trusted_config(args.base_commit, cwd=None if args.dir == "." else directory)
        if args.json:
            _common.emit_json(config.to_json(), args.json)
        if args.json != "-":
            print("\n".join(render.describe(config)))
        for waiver in render.expired(config):
            print_error(
                DlciError(
                    f"the waiver for {waiver.check} expired on {waiver.until} "
                    f"(set at {waiver.source}); the check runs again and the doctor fails",
                    hint="fix the check's finding, or renew the waiver with a new until and reason",
                )
            )
        return 1 if render.expired(config) else 0


main = ConfigVerb("config").main
