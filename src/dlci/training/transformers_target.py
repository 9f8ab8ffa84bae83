"""``dlci.Target.from_transformers``: a Transformers model, or a ``Trainer``, as a Target.

The step is the Transformers convention: the collated batch, ``labels`` included, goes to the
model, and its forward returns the loss (``model(**batch).loss``); with a Trainer, its own
``compute_loss`` computes it (a subclass's override included), and its optimizer, collator,
data loaders and gradient clipping are reused. docs/target.md says what is reused and what
is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlci.errors import DlciError
from dlci.training.adapters import PairLoader, parameters_swapped, require
from dlci.training.text_batches import GroupedBatches, pad_settings

DEFAULT_BATCH_SIZE = 8
DEFAULT_LR = 5e-5  # the Trainer's default learning rate, for a model given without one
LABELS = ("labels",)  # where the Transformers convention puts the targets of a batch


def label_names(model: Any, trainer: Any = None) -> tuple[str, ...]:
    """The batch keys the model takes its targets under, as the Trainer finds them: the
    Trainer's ``label_names`` (its ``args.label_names``, else Transformers' own search of the
    model's forward), for a model that search alone; ``labels`` when it finds none.

    >>> from transformers import BertConfig, BertForQuestionAnswering
    >>> label_names(BertForQuestionAnswering(BertConfig(num_hidden_layers=1)))
    ('start_positions', 'end_positions')
    """
    names = getattr(trainer, "label_names", None) if trainer is not None else None
    if not names:
        from transformers.utils.generic import find_labels

        names = find_labels(type(peft_base(model)))  # type: ignore[no-untyped-call]
    return tuple(str(n) for n in names) or LABELS


def peft_base(model: Any) -> Any:
    """The Transformers model inside a PEFT wrapper (``peft.get_peft_model``: a LoRA or other
    adapter over a ``PreTrainedModel``), else ``model`` itself. PEFT is not imported: its
    wrapper is known by its class's module and its ``get_base_model``."""
    wrapped = any(cls.__module__.startswith("peft.") for cls in type(model).__mro__)
    if wrapped and callable(getattr(model, "get_base_model", None)):
        return model.get_base_model()
    return model


def _is_trainer(obj: Any) -> bool:
    return any(
        cls.__name__ == "Trainer" and cls.__module__.startswith("transformers.")
        for cls in (type(obj).__mro__)
    )


def from_transformers(
    model: Any,
    train_dataset: Any = None,
    *,
    eval_dataset: Any = None,
    data_collator: Any = None,
    batch_size: int | None = None,
    optimizer: Any = None,
    num_classes: int | None = None,
) -> dict[str, Any]:
    """The Target of a ``PreTrainedModel`` and a data set, or of a ``Trainer`` instance, as
    dlci.Target's keyword arguments (the adapter never imports the Target it feeds)."""
    transformers = require("transformers", "transformers", "Target.from_transformers")
    if _is_trainer(model):
        return _from_trainer(
            model, train_dataset, eval_dataset=eval_dataset, data_collator=data_collator,
            batch_size=batch_size, optimizer=optimizer, num_classes=num_classes,
        )  # fmt: skip
    if not isinstance(peft_base(model), transformers.PreTrainedModel):
        raise DlciError(
            f"Target.from_transformers needs a PreTrainedModel, a PEFT model over one, or a "
            f"Trainer, got "
            f"{type(model).__name__}",
            hint="for a plain torch.nn.Module use dlci.Target(model, optimizer, train_loader, "
            "loss_fn=...)",
        )
    if train_dataset is None:
        raise DlciError(
            "Target.from_transformers(model, train_dataset): no train_dataset",
            hint="pass the training data set (a Trainer instance brings its own)",
        )
    collator = data_collator or transformers.default_data_collator
    size = batch_size or DEFAULT_BATCH_SIZE
    train = _loader(train_dataset, collator, size, shuffle=True)
    val = None if eval_dataset is None else _loader(eval_dataset, collator, size, shuffle=False)
    steps = TransformersSteps(model, trainer=None, labels=label_names(model))
    factory = optimizer or _default_optimizer
    return _target(model, steps, (train, val, collator), factory, num_classes)


