"""``dlci doctor``: the ordered debugging checks on a target."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from dlci.commands import _common


def main(argv: Sequence[str]) -> int:
    p = _common.parser(
        "doctor",
        "Run the debugging ladder on the target: cheap checks first, each ruling out a class "
        "of silent deep-learning bug. Exit 1 when any check fails.",
    )
    _common.add_target(p)
    _common.add_tier_options(p)
    _common.add_json(p, "the report (default: OUT/doctor.json)")
    p.add_argument("--markdown", metavar="FILE", help="also write the report as Markdown")
    p.add_argument(
        "--out",
        default="dlci-artifacts",
        metavar="DIR",
        help="directory for doctor.json (default: dlci-artifacts)",
    )
    p.add_argument("--only", metavar="IDS", help="comma-separated check IDs to run")
    p.add_argument("--stop-on-fail", action="store_true", help="skip the rest after a failure")
    p.add_argument("--seed", type=int, default=0, help="seed for every generator (default: 0)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: the GPU if any)")
    _common.add_detection(p)
    args = p.parse_args(list(argv))

    from dlci import checks
    from dlci.ladder.tiers import choose_tier
    from dlci.memorization.engine import seed_everything
    from dlci.memorization.target import load_target, resolve_spec
    from dlci.report import doctor as report

    selected = checks.select(args.only)
    spec = resolve_spec(args.target)
    tier = choose_tier(
        budget=args.budget,
        hardware=args.hardware,
        ladder=args.ladder,
        **_common.detection_options(args),
    )
    seed_everything(args.seed)
    target = load_target(spec)

    def progress(result) -> None:  # type: ignore[no-untyped-def]
        print(f"doctor: {result.id:<20} {result.status}", file=sys.stderr, flush=True)

    results = checks.run_checks(
        target,
        checks=selected,
        tier=tier,
        device=args.device,
        stop_on_fail=args.stop_on_fail,
        on_result=progress,
        factory=lambda: load_target(spec),
    )
    data = report.build(results, target=spec, tier=tier.to_dict(), seed=args.seed)
    json_path = args.json or str(Path(args.out) / report.REPORT_NAME)
    _common.emit_json(data, json_path)
    if args.markdown:
        from dlci.fsutil import atomic_write_text

        atomic_write_text(args.markdown, report.render_markdown(data))
    if json_path != "-":
        report.print_table(data)
        print(f"report {json_path}")
    return 1 if data["verdict"] == "fail" else 0
