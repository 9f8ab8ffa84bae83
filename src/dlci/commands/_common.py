"""Arguments and output helpers that several verbs share."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from dlci.errors import EXIT_USAGE, DlciError
from dlci.fsutil import atomic_write_bytes, read_input

if TYPE_CHECKING:
    from dlci.ladder.tiers import TierRequest


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors exit 2, as argparse's do, through the CLI's one handler.

    The usage goes to stderr first, as argparse prints it; raising rather than exiting keeps
    ``dlci.cli.main`` a function that returns its exit code (and annotates inside Actions).
    """

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise DlciError(
            f"{self.prog}: {message}",
            hint=f"run '{self.prog} --help' for usage",
            exit_code=EXIT_USAGE,
        )

    def parse_known_args(  # type: ignore[override]
        self, args: Any = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, rest = super().parse_known_args(args, namespace)
        from_config(parsed, getattr(self, "config_keys", {}))
        return parsed, rest


def configure(p: argparse.ArgumentParser, **keys: str) -> None:
    """Options whose default is the project's configuration (dlci.config): dest -> key."""
    p.config_keys = {**getattr(p, "config_keys", {}), **keys}  # type: ignore[attr-defined]


def from_config(args: argparse.Namespace, keys: dict[str, str]) -> None:
    """Fill the options not given from the configuration, with its one precedence rule
    (command line > action input > environment > the file > default; docs/configuration.md).

    The file is read only when an option is missing. With ``--plan`` (as ``dlci run`` passes
    the host's job plan) the plan's configuration decides the trusted keys, and the ladder is
    not taken: the tier is fixed by the host.
    """
    plan = getattr(args, "plan", None)
    if plan:
        keys = {dest: key for dest, key in keys.items() if key != "ladder"}
    missing = {dest: key for dest, key in keys.items() if getattr(args, dest, None) is None}
    if not missing:
        return
    from dlci.config import resolve  # yaml: read only for an option left to the configuration

    config = resolve(plan=plan)
    for dest, key in missing.items():
        setattr(args, dest, config.get(key))
    args.configured = {dest for dest in missing if getattr(args, dest) is not None}


def parser(verb: str, description: str) -> ArgumentParser:
    return ArgumentParser(prog=f"dlci {verb}", description=description)


def add_json(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help=f"write {what} as JSON to FILE, or to standard output when FILE is omitted",
    )


def add_ladder(p: argparse.ArgumentParser, *, config: bool = True) -> None:
    """--ladder; ``config``: its default is the configuration's ``ladder`` key, else
    $DLCI_LADDER only (the action's preflight reads the trusted configuration itself)."""
    p.add_argument(
        "--ladder",
        default=None if config else os.environ.get("DLCI_LADDER") or None,
        metavar="FILE",
        help="budget ladder file (default: $DLCI_LADDER, else the configuration's ladder key, "
        "else dl-ci's own budgets/ladder.yaml)",
    )
    if config:
        configure(p, ladder="ladder")


def add_detection(p: argparse.ArgumentParser, probes: str = "nvml,nvidia-smi,torch") -> None:
    """--timeout and --probes; ``probes`` is the default when $DLCI_PROBES is unset."""
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="give up on a GPU probe (NVML, nvidia-smi) after this long (default: 10)",
    )
    p.add_argument(
        "--probes",
        default=os.environ.get("DLCI_PROBES") or probes,
        metavar="LIST",
        help=f"GPU probes to try, in order (default: $DLCI_PROBES, else {probes}); "
        "host-side steps leave out torch so it is never imported",
    )


