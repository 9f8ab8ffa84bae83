"""The calibration's training runs: one per seed (and per sabotaged variant), in worker
processes, each kept in its own file so that an interrupted calibration resumes.

A run is the memorization engine with early stop off, the whole loss curve recorded up to
the epoch ceiling, on the batch the gate takes (the tier's batch size), seeded as
``dlci memorize --seed S`` seeds: the target is built after the seed is set, so its initial
weights (and any data order or dropout it draws from the global generators) follow the seed.

Workers are processes started with ``spawn``: one per GPU on a GPU machine, else one per CPU
core, each with one torch thread. Each finished run is written at once
to ``OUT/runs/<variant>-seed-<seed>.json`` (atomically); a later calibration with the same
settings keeps those files and runs only the rest.
"""

from __future__ import annotations

import contextlib
import math
import os
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from dlci import jsonio
from dlci.calibration.power import HEALTHY, VARIANTS, NotApplicable, sabotage
from dlci.calibration.stats import relative_curve
from dlci.calibration.summary import problems
from dlci.errors import DlciError
from dlci.fsutil import atomic_write_bytes, read_input
from dlci.memorization.engine import MemorizeConfig, memorize, seed_everything
from dlci.training.target import load_target

RUNS_DIR = "runs"
NEVER = 1e-300  # the engine's threshold in a calibration run: early stop is off, nothing passes
POLL_S = 0.5  # how often the parent looks for a worker that died without a word


class Job(msgspec.Struct, frozen=True):
    """One calibration run: what defines it, so a kept file is used only for the same run."""

    spec: str
    seed: int
    epochs: int
    batch_size: int
    time_cap_s: float
    variant: str = HEALTHY

    @property
    def name(self) -> str:
        return f"{self.variant}-seed-{self.seed}"

    def describe(self) -> str:
        what = "seed" if self.variant == HEALTHY else f"{VARIANTS[self.variant]}, seed"
        return f"{what} {self.seed}"


def environment(device: str) -> dict[str, str]:
    """What else changes a run's curve: torch's version and the kind of device."""
    import torch

    return {"torch": str(torch.__version__), "device_type": device.split(":")[0]}


# A loss as a run's file holds it: a number, or text for NaN and the infinities (JSON has none)
Loss = Annotated[float | Literal["nan", "inf", "-inf"], msgspec.Meta(extra={"words": "a number"})]


class Record(msgspec.Struct, kw_only=True):
    """One calibration run's record: ``OUT/runs/<variant>-seed-<seed>.json``. A variant that
    does not apply to the target has ``not_applicable`` (why) and no curve; a run that trained
    has the figures after ``stopped_by``, which the other lacks (UNSET: left out of the file)."""

    schema_version: int = 1
    kind: str = "calibration-run"
    job: Job
    environment: dict[str, str] = {}
    applied: str | UnsetType = UNSET  # what the sabotage did: "" for a healthy run, UNSET
    # when the variant does not apply
    not_applicable: str | UnsetType = UNSET
    losses: list[Loss] = []
    steps: Annotated[int, msgspec.Meta(ge=0, le=2**53)] = 0  # a kept file's: never beyond
    stopped_by: str = ""
    loss_floor: float | UnsetType | None = UNSET
    blind_loss: float | UnsetType | None = UNSET
    wall_time_s: float | UnsetType = UNSET
    setup_time_s: float | UnsetType = UNSET
    device: str | UnsetType = UNSET
    changes: list[str] | UnsetType = UNSET


def run_job(job: Job, device: str) -> Record:
    """Train one calibration run in this process; its record (raises DlciError on a mistake)."""
    seed_everything(job.seed)  # before the factory: the initial weights follow the seed
    target = load_target(job.spec)
    environ = environment(device)
    applied: str | UnsetType = UNSET
    try:
        applied = sabotage(target, job.variant, job.seed) if job.variant != HEALTHY else ""
        config = MemorizeConfig(
            max_epochs=job.epochs,
            max_loss=NEVER,
            time_cap_s=job.time_cap_s,
            batch_size=job.batch_size,
            seed=job.seed,
            early_stop=False,
            device=device,
        )
        result = memorize(target, config)
    except NotApplicable as exc:
        return Record(
            job=job, environment=environ, applied=applied, not_applicable=str(exc),
            stopped_by="not applicable",
        )  # fmt: skip
    return Record(
        job=job,
        environment=environ,
        applied=applied,
        losses=[v if math.isfinite(v) else str(v) for v in result.losses],  # type: ignore[misc]
        steps=result.steps,
        stopped_by=result.stopped_by,
        loss_floor=result.loss_floor,
        blind_loss=result.blind_loss,
        wall_time_s=result.wall_time_s,
        setup_time_s=result.setup_time_s,
        device=result.device,
        changes=list(result.changes),
    )


