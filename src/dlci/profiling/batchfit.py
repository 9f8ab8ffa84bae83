"""The largest batch that fits in memory, from the peak at two batch sizes.

A training step's peak memory is, to a first approximation, a line in the batch size:
activations (and their gradients) grow with each example, while parameters, gradients,
optimizer state and workspace do not. :func:`estimate` measures the peak (memcapture's
:class:`PeakMeter`) at the target's own batch size B and at a second size (B/2, or 2B when B
is small or on the CPU, where a process's peak resident memory needs a larger step to show),
both built from the target's own loader (``batching.take_batch``: batches joined or cut to the
size), and :func:`fit` turns the two points into slope (bytes per example), intercept (fixed
bytes) and the largest batch below the device's memory less a margin.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from dlci.errors import DlciError
from dlci.profiling.meter import PeakMeter, device_label, device_total
from dlci.report.fields import Recommendation, Utilization
from dlci.report.text import shown
from dlci.training.batching import as_pair, batch_size_of, take_batch

MARGIN = 0.10  # share of the device kept free: see docs/memory.md ("The margin")
STEPS = 3  # measured steps at each size, after one warmup step
SMALL_BATCH = 16  # below this B/2 is too few examples to measure; 2B is used instead
FAR = 64.0  # an estimate this many times the largest measured size is a long extrapolation
# On the CPU a growth below this is the C heap's own granularity (glibc grows and trims it in
# chunks of 128 KiB and more), not activation memory: see docs/memory.md ("The line")
CPU_RESOLUTION = 1 << 20
CPU_SPREAD = 8  # the CPU's second batch size, in multiples of B (2 when the data is short)
METHOD = (
    "peak memory measured at two batch sizes built from the target's loader ({points}); "
    "a line through them: slope = activation memory per example, intercept = fixed memory "
    "(parameters, gradients, optimizer state, workspace{cpu}); largest batch = floor((total "
    "x (1 - {margin:g}) - fixed) / slope)"
)


class ResizeError(DlciError):
    """The target's batches cannot be joined or cut to the size the estimate needs."""


class Point(msgspec.Struct, kw_only=True):
    """The peak measured at one batch size: the highest step, the steps' spread, each step."""

    batch_size: int
    peak_bytes: int
    spread_bytes: int = 0
    per_step_bytes: list[int] | UnsetType = UNSET


class Line(msgspec.Struct, kw_only=True):
    """The line through two points: slope, intercept, the largest batch under the usable
    memory (None when the slope cannot be measured) and how far to trust it."""

    bytes_per_example: float
    fixed_bytes: float
    usable_bytes: int | None
    largest_batch: int | None = None
    confidence: str = "none"  # none, low, medium
    confidence_reason: str = ""


class Estimate(msgspec.Struct, kw_only=True):
    """report["memory"]["batch_estimate"]: the two points, the line through them and the
    largest batch (docs/memory.md); an estimate refused (:func:`refused`) has only the keys
    that say why, the rest UNSET (left out of the JSON)."""

    device: str | UnsetType = UNSET
    batch_size: int | None = None
    points: list[Point] = []
    device_total_bytes: int | UnsetType | None = UNSET
    device_total_source: str | UnsetType = UNSET
    margin: float | UnsetType = UNSET
    measure: str | UnsetType = UNSET
    bytes_per_example: float | UnsetType = UNSET
    fixed_bytes: float | UnsetType = UNSET
    usable_bytes: int | UnsetType | None = UNSET
    largest_batch: int | None = None
    confidence: str = "none"
    confidence_reason: str = ""
    method: str | UnsetType = UNSET
    advice: str | None = None


def point(size: int, peaks: list[int]) -> Point:
    """The point of ``size`` from its steps' peaks."""
    return Point(
        batch_size=size,
        peak_bytes=max(peaks),
        spread_bytes=max(peaks) - min(peaks),
        per_step_bytes=peaks,
    )


