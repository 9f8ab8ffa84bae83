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


# ---- models of other shapes (issue 44): random forwards, reconstructions, dense targets, ---
# composite losses. Each follows its public source's lines, cut down to run on CPU in
# seconds; the source is named at each one.


class VAE(torch.nn.Module):
    """pytorch/examples vae/main.py's VAE (784 -> 400 -> 20 there; 784 -> 64 -> 8 here): the
    reparameterisation draws its noise with randn_like in every forward, eval mode too."""

    def __init__(self, hidden: int = 64, latent: int = 8, *, input_cut: bool = False) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(784, hidden)
        self.fc21 = torch.nn.Linear(hidden, latent)
        self.fc22 = torch.nn.Linear(hidden, latent)
        self.fc3 = torch.nn.Linear(latent, hidden)
        self.fc4 = torch.nn.Linear(hidden, 784)
        self.input_cut = input_cut

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x: torch.Tensor):
        if self.input_cut:  # a refactor that encodes a placeholder instead of the batch
            x = torch.zeros_like(x)
        mu, logvar = self.encode(x.view(-1, 784))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def vae(*, mean_reconstruction: bool = False, input_cut: bool = False) -> dlci.Target:
    """pytorch/examples vae/main.py's loop: Adam 1e-3, ``loss_function`` (summed BCE + KLD),
    the step reading its targets from ``batch[0]`` (``for data, _ in train_loader``), on
    MNIST-shaped pixels in [0, 1].

    Planted bugs: the reconstruction term averaged while the KL term stays summed (the
    posterior collapses: every input decodes to the mean image), and the encoder fed zeros."""

    def loss_function(recon_x, x, mu, logvar):
        reduction = "mean" if mean_reconstruction else "sum"
        bce = F.binary_cross_entropy(recon_x, x.view(-1, 784), reduction=reduction)
        kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return bce + kld

    def step(model, batch, optimizer):
        data, _ = batch
        optimizer.zero_grad()
        recon_batch, mu, logvar = model(data)
        loss = loss_function(recon_batch, data, mu, logvar)
        loss.backward()
        optimizer.step()
        return loss

    torch.manual_seed(0)
    model = VAE(input_cut=input_cut)
    train, val = image_loaders(normalized=False)
    return dlci.Target(
        model, lambda p: torch.optim.Adam(p, lr=1e-3), train, val_loader=val, train_step=step
    )


