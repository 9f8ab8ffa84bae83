"""Instruments for the user's own training loop: per-layer statistics into TensorBoard.

    with dlci.Instruments(model, every=50) as instruments:
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss_fn(model(inputs), targets).backward()
            optimizer.step()
            instruments.step()

Every ``every`` steps it records, per layer: the gradient norm, the weight norm, the update
ratio norm(update)/norm(weight), and for activation modules the mean, the standard deviation
and the fraction of dead (ReLU) or saturated (tanh, sigmoid) units. Between recordings the
hooks only test a flag, so the overhead is low (benchmarks/instruments_overhead.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlci.errors import DlciError

DEFAULT_DIR = Path("dlci-artifacts") / "tensorboard" / "instruments"


class Instruments:
    """A context manager; call ``step()`` once per training step, after ``optimizer.step()``."""

    def __init__(
        self, model: Any, *, every: int = 50, log_dir: str | Path | None = None, writer: Any = None
    ) -> None:
        if every < 1:
            raise DlciError(f"Instruments: every must be at least 1, got {every}")
        self.model, self.every = model, every
        self.log_dir = Path(log_dir) if log_dir else DEFAULT_DIR
        self._writer, self._own_writer = writer, writer is None
        self._handles: list[Any] = []
        self._count = 0
        self._armed = False  # the next forward records activations
        self._before: dict[str, Any] = {}
        self._activations: dict[str, dict[str, float]] = {}

    # ------------------------------------------------------------------ context
    def __enter__(self) -> Instruments:
        from torch import nn

        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.log_dir))
        watched = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.Tanh, nn.Sigmoid, nn.SiLU)
        for name, module in self.model.named_modules():
            if isinstance(module, watched):
                self._handles.append(module.register_forward_hook(self._hook(name, module)))
        self._arm_if_next_records()
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._writer is not None:
            self._writer.flush()
            if self._own_writer:
                self._writer.close()

    # ------------------------------------------------------------------ recording
    def step(self) -> None:
        """Count a training step; every ``every`` steps, record its statistics."""
        self._count += 1
        if self._count % self.every == 0:
            self._record()
        self._arm_if_next_records()

    def _arm_if_next_records(self) -> None:
        self._armed = (self._count + 1) % self.every == 0
        if self._armed:  # the weights before the recorded step, for the update ratio
            self._before = {
                n: p.detach().clone()
                for n, p in self.model.named_parameters()
                if p.requires_grad and p.ndim > 1
            }

    def _hook(self, name: str, module: Any) -> Callable[[Any, Any, Any], None]:
        from torch import nn

        dead_kind = isinstance(module, nn.ReLU | nn.ReLU6)
        sigmoid = isinstance(module, nn.Sigmoid)
        tanh = isinstance(module, nn.Tanh)

        def record(mod: Any, inputs: Any, output: Any) -> None:
            if not self._armed:
                return
            out = output.detach()
            stats = {"mean": float(out.mean()), "std": float(out.std()) if out.numel() > 1 else 0.0}
            if dead_kind and out.ndim > 1:
                units = out.transpose(0, 1).reshape(out.shape[1], -1)
                stats["dead_fraction"] = float((units.max(dim=1).values <= 0).float().mean())
            elif sigmoid:
                stats["saturated_fraction"] = float(((out < 0.01) | (out > 0.99)).float().mean())
            elif tanh:
                stats["saturated_fraction"] = float((out.abs() > 0.99).float().mean())
            self._activations[name] = stats

        return record

    def _record(self) -> None:
        step, writer = self._count, self._writer
        for name, p in self.model.named_parameters():
            if not p.requires_grad:
                continue
            if p.grad is not None:
                writer.add_scalar(f"grad_norm/{name}", float(p.grad.detach().norm()), step)
            weight = p.detach()
            writer.add_scalar(f"weight_norm/{name}", float(weight.norm()), step)
            if name in self._before:
                before = self._before[name]
                ratio = float((weight - before).norm() / (before.norm() + 1e-12))
                writer.add_scalar(f"update_ratio/{name}", ratio, step)
        for layer, stats in self._activations.items():
            for key, value in stats.items():
                writer.add_scalar(f"activation_{key}/{layer}", value, step)
        self._activations.clear()
        self._before = {}