def detection_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``hardware.detect`` from the parsed options."""
    # the probes: only the verbs that detect (not summary, report, baseline, history)
    from dlci.hardware import parse_probes

    return {"timeout": positive_timeout(args.timeout), "probes": parse_probes(args.probes)}


def add_target(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        default=None,
        metavar="MODULE:FUNCTION",
        help="function returning dlci.Target (default: $DLCI_TARGET, else [tool.dlci] target "
        "in pyproject.toml)",
    )


def add_tier_options(p: argparse.ArgumentParser, *, config: bool = True, plan: bool = True) -> None:
    """--budget, --hardware and --ladder, selected exactly as ``dlci tier`` selects; and
    ``plan``: --plan (add_plan), the job plan the host wrote (not for preflight, which writes
    it)."""
    p.add_argument(
        "--budget",
        default=os.environ.get("DLCI_BUDGET") or "auto",
        help="auto, pr, merge, nightly, or another budget of the ladder; auto follows "
        "GITHUB_EVENT_NAME (default: $DLCI_BUDGET, else auto)",
    )
    p.add_argument(
        "--hardware",
        default=os.environ.get("DLCI_HARDWARE") or "auto",
        help="auto (detect), a class of the ladder such as a100, or a GPU name such as "
        "'NVIDIA A100-SXM4-80GB' (default: $DLCI_HARDWARE, else auto)",
    )
    add_ladder(p, config=config)
    if plan:
        add_plan(p)


def add_plan(p: argparse.ArgumentParser) -> None:
    """--plan FILE: the job plan (dlci.ladder.plan), the one way the host's tier and trusted
    configuration reach a step."""
    p.add_argument(
        "--plan",
        metavar="FILE",
        help="use the job plan in FILE as it is (the preflight.json dlci preflight wrote, or "
        "dlci tier --json output): its tier, and its trusted configuration (the gates' bounds, "
        "the doctor's policy); dlci run passes the host's to every gate. --budget, --hardware "
        "and --ladder are then not used (a warning says so)",
    )


def tier_request(args: argparse.Namespace) -> TierRequest:
    """The verb's TierRequest (dlci.ladder.tiers) from --budget, --hardware, --ladder,
    --plan and the detection options."""
    # the ladder (msgspec, yaml): only the verbs that select a tier, and not for their --help
    from dlci.ladder import plan, tiers

    if args.plan is not None and not args.plan.strip():
        raise DlciError("--plan: an empty path", hint=plan.HINT)
    return tiers.TierRequest(
        budget=args.budget,
        hardware=args.hardware,
        ladder=args.ladder,
        plan=args.plan,
        **detection_options(args),
    )


def add_gates(p: argparse.ArgumentParser) -> None:
    """--min-gpu-util and --max-gpu-memory, which ``dlci profile`` and ``dlci analyze`` take."""
    p.add_argument(
        "--min-gpu-util",
        type=float,
        metavar="PCT",
        help="fail (exit 1) when GPU utilization is below PCT percent (0-100; default: the "
        "configuration's min-gpu-util, else no gate)",
    )
    p.add_argument(
        "--max-gpu-memory",
        type=float,
        metavar="PCT",
        help="fail (exit 1) when the GPU's peak memory (reserved, else allocated) is above PCT "
        "percent (0-100) of the device's memory (default: the configuration's max-gpu-memory, "
        "else no gate); see docs/memory.md",
    )
    configure(p, min_gpu_util="min-gpu-util", max_gpu_memory="max-gpu-memory")


def gates_need_analysis(args: argparse.Namespace) -> None:
    """Refuse a gate with --no-analyze: the gates read the report."""
    for name in ("min_gpu_util", "max_gpu_memory"):
        if name in getattr(args, "configured", ()):  # the file's gate: no analysis, no gate
            continue
        if getattr(args, name) is not None and not args.analyze:
            flag = "--" + name.replace("_", "-")
            raise DlciError(f"{flag} needs the analysis", hint="leave out --no-analyze")


def add_schedule(p: argparse.ArgumentParser) -> None:
    """--steps, --wait and --warmup: the profiler's schedule (``dlci profile``)."""
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        metavar="N",
        help="active (recorded) steps (default: the tier's profile_steps)",
    )
    p.add_argument(
        "--wait", type=int, default=1, metavar="N", help="steps skipped first (default: 1)"
    )
    p.add_argument(
        "--warmup", type=int, default=1, metavar="N", help="steps traced but discarded (default: 1)"
    )


def emit_json(data: Any, dest: str) -> None:
    """Write JSON to ``dest`` ('-' is standard output), atomically for files.

    Standard output closed early (``dlci analyze T --json - | head -c 1``) ends quietly: the
    reader has what it wanted, the verb goes on to its own exit code.
    """
    from dlci import jsonio  # msgspec: off every verb's --help (all of them import this module)

    blob = jsonio.encode(data)
    if dest == "-":
        with stdout_guard():
            sys.stdout.write(blob.decode())
            sys.stdout.flush()
    else:
        atomic_write_bytes(dest, blob)


