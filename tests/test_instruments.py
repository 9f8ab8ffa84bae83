"""dlci.Instruments in a real training loop: what lands in TensorBoard, and when."""

from __future__ import annotations

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import dlci
import zoo


def train(target, steps: int, instruments) -> None:
    model = target.model
    optimizer = target.optimizer(model.parameters())
    batches = iter(list(target.train_loader) * 3)
    for _ in range(steps):
        inputs, labels = next(batches)
        optimizer.zero_grad()
        target.loss_fn(model(inputs), labels).backward()
        optimizer.step()
        instruments.step()


def test_it_records_every_n_steps_per_layer(tmp_path) -> None:
    target = zoo.clean_classification()
    with dlci.Instruments(target.model, every=5, log_dir=tmp_path) as instruments:
        train(target, 20, instruments)
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for tag in (
        "grad_norm/first.weight",
        "weight_norm/last.weight",
        "update_ratio/first.weight",
        "activation_mean/act",
        "activation_dead_fraction/act",
    ):
        assert tag in tags, tag
        assert [e.step for e in events.Scalars(tag)] == [5, 10, 15, 20]
    ratios = [e.value for e in events.Scalars("update_ratio/first.weight")]
    assert all(0 < r < 1 for r in ratios)


def test_the_hooks_are_removed_on_exit(tmp_path) -> None:
    target = zoo.clean_classification()
    with dlci.Instruments(target.model, every=2, log_dir=tmp_path):
        assert target.model.act._forward_hooks
    assert not target.model.act._forward_hooks


def test_dead_relus_show_up_as_a_dead_fraction_of_one(tmp_path) -> None:
    target = zoo.dead_relus()
    with dlci.Instruments(target.model, every=1, log_dir=tmp_path) as instruments:
        with torch.no_grad():
            target.model(next(iter(target.train_loader))[0])
        instruments.step()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert events.Scalars("activation_dead_fraction/act")[0].value == 1.0
