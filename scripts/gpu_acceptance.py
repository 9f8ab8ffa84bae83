"""Collect the figures of scripts/gpu_acceptance.sh into OUT/acceptance.json.

    python scripts/gpu_acceptance.py OUT --gpu 0|1 --quick 0|1 --seconds TOTAL --budget LIMIT
    python scripts/gpu_acceptance.py --check-batch UTILIZATION_JSON --out DIR

The second form is the script's memory:digits step: one real training run of the digits
example at the batch size that ``dlci profile`` estimated to be the largest that fits
(report["memory"]["batch_estimate"]), writing DIR/batch-check.json: the peak it measured
against the peak the estimate predicts (on the CPU path the size is capped at
CPU_CHECK_FACTOR times the target's batch, so the smoke test stays small).

The shell script runs every step under ``timeout`` and appends one line per step to
OUT/steps.tsv (name, exit code, seconds, budget, expected exit codes, report). This reads
those lines and the steps' JSON reports, adds the machine (hardware class, GPU, torch, CUDA),
judges the known loops, writes acceptance.json and prints a table. Exit 0 when every step
ended as expected and every check held, else 1.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import Any

from dlci import jsonio

CPU_MESSAGE = "no GPU found: ran the CPU path"
CPU_CHECK_FACTOR = 16  # the CPU path checks the estimate at no more than 16 x the batch
PREDICTION_TOLERANCE = 0.25  # the GPU check: predicted peak within 25% of the measured one
LOOPS = ("healthy", "slow_loader", "item_every_step")


def _report(out: Path, name: str) -> dict[str, Any] | None:
    if not name:
        return None
    path = out / name
    try:
        data = jsonio.decode(path.read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _figures(kind: str, report: dict[str, Any] | None, out: Path) -> dict[str, Any]:
    """The key figures of one step's report (empty when it wrote none)."""
    if report is None:
        return {}
    if kind == "hardware":
        gpus = report.get("gpus") or []
        return {
            "hardware_class": report.get("hardware_class"),
            "class_reason": report.get("class_reason"),
            "source": report.get("source"),
            "gpu_count": report.get("gpu_count"),
            "gpu_name": gpus[0].get("name") if gpus else None,
            "driver_version": report.get("driver_version"),
            "cuda_driver_version": report.get("cuda_version"),
        }
    if kind == "memorize":
        keys = ("verdict", "stopped_by", "steps", "best_loss", "final_loss", "threshold")
        keys += ("start_loss", "relative_loss", "relative_threshold", "criterion")
        return {k: report.get(k) for k in (*keys, "wall_time_s", "device", "reason")}
    if kind == "doctor":
        return {"verdict": report.get("verdict"), "counts": report.get("counts")}
    if kind == "memory":
        return report
    return _utilization(report, out)


def _memory(report: dict[str, Any]) -> dict[str, Any]:
    """The memory figures of a utilization report (dlci profile's memory pass and estimate)."""
    memory = report.get("memory") or {}
    capture = memory.get("capture") or {}
    estimate = memory.get("batch_estimate") or {}
    tops = memory.get("top_allocations") or []
    keys = ("batch_size", "largest_batch", "confidence", "bytes_per_example", "fixed_bytes")
    return {
        "source": memory.get("source"),
        "device": capture.get("device"),
        "method": capture.get("method"),
        "peak_allocated_bytes": capture.get("peak_allocated_bytes"),
        "peak_reserved_bytes": capture.get("peak_reserved_bytes"),
        "device_total_bytes": capture.get("device_total_bytes"),
        "trace_peak_percent_of_device": memory.get("peak_percent_of_device"),
        "peak_phase": memory.get("peak_phase"),
        "top_operator": tops[0].get("operator") if tops else None,
        "memory_pass_seconds": capture.get("wall_time_s"),
        **{f"estimate_{k}": estimate.get(k) for k in keys},
        "estimate_points": [
            (p.get("batch_size"), p.get("peak_bytes")) for p in estimate.get("points") or []
        ],
    }


def _utilization(report: dict[str, Any], out: Path) -> dict[str, Any]:
    trace = report.get("trace") or {}
    steps = report.get("steps") or {}
    syncs = report.get("syncs") or {}
    gate = report.get("gate") or {}
    pct = (report.get("breakdown") or {}).get("pct") or {}
    path = Path(str(trace.get("path", "")))
    return {
        "gpu_utilization_pct": report.get("gpu_utilization_pct"),
        "cpu_only": trace.get("cpu_only"),
        "devices": sorted((trace.get("device_names") or {}).values()),
        "steps": steps.get("count"),
        "mean_step_us": steps.get("mean_step_us"),
        "kernel_pct": pct.get("kernel"),
        "data_loading_pct": pct.get("data_loading"),
        "syncs": syncs.get("count"),
        "syncs_per_step": syncs.get("per_step"),
        "gate_passed": gate.get("passed"),
        "gate_minimum": gate.get("minimum"),
        "recommendations": [r.get("id") for r in report.get("recommendations") or []],
        "trace": path.relative_to(out).as_posix() if path.is_relative_to(out) else path.name,
        "trace_bytes": trace.get("size_bytes"),
        "memory": _memory(report) if report.get("memory") else None,
    }