def losses(record: Record) -> list[float]:
    """A record's loss curve as floats (JSON keeps NaN and infinity as text)."""
    return [float(v) for v in record.losses]


def relative(record: Record) -> list[float]:
    """A record's curve as shares of its reference (the start, or the input-blind baseline
    below it) above the loss's floor, smoothed as the gate smooths it: what a tier judges."""
    floor, blind = record.loss_floor, record.blind_loss
    return relative_curve(
        losses(record),
        floor if isinstance(floor, int | float) else None,
        blind if isinstance(blind, int | float) else None,
    )


def read(raw: Any, name: str = "calibration run") -> Record:
    """A decoded run's file as a :class:`Record`; ValueError naming each field of a wrong type
    (with ``name``, the file), a required one missing, or a run that is neither trained nor
    not applicable.

    >>> read({"job": {"spec": "m:f", "seed": 0, "epochs": 2, "batch_size": 4,
    ...      "time_cap_s": 60}, "losses": [1.0, "nan"], "steps": 2, "wall_time_s": 1}).losses
    [1.0, 'nan']
    >>> read({"job": {"seed": "0"}, "losses": ["x"]}, "r.json")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: r.json: job.seed is '0', expected an integer; r.json: losses[0] is 'x', ...
    """
    wrong = problems(Record, raw, name)
    if wrong:
        raise ValueError("; ".join(wrong))
    try:
        record = msgspec.convert(raw, Record)
    except msgspec.ValidationError as exc:  # the types are right: a required one is missing
        raise ValueError(f"{name} cannot be read: {exc}") from None
    if record.not_applicable is UNSET and record.wall_time_s is UNSET:
        raise ValueError(f"{name}: a run with neither wall_time_s nor not_applicable")
    return record


def kept_runs(
    out: Path, jobs: Sequence[Job], env: dict[str, str], say: Callable[[str], None]
) -> dict[str, Record]:
    """The records in OUT/runs/ made for exactly these jobs here; others are run again."""
    kept: dict[str, Record] = {}
    for job in jobs:
        path = out / RUNS_DIR / f"{job.name}.json"
        if not path.exists():
            continue
        try:
            record = read(jsonio.decode(read_input(path, what="calibration run")), str(path))
        except (DlciError, jsonio.DecodeError, RecursionError, ValueError):
            record = None
        if record is None or record.kind != "calibration-run":
            say(f"{path}: not a calibration run dl-ci can read; running it again")
        elif record.job == job and record.environment == env:
            kept[job.name] = record
        else:
            say(f"{path}: made with other settings; running it again")
    return kept


def save(out: Path, record: Record) -> None:
    atomic_write_bytes(out / RUNS_DIR / f"{record.job.name}.json", jsonio.encode(record))


@dataclass(frozen=True)
class Pool:
    """Where the runs go: how many workers, their devices, torch threads for each."""

    workers: int
    devices: tuple[str, ...]
    threads: int


