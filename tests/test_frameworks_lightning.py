"""``dlci.Target.from_lightning`` with real Lightning: the step is Lightning's own (the same
weights as a Trainer's after the same steps), every gate runs through it, and bugs in a
user's ``training_step`` are caught by the check that looks inside the step."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import dlci
from dlci.checks import run_checks, select
from dlci.cli import main
from dlci.errors import DlciError
from dlci.ladder.tiers import choose_tier
from dlci.memorization.engine import MemorizeConfig, memorize
from dlci.training.lightning_optim import parse_configure_optimizers

TIER = choose_tier(budget="pr", hardware="cpu")
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lightning"
CONFIG = MemorizeConfig(max_epochs=300, max_loss=0.05, time_cap_s=120)


def data(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


def loader(n: int = 64, batch_size: int = 16, seed: int = 0) -> DataLoader:
    return DataLoader(TensorDataset(*data(n, seed)), batch_size=batch_size)


class Net(L.LightningModule):
    """A small classifier: automatic optimisation, or manual with ``manual=True``."""

    def __init__(
        self, manual: bool = False, dropout: float = 0.1, schedule: str = "", lr: float = 3e-3
    ) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 4))
        self.automatic_optimization = not manual
        self.schedule = schedule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", loss)
        if self.automatic_optimization:
            return loss
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            scheduler.step()
        return None  # the loss is what went to manual_backward

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)
        if self.schedule == "step":
            decay = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": decay, "interval": "step"},
            }
        if self.schedule == "lists":
            decay = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
            return [optimizer], [decay]
        if self.schedule == "clip":
            return torch.optim.SGD(self.parameters(), lr=0.5)
        return optimizer

    def configure_gradient_clipping(self, optimizer, gradient_clip_val, gradient_clip_algorithm):
        if self.schedule == "clip":
            self.clip_gradients(optimizer, gradient_clip_val=0.01, gradient_clip_algorithm="norm")


class EvalInStep(Net):
    """The bug: training_step switches the model to eval mode (dropout off while training)."""

    def training_step(self, batch, batch_idx):
        self.eval()
        return self.loss(batch)


class NoZeroGrad(Net):
    """The bug: a manual step that never zeroes the gradients."""

    def __init__(self) -> None:
        super().__init__(manual=True)

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.manual_backward(loss)
        self.optimizers().step()
        return loss


def target(module: L.LightningModule, **kwargs) -> dlci.Target:
    return dlci.Target.from_lightning(module, train_dataloaders=loader(), **kwargs)


@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_a_healthy_module_memorizes_through_the_adapter(manual: bool) -> None:
    torch.manual_seed(0)
    result = memorize(target(Net(manual=manual, lr=0.03)), CONFIG)  # few steps to memorise
    assert (result.verdict, result.stopped_by) == ("pass", "threshold"), result.reason
    assert "dropout off: net.2 (Dropout, p=0.1 -> 0)" in result.changes
    assert "weight decay off: param group 0 (0.01 -> 0)" in result.changes


def test_a_detached_training_step_fails_memorization_with_the_cause() -> None:
    class Detached(Net):
        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self(x).detach(), y)

    with pytest.raises(DlciError, match="output is detached") as caught:
        memorize(target(Detached()), CONFIG)
    assert caught.value.message.startswith("step 1: train_step raised RuntimeError")


def _trainer_weights(module: L.LightningModule, steps: int, tmp_path: Path) -> list[torch.Tensor]:
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, train_dataloaders=loader(16, 16))
    return [p.detach().clone() for p in module.parameters()]


def _adapter_weights(module: L.LightningModule, steps: int) -> list[torch.Tensor]:
    built = target(module)
    optimizer = built.optimizer([p for p in module.parameters() if p.requires_grad])
    for _ in range(steps):
        built.train_step(module, data(16), optimizer)
    return [p.detach().clone() for p in module.parameters()]


@pytest.mark.parametrize(
    ("manual", "schedule"),
    [(False, "step"), (False, "clip"), (True, "lists")],
    ids=["automatic-with-step-scheduler", "automatic-with-clipping", "manual-with-scheduler"],
)
def test_the_adapter_trains_as_lightnings_trainer_does(manual, schedule, tmp_path) -> None:
    """Three steps on one batch: the same weights as Trainer.fit (schedulers halving the rate
    after each step, and SGD with the module's own clipping, so a hook not run would show)."""
    torch.manual_seed(0)
    module = Net(manual=manual, dropout=0.0, schedule=schedule)
    twin = copy.deepcopy(module)
    start = [p.detach().clone() for p in module.parameters()]
    by_trainer = _trainer_weights(module, 3, tmp_path)
    by_adapter = _adapter_weights(twin, 3)
    assert any((a - b).abs().max() > 1e-3 for a, b in zip(by_adapter, start, strict=True))
    for a, b in zip(by_trainer, by_adapter, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_control_without_the_scheduler_the_weights_differ(tmp_path) -> None:
    """The comparison above can fail: one scheduler step left out gives other weights."""
    torch.manual_seed(0)
    module = Net(dropout=0.0, schedule="step")
    twin = copy.deepcopy(module)
    twin.schedule = ""  # the adapter's copy trains without the halving
    by_trainer = _trainer_weights(module, 3, tmp_path)
    by_adapter = _adapter_weights(twin, 3)
    assert any((a - b).abs().max() > 1e-5 for a, b in zip(by_trainer, by_adapter, strict=True))


@pytest.mark.parametrize(
    ("bug", "check", "status"),
    [(NoZeroGrad, "zero-grad", "fail"), (EvalInStep, "train-eval-mode", "warn")],
    ids=["no-zero-grad", "eval-in-training-step"],
)
def test_a_bug_in_training_step_is_caught_inside_the_step(bug, check, status) -> None:
    [caught] = run_checks(target(bug()), checks=select(check), tier=TIER)
    assert caught.status == status, caught
    healthy = Net(manual=bug is NoZeroGrad)
    [control] = run_checks(target(healthy), checks=select(check), tier=TIER)
    assert control.status == "pass", control


def test_doctor_runs_every_check_on_the_example_with_no_false_alarm(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(EXAMPLE)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    code = main(["doctor", "--budget", "pr", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "doctor.json").read_text())
    statuses = {c["id"]: c["status"] for c in report["checks"]}
    assert code == 0 and report["verdict"] == "pass", statuses
    skipped = {c["id"]: c["cause"] for c in report["checks"] if c["status"] == "skip"}
    assert set(statuses.values()) <= {"pass", "skip"} and set(skipped) == {"causality"}, skipped


def test_profile_runs_through_the_adapter(monkeypatch, tmp_path) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE))
    spec = "lightning_example.target:make_manual_target"
    args = ["profile", "--target", spec, "--steps", "3", "--out", str(tmp_path), "--quiet"]
    assert main(args) == 0
    report = json.loads((tmp_path / "utilization.json").read_text())
    assert report["steps"]["count"] == 3
    phases = report["phases"]["pct"]
    assert phases["forward"] > 0 and phases["backward"] > 0 and phases["optimizer"] > 0


@pytest.mark.parametrize(
    "form",
    ["optimizer", "dict", "lists", "one-item list"],
)
def test_each_form_of_configure_optimizers_gives_one_optimizer(form: str) -> None:
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    decay = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    configured = {
        "optimizer": optimizer,
        "dict": {"optimizer": optimizer, "lr_scheduler": {"scheduler": decay, "interval": "step"}},
        "lists": ([optimizer], [decay]),
        "one-item list": [{"optimizer": optimizer, "lr_scheduler": decay}],
    }[form]
    got, schedulers = parse_configure_optimizers(configured)
    assert got is optimizer
    assert [s.scheduler for s in schedulers] == ([] if form == "optimizer" else [decay])


@pytest.mark.parametrize(
    ("configured", "message"),
    [
        ("two", "configure_optimizers returned 2 optimizers"),
        (None, "configure_optimizers returned None"),
        ({"lr_scheduler": None}, "a dict without 'optimizer'"),
        ("text", "returned a str, which is not one of Lightning's forms"),
    ],
)
def test_what_dl_ci_does_not_run_is_refused_with_a_hint(configured, message) -> None:
    if configured == "two":
        configured = [torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1) for _ in range(2)]
    with pytest.raises(DlciError, match=message) as caught:
        parse_configure_optimizers(configured)
    assert caught.value.hint


