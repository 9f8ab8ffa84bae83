"""The ``dlci`` command line: parse the verb, dispatch to its module, handle errors.

Each verb lives in ``dlci.commands.<verb>`` and exposes ``main(argv) -> int``. Verb modules
are imported only when run, so ``dlci --help`` stays fast and never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from dlci import __version__
from dlci.errors import EXIT_FAIL, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE, DlciError

# verb -> one-line summary; the order is the order of a CI job.
VERBS: dict[str, str] = {
    "config": "print the resolved configuration, where each value came from, the waivers",
    "preflight": "check the runner host: fork guard, GPU, tier, Docker (no torch needed)",
    "container": "build or pull the job's image, run dlci run in it, clean up",
    "hardware": "detect the GPUs and name their hardware class (no torch needed)",
    "tier": "select the memorization-test tier from the budget ladder",
    "memorize": "overfit one batch of a target to the tier's loss threshold",
    "calibrate": "measure the ladder's numbers on many seeds, with a known false-failure rate",
    "doctor": "run the ordered debugging checks on a target",
    "profile": "record a torch.profiler trace of real training steps",
    "analyze": "compute GPU utilization and bottlenecks from a trace",
    "report": "write one self-contained HTML report of a folder of dl-ci's reports",
    "compare-profiles": "compare two utilization reports (alias: diff)",
    "compare-runs": "compare two memorization runs: what changed and what it did (alias: compare)",
    "run": "run the whole job: tests, memorization, doctor, profile, analyze",
    "summary": "write the GitHub job summary, step outputs and annotations",
    "baseline": "compare this run with its baseline run (fetched from GitHub), with statistics",
    "history": "append a run to the history, plot the trends, flag drift",
    "bisect": "find the first commit between a good and a bad one that fails a gate",
}

# old name -> verb: each runs the verb's module, with the same output
ALIASES: dict[str, str] = {"diff": "compare-profiles", "compare": "compare-runs"}


def _parser() -> argparse.ArgumentParser:
    width = max(map(len, VERBS))
    verbs = "\n".join(f"  {name:<{width}} {text}" for name, text in VERBS.items())
    parser = argparse.ArgumentParser(
        prog="dlci",
        description="dl-ci: CI gates for deep-learning code.",
        epilog=f"commands:\n{verbs}\n\nRun 'dlci COMMAND --help' for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dlci {__version__}")
    parser.add_argument("command", metavar="COMMAND", help="one of: " + ", ".join(VERBS))
    return parser


def log_dir() -> Path:
    """Where tracebacks of unexpected errors go: $DLCI_LOG_DIR, else the user cache."""
    if os.environ.get("DLCI_LOG_DIR"):
        return Path(os.environ["DLCI_LOG_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(cache) / "dlci"


def _write_crash_log(argv: Sequence[str]) -> Path:
    body = (
        f"dlci {__version__}, python {sys.version.split()[0]}\n"
        f"command: dlci {' '.join(argv)}\n"
        f"time: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n\n{traceback.format_exc()}"
    )
    for directory in (log_dir(), Path(tempfile.gettempdir())):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / "dlci-error.log"
            path.write_text(body, encoding="utf-8")
            return path
        except OSError:
            continue
    raise OSError("no writable directory for the error log")  # pragma: no cover


def module_name(verb: str) -> str:
    """The module of a verb or an alias: ``-`` in a verb is ``_`` in its module.

    >>> module_name("compare-profiles"), module_name("diff")
    ('dlci.commands.compare_profiles', 'dlci.commands.compare_profiles')
    """
    return "dlci.commands." + ALIASES.get(verb, verb).replace("-", "_")


def run_verb(verb: str, argv: Sequence[str]) -> int:
    """Import the verb's module (``dlci.commands.<verb>``) and call its ``main``."""
    module = importlib.import_module(module_name(verb))
    return int(module.main(list(argv)))


def closed_stdout_is_quiet(call: Callable[[], int]) -> int:
    """``call()``, then standard output flushed; if its reader has gone (``dlci tier --json - |
    head -c1``), the BrokenPipeError ends the verb quietly with its own exit code, or 1 when
    it had none yet (a gate cut short has no verdict, so it must not read as a pass): standard
    output is pointed at the null device, so nothing later (nor the flush at exit) raises
    again. A BrokenPipeError on any other pipe stays a bug (exit 3). ``--help`` exits through
    SystemExit after printing, and is flushed the same way; rich points standard output at
    the null device itself and exits 1, which counts as none yet.
    """
    code: int | None = None
    try:
        code = call()
        sys.stdout.flush()
    except SystemExit as exc:
        if isinstance(exc.__context__, BrokenPipeError):  # rich's Console exits 1 on one
            return EXIT_FAIL
        closed_stdout_is_quiet(lambda: 0)
        raise
    except BrokenPipeError:
        if not _stdout_gone():
            raise
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    return EXIT_FAIL if code is None else code


def _stdout_gone() -> bool:
    """Whether standard output is a pipe (or socket) whose reader has closed it."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll() here, or no descriptor
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dlci`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if not argv:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    verb = argv[0]
    if verb.startswith("-") or (verb not in VERBS and verb not in ALIASES):
        try:  # --help and --version exit 0; anything else is a usage error
            parser.parse_args(argv[:1])
        except SystemExit as exc:
            code = int(exc.code or 0)
            return closed_stdout_is_quiet(lambda: code)
        print(
            f"dlci: unknown command {verb!r}; choose from: {', '.join(VERBS)}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        return closed_stdout_is_quiet(lambda: run_verb(verb, argv[1:]))
    except DlciError as exc:
        from dlci.report.console import print_error  # msgspec: off `dlci --help`, for errors only

        print_error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # the one place that turns a bug into exit 3 and a log
        path = _write_crash_log(argv)
        print(
            f"error: dlci {verb} failed unexpectedly ({type(exc).__name__}: {exc}).\n"
            f"  The traceback is in {path}; please attach it to a bug report.",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
