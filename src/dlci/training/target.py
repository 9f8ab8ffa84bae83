"""The Target contract: how a user's model, optimizer and data reach dl-ci.

A user exposes a function, named ``"package.module:function"``, that returns a ``Target``.
This module loads it (``--target``, or ``[tool.dlci] target`` in pyproject.toml) and checks
it, turning every way it can go wrong into one ``DlciError`` that says what to fix.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlci.errors import DlciError
from dlci.fsutil import read_input
from dlci.ladder.yamlsource import LADDER_LIMIT
from dlci.training import lightning_target, transformers_target
from dlci.training.guard import exited, raised_by_dlci, user_error

CONTRACT_DOC = "docs/target.md"


class OptimizerFromModel:
    """An optimizer factory that is given the model (or the copy a check trains), not its
    parameters: a project's own ``configure_optimizers`` method, called as written.

    >>> import torch
    >>> factory = OptimizerFromModel(lambda model: torch.optim.SGD(model.parameters(), lr=0.1))
    >>> layer = torch.nn.Linear(2, 1)
    >>> len(build_optimizer(factory, layer).param_groups[0]["params"])
    2
    """

    def __init__(self, build: Callable[[Any], Any]) -> None:
        if not callable(build):
            raise DlciError(
                f"OptimizerFromModel needs a function of the model, got {type(build).__name__}",
                hint="OptimizerFromModel(lambda model: model.configure_optimizers(...))",
            )
        self.build = build

    def __call__(self, params: Iterable[Any]) -> Any:
        raise DlciError(
            "an OptimizerFromModel factory was called with parameters: it is given the model",
            hint="call dlci.training.target.build_optimizer(factory, model)",
        )

    def __repr__(self) -> str:
        return f"OptimizerFromModel({self.build!r})"


def build_optimizer(factory: Any, model: Any) -> Any:
    """A fresh optimizer for ``model`` from the Target's factory: the factory given the
    model (OptimizerFromModel), else its trainable parameters."""
    if isinstance(factory, OptimizerFromModel):
        return factory.build(model)
    return factory([p for p in model.parameters() if p.requires_grad])


@dataclass
class Target:
    """A model and what it takes to train it, as the user's own code builds them.

    ``optimizer`` is a factory (``params -> Optimizer``), so dl-ci can build a fresh one for
    each run; ``OptimizerFromModel(model -> Optimizer)`` for one that reads the model (a
    ``configure_optimizers`` method). When ``train_step`` is given, dl-ci calls it instead
    of its standard step (zero_grad, forward, ``loss_fn``, backward, step), so bugs inside it
    stay visible.
    """

    model: Any  # torch.nn.Module
    optimizer: Callable[[Iterable[Any]], Any]
    train_loader: Iterable[Any]
    loss_fn: Callable[[Any, Any], Any] | None = None
    val_loader: Iterable[Any] | None = None
    num_classes: int | None = None
    train_step: Callable[[Any, Any, Any], Any] | None = None
    eval_step: Callable[[Any, Any], Any] | None = None
    # the lowest value the loss can take on a batch, for a loss dl-ci cannot measure it of (a
    # train_step of its own): a number, or a function of the batch; where the loss is a
    # loss_fn the floor is measured on the gate's batch (memorization/floor.py)
    loss_floor: float | Callable[[Any], float] | None = None
    # what the doctor's figure of training examples decodes token ids with: a tokenizer (its
    # ``decode``) or a sequence of tokens by id; from_transformers takes the collator's
    vocab: Any = None

    def __post_init__(self) -> None:
        import torch

        problems = []
        optimizer: object = self.optimizer  # a user may pass anything, whatever the annotation
        if not isinstance(self.model, torch.nn.Module):
            problems.append(f"model must be a torch.nn.Module, got {type(self.model).__name__}")
        if isinstance(optimizer, torch.optim.Optimizer):
            problems.append(
                "optimizer must be a factory such as "
                "lambda params: torch.optim.Adam(params, lr=1e-3), not an Optimizer instance "
                "(dl-ci builds a fresh optimizer for each run)"
            )
        elif not callable(optimizer):
            problems.append(f"optimizer must be callable, got {type(optimizer).__name__}")
        if self.train_step is None and self.loss_fn is None:
            problems.append("give loss_fn (or your own train_step)")
        for name in ("loss_fn", "train_step", "eval_step"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                problems.append(f"{name} must be callable, got {type(value).__name__}")
        if self.num_classes is not None and (
            isinstance(self.num_classes, bool)
            or not isinstance(self.num_classes, int)
            or self.num_classes < 2
        ):
            problems.append(f"num_classes must be an integer >= 2, got {self.num_classes!r}")
        floor: object = self.loss_floor
        if (
            floor is not None
            and not callable(floor)
            and (
                isinstance(floor, bool)
                or not isinstance(floor, int | float)
                or not math.isfinite(floor)
            )
        ):
            problems.append(
                f"loss_floor must be a finite number or a function of the batch, got {floor!r}"
            )
        if not hasattr(self.train_loader, "__iter__"):
            problems.append(
                f"train_loader must be iterable, got {type(self.train_loader).__name__}"
            )
        if problems:
            raise DlciError(
                "invalid dlci.Target: " + "; ".join(problems), hint=f"see {CONTRACT_DOC}"
            )

    @classmethod
    def from_lightning(
        cls,
        module: Any,
        datamodule: Any = None,
        *,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        num_classes: int | None = None,
        loss_fn: Callable[[Any, Any], Any] | None = None,
        eval_step: Callable[[Any, Any], Any] | None = None,
    ) -> Target:
        """A LightningModule's own ``training_step``, ``configure_optimizers`` and batch hooks,
        run without a Trainer (training/lightning_target.py; docs/target.md)."""
        return cls(
            **lightning_target.from_lightning(
                module,
                datamodule,
                train_dataloaders=train_dataloaders,
                val_dataloaders=val_dataloaders,
                num_classes=num_classes,
                loss_fn=loss_fn,
                eval_step=eval_step,
            )
        )

    @classmethod
    def from_transformers(
        cls,
        model: Any,
        train_dataset: Any = None,
        *,
        eval_dataset: Any = None,
        data_collator: Any = None,
        batch_size: int | None = None,
        optimizer: Callable[[Iterable[Any]], Any] | None = None,
        num_classes: int | None = None,
    ) -> Target:
        """A Transformers model whose forward returns a loss from ``labels``, or a ``Trainer``
        with its optimizer, collator and data sets (training/transformers_target.py)."""

        return cls(
            **transformers_target.from_transformers(
                model,
                train_dataset,
                eval_dataset=eval_dataset,
                data_collator=data_collator,
                batch_size=batch_size,
                optimizer=optimizer,
                num_classes=num_classes,
            )
        )


def target_from_pyproject(directory: Path | None = None) -> str | None:
    """The configuration's ``target``: dlci.toml's top-level key when that file exists, else
    ``[tool.dlci] target`` in pyproject.toml, in ``directory`` (default: the cwd).

    The same file and messages as ``dlci.config`` (a lower room cannot import it): a bounded
    read, malformed TOML at its line, a target that is not a text at the key's line.
    """
    folder = directory or Path.cwd()
    found: list[tuple[str, dict[str, Any], str]] = []
    for name, prefix in (("dlci.toml", ()), ("pyproject.toml", ("tool", "dlci"))):
        read = _config_table(folder / name, prefix, name if directory is None else None)
        if read is not None:
            found.append((name, *read))
    if len(found) == 2:
        raise DlciError(
            "both dlci.toml and pyproject.toml ([tool.dlci]) configure dl-ci",
            hint="keep one: move [tool.dlci]'s keys into dlci.toml, or delete dlci.toml",
            file="dlci.toml" if directory is None else str(folder / "dlci.toml"),
        )
    if not found:
        return None
    name, table, text = found[0]
    value = table.get("target")
    if value is not None and (not isinstance(value, str) or not value.strip()):
        line = next(
            (i for i, row in enumerate(text.splitlines(), 1) if re.match(r"\s*target\s*=", row)),
            None,
        )
        raise DlciError(
            f"target: expected a text, got {value!r:.40} ({type(value).__name__})",
            hint="write target = 'package.module:function'",
            file=name if directory is None else str(folder / name),
            line=line,
        )
    return value.strip() if isinstance(value, str) else None


# a dotted key or table header of 32 parts or more at a line's start (as dlci.config.source)
_DEEP_KEY = re.compile(
    r"^[ \t]*(?:\[\[?[ \t]*)?(?:(?:[A-Za-z0-9_-]+|\"[^\"\n]*\"|'[^'\n]*')[ \t]*\.[ \t]*){32}",
    re.MULTILINE,
)


def _config_table(
    path: Path, prefix: tuple[str, ...], display: str | None
) -> tuple[dict[str, Any], str] | None:
    """The dl-ci table of one configuration file and its text, or None without one."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

    if not path.exists() and not path.is_symlink():
        return None
    blob = read_input(path, what="configuration file", limit=LADDER_LIMIT)
    try:
        text = blob.decode("utf-8")
        deep = _DEEP_KEY.search(text)  # the TOML reader is quadratic in a key's parts
        if deep:
            raise DlciError(
                "a key of more than 32 dotted parts; a configuration needs 5",
                file=display or str(path),
                line=text.count("\n", 0, deep.start()) + 1,
            )
        table: Any = tomllib.loads(text)
    except UnicodeDecodeError as exc:
        raise DlciError(f"not UTF-8 text (byte {exc.start})", file=display or str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        raise DlciError(
            f"malformed TOML: {str(exc)[:300]}",
            hint="check the quoting and the brackets on that line (https://toml.io)",
            file=display or str(path),
            line=int(found.group(1)) if found else max(1, len(text.splitlines())),
        ) from None
    for part in prefix:
        table = table.get(part) if isinstance(table, dict) else None
    if table is None:
        return None
    if not isinstance(table, dict):
        raise DlciError("[tool.dlci] must be a table", file=display or str(path))
    return table, text


def resolve_spec(spec: str | None) -> str:
    """The target spec from ``--target``, else $DLCI_TARGET, else pyproject.toml."""
    spec = spec or os.environ.get("DLCI_TARGET") or target_from_pyproject()
    if not spec:
        raise DlciError(
            f"no target given: no --target, no DLCI_TARGET, and no target in dlci.toml or "
            f"pyproject.toml's [tool.dlci] in {Path.cwd()}",
            hint="pass --target package.module:function, set DLCI_TARGET, or add "
            "[tool.dlci] target = 'package.module:function' to pyproject.toml (run dl-ci "
            "from the project's root folder)",
        )
    return spec


def load_target(spec: str, **kwargs: Any) -> Target:
    """Import ``"package.module:function"``, call the function, and check what it returns.

    The current directory is importable, so a project's own packages load without being
    installed; it goes last on the path, after the standard library and the installed
    packages, so a file the project (or an earlier phase of a job) leaves there, such as a
    ``statistics.pyc``, never stands in for a module of theirs.
    """
    module_name, function_name = _split(spec)
    if str(Path.cwd()) not in sys.path and "" not in sys.path:
        sys.path.append(str(Path.cwd()))
    module = _import(module_name, spec)
    factory = getattr(module, function_name, None)
    if factory is None:
        public = sorted(
            n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))
        )
        raise DlciError(
            f"--target {spec}: module '{module_name}' has no attribute '{function_name}'",
            hint="callables in that module: " + (", ".join(public[:12]) or "none"),
        )
    if not callable(factory):
        raise DlciError(
            f"--target {spec}: '{function_name}' is a {type(factory).__name__}, not a function",
            hint="name a function that returns dlci.Target",
        )
    _check_callable_without_arguments(factory, spec, function_name, kwargs)
    try:
        target = factory(**kwargs)
    except DlciError:
        raise
    except SystemExit as exc:
        raise exited(exc, f"{function_name}(), the target's factory") from None
    except Exception as exc:
        if raised_by_dlci(exc):
            raise
        raise user_error(exc, f"--target {spec}: {function_name}()") from None
    if not isinstance(target, Target):
        raise DlciError(
            f"--target {spec}: {function_name}() returned {type(target).__name__}, not dlci.Target",
            hint="return dlci.Target(model, optimizer, train_loader, loss_fn=...)",
        )
    return target