def test_multiple_optimizers_are_refused_when_the_run_builds_them() -> None:
    class GAN(Net):
        def configure_optimizers(self):
            opt = torch.optim.SGD
            return opt(self.net[0].parameters(), lr=0.1), opt(self.net[3].parameters(), lr=0.1)

    with pytest.raises(DlciError, match="returned 2 optimizers") as caught:
        memorize(target(GAN()), CONFIG)
    assert "one optimizer" in (caught.value.hint or "")


class NoLoss(Net):
    def training_step(self, batch, batch_idx):
        self.loss(batch)


class SkipsEpoch(Net):
    def on_train_batch_start(self, batch, batch_idx):
        return -1


class NoClosure(Net):
    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        optimizer.step()


@pytest.mark.parametrize(
    ("module", "message"),
    [
        (NoLoss, r"training_step returned no loss \(None\)"),
        (SkipsEpoch, "on_train_batch_start returned -1"),
        (NoClosure, "optimizer_step returned without calling optimizer_closure"),
    ],
    ids=["no-loss", "skips-the-epoch", "no-closure"],
)
def test_a_step_dl_ci_cannot_train_is_refused_with_a_hint(module, message) -> None:
    with pytest.raises(DlciError, match=message) as caught:
        memorize(target(module()), CONFIG)
    assert caught.value.hint


