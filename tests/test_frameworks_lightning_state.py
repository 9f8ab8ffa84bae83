"""A LightningModule written for a Trainer runs through ``Target.from_lightning`` as written:
it logs torchmetrics objects, dicts, tensors and numbers, reads the trainer's state and its
logger's ``experiment``; ``num_classes`` is read from the module; and ``dlci memorize``
without tensorboard tracks nothing instead of stopping. Real Lightning and torchmetrics."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torchmetrics
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import dlci
from dlci.cli import main
from dlci.errors import DlciError
from dlci.memorization import tracking
from dlci.memorization.engine import MemorizeConfig, MemorizeResult, memorize

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lightning"
CONFIG = MemorizeConfig(max_epochs=200, max_loss=0.05, time_cap_s=60)


def loader(targets: str = "classes") -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 8, generator=g)
    y = torch.randint(0, 4, (16,), generator=g) if targets == "classes" else torch.randn(16, 4)
    return DataLoader(TensorDataset(x, y), batch_size=16)


class Logging(L.LightningModule):
    """A module as Lightning's docs teach it: torchmetrics objects logged with ``self.log``
    and ``self.log_dict``, the trainer's state read, the logger's experiment called."""

    def __init__(self, lr: float = 0.03) -> None:
        super().__init__()
        self.save_hyperparameters()  # lr only: num_classes is stated by the metrics
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
        self.train_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=4)
        self.metrics = torchmetrics.MetricCollection(
            {"f1": torchmetrics.classification.MulticlassF1Score(num_classes=4)}, prefix="train/"
        )
        self.seen: list[dict[str, Any]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.train_acc(logits, y)
        self.log("train/acc", self.train_acc, on_step=True, on_epoch=True)
        self.log_dict(self.metrics(logits, y))
        self.log_dict({"train/loss": loss, "lr": self.hparams.lr}, prog_bar=True)
        self.logger.experiment.add_scalar("custom", loss.item(), self.global_step)
        self.seen.append(
            {
                "global_step": self.global_step,
                "trainer_step": self.trainer.global_step,
                "epoch": self.current_epoch,
                "callback": sorted(self.trainer.callback_metrics),
                "progress": sorted(self.trainer.progress_bar_metrics),
            }
        )
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


@pytest.fixture(scope="module")
def logged_run() -> tuple[Logging, dlci.Target, MemorizeResult]:
    """One memorize run of ``Logging``, read by the tests below."""
    torch.manual_seed(0)
    module = Logging()
    target = dlci.Target.from_lightning(module, train_dataloaders=loader())
    return module, target, memorize(target, CONFIG)


def test_a_module_that_logs_torchmetrics_objects_memorizes(logged_run) -> None:
    module, _, result = logged_run
    assert (result.verdict, result.stopped_by) == ("pass", "threshold"), result.reason
    assert module.seen[-1]["callback"] == ["lr", "train/acc", "train/f1", "train/loss"]
    assert module.seen[-1]["progress"] == ["lr", "train/loss"]


def test_the_trainer_state_counts_the_steps(logged_run) -> None:
    module, _, result = logged_run
    steps = [seen["global_step"] for seen in module.seen]
    assert steps == list(range(len(module.seen))) and len(module.seen) >= result.steps
    assert all(s["trainer_step"] == s["global_step"] and s["epoch"] == 0 for s in module.seen)


def test_num_classes_is_what_the_modules_metrics_state(logged_run) -> None:
    _, target, _ = logged_run
    assert target.num_classes == 4


def test_a_trainer_sees_the_same_steps_and_logs(tmp_path) -> None:
    """The reference: Lightning's own Trainer runs the module with the same steps and logs."""
    from lightning.pytorch.loggers import TensorBoardLogger

    torch.manual_seed(0)
    module = Logging()
    trainer = L.Trainer(
        max_steps=3,
        logger=TensorBoardLogger(save_dir=tmp_path),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(module, train_dataloaders=loader())
    assert [s["global_step"] for s in module.seen] == [0, 1, 2]
    assert set(trainer.callback_metrics) >= {"lr", "train/acc", "train/f1", "train/loss"}


def test_control_lightnings_fabric_alone_refuses_the_metric_and_counts_no_step() -> None:
    """Without dl-ci's stand-in (the adapter before this change), Lightning's Fabric path
    refuses the metric, and global_step stays 0."""
    module = Logging()
    module.fabric = L.Fabric(accelerator="cpu", devices=1)
    with pytest.raises(ValueError, match="MulticlassAccuracy` values cannot be logged"):
        module.training_step(next(iter(loader())), 0)
    assert module.global_step == 0


class Refused(Logging):
    """What a Trainer refuses too, or what dl-ci cannot give: ``what`` chooses which."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        if self.what == "string":
            self.log("name", "a string")
        elif self.what == "vector":
            self.log("per-class", torch.ones(4))
        else:
            self.trainer.fit_loop.epoch_progress  # noqa: B018 - a Trainer's loop, not given
        return loss


@pytest.mark.parametrize(
    ("what", "message", "hint"),
    [
        ("string", "`str` values cannot be logged", "the error is in your code"),
        ("vector", "the tensor must have a single element", "the error is in your code"),
        ("loop", "self.trainer.fit_loop", "gives self.trainer only its read-only state"),
    ],
)
def test_what_a_step_cannot_log_or_read_is_a_located_error(what, message, hint) -> None:
    target = dlci.Target.from_lightning(Refused(what), train_dataloaders=loader())
    with pytest.raises(DlciError, match=message) as caught:
        memorize(target, CONFIG)
    assert caught.value.message.startswith("step 1: train_step raised")
    assert caught.value.file is not None and caught.value.file.endswith(Path(__file__).name)
    assert hint in (caught.value.hint or "")


class Head(L.LightningModule):
    def __init__(self, **hparams: Any) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


@pytest.mark.parametrize(
    ("hparams", "targets", "classes"),
    [
        ({}, "classes", 4),  # the head's out_features: the targets are class indices below it
        ({}, "regression", None),  # control: a 4-wide regression head is not a classifier
        ({"num_classes": 5}, "classes", 5),  # stated in hparams, it wins
    ],
    ids=["head", "control-regression-head", "hparams"],
)
def test_num_classes_is_read_from_the_module(hparams, targets, classes) -> None:
    target = dlci.Target.from_lightning(Head(**hparams), train_dataloaders=loader(targets))
    assert target.num_classes == classes


def test_without_tensorboard_memorize_tracks_nothing_and_says_so_once(
    monkeypatch, tmp_path, capsys
) -> None:
    """Also the run of `dlci memorize` on the example (it passes)."""
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # the package missing
    monkeypatch.setattr(tracking, "_SAID_NO_TENSORBOARD", [])
    monkeypatch.chdir(EXAMPLE)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    assert main(["memorize", "--budget", "pr", "--out", str(tmp_path), "--quiet"]) == 0
    assert json.loads((tmp_path / "memorization.json").read_text())["verdict"] == "pass"
    assert not (tmp_path / "tensorboard").exists()
    tracking.make_tracker("tensorboard", tmp_path, "again")  # a second tracker says nothing
    err = capsys.readouterr().err
    assert err.count("tracking nothing: TensorBoard needs the tensorboard package") == 1, err


def test_control_with_tensorboard_the_tracker_writes_events(tmp_path, capsys) -> None:
    tracker = tracking.make_tracker("tensorboard", tmp_path, "run")
    tracker.log_metric("memorize/loss", 1.0, 1)
    tracker.close()
    assert list((tmp_path / "tensorboard" / "run").glob("events.out.tfevents.*"))
    assert "tracking nothing" not in capsys.readouterr().err
