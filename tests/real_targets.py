"""The targets of tests/test_real_code.py: real public training code (tests/data/code, vendored
unchanged, and code shipped inside Lightning, Transformers and PEFT), each wrapped as
docs/target.md shows, on synthetic data of the shapes it was written for (nothing is
downloaded). Each project has one planted bug of the kind it could really have, a keyword of
its factory. ``dlci ... --target real_targets:NAME`` loads any of them."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import dlci

CODE = Path(__file__).parent / "data" / "code"
for _project in (
    "nanogpt", "lightning_hydra_template", "lightning_examples", "mingpt", "word_language_model"
):  # fmt: skip
    if str(CODE / _project) not in sys.path:
        sys.path.insert(0, str(CODE / _project))

VOCAB, LENGTH = 32, 16


def tokens(n: int, seed: int, vocab: int = VOCAB, length: int = LENGTH) -> torch.Tensor:
    """A Markov chain of two successors per token (the same chain for every split): next-token
    data with something to learn and nothing to copy."""
    successors = torch.randint(0, vocab, (vocab, 2), generator=torch.Generator().manual_seed(9))
    g = torch.Generator().manual_seed(seed)
    out = torch.empty(n, length + 1, dtype=torch.long)
    out[:, 0] = torch.randint(0, vocab, (n,), generator=g)
    for i in range(1, length + 1):
        out[:, i] = successors[out[:, i - 1], torch.randint(0, 2, (n,), generator=g)]
    return out


def next_token_loaders(
    n: int = 512, batch: int = 16, *, shifted: bool = True
) -> tuple[DataLoader, DataLoader]:
    def split(t: torch.Tensor) -> TensorDataset:
        return TensorDataset(t[:, :-1], t[:, 1:] if shifted else t[:, :-1])

    g = torch.Generator().manual_seed(0)
    train = DataLoader(split(tokens(n, 1)), batch, shuffle=True, generator=g)
    return train, DataLoader(split(tokens(128, 2)), batch)


def digits(n: int, seed: int, *, normalized: bool = True) -> TensorDataset:
    """MNIST-shaped images (1x28x28): ten faint templates under noise, so a model learns them
    over steps, not at once; pixels in [0, 1] as ``transforms.ToTensor()`` gives them, or
    ``normalized`` as ``Normalize((0.1307,), (0.3081,))`` then makes them (zero mean, unit
    scale)."""
    templates = torch.rand(10, 1, 28, 28, generator=torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    pixels = 0.3 + 0.2 * templates[labels] + 0.25 * torch.randn(n, 1, 28, 28, generator=g)
    pixels = pixels.clamp(0.0, 1.0)
    if normalized:
        pixels = (pixels - pixels.mean()) / pixels.std()
    return TensorDataset(pixels, labels)


def image_loaders(
    batch: int = 64, *, normalized: bool = True, by_class: bool = False
) -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(0)
    train = digits(512, 1, normalized=normalized)
    if by_class:  # saved class by class and read in order: every batch holds one class
        order = torch.argsort(train.tensors[1], stable=True)
        train = TensorDataset(train.tensors[0][order], train.tensors[1][order])
    return (
        DataLoader(train, batch, shuffle=not by_class, generator=g),
        DataLoader(digits(256, 2, normalized=normalized), batch),
    )


# ---- Lightning: ashleve/lightning-hydra-template's MNISTLitModule and SimpleDenseNet --------


def hydra_mnist(*, view_bug: bool = False) -> dlci.Target:
    """configs/model/mnist.yaml as Hydra instantiates it: Adam 1e-3 and a ReduceLROnPlateau
    on val/loss (``_partial_`` factories), torchmetrics objects logged from training_step,
    ``self.trainer.model.parameters()`` in configure_optimizers.

    Planted bug: the net flattens with ``view(-1, batch).t()`` (a transpose where a view
    belongs), which mixes the examples of a batch."""
    from models.components.simple_dense_net import SimpleDenseNet
    from models.mnist_module import MNISTLitModule

    class Transposed(SimpleDenseNet):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.model(x.reshape(-1, x.size(0)).t())

    torch.manual_seed(0)
    net = (Transposed if view_bug else SimpleDenseNet)(
        input_size=784, lin1_size=64, lin2_size=128, lin3_size=64, output_size=10
    )
    module = MNISTLitModule(
        net=net,
        optimizer=functools.partial(torch.optim.Adam, lr=0.001, weight_decay=0.0),
        scheduler=functools.partial(
            torch.optim.lr_scheduler.ReduceLROnPlateau, mode="min", factor=0.1, patience=10
        ),
        compile=False,
    )
    train, val = image_loaders()
    return dlci.Target.from_lightning(
        module, train_dataloaders=train, val_dataloaders=val, loss_fn=F.cross_entropy
    )


# ---- Lightning: the demos shipped inside the lightning package -------------------------------


SMALL_TRANSFORMER = {"ninp": 32, "nhead": 2, "nhid": 64, "nlayers": 1}  # its 200s cut down


def lightning_transformer() -> dlci.Target:
    """lightning.pytorch.demos.LightningTransformer (the Transformer of Lightning's README and
    examples), its own training_step and SGD (lr 0.1), its Transformer at a small size, on
    next-token data of a 32-token vocabulary.

    As written it sees the future twice (Lightning issue #20920): the encoder has no mask
    (its ``src_mask`` is built and never passed), and the decoder is fed the targets it
    predicts, unshifted."""
    from lightning.pytorch.demos.transformer import Transformer

    return _demo_target(Transformer)


def _demo_target(transformer: type) -> dlci.Target:
    """LightningTransformer with ``transformer`` (its Transformer class, or one fixed) at the
    small size, on next-token data."""
    from lightning.pytorch.demos import LightningTransformer

    torch.manual_seed(0)
    module = LightningTransformer(vocab_size=VOCAB)
    module.model = transformer(vocab_size=VOCAB, **SMALL_TRANSFORMER)
    train, val = next_token_loaders()
    return dlci.Target.from_lightning(
        module,
        train_dataloaders=train,
        val_dataloaders=val,
        loss_fn=lambda out, target: F.nll_loss(out, target.reshape(-1)),
    )


def lightning_transformer_fixed() -> dlci.Target:
    """The same module with its future leak fixed (Lightning issue #20920): the encoder and
    the decoder's memory under the causal mask, the decoder fed the targets shifted right
    (which, for next-token targets, are the inputs)."""
    import math

    from lightning.pytorch.demos.transformer import Transformer

    class Causal(Transformer):
        def forward(self, inputs: torch.Tensor, target: torch.Tensor, mask=None) -> torch.Tensor:
            mask = self.generate_square_subsequent_mask(inputs.shape[1]).to(inputs.device)
            embedded = self.pos_encoder(self.embedding(inputs) * math.sqrt(self.ninp))
            out = self.transformer(
                embedded, embedded, src_mask=mask, tgt_mask=mask, memory_mask=mask
            )
            return F.log_softmax(self.decoder(out), dim=-1).view(-1, self.vocab_size)

    return _demo_target(Causal)


# ---- Lightning: examples/pytorch/basics/backbone_image_classifier.py (Lightning's own) -----


def lightning_backbone(*, sorted_data: bool = False) -> dlci.Target:
    """LitClassifier(Backbone()) as LightningCLI builds it (Adam at its default 1e-4) on
    MNIST-shaped images as its MyDataModule gives them (``ToTensor()`` pixels, batches of 32).

    Planted bug: the training data stored class by class and read without shuffling (the
    example's own train_dataloader passes no ``shuffle=True``; MNIST's file is mixed, so it
    gets away with it), so every batch holds one class."""
    from backbone_image_classifier import Backbone, LitClassifier

    torch.manual_seed(0)
    module = LitClassifier(Backbone())
    train, val = image_loaders(batch=32, normalized=False, by_class=sorted_data)
    return dlci.Target.from_lightning(
        module, train_dataloaders=train, val_dataloaders=val, loss_fn=F.cross_entropy
    )


# ---- Transformers and PEFT from PyPI: a tiny BERT on the transformers example's topics -------

EXAMPLE_TEXT = Path(__file__).resolve().parents[1] / "examples" / "transformers"


def _text():  # the example's word-level tokenizer and four-topic sentences (nothing downloaded)
    if str(EXAMPLE_TEXT) not in sys.path:
        sys.path.insert(0, str(EXAMPLE_TEXT))
    from transformers_example import text

    return text


def _bert(labels: int = 4):
    """The transformers example's tiny BERT classifier (two layers of width 32)."""
    _text()  # the example on sys.path
    from transformers_example.model import tiny_bert

    return tiny_bert(labels)


@functools.cache
def _pretrained_encoder() -> dict[str, torch.Tensor]:
    """A base to adapt, as LoRA is used: the tiny BERT pretrained by masked-language
    modelling (15% of tokens masked, 400 AdamW steps) on the example's sentences, no labels
    seen; its encoder's weights, computed once per process (nothing is downloaded)."""
    from transformers import BertForMaskedLM, DataCollatorForLanguageModeling

    text = _text()
    tokenizer = text.tokenizer()
    tokenizer.mask_token = "[UNK]"  # the word-level vocabulary has no [MASK]: [UNK] stands in
    collate = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    rows = [{"input_ids": e["input_ids"]} for e in text.encoded(256, seed=5)]
    state = torch.random.get_rng_state()
    torch.manual_seed(1)
    model = BertForMaskedLM(_bert().config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(400):
        batch = collate(rows[(step * 32) % 256 : (step * 32) % 256 + 32])
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.random.set_rng_state(state)
    return {k: v.detach().clone() for k, v in model.bert.state_dict().items()}


def peft_lora(*, optimizer_before_wrapping: bool = False) -> dlci.Target:
    """PEFT's LoRA as its sequence-classification guide sets it up (``get_peft_model`` with
    task_type SEQ_CLS: adapters on query and value, the new head trainable, 5% of the
    parameters), through ``Target.from_transformers``, over a tiny BERT pretrained here by
    masked-language modelling (no pretrained weights offline), at AdamW 2e-3.

    Planted bug: the optimizer built over the model before it was wrapped (the base model's
    parameters, frozen by get_peft_model), so the adapters never train."""
    from peft import LoraConfig, get_peft_model
    from transformers import DataCollatorWithPadding

    text = _text()
    torch.manual_seed(0)
    base = _bert()
    base.bert.load_state_dict(_pretrained_encoder(), strict=False)  # pooler: fresh, as HF's
    before = list(base.parameters())
    model = get_peft_model(
        base,
        LoraConfig(task_type="SEQ_CLS", r=8, lora_alpha=16, target_modules=["query", "value"]),
    )

    def optimizer(params):
        return torch.optim.AdamW(before if optimizer_before_wrapping else params, lr=3e-3)

    return dlci.Target.from_transformers(
        model,
        text.encoded(64, seed=0),
        eval_dataset=text.encoded(32, seed=1),
        data_collator=DataCollatorWithPadding(text.tokenizer()),
        optimizer=optimizer,
    )


def weighted_trainer(*, softmax_first: bool = False) -> dlci.Target:
    """A Trainer subclass that overrides ``compute_loss`` with class weights, the pattern the
    Trainer's documentation teaches (labels popped from the inputs, the model run without them,
    CrossEntropyLoss with ``weight=``), through ``Target.from_transformers(trainer)``.

    Planted bug: the logits go through softmax before the cross-entropy (which applies its own
    log-softmax), so the loss cannot fall far."""
    import tempfile

    from torch import nn
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

    class WeightedTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            labels = inputs.pop("labels")
            outputs = model(**inputs)
            logits = outputs.get("logits")
            if softmax_first:
                logits = logits.softmax(dim=-1)
            weight = torch.tensor([1.0, 2.0, 2.0, 1.0], device=logits.device)
            loss = nn.CrossEntropyLoss(weight=weight)(
                logits.view(-1, self.model.config.num_labels), labels.view(-1)
            )
            return (loss, outputs) if return_outputs else loss

    text = _text()
    torch.manual_seed(0)
    arguments = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="dlci-trainer-"),
        learning_rate=1e-3,
        per_device_train_batch_size=16,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = WeightedTrainer(
        model=_bert(),
        args=arguments,
        train_dataset=text.encoded(64, seed=0),
        eval_dataset=text.encoded(32, seed=1),
        data_collator=DataCollatorWithPadding(text.tokenizer()),
    )
    return dlci.Target.from_transformers(trainer)


# ---- plain PyTorch: karpathy/nanoGPT's model.py ------------------------------------------


def nanogpt(
    *, unmasked: bool = False, unshifted: bool = False, no_zero_grad: bool = False
) -> dlci.Target:
    """nanoGPT's GPT wrapped as docs/target.md shows (configure_optimizers' two groups over
    the parameters dl-ci passes, its train.py step with clipping and
    ``zero_grad(set_to_none=True)``), a 2-layer config, on next-token data.

    Planted bugs: attention that sees the whole sequence (the causal mask of ones), targets
    that are the inputs unshifted, and no ``zero_grad``."""
    import nanogpt_model

    def optimizer(params, weight_decay=0.1, lr=1e-3, betas=(0.9, 0.95)):
        params = [p for p in params if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=lr, betas=betas)

    def step(model, batch, opt):
        x, y = batch
        model.train()
        _, loss = model(x, y)
        if not no_zero_grad:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    def evaluate(model, batch):
        model.eval()  # the doctor's train-eval-mode check caught this line missing
        return model(*batch)  # every position's logits, and the loss

    torch.manual_seed(0)
    config = nanogpt_model.GPTConfig(
        block_size=LENGTH, vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=32, dropout=0.0
    )
    model = nanogpt_model.GPT(config)
    if unmasked:  # attention that sees the whole sequence (a mask of ones)
        for block in model.transformer.h:
            block.attn.flash = False
            block.attn.register_buffer("bias", torch.ones(1, 1, LENGTH, LENGTH))
    train, val = next_token_loaders(shifted=not unshifted)
    return dlci.Target(
        model,
        optimizer,
        train,
        val_loader=val,
        train_step=step,
        eval_step=evaluate,
        loss_fn=lambda outputs, targets: F.cross_entropy(
            outputs[0].flatten(0, 1), targets.flatten()
        ),
        num_classes=VOCAB,
    )


# ---- plain PyTorch: karpathy/minGPT's adder project, its own data, model and Trainer loop ---


def mingpt_adder(*, unmasked: bool = False) -> dlci.Target:
    """projects/adder/adder.py as its get_config() sets it up: AdditionDataset (2-digit sums,
    the project's own data), GPT 'gpt-nano', minGPT's Trainer settings (AdamW at 5e-4 from
    ``GPT.configure_optimizers(train_config)``, called as written, clipping at 1.0, batches
    of 64; workers 0 here). The step is Trainer.run's.

    Planted bug: the causal mask of every attention layer set to ones (the whole sequence
    visible), so the sum's digits are read, not computed."""
    from adder import AdditionDataset, get_config
    from mingpt.model import GPT

    config = get_config()
    config.model.vocab_size = 10
    config.model.block_size = 6
    config.trainer.num_workers = 0
    torch.manual_seed(config.system.seed)
    model = GPT(config.model)
    if unmasked:
        for block in model.transformer.h:
            block.attn.bias.fill_(1.0)
    trainer = config.trainer

    def step(model, batch, optimizer):
        model.train()  # Trainer.run's, before its loop (adder's evaluation callback restores it)
        x, y = batch
        _logits, loss = model(x, y)
        model.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), trainer.grad_norm_clip)
        optimizer.step()
        return loss

    def evaluate(model, batch):
        model.eval()
        return model(*batch)

    g = torch.Generator().manual_seed(0)
    return dlci.Target(
        model,
        dlci.OptimizerFromModel(lambda m: m.configure_optimizers(trainer)),
        DataLoader(AdditionDataset(config.data, "train"), trainer.batch_size, shuffle=True,
                   generator=g),
        val_loader=DataLoader(AdditionDataset(config.data, "test"), trainer.batch_size),
        train_step=step,
        eval_step=evaluate,
        loss_fn=lambda outputs, targets: outputs[1],
        num_classes=10,
    )  # fmt: skip


