"""Small training loops of the shapes script mode must follow or refuse (dl-ci's own tests).

python shapes.py --shape scaled|accelerate|per-example|eval-first|scheduled|two-optimizers|no-backward|ddp --epochs N
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--shape", default="scaled")
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))
loader = DataLoader(data, batch_size=16, shuffle=True)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-4)
loss_fn = nn.CrossEntropyLoss()

if args.shape == "scaled":  # a GradScaler: the loss is read unscaled
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for epoch in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            print(f"loss {loss.item():.6f}")
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

elif args.shape == "accelerate":  # accelerate's backward, its prepared loader and optimizer
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            print(f"loss {loss.item():.6f}")
            accelerator.backward(loss)
            optimizer.step()

elif args.shape == "per-example":  # a loss per example, given its gradient
    for epoch in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            losses = nn.functional.cross_entropy(model(x), y, reduction="none")
            print(f"loss {losses.mean().item():.6f}")
            losses.backward(torch.full_like(losses, 1 / len(losses)))
            optimizer.step()

elif args.shape == "eval-first":  # a validation pass before training, on another loader
    held_out = DataLoader(TensorDataset(torch.randn(48, 8), torch.randint(0, 4, (48,))), 16)
    with torch.no_grad():
        print("validation", sum(loss_fn(model(x), y).item() for x, y in held_out))
    for epoch in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()

elif args.shape == "scheduled":  # a schedule that steps once per epoch
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    for epoch in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        scheduler.step()

elif args.shape == "two-optimizers":  # a GAN's shape: two models, two optimizers
    critic = nn.Linear(4, 1)
    critic_optimizer = torch.optim.SGD(critic.parameters(), lr=1e-2)
    for epoch in range(args.epochs):
        for x, y in loader:
            critic_optimizer.zero_grad()
            critic(model(x).detach()).mean().backward()
            critic_optimizer.step()
            optimizer.zero_grad()
            (-critic(model(x)).mean()).backward()
            optimizer.step()

elif args.shape == "no-backward":  # gradients set by hand from torch.autograd.grad
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = loss_fn(model(x), y)
            grads = torch.autograd.grad(loss, list(model.parameters()))
            for parameter, grad in zip(model.parameters(), grads):
                parameter.grad = grad
            optimizer.step()

elif args.shape == "ddp":  # a process group of its own, one process
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29531", rank=0, world_size=1)
    model = nn.parallel.DistributedDataParallel(model)
