"""``dlci profile``: record a torch.profiler trace of the target's real training steps."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from dlci.commands import _common


def main(argv: Sequence[str]) -> int:
    p = _common.parser(
        "profile",
        "Train the target for a few real steps under torch.profiler (a wait/warmup/active "
        "schedule, so every recorded step carries a ProfilerStep#N marker; data, forward, "
        "backward and optimizer annotated) and write OUT/trace.json.gz, then analyze it "
        "(OUT/utilization.json, .md, .png). On a machine without a GPU the trace is CPU-only "
        "and the report says so.",
    )
    _common.add_target(p)
    _common.add_tier_options(p)
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
    p.add_argument(
        "--out",
        default="dlci-artifacts",
        metavar="DIR",
        help="directory for trace.json.gz and the utilization report (default: dlci-artifacts)",
    )
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: the GPU if any)")
    p.add_argument("--seed", type=int, default=0, help="seed for every generator (default: 0)")
    p.add_argument(
        "--no-analyze",
        dest="analyze",
        action="store_false",
        help="write the trace only, without the utilization report",
    )
    p.add_argument(
        "--min-gpu-util",
        type=float,
        metavar="PCT",
        help="fail (exit 1) when GPU utilization is below PCT percent",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    _common.add_detection(p)
    args = p.parse_args(list(argv))

    from dlci.commands import analyze as analyze_command
    from dlci.errors import DlciError
    from dlci.memorization.target import load_target, resolve_spec
    from dlci.profiling.capture import Schedule, profile_target

    if args.min_gpu_util is not None and not args.analyze:
        raise DlciError("--min-gpu-util needs the analysis", hint="leave out --no-analyze")
    steps = args.steps
    tier_info = ""
    if steps is None:
        from dlci.ladder.tiers import choose_tier

        tier = choose_tier(
            budget=args.budget,
            hardware=args.hardware,
            ladder=args.ladder,
            **_common.detection_options(args),
        )
        steps = tier.profile_steps
        tier_info = f" ({tier.budget} tier on {tier.hardware_class})"
    schedule = Schedule(wait=args.wait, warmup=args.warmup, active=steps)
    spec = resolve_spec(args.target)
    target = load_target(spec)
    out = Path(args.out)

    def progress(step: int, total: int) -> None:
        if not args.quiet:
            phase = (
                "wait"
                if step <= schedule.wait
                else "warmup"
                if step <= schedule.wait + schedule.warmup
                else "record"
            )
            print(f"profile: step {step}/{total} ({phase})", file=sys.stderr, flush=True)

    if not args.quiet:
        print(
            f"profile: {spec}, {schedule.active} recorded steps{tier_info} "
            f"after {schedule.wait} wait and {schedule.warmup} warmup",
            file=sys.stderr,
        )
    result = profile_target(
        target,
        out=out,
        schedule=schedule,
        device=args.device,
        seed=args.seed,
        on_step=progress,
    )
    if not args.quiet:
        kind = "CPU-only trace (no GPU here)" if result.cpu_only else f"trace on {result.device}"
        print(f"profile: wrote {result.trace}: {kind}, {result.wall_time_s:.1f} s", file=sys.stderr)
    if not args.analyze:
        return 0
    return analyze_command.main(
        [str(result.trace), "--out", str(out)]
        + (["--min-gpu-util", str(args.min_gpu_util)] if args.min_gpu_util is not None else [])
        + (["--quiet"] if args.quiet else [])
    )
