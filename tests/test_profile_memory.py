"""``dlci profile``'s memory figures: the memory pass, the batch size estimate, the memory gate.

The peaks are measured on real CPU training steps (the process's resident memory); the
estimate is checked against actually running a larger batch of the digits example. The GPU
path of the gate reads a synthetic trace with CUDA memory events (no GPU on CI).
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import json
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch
from msgspec.structs import replace

import dlci
from dlci.cli import main
from dlci.errors import DlciError
from dlci.profiling import batchfit, gate, memcapture
from dlci.profiling import meter as meters
from dlci.profiling.gate import memory_gate
from dlci.profiling.session import Trainer
from dlci.report.fields import Recommendation, Utilization
from dlci.report.utilization import read
from tracegen import training_trace


def combined_gate(report: Utilization, *given: Any, **named: Any) -> dict[str, Any] | None:
    """The combined gate as the report's JSON holds it."""
    found = gate.combined_gate(report, *given, **named)
    return None if found is None else msgspec.to_builtins(found)  # type: ignore[no-any-return]


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits"
MIB = 2**20


def _point(size: int, peak: int, spread: int = 0) -> batchfit.Point:
    return batchfit.Point(batch_size=size, peak_bytes=peak, spread_bytes=spread)


# ------------------------------------------------------------------------------ the line fit