def fit(
    a: Point, b: Point, total: int | None, *, margin: float = MARGIN, resolution: int = 0
) -> Line:
    """Slope, intercept, largest batch and how far to trust it, from two measured points.

    >>> small = Point(batch_size=10, peak_bytes=2000)
    >>> large = Point(batch_size=20, peak_bytes=3000)
    >>> r = fit(small, large, 11000, margin=0.1)
    >>> r.bytes_per_example, r.fixed_bytes, r.largest_batch, r.confidence
    (100.0, 1000.0, 89, 'medium')
    >>> fit(small, Point(batch_size=20, peak_bytes=2000), 11000).largest_batch is None
    True
    >>> fit(small, large, 11000, resolution=4096).confidence_reason[:44]
    'the peak grew by only 1,000 bytes from 10 to'
    """
    a, b = sorted((a, b), key=lambda p: p.batch_size)
    growth = b.peak_bytes - a.peak_bytes
    noise = max(a.spread_bytes, b.spread_bytes)
    slope = growth / (b.batch_size - a.batch_size)
    fixed = a.peak_bytes - slope * a.batch_size
    line = Line(
        bytes_per_example=slope,
        fixed_bytes=fixed,
        usable_bytes=None if total is None else int(total * (1 - margin)),
    )
    if line.usable_bytes is None:
        line.confidence_reason = "the device's total memory is unknown"
    elif 0 < growth < resolution and growth > noise:
        line.confidence_reason = (
            f"the peak grew by only {growth:,} bytes from {a.batch_size} to "
            f"{b.batch_size} examples, under the {resolution:,} bytes a process's resident "
            "memory resolves (the C heap grows in chunks): activation memory is too small to "
            "measure at these sizes"
        )
    elif growth <= noise or slope <= 0:
        line.confidence_reason = (
            f"the peak did not grow measurably with the batch ({growth:+,} bytes from "
            f"{a.batch_size} to {b.batch_size} examples, step-to-step spread "
            f"{noise:,} bytes): activation memory is too small to measure at these sizes"
        )
    else:
        least = max(resolution, growth // 10)  # a rise that moves the slope by 10% or more
        rising = [p.batch_size for p in (a, b) if _rising(p.per_step_bytes or None, least)]
        _largest(line, line.usable_bytes, growth, noise, b.batch_size, rising)
    return line


def _rising(peaks: list[int] | None, least: int) -> bool:
    """True when every step's peak is above the one before and the last is at least
    ``least`` above the first: memory that grows step after step, not noise.

    >>> _rising([1, 2, 30], 10), _rising([1, 2, 3], 10), _rising([1, 1, 30], 10), _rising([5], 0)
    (True, False, False, False)
    """
    if not peaks or len(peaks) < 2:
        return False
    return all(x < y for x, y in itertools.pairwise(peaks)) and peaks[-1] - peaks[0] >= least


def _largest(
    line: Line, usable: int, growth: int, noise: int, biggest: int, rising: list[int]
) -> None:
    """The largest batch and the confidence words, once the slope is measurable."""
    slope, fixed = line.bytes_per_example, line.fixed_bytes
    largest = max(0, math.floor((usable - fixed) / slope))
    doubts = []
    if growth < 3 * noise:
        doubts.append(
            f"the growth between the two sizes ({growth:,} bytes) is under three times the "
            f"step-to-step spread ({noise:,} bytes)"
        )
    if fixed < 0:
        doubts.append(
            "the line's intercept is negative: memory grows faster than linearly in the batch "
            "(the estimate is too high)"
        )
    if largest > FAR * biggest:
        doubts.append(
            f"{largest:,} is {largest / biggest:,.0f} times the largest size measured: a long "
            "extrapolation (other limits, such as data set size, time or numerics, come first)"
        )
    if largest == 0:
        doubts.append("the fixed memory alone is over the usable memory")
    if rising:
        doubts.append(
            f"the peak rose at every measured step at {' and '.join(map(str, rising))} "
            "examples (memory that grows from step to step, such as a leak or a cache that "
            "fills, is mixed into the line)"
        )
    line.largest_batch = largest
    line.confidence = "low" if doubts else "medium"
    line.confidence_reason = "; ".join(doubts) or (
        "two points, memory assumed linear in the batch size; the allocator's rounding and "
        "fragmentation are covered by the margin only"
    )


def second_size(size: int, *, cuda: bool) -> int:
    """The other batch size measured: half of B on a GPU (the larger one might not fit),
    twice B on the CPU or when B is small.

    >>> second_size(64, cuda=True), second_size(64, cuda=False), second_size(8, cuda=True)
    (32, 128, 16)
    """
    return size // 2 if cuda and size >= SMALL_BATCH else size * 2


def measure(trainer: Any, loader: Any, size: int, meter: Any, steps: int = STEPS) -> list[int]:
    """The peak of ``steps`` training steps on one batch of ``size`` examples from ``loader``
    (after a warmup step, which also builds the optimizer's state)."""
    try:
        batch, taken = take_batch(loader, size)
    except DlciError as exc:
        raise ResizeError(exc.message, hint=exc.hint) from None
    if taken < size:
        raise ResizeError(
            f"the batch size estimate needs a batch of {size} examples, and the target's "
            f"train_loader holds only {taken}",
            hint="use --no-memory, or a larger data set",
        )
    peaks = []
    for step in range(steps + 1):
        meter.start()
        trainer.step(iter([batch]), step + 1)
        allocated, _reserved = meter.stop()
        if step:
            peaks.append(allocated)
    return peaks


def _wide_cpu_point(trainer: Any, loader: Any, size: int, meter: Any) -> Point:
    """The CPU's second point: 8 x B when the data set has that many examples, else 2 x B.
    A process's resident memory moves by a few MiB from step to step; 2 x B of a small model
    grows it by little more than that (the estimate then came out with no number on a loaded
    machine), 8 x B by several times as much."""
    try:
        return point(CPU_SPREAD * size, measure(trainer, loader, CPU_SPREAD * size, meter))
    except ResizeError:
        return point(2 * size, measure(trainer, loader, 2 * size, meter))


def batch_size_of_loader(loader: Any) -> int:
    """B: the examples in the first batch the target's loader yields."""
    for raw in loader:
        return batch_size_of(as_pair(raw, 0))
    raise DlciError("the target's train_loader yielded no batches", hint="check the data set")


def estimate(target: Any, *, device: str | None, seed: int) -> Estimate:
    """report["memory"]["batch_estimate"] for ``target``, measured on ``device``."""
    # here, not at the top: dlci analyze reads this module's advice and never trains (session
    # brings memorization.engine and training.target, with yaml: ~45 modules)
    from dlci.profiling.session import Trainer

    trainer = Trainer(target, device, seed)
    cuda = trainer.device.type == "cuda"
    size = batch_size_of_loader(target.train_loader)
    meter = PeakMeter(trainer.device)
    points = []
    with meter:
        for n in sorted((size, second_size(size, cuda=cuda))):  # smaller first: a grown heap
            if not cuda and n > size:
                points.append(_wide_cpu_point(trainer, target.train_loader, size, meter))
            else:
                points.append(point(n, measure(trainer, target.train_loader, n, meter)))
    total, total_source = device_total(trainer.device)
    line = fit(points[0], points[1], total, resolution=0 if cuda else CPU_RESOLUTION)
    sizes = " and ".join(str(p.batch_size) for p in points)
    cpu = ", and on the CPU the whole process: Python, libraries, data" if not cuda else ""
    return Estimate(
        device=device_label(trainer.device),
        batch_size=size,
        points=points,
        device_total_bytes=total,
        device_total_source=total_source,
        margin=MARGIN,
        measure=("peak allocated bytes; " if cuda else "peak RSS; ") + meter.method,
        bytes_per_example=line.bytes_per_example,
        fixed_bytes=line.fixed_bytes,
        usable_bytes=line.usable_bytes,
        largest_batch=line.largest_batch,
        confidence=line.confidence,
        confidence_reason=line.confidence_reason,
        method=METHOD.format(points=sizes, cpu=cpu, margin=MARGIN),
    )


def refused(why: str) -> Estimate:
    """report["memory"]["batch_estimate"] when the batch size cannot be changed."""
    return Estimate(confidence_reason=f"the batch size cannot be changed: {why}")


def advice(report: Utilization, est: Estimate | None) -> Recommendation | None:
    """A recommendation when the GPU is under-used and the batch could grow a lot."""
    util = report.gpu_utilization_pct
    largest, size = (est.largest_batch, est.batch_size) if est else (None, None)
    if util is None or util >= 50.0 or not largest or not size or largest < 2 * size:
        return None
    confidence = est.confidence if est else None
    return Recommendation(
        id="batch-size",
        finding=f"GPU utilization {util:.1f}% with room in memory for a batch of "
        f"{shown(largest, confidence)} examples ({largest / size:.2g}x the current "
        f"{size}; confidence {confidence})",
        advice="raise the batch size (a larger batch cuts Python and launch overhead per "
        "example), scaling the learning rate with it, and check the new peak with dlci profile",
    )