# ---- plain PyTorch: pytorch/examples word_language_model (RNNModel, main.py's train()) -------


def word_language_model(*, batch_as_time: bool = False) -> dlci.Target:
    """RNNModel('LSTM') as main.py builds it, small (emsize = nhid = 64, 2 layers, dropout
    0.2), run as ``main.py --use-optimizer --lr 0.005`` (its AdamW path), its train():
    time-major batches (get_batch), the hidden state carried and repackaged, clipping at
    0.25. dl-ci's batches are examples first, so the step transposes them to the (bptt,
    batch) layout main.py feeds the model. (main.py's default, plain SGD at lr 20, relies on
    WikiText-2's 33,278-word decoder to keep each step small against the weights; at a
    32-word vocabulary each step rewrites the decoder, and update-ratio says so.)

    Planted bug: the transpose left out, so the LSTM (batch_first=False) runs along the batch
    and each example's outputs depend on its neighbours."""
    from word_language_model import RNNModel

    torch.manual_seed(0)
    model = RNNModel("LSTM", VOCAB, 64, 64, 2, dropout=0.2)
    carried: dict[str, object] = {}

    def time_major(x: torch.Tensor) -> torch.Tensor:
        return x if batch_as_time else x.t().contiguous()

    def repackage_hidden(h):  # main.py's, verbatim in behaviour
        if isinstance(h, torch.Tensor):
            return h.detach()
        return tuple(repackage_hidden(v) for v in h)

    def step(model, batch, optimizer):
        data, targets = time_major(batch[0]), time_major(batch[1]).reshape(-1)
        model.train()
        size = data.size(1)
        hidden = carried.get(size) or model.init_hidden(size)
        model.zero_grad()
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        carried[size] = hidden
        loss = F.nll_loss(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        return loss

    def evaluate(model, batch):  # main.py's evaluate(): eval mode, a fresh hidden state
        model.eval()
        data = time_major(batch[0])
        return model(data, model.init_hidden(data.size(1)))[0]

    train, val = next_token_loaders(batch=20)
    return dlci.Target(
        model,
        lambda params: torch.optim.AdamW(params, lr=0.005),
        train,
        val_loader=val,
        train_step=step,
        eval_step=evaluate,
        loss_fn=lambda output, targets: F.nll_loss(output, time_major(targets).reshape(-1)),
        num_classes=VOCAB,
    )