def test_two_train_loaders_are_refused() -> None:
    with pytest.raises(DlciError, match="2 train loaders; dl-ci takes one"):
        dlci.Target.from_lightning(Net(), train_dataloaders=[loader(), loader()])


def test_a_plain_module_or_missing_data_is_a_clear_error() -> None:
    with pytest.raises(DlciError, match="needs a LightningModule, got Linear"):
        dlci.Target.from_lightning(nn.Linear(2, 2))
    with pytest.raises(DlciError, match="no training data"):
        dlci.Target.from_lightning(Net())


def test_dict_and_longer_tuple_batches_reach_training_step_as_they_were() -> None:
    seen: list[type] = []

    class DictBatches(Net):
        def training_step(self, batch, batch_idx):
            seen.append(type(batch))
            return F.cross_entropy(self(batch["x"]), batch["labels"]) + 0 * batch["w"].sum()

    x, y = data()
    rows = [{"x": x[i], "labels": y[i], "w": torch.ones(1)} for i in range(len(y))]
    torch.manual_seed(0)
    built = dlci.Target.from_lightning(DictBatches(), train_dataloaders=DataLoader(rows, 16))
    result = memorize(built, CONFIG)
    assert result.verdict == "pass" and seen[0] is dict
    inputs, labels = next(iter(built.train_loader))
    assert set(inputs) == {"x", "w"} and labels.shape == (16,)

    class Triples(Net):
        def training_step(self, batch, batch_idx):
            x, w, y = batch
            return F.cross_entropy(self(x * w), y)

    triples = DataLoader(TensorDataset(x, torch.ones_like(x), y), batch_size=16)
    torch.manual_seed(0)
    result = memorize(dlci.Target.from_lightning(Triples(), train_dataloaders=triples), CONFIG)
    assert result.verdict == "pass"


def test_importing_dlci_imports_no_framework() -> None:
    code = (
        "import sys, dlci; dlci.Target; "
        "import dlci.training.lightning_target, dlci.training.transformers_target; "
        "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers') "
        "if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def _ddp_rank(rank: int, world: int, port: int, out: str) -> None:
    """One gloo process: three adapter steps on this rank's own examples, through the
    DistributedDataParallel wrapper and (the control) without it; each way, every rank's
    parameters gathered to rank 0."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = {}
        for way in ("ddp", "control-no-ddp"):
            torch.manual_seed(0)
            module = Net(dropout=0.0)
            model = DistributedDataParallel(module) if way == "ddp" else module
            built = target(module)
            optimizer = built.optimizer([p for p in model.parameters() if p.requires_grad])
            for _ in range(3):
                built.train_step(model, data(16, seed=rank), optimizer)
            flat = torch.cat([p.detach().flatten() for p in module.parameters()])
            gathered = [torch.zeros_like(flat) for _ in range(world)]
            dist.all_gather(gathered, flat)
            results[way] = gathered
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()


def test_under_ddp_the_step_goes_through_the_wrapper_so_ranks_agree(tmp_path) -> None:
    """Two gloo processes, different examples on each: through DistributedDataParallel's
    forward the gradients are averaged and both ranks hold the same weights; the control,
    the same steps without the wrapper, ends with different weights."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    out = tmp_path / "weights.pt"
    mp.spawn(_ddp_rank, args=(2, port, str(out)), nprocs=2)
    results = torch.load(out)
    assert torch.equal(*results["ddp"])
    assert not torch.equal(*results["control-no-ddp"])