def plan_pool(requested: int | None, jobs: int, device: str | None) -> Pool:
    """One worker per GPU on a GPU machine, else one per CPU core (never more than jobs),
    each with one torch thread."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = max(1, cores or 1)
    use_gpu = (device is None and torch.cuda.is_available()) or (device or "").startswith("cuda")
    if use_gpu and device in (None, "cuda"):
        devices = tuple(f"cuda:{i}" for i in range(torch.cuda.device_count()))
    else:
        devices = (device or "cpu",)
    default = len(devices) if use_gpu else cores
    workers = max(1, min(requested or default, max(jobs, 1)))
    # one torch thread each: on a busy 2-core machine two threads made a digits run 9 to 20
    # times slower than one (they wait on each other); more cores take more workers instead
    return Pool(workers, devices, 1)


def _worker(device: str, threads: int, tasks: Any, results: Any) -> None:
    """A worker process: take numbered jobs until the sentinel; say on its own pipe when
    each starts and how it ended (a pipe's send is written at once, so a word sent before
    the process dies inside the target still reaches the parent)."""
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C reaches the whole group: the
        _serve(device, threads, tasks, results)  # parent says it, once


def _serve(device: str, threads: int, tasks: Any, results: Any) -> None:
    import torch

    torch.set_num_threads(threads)
    while (task := tasks.get()) is not None:
        number, job = task
        results.send(("start", number))
        try:
            record = run_job(job, device)
        except DlciError as exc:
            results.send(("error", number, exc.message, exc.hint, exc.file, exc.line))
            return
        except Exception:  # a bug in dl-ci: the parent shows it as one (exit 3)
            results.send(("crash", number, traceback.format_exc()))
            return
        results.send(("done", number, record))


class Workers:
    """The worker processes of one calibration, started at the first jobs and kept for the
    next (the power runs), so each pays torch's import once; a context manager.

    A mistake in the target stops the calibration with a DlciError that names the run; so
    does a worker that dies inside the target (os._exit, a signal, out of memory).
    """

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.procs: list[Any] = []
        self.pipes: dict[int, Any] = {}  # the parent's end of each live worker's pipe
        self.tasks: Any = None
        self.jobs: dict[int, Job] = {}  # every job sent, by its number
        self.holding: dict[int, int] = {}  # worker -> the job it started and has not ended

    def __enter__(self) -> Workers:
        return self

    def _start(self) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.tasks = context.Queue()
        devices, threads = self.pool.devices, self.pool.threads
        for i in range(self.pool.workers):
            reader, writer = context.Pipe(duplex=False)
            args = (devices[i % len(devices)], threads, self.tasks, writer)
            proc = context.Process(target=_worker, args=args, daemon=True)
            proc.start()
            writer.close()  # the worker's end: the parent reads EOF when the worker is gone
            self.procs.append(proc)
            self.pipes[i] = reader

    def run(self, jobs: Sequence[Job], on_done: Callable[[Record], None]) -> None:
        """Run ``jobs``; ``on_done`` gets each record as it arrives."""
        from multiprocessing.connection import wait

        if not jobs:
            return
        if not self.procs:
            self._start()
        pending = set()
        for job in jobs:
            number = len(self.jobs)
            self.jobs[number] = job
            pending.add(number)
            self.tasks.put((number, job))
        while pending:
            if not self.pipes:
                raise RuntimeError("every calibration worker ended before the runs finished")
            by_pipe = {id(pipe): index for index, pipe in self.pipes.items()}
            for ready in wait(list(self.pipes.values()), timeout=POLL_S):
                index = by_pipe[id(ready)]
                try:
                    message = self.pipes[index].recv()
                except EOFError:  # the worker is gone, and every word it sent was read
                    self._gone(index)
                    continue
                self._handle(index, message, pending, on_done)

    def _handle(
        self,
        index: int,
        message: tuple[Any, ...],
        pending: set[int],
        on_done: Callable[[Record], None],
    ) -> None:
        kind, number = message[:2]
        if kind == "start":
            self.holding[index] = number
        elif kind == "done":
            self.holding.pop(index, None)
            pending.discard(number)
            on_done(message[2])
        elif kind == "error":
            _, _, text, hint, file, line = message
            where = self.jobs[number].describe()
            raise DlciError(f"{where}: {text}", hint=hint, file=file, line=line)
        else:
            name = self.jobs[number].name
            raise RuntimeError(f"a calibration worker failed in {name}:\n{message[2]}")

    def _gone(self, index: int) -> None:
        """A worker's pipe closed: fine after its share, else it died inside a job."""
        proc = self.procs[index]
        proc.join(timeout=10)
        job = self.jobs.get(self.holding.get(index, -1))
        if job is None and proc.exitcode == 0:
            self.pipes.pop(index).close()
            return
        raise DlciError(
            (
                f"{job.describe()}: the worker process ended inside the target's code"
                if job
                else "a calibration worker ended before it took a run"
            )
            + f" (exit code {proc.exitcode})",
            hint="os._exit, a signal or the out-of-memory killer ends a process that way"
            + (f"; dlci memorize --seed {job.seed} runs that seed alone" if job else ""),
        )

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.is_alive():
                self.tasks.put(None)
        for proc in self.procs:
            proc.join(timeout=10 if exc[0] is None else 0.1)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=10)
        for pipe in self.pipes.values():
            pipe.close()