@contextlib.contextmanager
def stdout_guard() -> Iterator[None]:
    """Writes to standard output whose reader has gone: nothing more is written there.

    Standard output is pointed at the null device, so that later writes, and the flush at
    exit, go nowhere instead of raising BrokenPipeError again.
    """
    try:
        yield
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)


@contextlib.contextmanager
def stdout_for_the_report(dest: str | None) -> Iterator[None]:
    """With ``--json -`` the report alone is standard output: while the verb runs a target
    (which may print, as may its DataLoader workers and torchrun's children), file
    descriptor 1 is standard error, so no print of theirs lands in the report."""
    if dest != "-":
        yield
        return
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):  # no standard output to guard
        yield
        return
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):  # and sys.stdout, wherever it writes
            yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()  # the target's buffered prints: to standard error too
        os.dup2(saved, 1)
        os.close(saved)


def append_to(path: str, text: str, *, what: str = "") -> None:
    """Append ``text`` and a newline to ``path`` (a verb's --markdown); a file that cannot be
    appended to is the user's mistake, said with why (``what``: " the summary")."""
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(text + "\n")
    except OSError as exc:
        raise DlciError(f"{path}: cannot append{what} ({exc.strerror})") from None


def positive_timeout(value: float) -> float:
    if not value > 0:
        raise DlciError(
            f"--timeout must be a positive number of seconds, got {value:g}",
            hint="use --timeout 10",
        )
    return value


def load_report(
    location: str,
    *,
    kind: str,
    name: str,
    writer: str,
    check: Callable[[dict[str, Any]], str | None] | None = None,
) -> dict[str, Any]:
    """A JSON report of ``kind`` (schema_version 1), or the file ``name`` in a directory.

    Every way it can be wrong is one DlciError naming the file: missing, not a regular file,
    over the size cap, a directory without the report, not JSON, nested too deep, another
    kind of report, a schema this dl-ci does not read, and (``check``, which returns what is
    wrong as "key.path: expected ..., got ...") a field the verb uses that is missing or of
    the wrong type.
    """
    from dlci import jsonio  # msgspec: off every verb's --help (all of them import this module)

    path = Path(location)
    if path.is_dir():
        path = path / name
        if not path.exists():
            raise DlciError(f"{path.parent}: is a directory without {name}")
    blob = read_input(path, what="file", hint=f"give a {name} or its directory")
    try:
        data = jsonio.decode(blob)
    except jsonio.DecodeError as exc:
        raise DlciError(f"not valid JSON ({exc})", file=str(path)) from None
    except RecursionError:
        raise DlciError("JSON nested too deep to be a report", file=str(path)) from None
    if not isinstance(data, dict) or data.get("kind") != kind:
        raise DlciError(f"not a {kind} report", hint=f"{writer} writes one", file=str(path))
    version = data.get("schema_version")
    if version != 1:
        raise DlciError(
            f"{kind} report schema_version {version!r:.40} is not supported (this dl-ci reads 1)",
            hint="compare reports written by the same major version of dl-ci",
            file=str(path),
        )
    problem = check(data) if check is not None else None
    if problem:
        raise DlciError(
            problem, hint=f"{writer} writes every field; was the file edited?", file=str(path)
        )
    return data


def no_gpu(args: argparse.Namespace, cpu_only: bool) -> str:
    """Why this run has no GPU, when the hardware class (the tier's: detected, given, or the
    host's tier file in CI) is ``cpu`` and the trace is CPU-only; ``""`` otherwise, and
    with --strict-gates. On a GPU class a trace without GPU work still fails the gates: a
    container that lost its GPU is what they must catch."""
    if args.strict_gates or not cpu_only:
        return ""
    try:
        hardware = tier_request(args).choose().hardware_class
    except DlciError:
        return ""
    if hardware != "cpu":
        return ""
    return "this machine has no GPU (hardware class cpu), so the trace holds no GPU work"


def write_html(folder: Any, say: Callable[[str], None]) -> Any:
    """The folder's report.html (dlci.report.html), said where it went; a report that cannot
    be written is said too and never changes the verb's exit code. Returns its path or None."""
    from dlci.report import html  # off the verbs that write no report.html (the host's)

    try:
        path = html.write_report(folder)
    except (OSError, DlciError) as exc:
        say(f"no {html.REPORT_NAME} in {folder}: {exc}")
        return None
    say(f"wrote {path}: the HTML report of this folder")
    return path
