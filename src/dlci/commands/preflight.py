"""``dlci preflight``: the runner host's checks before a job (no torch is imported)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlci.commands import _common
from dlci.errors import DlciError

REPORT_NAME = "preflight.json"


def main(argv: Sequence[str]) -> int:
    p = _common.parser(
        "preflight",
        "Check the runner host before a job: refuse a fork's pull request on a self-hosted "
        "runner (unless allowed), detect the GPU without torch, select the tier, and check "
        "the Docker engine and, with a GPU, the NVIDIA container runtime. Writes "
        "OUT/preflight.json, pass or fail, so the job summary can say what happened.",
    )
    _common.add_tier_options(p)
    p.add_argument(
        "--allow-fork-prs",
        action="store_true",
        default=os.environ.get("DLCI_ALLOW_FORK_PRS", "").lower() in ("1", "true", "yes"),
        help="run pull requests from forks on a self-hosted runner too "
        "(default: $DLCI_ALLOW_FORK_PRS, else refuse; see docs/security.md)",
    )
    p.add_argument(
        "--max-time-cap-minutes",
        type=float,
        default=float(os.environ.get("DLCI_MAX_TIME_CAP_MINUTES") or 0) or None,
        metavar="MINUTES",
        help="a ceiling on the tier's time cap, whatever the ladder says "
        "(default: $DLCI_MAX_TIME_CAP_MINUTES; on a pull request whose ladder cannot be "
        "checked against the base branch: the default ladder's nightly cap for the class)",
    )
    p.add_argument(
        "--no-docker",
        dest="docker",
        action="store_false",
        help="skip the Docker checks (for a job that runs on the host)",
    )
    p.add_argument(
        "--out",
        default="dlci-artifacts",
        metavar="DIR",
        help="directory for preflight.json (default: dlci-artifacts)",
    )
    _common.add_json(p, "the preflight report")
    _common.add_detection(p, probes="nvml,nvidia-smi")  # the host side: never torch
    args = p.parse_args(list(argv))
    if "torch" in [x.strip() for x in args.probes.split(",")]:
        raise DlciError(
            "dlci preflight never imports torch: leave torch out of --probes",
            hint="use --probes nvml,nvidia-smi",
        )

    from dlci.action.preflight import check_docker, fork_guard, trusted_ladder
    from dlci.ladder.tiers import choose_tier
    from dlci.report.github import write_outputs

    report: dict[str, Any] = {"schema_version": 1, "kind": "preflight", "passed": False}
    start = time.perf_counter()
    try:
        report["fork_guard"] = fork_guard(allow=args.allow_fork_prs)
        ladder, note, verified = trusted_ladder(args.ladder, Path(args.out))
        tier = choose_tier(
            budget=args.budget,
            hardware=args.hardware,
            ladder=ladder,
            **_common.detection_options(args),
        )
        notes = [note] if note else []
        tier = _ceiling(tier, args.max_time_cap_minutes, verified, notes)
        report["ladder"] = {"used": ladder, "verified": verified, "notes": notes}
        report["tier"] = tier.to_dict()
        report["warnings"] = list(tier.warnings) + notes
        gpu = tier.hardware_class != "cpu"
        report["gpu"] = gpu
        if args.docker:
            report["docker"] = check_docker(gpu=gpu, timeout=max(args.timeout, 5.0))
        report["passed"] = True
    except DlciError as exc:
        report["error"] = {"message": exc.message, "hint": exc.hint}
        raise
    finally:
        report["wall_time_s"] = round(time.perf_counter() - start, 3)
        _common.emit_json(report, str(Path(args.out) / REPORT_NAME))
        if args.json:
            _common.emit_json(report, args.json)

    from dlci.report.console import print_warning

    for warning in report["warnings"]:
        print_warning(warning)
    import orjson

    write_outputs(
        {
            "hardware-class": tier.hardware_class,
            "budget": tier.budget,
            "gpu": "true" if report["gpu"] else "false",
            "tier-json": orjson.dumps(report["tier"]).decode(),
        }
    )
    if args.json != "-":
        fork = report["fork_guard"]
        print(
            f"preflight: {tier.budget} tier on {tier.hardware_class}"
            + (" (GPU)" if report["gpu"] else " (CPU path)")
            + (f"; Docker {report['docker']['server_version']}" if args.docker else "")
            + ("; fork pull request allowed" if fork["fork"] else "")
        )
    return 0


def _ceiling(tier: Any, ceiling: float | None, verified: bool, notes: list[str]) -> Any:
    """Cap the tier's time; an unverified pull-request ladder gets the default's nightly cap."""
    import dataclasses

    if ceiling is None and not verified:
        from dlci.ladder.load import load_ladder

        row = load_ladder().budgets.get("nightly", {}).get(tier.hardware_class)
        ceiling = row.time_cap_minutes if row is not None else None
    if ceiling is not None and tier.time_cap_minutes > ceiling:
        notes.append(
            f"time cap {tier.time_cap_minutes:g} min lowered to the ceiling of {ceiling:g} min"
        )
        return dataclasses.replace(tier, time_cap_minutes=ceiling)
    return tier
