"""What every check shares: its result, the context it runs in, and the promise to leave the
user's model and random state as it found them."""

from __future__ import annotations

import copy
import itertools
import math
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from dlci.errors import DlciError
from dlci.ladder.model import Tier
from dlci.memorization.engine import pick_device
from dlci.policy import Policy
from dlci.training.batching import (
    as_pair,
    batch_size_of,
    call_model,
    logits_of,
    take_batch,
    to_device,
    tree_map,
)
from dlci.training.guard import user_code
from dlci.training.stepping import loss_value
from dlci.training.target import Target, build_optimizer

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
CRASHED = "crashed"  # the check itself raised: no verdict from it, never a catch
CACHE_BYTES = 256 << 20  # loader batches kept for the next check (Context.loader_batches)


class TargetFault(Exception):
    """What the target's code gave back is unusable (a loss that is not a number): the
    check fails, as for an exception of the target's own."""


@dataclass
class CheckResult:
    id: str
    status: str
    measured: str = ""
    expected: str = ""
    cause: str = ""  # one line, for anything but pass
    fix: str = ""  # one line, for anything but pass
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    # the project's waiver, when one applied: mode, reason, until, source, and the status the
    # check would have had without it (None for a check the waiver kept from running)
    waived: dict[str, Any] | None = None
    # the earlier failures this one may follow from (checks/cascade.py); empty for a root
    follows: list[str] = field(default_factory=list)


@dataclass
class Context:
    """The target and one batch of it on the device; built once per doctor run."""

    target: Target
    batch: tuple[Any, Any]
    device: Any
    tier: Tier | None = None
    factory: Callable[[], Target] | None = None  # rebuilds the target, for reproducibility
    shared: dict[str, Any] = field(default_factory=dict)  # work one check leaves for another
    policy: Policy = field(default_factory=Policy)  # the project's thresholds (and waivers)

    @classmethod
    def build(
        cls,
        target: Target,
        *,
        batch_size: int = 16,
        device: Any = None,
        tier: Tier | None = None,
        factory: Callable[[], Target] | None = None,
        policy: Policy | None = None,
    ) -> Context:
        device = pick_device(device)
        with preserved(target), user_code("train_loader"):
            batch, _ = take_batch(target.train_loader, batch_size)
        target.model.to(device)
        batch = to_device(batch, device)
        return cls(target, batch, device, tier, factory, policy=policy or Policy())

    @property
    def model(self) -> Any:
        return self.target.model

    def memo(self, key: str, build: Callable[[], Any]) -> Any:
        """``build()`` once per doctor run: later checks reuse what an earlier one computed."""
        if key not in self.shared:
            self.shared[key] = build()
        return self.shared[key]

    def optimizer(self, model: Any = None) -> Any:
        """A fresh optimizer from the user's factory, over the trainable parameters."""
        model = model or self.model
        return build_optimizer(self.target.optimizer, model)

    def forward(self, model: Any = None, batch: Any = None) -> Any:
        return call_model(model or self.model, (batch or self.batch)[0])

    def evaluate(self, batch: Any = None, model: Any = None, draws: Any = None) -> Any:
        """The model's (or a copy's) outputs as the target scores them: its own
        ``eval_step`` when given (a model whose forward needs the targets for its full
        outputs), else a forward. ``draws`` (training/draws.py's ``Draws``) are replayed
        first: the same input then meets the same random draws (a VAE's noise)."""
        batch, model = batch or self.batch, model or self.model
        if draws is not None:
            draws.replay()
        if self.target.eval_step is not None:
            return self.target.eval_step(model, batch)
        return self.forward(model, batch)

    def step(
        self, model: Any, optimizer: Any, batch: Any = None, target: Target | None = None
    ) -> float:
        """One training step: the user's own train_step when given, else the standard one;
        ``target``'s (a rebuilt one, whose step keeps its own state) where given."""
        batch = batch or self.batch
        target = target or self.target
        if target.train_step is not None:
            loss = target.train_step(model, batch, optimizer)
        else:
            optimizer.zero_grad(set_to_none=True)
            loss = target.loss_fn(call_model(model, batch[0]), batch[1])  # type: ignore[misc]
            loss.backward()
            optimizer.step()

        try:
            return loss_value(loss, 1)
        except DlciError as exc:
            raise TargetFault(exc.message) from None

    def loader_batches(self, loader: Any, count: int) -> list[Any]:
        """Up to ``count`` (inputs, targets) batches of ``loader``, on the device.

        Every check starts from the same random state (``preserved``), so a loader's first
        batches are the same for each: the longest read so far is kept (up to CACHE_BYTES)
        and a later check takes its first ``count`` (lr-range reads 100 training batches,
        label-alignment then takes 60 and leakage 20 of them, without reading again).
        """
        key = f"batches:{id(loader)}"
        kept = self.shared.get(key)
        if kept is not None and (kept[0] >= count or len(kept[1]) < kept[0]):
            return list(kept[1][:count])  # enough of them, or all the loader has
        items = itertools.islice(iter(loader), count)
        batches = [to_device(as_pair(b, i), self.device) for i, b in enumerate(items)]
        if nbytes(batches) <= CACHE_BYTES:
            self.shared[key] = (count, batches)
        return batches

    def classes(self) -> tuple[int | None, str]:
        """(the number of classes to judge by, a note): ``num_classes``, unless the model's
        (N, K) scores say otherwise (a hand-given 10 for a head of 4 labels), when the
        outputs' width counts and the note says so."""
        given = self.target.num_classes
        width = self.memo("output-width", self._output_width)
        if given and width and width != given:
            return width, f"num_classes={given} is given, but the outputs score {width} classes"
        return given, ""

    def _output_width(self) -> int | None:
        import torch

        flags = {module: module.training for module in self.model.modules()}
        try:
            self.model.eval()
            with torch.no_grad():
                outputs = self.evaluate()
            scores = logits_of(outputs, batch_size_of(self.batch), self.target.num_classes)
        except (Exception, SystemExit):  # the checks that run the model report these themselves
            return None
        finally:
            for module, flag in flags.items():
                module.training = flag
        if isinstance(scores, torch.Tensor) and scores.ndim == 2 and scores.shape[1] >= 2:
            return int(scores.shape[1])
        return None

    def is_classification(self) -> bool:
        targets = self.batch[1]
        return (
            bool(self.target.num_classes)
            and getattr(targets, "dtype", None) is not None
            and (not targets.dtype.is_floating_point)
        )


