"""The verbs' one base, as pip's ``Command``: a verb declares its options and what it runs.

Each ``dlci <verb>`` is a subclass of :class:`Verb` in ``dlci.commands.<verb>``: its class
docstring is its ``--help`` description, ``add_options`` declares its options and ``run``
returns its exit code; the module's ``main = TheVerb("verb").main`` is what the CLI calls.
``main`` parses with :class:`dlci.commands._common.ArgumentParser`, so every verb's usage
errors and configured defaults are handled the same way; every error then reaches the CLI's
one handler (``dlci.cli.main``): exit 1 with the message, 2 with the usage, 3 with a log.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from dlci.commands._common import ArgumentParser
from dlci.script.command import split_command


class Verb:
    """One verb: a name (``tier``, ``container build``), its options and its run."""

    def __init__(self, name: str) -> None:
        self.name = name

    def add_options(self, p: ArgumentParser) -> None:
        """Declare the verb's options on its parser (none by default)."""

    def run(self, args: argparse.Namespace) -> int:
        """Do the verb's work with the parsed options; return the exit code."""
        raise NotImplementedError

    def parser(self) -> ArgumentParser:
        """The verb's parser: ``dlci <name>``, its class docstring as the description (argparse
        folds its lines)."""
        p = ArgumentParser(prog=f"dlci {self.name}", description=type(self).__doc__)
        self.add_options(p)
        return p

    def parse(self, argv: Sequence[str]) -> argparse.Namespace:
        """The parsed options; a usage error raises DlciError (exit 2)."""
        return self.parser().parse_args(list(argv))

    def main(self, argv: Sequence[str]) -> int:
        """Parse ``argv``, then run the verb: its exit code."""
        return self.run(self.parse(argv))


class ScriptVerb(Verb):
    """A verb that also runs the user's training command given after ``--`` (script mode,
    docs/script-mode.md): the command's words are ``args.script``, empty without one."""

    def parse(self, argv: Sequence[str]) -> argparse.Namespace:
        argv, script = split_command(argv)
        return argparse.Namespace(**vars(super().parse(argv)), script=script)
