"""``dlci memorize``: overfit one batch of the target to the tier's loss threshold."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from dlci.commands import _common

DISTRIBUTED_FLAG = "DLCI_MEMORIZE_WORKER"  # set in torchrun's workers, so they do not relaunch
# The workers' arguments travel in the environment: torchrun's own parser would otherwise
# take options such as --nproc as abbreviations of its own.
ARGV_VARIABLE = "DLCI_MEMORIZE_ARGV"
VERDICT_VARIABLE = "DLCI_MEMORIZE_VERDICT"  # where rank 0 writes pass or fail for the launcher


def main(argv: Sequence[str]) -> int:
    if os.environ.get(DISTRIBUTED_FLAG) == "1" and not argv:
        import json

        argv = json.loads(os.environ.get(ARGV_VARIABLE, "[]"))
    p = _common.parser(
        "memorize",
        "Overfit one small batch of the target until the loss falls below the tier's threshold; "
        "stop as soon as it does, fail when the tier's epoch or time cap runs out.",
    )
    _common.add_target(p)
    _common.add_tier_options(p)
    _common.add_json(p, "the report (default: OUT/memorization.json)")
    p.add_argument(
        "--out",
        default="dlci-artifacts",
        metavar="DIR",
        help="directory for the report, the loss curve and tracking files "
        "(default: dlci-artifacts)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for every generator (default: 0)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: the GPU if any)")
    p.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="processes under torchrun with DDP (default: the tier's nproc)",
    )
    p.add_argument(
        "--no-early-stop",
        dest="early_stop",
        action="store_false",
        help="run every epoch of the tier even after the threshold is reached",
    )
    p.add_argument(
        "--tracker",
        default=os.environ.get("DLCI_TRACKER") or "tensorboard",
        choices=("tensorboard", "wandb", "none"),
        help="where the run's configuration and metrics go (default: tensorboard)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    _common.add_detection(p)
    args = p.parse_args(list(argv))

    from dlci.ladder.tiers import choose_tier
    from dlci.memorization.target import resolve_spec

    spec = resolve_spec(args.target)
    tier = choose_tier(
        budget=args.budget,
        hardware=args.hardware,
        ladder=args.ladder,
        **_common.detection_options(args),
    )
    nproc = args.nproc if args.nproc is not None else tier.nproc
    if nproc < 1:
        from dlci.errors import DlciError

        raise DlciError(f"--nproc must be at least 1, got {nproc}", hint="use --nproc 2")
    if nproc > 1 and os.environ.get(DISTRIBUTED_FLAG) != "1":
        return _launch(argv, nproc, args.quiet)
    return _run(args, spec, tier)


def _launch(argv: Sequence[str], nproc: int, quiet: bool) -> int:
    """Run this same command in ``nproc`` processes under torchrun (DDP).

    Workers exit 0 once a verdict exists, whatever it is, and rank 0 writes the verdict to a
    file: a worker that exits early with a failing code would make torchrun kill rank 0
    before it writes the report.
    """
    import json
    import tempfile

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    _check_gpu_count(nproc)
    if not quiet:
        print(f"memorize: starting {nproc} processes under torchrun (DDP)", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="dlci-ddp-") as scratch:
        verdict_file = Path(scratch) / "verdict"
        saved = {k: os.environ.get(k) for k in (DISTRIBUTED_FLAG, ARGV_VARIABLE, VERDICT_VARIABLE)}
        os.environ.update(
            {
                DISTRIBUTED_FLAG: "1",
                ARGV_VARIABLE: json.dumps(list(argv)),
                VERDICT_VARIABLE: str(verdict_file),
            }
        )
        try:
            run(parse_args(["--standalone", f"--nproc-per-node={nproc}", "-m", "dlci", "memorize"]))
        except ChildFailedError as exc:
            print(
                f"memorize: {len(exc.failures)} of {nproc} DDP processes failed "
                "(their messages are above)",
                file=sys.stderr,
            )
            return 1
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        verdict = verdict_file.read_text().strip() if verdict_file.exists() else ""
    return 0 if verdict == "pass" else 1


def _check_gpu_count(nproc: int) -> None:
    import torch

    from dlci.errors import DlciError

    if torch.cuda.is_available() and torch.cuda.device_count() < nproc:
        raise DlciError(
            f"the tier runs {nproc} processes, one per GPU, but this machine has "
            f"{torch.cuda.device_count()} GPU(s)",
            hint="pass --nproc with the number of GPUs, or set nproc in your ladder",
        )


def _run(args, spec: str, tier) -> int:  # type: ignore[no-untyped-def]
    from dlci.errors import DlciError
    from dlci.memorization.engine import Distributed

    dist = Distributed.from_env()
    if dist.active:
        _init_process_group(dist)
    try:
        return _memorize(args, spec, tier, dist)
    except DlciError:
        if dist.rank != 0:
            return 1  # rank 0 reports the same mistake; one message is enough
        raise
    finally:
        if dist.active:
            import torch.distributed

            torch.distributed.destroy_process_group()


def _memorize(args, spec: str, tier, dist) -> int:  # type: ignore[no-untyped-def]
    from dlci.memorization.engine import MemorizeConfig, memorize, seed_everything
    from dlci.memorization.target import load_target
    from dlci.progress import StepProgress

    seed_everything(args.seed + dist.rank)  # the model's initial weights come from here
    target = load_target(spec)
    config = MemorizeConfig.from_tier(
        tier, seed=args.seed, device=args.device, early_stop=args.early_stop
    )
    leader = dist.rank == 0
    tracker, on_step = _tracking(args, leader)
    label = f"memorize {tier.budget}/{tier.hardware_class}"
    try:
        with StepProgress(tier.max_epochs, label, enabled=leader and not args.quiet) as progress:

            def report_step(step: int, loss: float, best: float) -> None:
                progress(step, loss, best)
                on_step(step, loss, best)

            result = memorize(target, config, on_step=report_step, dist=dist)
        if leader:
            _write_outputs(args, spec, tier, result, tracker)
    finally:
        tracker.close()
    if dist.active:
        if leader:
            Path(os.environ[VERDICT_VARIABLE]).write_text(result.verdict)
        return 0  # the launcher turns the verdict into the exit code
    return 0 if result.passed else 1


def _init_process_group(dist) -> None:  # type: ignore[no-untyped-def]
    import torch
    import torch.distributed

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(dist.local_rank)
    torch.distributed.init_process_group(backend=backend)


def _tracking(args, leader: bool):  # type: ignore[no-untyped-def]
    from dlci.memorization.tracking import NullTracker, make_tracker

    tracker = make_tracker(args.tracker, Path(args.out), "memorize") if leader else NullTracker()

    def on_step(step: int, loss: float, best: float) -> None:
        tracker.log_metric("memorize/loss", loss, step)

    return tracker, on_step


def _write_outputs(args, spec: str, tier, result, tracker) -> None:  # type: ignore[no-untyped-def]
    import torch

    from dlci.commands._common import emit_json
    from dlci.report import memorization
    from dlci.report.github import write_outputs

    gpu_name = torch.cuda.get_device_name() if result.device.startswith("cuda") else None
    report = memorization.build_report(
        result=result,
        tier=tier.to_dict(),
        seed=args.seed,
        target=spec,
        gpu_name=gpu_name,
        tracking=": ".join(filter(None, (args.tracker, getattr(tracker, "location", "")))),
    )
    tracker.log_config(report["config"])
    tracker.log_summary(
        {
            "best_loss": float("nan") if result.best_loss is None else result.best_loss,
            "steps": result.steps,
            "passed": int(result.passed),
            "wall_time_s": result.wall_time_s,
        }
    )
    out = Path(args.out)
    json_path = args.json or str(out / memorization.REPORT_NAME)
    emit_json(report, json_path)
    curve = (
        memorization.plot_curve(report, out / memorization.CURVE_NAME) if result.losses else None
    )
    write_outputs(
        {
            "memorization-passed": result.passed,
            "memorization-loss": result.best_loss if result.best_loss is not None else "",
        }
    )
    for change in result.changes:
        print(f"memorize: {change}", file=sys.stderr)
    # with the report on standard output, the verdict line goes to stderr to keep it JSON
    stream = sys.stderr if json_path == "-" else sys.stdout
    mark = "PASS" if result.passed else "FAIL"
    print(f"memorization {mark}: {result.reason}", file=stream)
    where = f"report {json_path}" if json_path != "-" else "report on standard output"
    where += f", curve {curve}" if curve else ""
    print(f"  {where}, tracking {report['tracking']}", file=stream)
