"""``dlci analyze``: GPU utilization and bottlenecks from a torch.profiler trace."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from dlci.commands import _common
from dlci.commands._common import ArgumentParser
from dlci.commands.base import Verb
from dlci.errors import DlciError
from dlci.profiling.analysis import Analysis, Destinations, analyze_trace, summary_lines
from dlci.report.console import print_error, print_warning
from dlci.report.text import clean


class AnalyzeVerb(Verb):
    """Read a Kineto trace (.json or .json.gz, as torch.profiler writes it) in bounded memory
    and report GPU utilization (TensorBoard's definition), the temporal breakdown (Holistic
    Trace Analysis's), busy time (TraceLens's), a per-step breakdown, the
    forward/backward/optimizer/data-loading split, idle gaps, sync points, host-to-device
    copies and launch overhead. Definitions: docs/profiling.md."""

    def add_options(self, p: ArgumentParser) -> None:
        p.add_argument("trace", metavar="TRACE", help="the trace file (.json or .json.gz)")
        _common.add_json(p, "the report (utilization.json)")
        p.add_argument("--markdown", metavar="FILE", help="write the Markdown summary to FILE")
        p.add_argument("--plot", metavar="FILE", help="write the per-step PNG to FILE")
        p.add_argument(
            "--out",
            metavar="DIR",
            help="write utilization.json, utilization.md and utilization.png into DIR",
        )
        _common.add_gates(p)
        p.add_argument(
            "--max-size",
            type=float,
            default=64.0,
            metavar="GIB",
            help="refuse traces larger than this once decompressed (default: 64 GiB)",
        )
        p.add_argument("--quiet", action="store_true", help="print nothing but errors")

    def run(self, args: argparse.Namespace) -> int:
        if not 0 < args.max_size < 2**33:  # NaN and infinity too
            raise DlciError(
                f"--max-size must be a positive number of GiB, got {args.max_size:g}",
                hint="the default is 64; raise it for larger traces",
            )

        say = speaker("analyze", quiet=args.quiet)
        result = analyze_trace(
            args.trace,
            Destinations.choose(args.out, json=args.json, markdown=args.markdown, plot=args.plot),
            min_gpu_util=args.min_gpu_util,
            max_gpu_memory=args.max_gpu_memory,
            max_size=int(args.max_size * 2**30),
            on_written=lambda path: say(f"wrote {path}"),
        )
        if args.json == "-":
            _common.emit_json(result.report, "-")
        return show(result, say if args.json != "-" else speaker("analyze", quiet=True))


def speaker(verb: str, *, quiet: bool) -> Callable[[str], None]:
    """One line of the verb's console output on stderr, outside text made safe."""

    def say(line: str) -> None:
        if not quiet:
            print(f"{verb}: {clean(line)}", file=sys.stderr, flush=True)

    return say


def show(result: Analysis, say: Callable[[str], None]) -> int:
    """Print the report's summary and the gate's verdict; return the exit code."""
    for line in summary_lines(result.report):
        say(line)
    if result.gate is not None and result.gate.applicable is False:
        print_warning(f"{result.gate.message} ({result.gate.hint})")
    if result.gate is not None and not result.passed:
        print_error(DlciError(result.gate.message, hint=result.gate.hint))
        return 1
    return 0


main = AnalyzeVerb("analyze").main