def _from_trainer(
    trainer: Any,
    train_dataset: Any,
    *,
    eval_dataset: Any,
    data_collator: Any,
    batch_size: int | None,
    optimizer: Any,
    num_classes: int | None,
) -> dict[str, Any]:
    """A Trainer's model, data loaders (its collator, sampler and column removal), optimizer
    and ``compute_loss``."""
    given = {
        "train_dataset": train_dataset,
        "data_collator": data_collator,
        "batch_size": batch_size,
    }
    extra = [name for name, value in given.items() if value is not None]
    if extra:
        raise DlciError(
            f"Target.from_transformers(trainer, ...): {', '.join(extra)} given with a Trainer",
            hint="a Trainer brings its own training data, collator and batch size; set them on "
            "the Trainer (eval_dataset and optimizer may be given)",
        )
    if trainer.train_dataset is None:
        raise DlciError(
            "Target.from_transformers(trainer): the Trainer has no train_dataset",
            hint="Trainer(model, args, train_dataset=...)",
        )
    if optimizer is None and trainer.optimizer is not None:
        raise DlciError(
            "Target.from_transformers(trainer): the Trainer was given an optimizer instance, "
            "and dl-ci builds a fresh optimizer for each run",
            hint="give Trainer(optimizer_cls_and_kwargs=(AdamW, {...})) instead of "
            "optimizers=(...), or pass optimizer=lambda params: ... to from_transformers",
        )
    train = trainer.get_train_dataloader()
    val = None
    if eval_dataset is not None or trainer.eval_dataset is not None:
        if eval_dataset is None and isinstance(trainer.eval_dataset, dict):
            raise DlciError(
                "Target.from_transformers(trainer): the Trainer has several eval data sets",
                hint="pass eval_dataset=... (one of them)",
            )
        val = trainer.get_eval_dataloader(eval_dataset)
    steps = TransformersSteps(
        trainer.model, trainer=trainer, labels=label_names(trainer.model, trainer)
    )
    factory = optimizer or steps.trainer_optimizer
    loaders = (train, val, trainer.data_collator)
    return _target(trainer.model, steps, loaders, factory, num_classes)


def _target(
    model: Any,
    steps: TransformersSteps,
    loaders: tuple[Any, Any, Any],
    factory: Any,
    classes: int | None,
) -> dict[str, Any]:
    """The Target's keyword arguments: the loaders (train, eval, their collator) as (inputs,
    labels) pairs of batches grouped to one length each, the steps and the optimizer factory."""
    train, val, collator = loaders
    pad_id, side = pad_settings(model, collator)
    keys = steps.labels
    every = len(keys) > 1
    train_view = PairLoader(GroupedBatches(train, pad_id, side), "the training data", keys, every)
    val_view = None
    if val is not None:
        val_view = PairLoader(GroupedBatches(val, pad_id, side), "the evaluation data", keys, every)
    return dict(  # the keyword arguments of dlci.Target
        model=model,
        optimizer=factory,
        train_loader=train_view,
        loss_fn=steps.loss_fn,
        val_loader=val_view,
        num_classes=classes or classifier_classes(model),
        train_step=steps.train_step,
        eval_step=steps.eval_step,
        vocab=getattr(collator, "tokenizer", None),  # the doctor's figure decodes ids with it
    )


def _loader(dataset: Any, collator: Any, size: int, *, shuffle: bool) -> Any:
    from torch.utils.data import DataLoader

    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise DlciError(
            f"Target.from_transformers: batch_size must be a whole number >= 1, got {size!r}"
        )
    return DataLoader(dataset, batch_size=size, shuffle=shuffle, collate_fn=collator)


def _default_optimizer(params: Any) -> Any:
    import torch

    return torch.optim.AdamW(params, lr=DEFAULT_LR)


