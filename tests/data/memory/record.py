"""Record the real CPU traces with [memory] events that tests/test_trace_memory.py reads.

Run from the repository root with torch installed:

    python tests/data/memory/record.py

Each trace is a small MLP trained for 2 profiled steps (schedule wait=1, warmup=1,
active=2) on the CPU under torch.profiler with profile_memory=True and record_shapes=True,
with dl-ci's phase annotations. Each step plants a known allocation: a tensor of exactly
PLANT_BYTES, made and freed at once in the phase the trace's name says (by aten::mul in
forward, by aten::add in the optimizer phase), so that phase holds the step's peak and that
op the largest allocations. A third trace is recorded without profile_memory. expected.json keeps what torch itself says about each trace: the planted
tensor's nbytes, and the self CPU memory of each op from the profiler's key_averages().
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

PLANT_BYTES = 8 << 20  # 8 MiB: far above anything else the small model allocates
HERE = Path(__file__).resolve().parent


def plant(source: torch.Tensor, where: str) -> torch.Tensor:
    """A new tensor of exactly PLANT_BYTES, allocated by the op itself (no inner aten::empty):
    aten::mul in forward, aten::add in the optimizer phase."""
    return source * 2 if where == "forward" else source + 1


def record(
    name: str, plant_in: str | None, memory: bool = True, out: Path = HERE
) -> dict[str, object]:
    """Record ``out/<name>.json.gz``; what torch says about it (see the module docstring)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(8, 16), torch.randn(8, 4)) for _ in range(4)]
    source = torch.zeros(PLANT_BYTES // 4, dtype=torch.float32)  # before profiling: not counted
    planted: list[int] = []
    with profile(
        activities=[ProfilerActivity.CPU],
        profile_memory=memory,
        record_shapes=True,
        schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
    ) as prof:
        for inputs, targets in data:
            with record_function("dlci/data"):
                inputs, targets = inputs.clone(), targets.clone()
            with record_function("dlci/forward"):
                if plant_in == "forward":
                    planted.append(plant(source, "forward").nbytes)  # freed at once
                loss = torch.nn.functional.mse_loss(model(inputs), targets)
            with record_function("dlci/backward"):
                loss.backward()
            with record_function("dlci/optimizer"):
                if plant_in == "optimizer":
                    planted.append(plant(source, "optimizer").nbytes)  # freed at once
                optimizer.step()
                optimizer.zero_grad()
            prof.step()
    path = out / f"{name}.json"
    prof.export_chrome_trace(str(path))
    data_bytes = path.read_bytes()
    path.unlink()
    (out / f"{name}.json.gz").write_bytes(gzip.compress(data_bytes, 9, mtime=0))
    averages = prof.key_averages()
    return {
        "planted_in": plant_in,
        "planted_nbytes": planted[-1] if planted else None,
        "self_cpu_memory_by_op": {
            e.key: e.self_cpu_memory_usage for e in averages if e.self_cpu_memory_usage
        },
    }


def main() -> None:
    expected = {
        "torch_version": torch.__version__,
        "traces": {
            "cpu_plant_forward": record("cpu_plant_forward", "forward"),
            "cpu_plant_optimizer": record("cpu_plant_optimizer", "optimizer"),
            "cpu_no_memory": record("cpu_no_memory", "forward", memory=False),
        },
    }
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    print(json.dumps(expected, indent=1), file=sys.stderr)


if __name__ == "__main__":
    main()
