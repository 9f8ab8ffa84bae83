"""DDP for the memorization test: run the same command in N processes under torchrun."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dlci import jsonio
from dlci.errors import DlciError
from dlci.memorization.request import ARGV_VARIABLE, DISTRIBUTED_FLAG, VERDICT_VARIABLE


def launch(argv: Sequence[str], nproc: int, say: Callable[[str], None], *, quiet: bool) -> int:
    """Run ``dlci memorize argv`` in ``nproc`` processes under torchrun; the exit code.

    Workers exit 0 once a verdict exists, whatever it is, and rank 0 writes the verdict to a
    file: a worker that exits early with a failing code would make torchrun kill rank 0
    before it writes the report. Only a written ``pass`` passes: workers that all exit 0
    without one (``os._exit(0)`` in the target) fail.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    check_gpu_count(nproc)
    if not quiet:
        say(f"starting {nproc} processes under torchrun (DDP)")
    with tempfile.TemporaryDirectory(prefix="dlci-ddp-") as scratch:
        verdict_file = Path(scratch) / "verdict"
        saved = {k: os.environ.get(k) for k in (DISTRIBUTED_FLAG, ARGV_VARIABLE, VERDICT_VARIABLE)}
        os.environ.update(
            {
                DISTRIBUTED_FLAG: "1",
                ARGV_VARIABLE: jsonio.encode(list(argv), indent=False).decode(),
                VERDICT_VARIABLE: str(verdict_file),
            }
        )
        command = ["--standalone", f"--nproc-per-node={nproc}", *_worker_entry(), "memorize"]
        try:
            run(parse_args(command))  # type: ignore[no-untyped-call]
        except ChildFailedError as exc:
            say(f"{len(exc.failures)} of {nproc} DDP processes failed (their messages are above)")
            return 1
        finally:
            _restore(saved)
        verdict = verdict_file.read_text().strip() if verdict_file.exists() else ""
    if not verdict:  # a positive verdict or a failure: every process exiting 0 is not a pass
        say(
            "the target exited before a verdict: the DDP processes ended without rank 0 "
            "writing one (an exit in the target's code?)"
        )
    return 0 if verdict == "pass" else 1


def _worker_entry() -> list[str]:
    """How torchrun starts dl-ci in each worker: the ``dlci`` console script beside this
    interpreter (run as a script, its own folder is first on sys.path), not ``-m dlci``,
    which puts the working directory (a pull request's workspace) first, so that a ``dlci/``
    folder planted there would be imported instead; ``-m dlci`` only where there is no script.
    """
    beside = Path(sys.executable).with_name("dlci")
    return [str(beside)] if beside.is_file() else ["-m", "dlci"]


def _restore(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def check_gpu_count(nproc: int) -> None:
    """Refuse more processes than GPUs, on a machine with GPUs."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() < nproc:
        raise DlciError(
            f"the tier runs {nproc} processes, one per GPU, but this machine has "
            f"{torch.cuda.device_count()} GPU(s)",
            hint="pass --nproc with the number of GPUs, or set nproc in your ladder",
        )


def init_process_group(dist: Any) -> None:
    """Join the DDP process group: NCCL on GPUs (one per local rank), gloo on the CPU."""
    import torch
    import torch.distributed

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(dist.local_rank)
    torch.distributed.init_process_group(backend=backend)