def _steps(out: Path) -> list[dict[str, Any]]:
    steps = []
    for line in (out / "steps.tsv").read_text("utf-8").splitlines():
        name, rc, seconds, budget, expected, report = line.split("\t")
        codes = [int(c) for c in expected.split(",")]
        kind = name.split(":")[0]
        steps.append(
            {
                "name": name,
                "exit_code": int(rc),
                "expected_exit_codes": codes,
                "ok": int(rc) in codes,
                "timed_out": int(rc) in (124, 137),
                "seconds": round(float(seconds), 2),
                "budget_seconds": int(budget),
                "report": report or None,
                "figures": _figures(kind, _report(out, report), out),
            }
        )
    return steps


def _torch() -> dict[str, Any]:
    import torch

    import dlci

    cudnn = torch.backends.cudnn.version() if torch.cuda.is_available() else None  # type: ignore[no-untyped-call]
    info: dict[str, Any] = {
        "dlci_version": dlci.__version__,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "cudnn_version": cudnn,
        "python_version": platform.python_version(),
        "gpu_name": None,
        "compute_capability": None,
    }
    if torch.cuda.is_available():
        info["gpu_name"] = torch.cuda.get_device_name(0)
        info["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    return info


def _check(name: str, ok: bool, detail: Any) -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "detail": detail}


def _checks(steps: list[dict[str, Any]], gpu: bool) -> list[dict[str, Any]]:
    """What the run must show; the GPU-only expectations are judged only with a GPU."""
    by = {s["name"]: s["figures"] for s in steps}
    hw = by.get("hardware", {})
    mem = by.get("memorize", {})
    doc = by.get("doctor", {})
    checks = [
        _check("every step ended as expected", all(s["ok"] for s in steps), None),
        _check("memorization passed", mem.get("verdict") == "pass", mem.get("reason")),
        _check("no doctor check failed", (doc.get("counts") or {}).get("fail") == 0, doc),
    ]
    memory = by.get("profile:digits", {}).get("memory") or {}
    batch = by.get("memory:digits", {})
    checks += [
        _check("digits memory recorded", bool(memory.get("peak_allocated_bytes")), memory),
        _check("the estimated batch ran", batch.get("fits") is True, batch.get("reason")),
    ]
    loops = {name: by.get(f"analyze:{name}", {}) for name in LOOPS}
    if not gpu:
        checks.append(_check("hardware class is cpu", hw.get("hardware_class") == "cpu", hw))
        return checks
    error = batch.get("error")
    checks += [
        _check(
            "digits memory measured on CUDA",
            str(memory.get("device", "")).startswith("cuda")
            and bool(memory.get("peak_reserved_bytes")),
            memory.get("device"),
        ),
        _check(
            f"the estimate predicts the peak within {PREDICTION_TOLERANCE:.0%}",
            isinstance(error, float) and abs(error) <= PREDICTION_TOLERANCE,
            error,
        ),
    ]
    checks += [
        _check("NVML detected the GPU", hw.get("source") == "nvml", hw.get("source")),
        _check("a GPU hardware class", hw.get("hardware_class") not in (None, "cpu"), hw),
        _check("memorized on CUDA", str(mem.get("device", "")).startswith("cuda"), mem),
        _check(
            "digits trace has GPU work", by.get("profile:digits", {}).get("cpu_only") is False, None
        ),
        _check("healthy loop passes the gate", loops["healthy"].get("gate_passed") is True, None),
        _check(
            "slow loader fails the gate", loops["slow_loader"].get("gate_passed") is False, None
        ),
        _check(
            "item() loop syncs every step",
            (loops["item_every_step"].get("syncs_per_step") or 0) >= 1,
            loops["item_every_step"].get("syncs_per_step"),
        ),
    ]
    return checks