@contextmanager
def preserved(target: Target) -> Iterator[None]:
    """Restore the model's weights, train/eval flags and dropout rates, every random
    generator, and the loaders' own generators after the block."""
    import torch

    model = target.model
    weights = copy.deepcopy(model.state_dict())
    modes = {name: module.training for name, module in model.named_modules()}
    rates = {
        name: module.p
        for name, module in model.named_modules()
        if isinstance(getattr(module, "p", None), float)
    }
    grads = {
        name: (None if p.grad is None else p.grad.detach().clone())
        for name, p in model.named_parameters()
    }
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        states["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover
        np = None  # type: ignore[assignment]
    loader_generators = [
        (gen, gen.get_state())
        for loader in (target.train_loader, target.val_loader)
        for gen in (
            getattr(loader, "generator", None),
            getattr(getattr(loader, "sampler", None), "generator", None),
            # a loader given a batch_sampler keeps an unused sampler: the real one is inside
            getattr(
                getattr(getattr(loader, "batch_sampler", None), "sampler", None), "generator", None
            ),
        )
        if isinstance(gen, torch.Generator)
    ]
    try:
        yield
    finally:
        model.load_state_dict(weights)
        for name, module in model.named_modules():
            if name in modes:
                module.training = modes[name]
            if name in rates:
                module.p = rates[name]
        for name, p in model.named_parameters():
            p.grad = grads.get(name)
        torch.set_rng_state(states["torch"])
        random.setstate(states["python"])
        if "cuda" in states:
            torch.cuda.set_rng_state_all(states["cuda"])
        if "numpy" in states:
            np.random.set_state(states["numpy"])
        for gen, state in loader_generators:
            gen.set_state(state)


def nbytes(batches: Any) -> int:
    """Bytes in the tensors of a batch, or of a list of batches."""
    sizes: list[int] = []
    tree_map(lambda leaf: sizes.append(int(leaf.element_size() * leaf.numel())), batches)
    return sum(sizes)


def layer_name(name: str) -> str:
    """``head.2.weight`` -> ``head.2``: the module a parameter belongs to."""
    return name.rsplit(".", 1)[0] if "." in name else name


def difference(a: Any, b: Any) -> tuple[float, float]:
    """(largest change, the outputs' scale) between two output tensors of one shape, safe
    for non-finite values: a NaN or an infinity in the same place on both sides is no change
    (a logit masked to -inf), one where the other side differs is an infinite change; the
    scale is 1 + the largest finite magnitude.

    >>> import torch
    >>> inf = float("inf")
    >>> difference(torch.tensor([1.0, -inf, 2.0]), torch.tensor([1.5, -inf, 2.0]))
    (0.5, 3.0)
    >>> difference(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 0.0]))
    (inf, 2.0)
    """
    import torch

    a, b = a.detach().float(), b.detach().float()
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    finite = torch.isfinite(a) & torch.isfinite(b)
    if bool((~same & ~finite).any()):
        change = math.inf
    else:
        gaps = (a - b).abs()[finite & ~same]
        change = float(gaps.max()) if gaps.numel() else 0.0
    magnitudes = a.abs()[torch.isfinite(a)]
    scale = 1.0 + (float(magnitudes.max()) if magnitudes.numel() else 0.0)
    return change, scale


def fmt(value: float) -> str:
    return f"{value:.3g}"


def number(value: float) -> str:
    """A threshold as people write it: ``1e-05`` -> ``1e-5``, ``1e+03`` -> ``1e3``.

    >>> number(1e-5), number(1e-4), number(2.5e-4), number(1e3), number(0.3), number(1e12)
    ('1e-5', '1e-4', '2.5e-4', '1000', '0.3', '1e12')
    """
    text = f"{value:.3e}" if 0 < abs(value) < 1e-3 else f"{value:g}"
    mantissa, _, exponent = text.partition("e")
    if not exponent:
        return text
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"