def classifier_classes(model: Any) -> int | None:
    """The classes of a single-label sequence-classification head (``num_labels``), a PEFT
    model's included."""
    model = peft_base(model)
    config = getattr(model, "config", None)
    labels = getattr(config, "num_labels", None)
    if (
        type(model).__name__.endswith("ForSequenceClassification")
        and getattr(config, "problem_type", None) in (None, "single_label_classification")
        and isinstance(labels, int)
        and labels >= 2
    ):
        return labels
    return None


@dataclass
class TransformersSteps:
    """The step, evaluation and loss as Transformers defines them, for the model or a Trainer."""

    model: Any
    trainer: Any
    labels: tuple[str, ...] = LABELS  # the batch keys of the targets (label_names)

    def trainer_optimizer(self, params: Any) -> Any:
        """The Trainer's ``create_optimizer`` over ``params`` (the model's or a copy's)."""
        trainer = self.trainer
        with parameters_swapped(trainer.model, list(params)):
            trainer.optimizer = None
            try:
                return trainer.create_optimizer()
            finally:
                trainer.optimizer = None  # the Trainer's own training builds its own

    def _batch(self, pair: Any) -> dict[str, Any]:
        inputs, labels = pair
        if len(self.labels) > 1:  # several targets (a QA head's start and end): a dict
            return {**inputs, **labels}
        return {**inputs, self.labels[0]: labels}

    def train_step(self, model: Any, batch: Any, optimizer: Any) -> Any:
        """One step as the Trainer takes it: train mode, the loss, backward, gradient clipping
        (a Trainer's ``max_grad_norm``), the optimizer step, gradients zeroed; each part in
        the annotation ``dlci profile`` splits the step by."""
        import torch
        from torch.profiler import record_function

        model.train()
        inputs = self._batch(batch)
        trainer = self.trainer
        if trainer is None:
            optimizer.zero_grad(set_to_none=True)
        with record_function("dlci/forward"):
            if trainer is None:
                loss = self._model_loss(model(**inputs))
            else:
                loss = trainer.compute_loss(model, inputs)
        with record_function("dlci/backward"):
            if trainer is None:
                loss.backward()
            else:
                trainer.accelerator.backward(loss)
        with record_function("dlci/optimizer"):
            clip = None if trainer is None else trainer.args.max_grad_norm
            if clip is not None and clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            if trainer is not None:
                model.zero_grad(set_to_none=True)  # the Trainer zeroes after the step
        return loss

    def eval_step(self, model: Any, batch: Any) -> Any:
        """The model's outputs in eval mode, with the loss it computes from the labels (the
        Trainer's ``compute_loss`` for a Trainer), as its evaluation loop does."""
        import torch

        model.eval()
        inputs = self._batch(batch)
        with torch.no_grad():
            if self.trainer is None:
                return model(**inputs)
            loss, outputs = self.trainer.compute_loss(model, inputs, return_outputs=True)
        outputs["loss"] = loss
        return outputs

    def loss_fn(self, outputs: Any, labels: Any) -> Any:
        """The loss in ``outputs`` (computed by the model from the labels); for outputs of a
        forward without labels, a sequence classifier's loss from Transformers' own loss
        function for its head."""
        loss = getattr(outputs, "loss", None)
        if loss is not None:
            return loss
        if classifier_classes(self.model) is None or getattr(outputs, "logits", None) is None:
            raise DlciError(
                "the model's outputs carry no loss",
                hint="dl-ci scores a Transformers model by the loss its forward computes "
                "from labels",
            )
        from transformers.loss.loss_utils import ForSequenceClassificationLoss

        return ForSequenceClassificationLoss(labels, outputs.logits, self.model.config)

    @staticmethod
    def _model_loss(outputs: Any) -> Any:
        loss = getattr(outputs, "loss", None)
        if loss is None:
            raise DlciError(
                "the model returned no loss for a batch with labels",
                hint="Target.from_transformers needs a model whose forward computes the loss "
                "from labels (a *For... head); check that the collator keeps 'labels'",
            )
        return loss
