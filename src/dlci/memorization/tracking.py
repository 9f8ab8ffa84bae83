"""Where a run's configuration and metrics go: TensorBoard by default, Weights & Biases on request.

A run records its configuration (tier, seed, hardware, library versions, hyperparameters)
beside its metrics, so two runs can be compared later (``dlci compare-runs``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Protocol

from dlci import jsonio
from dlci.compare.runs import flatten
from dlci.errors import DlciError

TRACKERS = ("tensorboard", "wandb", "none")


class Tracker(Protocol):
    def log_config(self, config: dict[str, Any]) -> None: ...
    def log_metric(self, name: str, value: float, step: int) -> None: ...
    def log_summary(self, summary: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class NullTracker:
    """Records nothing (``--tracker none``)."""

    location = ""

    def log_config(self, config: dict[str, Any]) -> None:
        pass

    def log_metric(self, name: str, value: float, step: int) -> None:
        pass

    def log_summary(self, summary: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardTracker:
    """One event file under ``directory``, replacing the previous run's: the configuration as a
    text summary and hparams, the metrics as scalars."""

    def __init__(self, directory: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # pragma: no cover - tensorboard is in dl-ci[train]
            raise DlciError(
                f"TensorBoard tracking needs the tensorboard package ({exc})",
                hint="pip install 'dl-ci[train]', or pass --tracker none",
            ) from None
        self.location = str(directory)
        clear_events(directory)
        self._writer = SummaryWriter(log_dir=str(directory))
        self._config: dict[str, Any] = {}

    def log_config(self, config: dict[str, Any]) -> None:
        self._config = config
        text = "```json\n" + jsonio.encode(config).decode().rstrip() + "\n```"
        self._writer.add_text("dlci/config", text, global_step=0)

    def log_metric(self, name: str, value: float, step: int) -> None:
        self._writer.add_scalar(name, value, global_step=step)

    def log_summary(self, summary: dict[str, Any]) -> None:
        hparams = {
            key: value
            for key, value in flatten(self._config).items()
            if isinstance(value, int | float | str | bool)
        }
        metrics = {
            f"summary/{k}": float(v) for k, v in summary.items() if isinstance(v, int | float)
        }
        # what add_hparams writes, but through this writer: add_hparams opens a second event
        # file in the same folder, and TensorBoard then shows two runs for one
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        writer = self._writer._get_file_writer()  # type: ignore[no-untyped-call]
        for part in hparams_summary(hparams, metrics):  # type: ignore[no-untyped-call]
            writer.add_summary(part)
        for name, value in metrics.items():
            self._writer.add_scalar(name, value)

    def close(self) -> None:
        self._writer.close()


class WandbTracker:
    """A Weights & Biases run; offline (files under ``directory``) when no API key is set."""

    def __init__(self, directory: Path, name: str) -> None:
        try:
            import wandb
        except ImportError:
            raise DlciError(
                "--tracker wandb needs the wandb package",
                hint="pip install wandb, or use the default --tracker tensorboard",
            ) from None
        offline = not os.environ.get("WANDB_API_KEY") and os.environ.get("WANDB_MODE") != "online"
        directory.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "dl-ci"),
            name=name,
            dir=str(directory),
            mode="offline" if offline else None,
        )
        self.location = str(directory / "wandb") + (" (offline)" if offline else "")

    def log_config(self, config: dict[str, Any]) -> None:
        self._run.config.update(config, allow_val_change=True)  # type: ignore[no-untyped-call]

    def log_metric(self, name: str, value: float, step: int) -> None:
        self._run.log({name: value}, step=step)

    def log_summary(self, summary: dict[str, Any]) -> None:
        self._run.summary.update(summary)

    def close(self) -> None:
        self._run.finish()


def clear_events(directory: Path) -> list[Path]:
    """Delete the TensorBoard event files a previous run left in ``directory``; return them.

    Two runs' events in one folder show as one run with two curves on top of each other.
    """
    removed = sorted(directory.glob("events.out.tfevents.*")) if directory.is_dir() else []
    for path in removed:
        path.unlink()
    return removed


# whether this process has said that TensorBoard tracking is off (it says so once)
_SAID_NO_TENSORBOARD: list[bool] = []


def tensorboard_missing() -> str | None:
    """Why TensorBoard cannot be written here (its package is missing), or None."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


def make_tracker(kind: str, directory: Path, name: str) -> Tracker:
    """The run's tracker. TensorBoard (the default) degrades to tracking nothing where its
    package is missing (only the framework extra installed), said once on stderr."""
    if kind == "tensorboard":
        missing = tensorboard_missing()
        if missing is not None:
            if not _SAID_NO_TENSORBOARD:
                _SAID_NO_TENSORBOARD.append(True)
                print(
                    f"dl-ci: tracking nothing: TensorBoard needs the tensorboard package "
                    f"({missing}); pip install 'dl-ci[train]' to track, or pass --tracker none",
                    file=sys.stderr,
                )
            return NullTracker()
        return TensorBoardTracker(directory / "tensorboard" / name)
    if kind == "wandb":
        return WandbTracker(directory, name)  # wandb adds its own wandb/ folder
    if kind == "none":
        return NullTracker()
    raise DlciError(
        f"--tracker: unknown tracker {kind!r}", hint=f"choose from {', '.join(TRACKERS)}"
    )