def test_fit_recovers_a_known_line() -> None:
    # fixed 1 GiB, 3 MiB per example, 8 GiB device, 10% margin
    a, b = _point(32, 2**30 + 32 * 3 * MIB), _point(64, 2**30 + 64 * 3 * MIB)
    r = batchfit.fit(a, b, 8 * 2**30, margin=0.1)
    assert r.bytes_per_example == 3 * MIB and r.fixed_bytes == 2**30
    assert r.largest_batch == int((8 * 2**30 * 0.9 - 2**30) // (3 * MIB))
    assert r.confidence == "medium"
    assert batchfit.fit(b, a, 8 * 2**30, margin=0.1) == r  # the order of the points


@pytest.mark.parametrize(
    ("b", "spread", "words"),
    [
        (1000, 0, "did not grow measurably"),  # flat: no slope
        (900, 0, "did not grow measurably"),  # shrinking
        (1050, 100, "did not grow measurably"),  # growth within the step-to-step spread
    ],
)
def test_fit_gives_no_number_without_a_measurable_slope(b: int, spread: int, words: str) -> None:
    r = batchfit.fit(_point(10, 1000, spread), _point(20, b, spread), 10**6)
    assert r.largest_batch is None and r.confidence == "none"
    assert words in r.confidence_reason


def test_fit_says_low_confidence_and_why() -> None:
    noisy = batchfit.fit(_point(10, 1000, 40), _point(20, 1100, 40), 10**5)
    assert noisy.confidence == "low" and "three times" in noisy.confidence_reason
    convex = batchfit.fit(_point(10, 100), _point(20, 1100), 10**5)  # intercept -900
    assert convex.confidence == "low" and "negative" in convex.confidence_reason
    far = batchfit.fit(_point(10, 1000), _point(20, 1100), 10**9)
    assert far.confidence == "low" and "extrapolation" in far.confidence_reason
    full = batchfit.fit(_point(10, 1000), _point(20, 1100), 900)
    assert full.largest_batch == 0 and "over the usable" in full.confidence_reason
    unknown = batchfit.fit(_point(10, 1000), _point(20, 1100), None)
    assert unknown.largest_batch is None and "unknown" in unknown.confidence_reason


def test_fit_on_the_cpu_needs_a_growth_above_the_heaps_granularity() -> None:
    """A B of 1 or a tiny model: the resident memory moves by the C heap's chunks (256 KiB
    measured between 16 and 32 examples of an 8-feature model), not by activations."""
    heap = batchfit.fit(_point(16, 322_490_368), _point(32, 322_752_512), 25 * 2**30,
                        resolution=batchfit.CPU_RESOLUTION)  # fmt: skip
    assert heap.largest_batch is None and heap.confidence == "none"
    assert "under the 1,048,576 bytes" in heap.confidence_reason
    # control: the same points on a GPU (exact allocator figures) give a number
    assert batchfit.fit(_point(16, 322_490_368), _point(32, 322_752_512), 25 * 2**30).largest_batch


def test_fit_says_so_when_the_peak_rises_at_every_step() -> None:
    """A target that allocates more on every step (a leak): the growth between the sizes
    mixes it in, so the number is only 'low'."""
    leak = 16 * MIB
    a = replace(
        _point(64, 491 * MIB, 2 * leak), per_step_bytes=[457 * MIB, 457 * MIB + leak, 491 * MIB]
    )
    b = replace(
        _point(128, 558 * MIB, 2 * leak), per_step_bytes=[525 * MIB, 525 * MIB + leak, 558 * MIB]
    )
    r = batchfit.fit(a, b, 25 * 2**30, resolution=batchfit.CPU_RESOLUTION)
    assert r.confidence == "low" and "rose at every measured step at 64 and 128" in (
        r.confidence_reason
    )
    # control: steps that rise by a few pages (noise, digits at 2B) are not a leak
    flat = replace(b, per_step_bytes=[558 * MIB - 8192, 558 * MIB - 4096, 558 * MIB])
    assert "rose" not in batchfit.fit(replace(a, per_step_bytes=[491 * MIB] * 3), flat,
                                      25 * 2**30).confidence_reason  # fmt: skip


def test_the_advice_needs_low_utilization_and_room() -> None:
    def advice(util: float | None, largest: int | None) -> Recommendation | None:
        estimate = batchfit.Estimate(batch_size=64, largest_batch=largest, confidence="medium")
        return batchfit.advice(read({"gpu_utilization_pct": util}), estimate)

    found = advice(20.0, 1000)
    assert found is not None and found.id == "batch-size"
    assert "about 1,000 examples (16x the current 64" in found.finding
    assert advice(80.0, 1000) is None  # control: the GPU is busy
    assert advice(20.0, 100) is None  # control: little headroom
    assert advice(None, 1000) is None  # control: no GPU


# --------------------------------------------------------------------------- peak measurement


def _peak_with(meter: meters.PeakMeter, nbytes: int) -> int:
    """The step's rise: its peak over the RSS it started from.

    Measured from its own start, not from another step's peak: under a loaded CI machine the
    kernel drops file-backed pages between steps, and two absolute peaks differ by more than
    the noise (12 MiB in one full run).
    """
    meter.start()
    base = meters._status_bytes("VmRSS") or 0
    if nbytes:
        block = torch.ones(nbytes // 4)  # written, so its pages are resident
        time.sleep(0.05)  # long enough for the sampler too
        del block
    peak, reserved = meter.stop()
    assert reserved is None  # no caching allocator on the CPU
    return peak - base


def test_the_cpu_peak_sees_a_step_that_allocates_and_frees(tmp_path: Path) -> None:
    with meters.PeakMeter(torch.device("cpu")) as meter:
        assert meter.method == meters.METHOD_HWM  # this kernel lets the peak be reset
        assert _peak_with(meter, 64 * MIB) >= 60 * MIB  # freed before stop(): only a peak shows
        assert _peak_with(meter, 0) < 32 * MIB  # control: the reset forgets the last peak
        assert gc.get_freeze_count() > 0  # start() froze what survived: steps rescan no heap
    assert gc.get_freeze_count() == 0  # and close() gave it back to the collector


def test_the_cpu_peak_falls_back_to_sampling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(meters, "_CLEAR_REFS", Path("/nonexistent/clear_refs"))
    with meters.PeakMeter(torch.device("cpu")) as meter:
        assert meter.method == meters.METHOD_SAMPLED
        assert _peak_with(meter, 64 * MIB) >= 60 * MIB
        assert _peak_with(meter, 0) < 32 * MIB  # control: a new sampler starts from the RSS


def test_the_cpu_total_is_the_memory_the_process_may_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    meminfo = Path("/proc/meminfo").read_text().split()
    machine = int(meminfo[meminfo.index("MemTotal:") + 1]) * 1024
    limit = tmp_path / "memory.max"
    monkeypatch.setattr(meters, "_CGROUP_LIMITS", (limit,))
    limit.write_text("max\n")  # cgroup v2 without a limit
    assert meters.device_total(torch.device("cpu")) == (
        machine,
        "the machine's memory (MemTotal of /proc/meminfo; no lower cgroup limit)",
    )
    limit.write_text(f"{2**30}\n")
    total, source = meters.device_total(torch.device("cpu"))
    assert (total, source.startswith("the control group's")) == (2**30, True)
    limit.write_text(f"{machine * 4}\n")  # a limit above the machine's memory is no limit
    assert meters.device_total(torch.device("cpu"))[0] == machine


# -------------------------------------------------------------------- resizing the batches


def _target(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dlci.Target:
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(2))
    return dlci.Target(
        model, lambda p: torch.optim.SGD(p, lr=0.1), batches, loss_fn=torch.nn.CrossEntropyLoss()
    )


def test_batches_that_cannot_be_joined_are_refused_clearly() -> None:
    ragged = [(torch.randn(4, 5), torch.zeros(4, dtype=torch.long)),
              (torch.randn(4, 7), torch.zeros(4, dtype=torch.long))]  # fmt: skip
    with pytest.raises(batchfit.ResizeError, match="cannot be joined"):
        batchfit.estimate(_target(ragged), device="cpu", seed=0)
    too_few = ragged[:1]
    with pytest.raises(batchfit.ResizeError, match="holds only 4"):
        batchfit.estimate(_target(too_few), device="cpu", seed=0)
    refused = batchfit.refused("x")
    assert refused.largest_batch is None and refused.confidence == "none"
    assert issubclass(batchfit.ResizeError, DlciError)  # one clear line, not a traceback


class _MeanLinear(torch.nn.Module):
    """Any sequence length: the mean over it, then a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.mean(dim=1, keepdim=True))


def ragged() -> dlci.Target:
    """Batches of sequences whose length changes from batch to batch (no padding)."""
    batches = [(torch.randn(4, 5 + i), torch.zeros(4, dtype=torch.long)) for i in range(4)]
    return dlci.Target(
        _MeanLinear(), lambda p: torch.optim.SGD(p, lr=0.1), batches,
        loss_fn=torch.nn.CrossEntropyLoss(),
    )  # fmt: skip


def test_profile_without_resizable_batches_says_why_there_is_no_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    args = ["profile", "--target", "test_profile_memory:ragged", "--steps", "1", "--wait", "0"]
    assert main([*args, "--warmup", "1", "--out", str(tmp_path)]) == 0  # the profile stands
    assert "no batch size estimate: train_loader's batches have different shapes" in (
        capsys.readouterr().err
    )
    memory = json.loads((tmp_path / "utilization.json").read_text())["memory"]
    assert memory["capture"]["peak_allocated_bytes"] > 0  # the memory pass still ran
    estimate = memory["batch_estimate"]
    assert estimate["largest_batch"] is None and estimate["confidence"] == "none"
    assert estimate["confidence_reason"].startswith("the batch size cannot be changed: ")


class _Lin(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 2)
        self.bn = torch.nn.BatchNorm1d(8)  # a buffer the passes move too

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.bn(x))


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "control: not kept"])
def test_the_memory_passes_leave_the_model_as_they_found_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept: bool
) -> None:
    """The memory pass and the estimate train the target's own model 12 steps more: a
    target shared with other code must come back as the timed profile left it."""
    torch.manual_seed(1)
    batches = [(torch.randn(16, 8), torch.randint(0, 2, (16,))) for _ in range(4)]
    target = dlci.Target(
        _Lin(), lambda p: torch.optim.SGD(p, lr=0.5), batches, loss_fn=torch.nn.CrossEntropyLoss()
    )
    before = _state(target.model)
    if not kept:
        monkeypatch.setattr(memcapture, "kept_state", lambda model, say: contextlib.nullcontext())
    memcapture.measure_memory(target, out=tmp_path, device="cpu", seed=0, say=lambda _: None)
    after = _state(target.model)
    same = all(torch.equal(before[k], after[k]) for k in before)
    assert same is kept
    assert target.model.lin.weight.requires_grad and target.model.lin.weight.grad is None


class _Unpicklable(_Lin):
    def get_extra_state(self) -> Any:
        return lambda: None  # torch.save cannot pickle it

    def set_extra_state(self, state: Any) -> None:
        pass


def test_a_state_torch_cannot_save_is_said_not_fatal(tmp_path: Path) -> None:
    batches = [(torch.randn(16, 8), torch.randint(0, 2, (16,))) for _ in range(4)]
    target = dlci.Target(_Unpicklable(), lambda p: torch.optim.SGD(p, lr=0.1), batches,
                         loss_fn=torch.nn.CrossEntropyLoss())  # fmt: skip
    said: list[str] = []
    figures = memcapture.measure_memory(target, out=tmp_path, device="cpu", seed=0, say=said.append)
    assert figures.capture is not None  # the passes ran
    assert any(line.startswith("the memory passes leave the model trained further: it could "
                               "not be saved") for line in said)  # fmt: skip


# ------------------------------------------------------- the digits example, end to end


@pytest.fixture(scope="module")
def digits() -> Any:
    mp = pytest.MonkeyPatch()
    mp.chdir(EXAMPLE)
    mp.syspath_prepend(str(EXAMPLE))
    mp.setenv("CUDA_VISIBLE_DEVICES", "")
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def profiled(digits: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``dlci profile`` on the digits example with the memory gate asked for, on the CPU."""
    out = tmp_path_factory.mktemp("memory")
    args = ["profile", "--steps", "2", "--out", str(out), "--quiet", "--max-gpu-memory", "90"]
    assert main([*args, "--strict-gates"]) == 1  # asked strictly: no GPU, no evaluation
    return out


def test_profile_records_memory_and_a_batch_estimate(profiled: Path) -> None:
    report = json.loads((profiled / "utilization.json").read_text())
    memory = report["memory"]
    assert memory["trace_file"] == "trace-memory.json.gz"
    capture = memory["capture"]
    assert capture["device"] == "cpu" and len(capture["per_step"]) == memcapture.MEMORY_STEPS
    assert capture["peak_allocated_bytes"] == max(
        s["peak_allocated_bytes"] for s in capture["per_step"]
    )
    assert capture["peak_reserved_bytes"] is None and capture["device_total_bytes"] > 0
    assert "VmHWM" in capture["method"]
    estimate = memory["batch_estimate"]
    assert [p["batch_size"] for p in estimate["points"]] == [64, 512]  # B and 8B on the CPU
    assert estimate["margin"] == batchfit.MARGIN and "floor(" in estimate["method"]
    assert estimate["confidence"] in ("low", "medium", "none")
    # what a user reads: on the CPU the figure is the whole process's resident memory, and
    # the estimate's confidence comes with its reason
    markdown = (profiled / "utilization.md").read_text()
    assert "peak resident memory (the whole process)" in markdown
    assert f"(confidence {estimate['confidence']}: {estimate['confidence_reason'][:30]}" in (
        markdown
    )
    # the memory pass's own trace holds the allocations; the timed trace holds none
    events = json.loads(gzip.decompress((profiled / "trace-memory.json.gz").read_bytes()))
    assert any(e.get("name") == "[memory]" for e in events["traceEvents"])
    timed = json.loads(gzip.decompress((profiled / "trace.json.gz").read_bytes()))
    assert not any(e.get("name") == "[memory]" for e in timed["traceEvents"])


def test_the_memory_gate_on_the_cpu_cannot_be_evaluated(profiled: Path, capsys) -> None:
    gate = json.loads((profiled / "utilization.json").read_text())["gate"]
    assert gate["passed"] is False and gate["checks"][0]["name"] == "max-gpu-memory"
    assert "no GPU memory figures" in gate["message"]
    trace = str(profiled / "trace.json.gz")
    assert main(["analyze", trace, "--max-gpu-memory", "50", "--quiet"]) == 1
    assert "GPU memory gate cannot be evaluated" in capsys.readouterr().err
    assert main(["analyze", trace, "--quiet"]) == 0  # control: no gate asked for


def test_the_estimate_holds_for_a_larger_batch_on_the_cpu(digits: Any) -> None:
    """The estimate's line, checked by running a larger batch: the line through 64 and 512
    examples (a spread wide enough to stand well above the few MiB a process's RSS moves from
    step to step, so the check does not depend on the machine's load) predicts the peak of
    1,024 examples. Tolerance: within 10% of the measured peak, and the activation part (peak
    less the fixed memory) within a factor of 2. The target's own sizes (64 and 128) are
    exercised by test_profile_records_memory_and_a_batch_estimate."""
    from digits_example.target import make_target

    trainer = Trainer(make_target(), "cpu", 0)
    meter = meters.PeakMeter(trainer.device)
    loader = trainer.target.train_loader
    points = [batchfit.point(n, batchfit.measure(trainer, loader, n, meter)) for n in (64, 512)]
    total, _ = meters.device_total(trainer.device)
    line = batchfit.fit(points[0], points[1], total, resolution=batchfit.CPU_RESOLUTION)
    assert line.largest_batch is not None and line.largest_batch > 1024, line
    size = 1024
    measured = max(batchfit.measure(trainer, loader, size, meter))
    predicted = line.fixed_bytes + line.bytes_per_example * size
    error = (predicted - measured) / measured
    print(f"batch {size}: predicted {predicted / MIB:.1f} MiB, measured {measured / MIB:.1f}"
          f" MiB, error {error:+.1%}")  # fmt: skip
    assert abs(error) < 0.10
    activations = measured - line.fixed_bytes
    assert 0.5 < line.bytes_per_example * size / activations < 2.0


# ----------------------------------------------------------------------------- the gate


def _gpu_report(pct: float | None) -> Utilization:
    capture = None
    if pct is not None:
        total = 80 * 2**30
        capture = {"device": "cuda:0", "peak_allocated_bytes": int(total * pct / 200),
                   "peak_reserved_bytes": int(total * pct / 100), "device_total_bytes": total}  # fmt: skip
    return read({"memory": {"device": "cuda:0" if pct else "cpu", "capture": capture}})


def test_the_memory_gate_reads_peak_reserved_against_the_device() -> None:
    assert memory_gate(_gpu_report(40.0), 50).passed is True
    failed = memory_gate(_gpu_report(40.0), 30)
    assert failed.passed is False
    assert "40.0% of the device (cuda:0, measured by dlci profile)" in failed.message
    assert memory_gate(_gpu_report(None), 50).passed is False  # nothing to read


def test_the_combined_gate_passes_only_when_every_gate_passes() -> None:
    ok = {"minimum": 50, "value": 60.0, "passed": True, "message": "ok", "hint": None}
    util_ok = gate.Verdict(**ok)
    util_bad = replace(util_ok, value=40.0, passed=False, message="util low", hint="h")
    report = _gpu_report(40.0)
    assert combined_gate(report, None, max_gpu_memory=None) is None
    alone = combined_gate(report, util_ok, max_gpu_memory=None)
    assert alone is not None and {**alone, "checks": None} == {**ok, "checks": None}
    both = combined_gate(report, util_ok, max_gpu_memory=50)
    assert both is not None and both["passed"] is True and len(both["checks"]) == 2
    memory_fails = combined_gate(report, util_ok, max_gpu_memory=30)
    assert memory_fails is not None and memory_fails["passed"] is False
    assert memory_fails["message"].startswith("GPU peak memory 40.0%")  # only the failing one
    util_fails = combined_gate(report, util_bad, max_gpu_memory=50)
    assert util_fails is not None and util_fails["passed"] is False
    assert util_fails["message"] == "util low" and util_fails["hint"] == "h"


@pytest.fixture
def gpu_memory_trace(tmp_path: Path) -> Path:
    """A synthetic GPU trace (no GPU on CI) whose caching allocator peaks at 40% of the
    device's 85,029,158,912 bytes (its deviceProperties)."""
    trace = training_trace(steps=3, kernels=4)
    reserved = int(85029158912 * 0.4)
    trace.memory(150.0, 2**30, 2**31, reserved)
    trace.memory(160.0, -(2**30), 2**30, reserved)
    return trace.write(tmp_path / "gpu-memory.json.gz")


def test_analyze_applies_the_memory_gate_to_a_traces_events(
    gpu_memory_trace: Path, tmp_path: Path, capsys
) -> None:
    trace = str(gpu_memory_trace)
    assert main(["analyze", trace, "--max-gpu-memory", "50", "--quiet"]) == 0
    out = tmp_path / "u.json"
    assert main(["analyze", trace, "--max-gpu-memory", "30", "--json", str(out)]) == 1
    assert "GPU peak memory 40.0% of the device (cuda:0, from the trace" in capsys.readouterr().err
    gate = json.loads(out.read_text())["gate"]
    assert gate["gpu_memory_pct"] == pytest.approx(40.0) and gate["max_gpu_memory"] == 30
    # both gates: the utilization gate passes (61%), the memory gate fails
    assert main(["analyze", trace, "--min-gpu-util", "50", "--max-gpu-memory", "30"]) == 1


@pytest.mark.parametrize("value", ["-1", "101", "nan"])
def test_a_bad_memory_gate_is_refused(gpu_memory_trace: Path, value: str, capsys) -> None:
    assert main(["analyze", str(gpu_memory_trace), "--max-gpu-memory", value]) == 1
    assert "--max-gpu-memory must be a percentage" in capsys.readouterr().err