def shapes(n: int, seed: int, size: int = 16) -> TensorDataset:
    """Segmentation data: one to three rectangles of random height and width per image, the
    mask 1 inside them; the image a faint copy of the mask under noise, three channels."""
    g = torch.Generator().manual_seed(seed)
    masks = torch.zeros(n, size, size, dtype=torch.long)
    for i in range(n):
        for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
            h, w = (int(v) for v in torch.randint(2, 8, (2,), generator=g))
            top, left = (int(v) for v in torch.randint(0, size - 7, (2,), generator=g))
            masks[i, top : top + h, left : left + 2 * w // 3 + 1] = 1
    colour = torch.rand(n, 3, 1, 1, generator=g)
    images = 0.6 * masks[:, None].float() * colour + 0.2 * torch.randn(
        n, 3, size, size, generator=g
    )
    return TensorDataset(images, masks)


class DoubleConv(torch.nn.Sequential):
    """milesial/Pytorch-UNet unet/unet_parts.py's DoubleConv: (conv => BN => ReLU) * 2."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(
            torch.nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(cout),
            torch.nn.ReLU(inplace=True),
            torch.nn.Conv2d(cout, cout, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(cout),
            torch.nn.ReLU(inplace=True),
        )


class UNet(torch.nn.Module):
    """milesial/Pytorch-UNet's UNet cut to two levels (64..1024 channels there, 8..16 here):
    inc, down (max-pool, DoubleConv), up (bilinear upsample, concatenated skip, DoubleConv),
    outc."""

    def __init__(self, n_channels: int = 3, n_classes: int = 2, *, input_cut: bool = False):
        super().__init__()
        self.n_classes = n_classes
        self.inc = DoubleConv(n_channels, 8)
        self.down = torch.nn.Sequential(torch.nn.MaxPool2d(2), DoubleConv(8, 16))
        self.up = torch.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        self.conv = DoubleConv(24, 8)
        self.outc = torch.nn.Conv2d(8, n_classes, kernel_size=1)
        self.input_cut = input_cut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_cut:  # an input path cut: the network sees a detached constant
            x = x.detach() * 0
        x1 = self.inc(x)
        x2 = self.down(x1)
        return self.outc(self.conv(torch.cat([x1, self.up(x2)], dim=1)))


def dice_loss(pred: torch.Tensor, target: torch.Tensor, epsilon: float = 1e-6) -> torch.Tensor:
    """milesial/Pytorch-UNet utils/dice_score.py's multiclass dice loss (reduce_batch_first)."""
    pred, target = pred.flatten(0, 1), target.flatten(0, 1)
    inter = 2 * (pred * target).sum(dim=(-1, -2, -3))
    sets_sum = pred.sum(dim=(-1, -2, -3)) + target.sum(dim=(-1, -2, -3))
    sets_sum = torch.where(sets_sum == 0, inter, sets_sum)
    return 1 - ((inter + epsilon) / (sets_sum + epsilon)).mean()


def unet(*, transposed: bool = False, input_cut: bool = False) -> dlci.Target:
    """Pytorch-UNet's train.py loss, cross-entropy plus the dice loss of the softmax against
    the one-hot mask, on rectangles (Adam 1e-3 where train.py's RMSprop runs at 1e-5 for days
    on Carvana).

    Planted bugs: every image transposed (height and width swapped) while its mask is not,
    and the network's input path cut."""

    def loss_fn(masks_pred, true_masks):
        loss = F.cross_entropy(masks_pred, true_masks)
        loss += dice_loss(
            F.softmax(masks_pred, dim=1).float(),
            F.one_hot(true_masks, 2).permute(0, 3, 1, 2).float(),
        )
        return loss

    def split(n: int, seed: int) -> TensorDataset:
        data = shapes(n, seed)
        images, masks = data.tensors
        return TensorDataset(images.transpose(-1, -2) if transposed else images, masks)

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return dlci.Target(
        UNet(input_cut=input_cut),
        lambda p: torch.optim.Adam(p, lr=1e-3),
        DataLoader(split(512, 1), 16, shuffle=True, generator=g),
        loss_fn=loss_fn,
        val_loader=DataLoader(split(128, 2), 16),
        num_classes=2,
    )


class Denoiser(torch.nn.Module):
    """A small noise predictor eps(x_t, t): convolutions with a learned timestep embedding."""

    def __init__(self, timesteps: int, width: int = 16) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(timesteps, width)
        self.inp = torch.nn.Conv2d(1, width, 3, padding=1)
        self.mid = torch.nn.Conv2d(width, width, 3, padding=1)
        self.out = torch.nn.Conv2d(width, 1, 3, padding=1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.inp(x) + self.embed(t)[:, :, None, None])
        return self.out(F.silu(self.mid(h)))


class GaussianDiffusion(torch.nn.Module):
    """lucidrains/denoising-diffusion-pytorch's GaussianDiffusion training step (linear beta
    schedule, objective pred_noise): every forward draws a timestep per image and the noise,
    and returns the prediction beside the noise it must match."""

    def __init__(
        self, model: torch.nn.Module, timesteps: int = 100, *, noise_first: bool = False
    ) -> None:
        super().__init__()
        self.model, self.num_timesteps, self.noise_first = model, timesteps, noise_first
        scale = 1000 / timesteps
        betas = torch.linspace(scale * 0.0001, scale * 0.02, timesteps)
        alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
        self.register_buffer("sqrt_alphas_cumprod", alphas_cumprod.sqrt())
        self.register_buffer("sqrt_one_minus_alphas_cumprod", (1.0 - alphas_cumprod).sqrt())

    def forward(self, img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = img.shape[0]
        t = torch.randint(0, self.num_timesteps, (b,), device=img.device).long()
        noise = torch.randn_like(img)
        x = (
            self.sqrt_alphas_cumprod[t][:, None, None, None] * img
            + self.sqrt_one_minus_alphas_cumprod[t][:, None, None, None] * noise
        )
        if self.noise_first:  # the order a user may well choose: (target, prediction)
            return noise, self.model(x, t)
        return self.model(x, t), noise


def ddpm(*, noise_first: bool = False) -> dlci.Target:
    """A DDPM training step on MNIST-shaped images scaled to [-1, 1], Adam 1e-3 (8e-5 in the
    library's Trainer, for hours), the loss the MSE of the predicted against the drawn noise;
    ``noise_first`` returns the noise before the prediction."""
    torch.manual_seed(0)
    train, val = image_loaders(normalized=False)
    scaled = [
        DataLoader(
            TensorDataset(loader.dataset.tensors[0] * 2 - 1, loader.dataset.tensors[1]),
            64,
            shuffle=shuffle,
            generator=torch.Generator().manual_seed(0),
        )
        for loader, shuffle in ((train, True), (val, False))
    ]
    return dlci.Target(
        GaussianDiffusion(Denoiser(100), noise_first=noise_first),
        lambda p: torch.optim.Adam(p, lr=1e-3),
        scaled[0],
        loss_fn=lambda outputs, _: F.mse_loss(*outputs),
        val_loader=scaled[1],
    )


def nanogpt_pair(*, unmasked: bool = False) -> dlci.Target:
    """nanoGPT's GPT called as its train.py calls it, ``logits, loss = model(X, Y)``: the
    batch's inputs are the pair (X, Y), the targets Y beside them; the standard step."""
    import nanogpt_model

    torch.manual_seed(0)
    config = nanogpt_model.GPTConfig(
        block_size=LENGTH, vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=32, dropout=0.0
    )
    model = nanogpt_model.GPT(config)
    if unmasked:
        for block in model.transformer.h:
            block.attn.flash = False
            block.attn.register_buffer("bias", torch.ones(1, 1, LENGTH, LENGTH))

    def pairs(loader: DataLoader) -> DataLoader:
        x, y = loader.dataset.tensors
        return DataLoader(
            _Pairs(x, y), 16, shuffle=loader is train, generator=torch.Generator().manual_seed(0)
        )

    train, val = next_token_loaders()
    return dlci.Target(
        model,
        lambda p: torch.optim.AdamW(p, lr=1e-3, betas=(0.9, 0.95)),
        pairs(train),
        val_loader=pairs(val),
        loss_fn=lambda outputs, targets: F.cross_entropy(
            outputs[0].flatten(0, 1), targets.flatten()
        ),
        num_classes=VOCAB,
    )


class _Pairs(torch.utils.data.Dataset):
    """((X, Y), Y) examples: the forward given the targets, as nanoGPT's train.py gives them."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return (self.x[i], self.y[i]), self.y[i]


class MnistNet(torch.nn.Module):
    """pytorch/examples mnist/main.py's Net, as written there."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3, 1)
        self.conv2 = torch.nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = torch.nn.Dropout(0.25)
        self.dropout2 = torch.nn.Dropout(0.5)
        self.fc1 = torch.nn.Linear(9216, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def mnist() -> dlci.Target:
    """pytorch/examples mnist/main.py's loop: Adadelta at lr 1.0 (its default), nll_loss on
    log_softmax outputs, normalised MNIST-shaped images."""
    torch.manual_seed(0)
    train, val = image_loaders()
    return dlci.Target(
        MnistNet(),
        lambda p: torch.optim.Adadelta(p, lr=1.0),
        train,
        loss_fn=F.nll_loss,
        val_loader=val,
        num_classes=10,
    )


class PerceiverAttention(torch.nn.Module):
    """lucidrains/perceiver-pytorch's Attention, its einops rearranges written as reshapes:
    heads split as '(b h) n d' and merged back. ``merge_bug`` merges them as '(h b) n d',
    which mixes the examples of a batch (invisible at batch size 1)."""

    def __init__(self, query_dim: int, context_dim: int, heads: int = 2, dim_head: int = 16,
                 *, merge_bug: bool = False) -> None:  # fmt: skip
        super().__init__()
        inner = heads * dim_head
        self.heads, self.scale, self.merge_bug = heads, dim_head**-0.5, merge_bug
        self.to_q = torch.nn.Linear(query_dim, inner, bias=False)
        self.to_kv = torch.nn.Linear(context_dim, inner * 2, bias=False)
        self.to_out = torch.nn.Linear(inner, query_dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        h = self.heads
        context = x if context is None else context
        q, (k, v) = self.to_q(x), self.to_kv(context).chunk(2, dim=-1)

        def split(t: torch.Tensor) -> torch.Tensor:  # 'b n (h d) -> (b h) n d'
            b, n, _ = t.shape
            return t.reshape(b, n, h, -1).transpose(1, 2).reshape(b * h, n, -1)

        q, k, v = split(q), split(k), split(v)
        attn = (torch.einsum("b i d, b j d -> b i j", q, k) * self.scale).softmax(dim=-1)
        out = torch.einsum("b i j, b j d -> b i d", attn, v)
        bh, n, d = out.shape
        if self.merge_bug:  # '(h b) n d -> b n (h d)'
            out = out.reshape(h, bh // h, n, d).permute(1, 2, 0, 3)
        else:  # '(b h) n d -> b n (h d)'
            out = out.reshape(bh // h, h, n, d).permute(0, 2, 1, 3)
        return self.to_out(out.reshape(bh // h, n, h * d))


def fourier_encode(x: torch.Tensor, max_freq: float, num_bands: int) -> torch.Tensor:
    """perceiver-pytorch's fourier_encode: the positions, their sines and cosines."""
    x = x.unsqueeze(-1)
    orig_x = x
    scales = torch.linspace(1.0, max_freq / 2, num_bands)
    x = x * scales * torch.pi
    return torch.cat([x.sin(), x.cos(), orig_x], dim=-1)


class Perceiver(torch.nn.Module):
    """perceiver-pytorch's Perceiver cut to one cross-attention and one latent
    self-attention: channels-last images (b, H, W, C) with Fourier position features,
    latents that attend to them, the mean latent classified."""

    def __init__(self, classes: int = 4, latents: int = 8, dim: int = 32, *,
                 merge_bug: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.latents = torch.nn.Parameter(torch.randn(latents, dim))
        context = 3 + 2 * (2 * 4 + 1)  # channels and each axis's Fourier features
        self.cross = PerceiverAttention(dim, context, heads=1, merge_bug=merge_bug)
        self.attend = PerceiverAttention(dim, dim, heads=2, merge_bug=merge_bug)
        self.norm_cross = torch.nn.LayerNorm(dim)
        self.norm_self = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Sequential(torch.nn.LayerNorm(dim), torch.nn.Linear(dim, classes))

    def forward(self, data: torch.Tensor) -> torch.Tensor:
        b, *axis, _ = data.shape
        grid = torch.stack(
            torch.meshgrid(*[torch.linspace(-1.0, 1.0, s) for s in axis], indexing="ij"), dim=-1
        )
        pos = fourier_encode(grid, 8, 4).reshape(*axis, -1).to(data)
        data = torch.cat([data, pos.expand(b, *pos.shape)], dim=-1).reshape(b, -1, 3 + 18)
        x = self.latents.expand(b, *self.latents.shape)
        x = x + self.cross(self.norm_cross(x), context=data)
        x = x + self.attend(self.norm_self(x))
        return self.head(x.mean(dim=1))


def perceiver(*, merge_bug: bool = False) -> dlci.Target:
    """The Perceiver on 8x8 RGB images given channels last, as its forward takes them;
    Adam 1e-3, cross-entropy. Planted bug: heads merged back in the wrong batch order."""
    templates = torch.randn(4, 8, 8, 3, generator=torch.Generator().manual_seed(7))

    def split(n: int, seed: int) -> TensorDataset:
        g = torch.Generator().manual_seed(seed)
        labels = torch.randint(0, 4, (n,), generator=g)
        return TensorDataset(0.4 * templates[labels] + torch.randn(n, 8, 8, 3, generator=g), labels)

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return dlci.Target(
        Perceiver(merge_bug=merge_bug),
        lambda p: torch.optim.Adam(p, lr=1e-3),
        DataLoader(split(512, 1), 16, shuffle=True, generator=g),
        loss_fn=F.cross_entropy,
        val_loader=DataLoader(split(128, 2), 16),
        num_classes=4,
    )