def _check_callable_without_arguments(
    factory: Any, spec: str, function_name: str, kwargs: dict[str, Any]
) -> None:
    """A factory that cannot be called as dl-ci calls it (``os:system`` needs a command) is
    the user's mistake, named before the call: the TypeError it would raise comes from
    dl-ci's own line, and would read as a dl-ci bug."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without a signature: the call will tell
        return
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        needed = [
            name
            for name, p in signature.parameters.items()
            if p.default is p.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            and name not in kwargs
        ]
        raise DlciError(
            f"--target {spec}: {function_name}{signature} cannot be called without "
            f"arguments ({exc})",
            hint="name a function that takes no required arguments"
            + (f" (this one needs {', '.join(needed)})" if needed else "")
            + " and returns dlci.Target, e.g. def make_target() -> dlci.Target",
        ) from None


def _split(spec: str) -> tuple[str, str]:
    module_name, sep, function_name = spec.strip().partition(":")
    if (
        not sep
        or not module_name
        or not function_name.isidentifier()
        or not all(part.isidentifier() for part in module_name.split("."))
    ):
        raise DlciError(
            f"--target {spec!r}: expected 'package.module:function'",
            hint="for example --target digits_example.target:make_target",
        )
    return module_name, function_name


def _import(module_name: str, spec: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise DlciError(
                f"--target {spec}: no module named '{exc.name}'",
                hint=f"run dl-ci from your project's root, or install the project "
                f"(cwd: {Path.cwd()})",
            ) from None
        raise DlciError(
            f"--target {spec}: importing '{module_name}' failed: {exc}",
            hint="a dependency of your module is missing:\n" + _short_traceback(),
        ) from None
    except SystemExit as exc:
        raise exited(exc, f"importing {module_name}") from None
    except Exception as exc:
        raise user_error(exc, f"--target {spec}: importing '{module_name}'") from None


def _short_traceback(limit: int = 3) -> str:
    """The last frames of the current exception: the user's own code, not dl-ci's."""
    frames = traceback.extract_tb(sys.exc_info()[2])[-limit:]
    return "".join(traceback.format_list(frames)).rstrip()