def _batch_of(loader: Any, base: int, size: int) -> Any:
    """A batch of ``size`` examples: the loader's first ``base``, repeated (the digits data
    set is smaller than the sizes a GPU holds; memory depends on the shape, not the values)."""
    from dlci.training.batching import take_batch, tree_map

    batch, taken = take_batch(loader, base)
    times = -(-size // taken)
    return tree_map(lambda t: t.repeat(times, *([1] * (t.ndim - 1)))[:size], batch)


def check_batch(report_path: Path, out: Path) -> dict[str, Any]:
    """Train the digits example at the estimated largest batch; the peak against the
    prediction (report["memory"]["batch_estimate"]: fixed + bytes per example x size)."""
    import torch

    from digits_example.target import make_target
    from dlci.profiling.meter import PeakMeter
    from dlci.profiling.session import Trainer as _Trainer

    report = _report(report_path.parent, report_path.name) or {}
    estimate = (report.get("memory") or {}).get("batch_estimate") or {}
    largest, base = estimate.get("largest_batch"), estimate.get("batch_size")
    result: dict[str, Any] = {"estimate": largest, "batch_size": base, "ran": False}
    if not largest or not base:
        return {**result, "fits": None, "reason": "no estimate in the report"}
    cuda = torch.cuda.is_available()
    size = largest if cuda else min(largest, CPU_CHECK_FACTOR * base)
    target = make_target()
    trainer = _Trainer(target, "cuda" if cuda else "cpu", 0)
    batch = _batch_of(target.train_loader, base, size)
    meter = PeakMeter(trainer.device)
    peaks: list[tuple[int, int | None]] = []
    result.update(size=size, capped=size < largest, device=str(trainer.device))
    try:
        for step in range(3):  # the first builds the optimizer's state: not counted
            meter.start()
            trainer.step(iter([batch]), step + 1)
            peaks.append(meter.stop())
    except Exception as exc:  # out of memory is a figure here, not a crash
        return {**result, "fits": False, "reason": f"{type(exc).__name__}: {exc}"[:500]}
    measured = max(p[0] for p in peaks[1:])
    reserved = [p[1] for p in peaks[1:] if p[1] is not None]
    predicted = estimate["fixed_bytes"] + estimate["bytes_per_example"] * size
    total = estimate.get("device_total_bytes")
    return {
        **result,
        "ran": True,
        "fits": True,
        "reason": None,
        "measured_peak_bytes": measured,
        "measured_peak_reserved_bytes": max(reserved) if reserved else None,
        "predicted_peak_bytes": predicted,
        "error": (predicted - measured) / measured,
        "percent_of_device": (max(reserved or [measured]) / total * 100) if total else None,
        "method": meter.method,
    }


def check_batch_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="the memory:digits step (see the docstring)")
    parser.add_argument("--check-batch", type=Path, required=True, metavar="UTILIZATION_JSON")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = {"schema_version": 1, "kind": "batch-check", **check_batch(args.check_batch, args.out)}
    args.out.mkdir(parents=True, exist_ok=True)
    jsonio.write(args.out / "batch-check.json", result)
    error = result.get("error")
    print(
        f"batch {result.get('size')} (estimate {result['estimate']}): "
        + (f"peak {result['measured_peak_bytes']:,} bytes, predicted error {error:+.1%}"
           if result["ran"] else f"did not run: {result['reason']}")
    )  # fmt: skip
    return 0 if result["fits"] else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--check-batch"]:
        return check_batch_main(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--gpu", type=int, choices=(0, 1), required=True)
    parser.add_argument("--quick", type=int, choices=(0, 1), default=0)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--budget", type=int, required=True)
    args = parser.parse_args(argv)
    out = args.out.resolve()
    gpu = bool(args.gpu)
    steps = _steps(out)
    hw: dict[str, Any] = next((s["figures"] for s in steps if s["name"] == "hardware"), {})
    checks = _checks(steps, gpu)
    result: dict[str, Any] = {
        "schema_version": 1,
        "kind": "gpu-acceptance",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": gpu,
        "message": "GPU found: ran the CUDA path" if gpu else CPU_MESSAGE,
        "quick": bool(args.quick),
        "hardware_class": hw.get("hardware_class"),
        **_torch(),
        "total_seconds": round(args.seconds, 1),
        "budget_seconds": args.budget,
        "step_budgets_seconds": sum(s["budget_seconds"] for s in steps),
        "steps": steps,
        "loops": {
            name: next((s["figures"] for s in steps if s["name"] == f"analyze:{name}"), {})
            for name in LOOPS
        },
        "checks": checks,
        "passed": all(c["ok"] for c in checks),
    }
    jsonio.write(out / "acceptance.json", result)
    for s in steps:
        mark = "ok " if s["ok"] else "BAD"
        print(f"{mark} {s['name']:<24} exit {s['exit_code']:>3}  {s['seconds']:7.1f} s")
    for c in checks:
        print(f"{'ok ' if c['ok'] else 'BAD'} check: {c['name']}")
    print(f"{result['message']}; {'passed' if result['passed'] else 'FAILED'}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
