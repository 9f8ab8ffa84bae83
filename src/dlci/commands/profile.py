"""``dlci profile``: record a torch.profiler trace of the target's real training steps."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dlci.commands import _common, analyze
from dlci.commands._common import ArgumentParser
from dlci.commands.base import ScriptVerb
from dlci.profiling.analysis import Destinations, analyze_trace
from dlci.profiling.capture import profile_target
from dlci.profiling.gate import MemoryFigures, check_gate
from dlci.profiling.memcapture import measure_memory
from dlci.profiling.session import Schedule
from dlci.script.run import profile_script
from dlci.training.target import load_target, resolve_spec


class ProfileVerb(ScriptVerb):
    """Train the target for a few real steps under torch.profiler (a wait/warmup/active
    schedule, so every recorded step carries a ProfilerStep#N marker; data, forward, backward
    and optimizer annotated) and write OUT/trace.json.gz, then analyze it (OUT/utilization.json,
    .md, .png). Then, unless --no-memory, a short memory pass of its own
    (OUT/trace-memory.json.gz, peak memory per step) and the largest batch that fits
    (docs/memory.md). On a machine without a GPU the trace is CPU-only and the report says so.
    OUT/report.html shows it all. After --: a script (docs/script-mode.md)."""

    def add_options(self, p: ArgumentParser) -> None:
        _common.add_target(p)
        _common.add_tier_options(p)
        _common.add_schedule(p)
        p.add_argument(
            "--out",
            default="dlci-artifacts",
            metavar="DIR",
            help="directory for trace.json.gz and the utilization report (default: dlci-artifacts)",
        )
        p.add_argument(
            "--device", default=None, help="cpu, cuda or cuda:N (default: the GPU if any)"
        )
        p.add_argument("--seed", type=int, default=0, help="seed for every generator (default: 0)")
        p.add_argument("--no-analyze", dest="analyze", action="store_false",
                       help="write the trace only, without the utilization report")  # fmt: skip
        p.add_argument(
            "--no-memory",
            dest="memory",
            action="store_false",
            help="skip the memory pass and the batch size estimate",
        )
        _common.add_gates(p)
        p.add_argument(
            "--strict-gates",
            action="store_true",
            help="on a machine without a GPU, fail the GPU gates (default: they are not "
            "applicable there, as CI on the same hardware says)",
        )
        p.add_argument("--quiet", action="store_true", help="no progress output")
        _common.add_detection(p)

    def run(self, args: argparse.Namespace) -> int:
        script = args.script
        _common.gates_need_analysis(args)
        check_gate(args.min_gpu_util, args.max_gpu_memory)
        schedule, tier_info = _schedule(args)
        say = analyze.speaker("profile", quiet=args.quiet)
        out = Path(args.out)
        if script:  # the user's own script, unchanged: its steps, no memory pass (a Target's)
            target, result = None, profile_script(script, args, schedule, out)
        else:
            target, result = _target(args, schedule, tier_info, out, say)
        kind = "CPU-only trace (no GPU here)" if result.cpu_only else f"trace on {result.device}"
        say(f"wrote {result.trace}: {kind}, {result.wall_time_s:.1f} s")
        if result.log is not None:
            say(f"wrote {result.log}: what torch.profiler printed")
        memory = MemoryFigures(skipped="script mode" if script else "--no-memory")
        if target is not None and args.memory and args.analyze:  # the figures go into the report
            memory = measure_memory(target, out=out, device=args.device, seed=args.seed, say=say)
        if not args.analyze:
            return 0
        analysis = analyze_trace(
            result.trace, Destinations.choose(out), min_gpu_util=args.min_gpu_util,
            max_gpu_memory=args.max_gpu_memory, memory=memory, on_written=lambda path:
            say(f"wrote {path}"), no_gpu=_common.no_gpu(args, result.cpu_only),
        )  # fmt: skip
        _common.write_html(out, say)
        return analyze.show(analysis, say)


def _target(args: argparse.Namespace, sch: Schedule, info: str, out: Path, say: Any) -> Any:
    """The target, and its steps under the profiler."""
    spec = resolve_spec(args.target)
    target = load_target(spec)
    say(f"{spec}, {sch.active} recorded steps{info} after {sch.wait} wait and {sch.warmup} warmup")
    result = profile_target(target, out=out, schedule=sch, device=args.device,
        seed=args.seed, on_step=lambda step, total: say(f"step {step}/{total} "
        f"({sch.phase_of(step)})"))  # fmt: skip
    return target, result


def _schedule(args: argparse.Namespace) -> tuple[Schedule, str]:
    """The wait/warmup/active schedule (active steps from the tier unless --steps), and
    the tier it came from."""
    if args.steps is not None:
        return Schedule(wait=args.wait, warmup=args.warmup, active=args.steps), ""
    tier = _common.tier_request(args).choose()
    info = f" ({tier.budget} tier on {tier.hardware_class})"
    return Schedule(wait=args.wait, warmup=args.warmup, active=tier.profile_steps), info


main = ProfileVerb("profile").main
