"""Which hardware class of the ladder a machine belongs to.

The ladder owns classification: its classes carry the GPU name patterns and relative speeds,
so ``dlci.hardware`` only detects (what the machine has) and this module names the class.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlci import hardware
from dlci.hardware import DEFAULT_TIMEOUT_S, PROBES, GpuInfo, HardwareInfo, to_dict
from dlci.ladder.load import load_ladder
from dlci.ladder.model import CPU_CLASS, Ladder

# Relative training speed (T4 = 1.0, the default ladder's unit) by CUDA compute capability,
# used only for a GPU whose name no class pattern matches.
SPEED_BY_COMPUTE_CAPABILITY: dict[str, float] = {
    "6": 0.5,  # Pascal: P100, P40
    "7.0": 2.0,  # V100
    "7.2": 0.3,  # Jetson Xavier
    "7.5": 1.0,  # T4, Quadro RTX, RTX 20xx
    "8.0": 4.0,  # A100, A30
    "8.6": 2.2,  # A10, A40, RTX A6000, RTX 30xx
    "8.7": 0.5,  # Jetson Orin
    "8.9": 2.5,  # L4, L40, RTX 6000 Ada, RTX 40xx
    "9.0": 8.0,  # H100, H200, GH200
    "10": 16.0,  # B200, GB200
    "12": 4.0,  # RTX 50xx, RTX PRO Blackwell
}
UNKNOWN_GPU_SPEED = 1.0


@dataclass(frozen=True)
class ClassMatch:
    """The class of a machine, why, and (when detected) each probe's answer, said once."""

    name: str
    reason: str
    warnings: tuple[str, ...] = field(default_factory=tuple)
    probes: tuple[str, ...] = field(default_factory=tuple)


def estimate_speed(gpu: GpuInfo) -> float:
    """Relative speed of a GPU no class names, from its compute capability.

    >>> estimate_speed(GpuInfo(0, "NVIDIA L40S", compute_capability="8.9"))
    2.5
    >>> estimate_speed(GpuInfo(0, "NVIDIA B300", compute_capability="10.3"))
    16.0
    """
    capability = gpu.compute_capability or ""
    major = capability.split(".", 1)[0]
    if capability in SPEED_BY_COMPUTE_CAPABILITY:
        return SPEED_BY_COMPUTE_CAPABILITY[capability]
    if major in SPEED_BY_COMPUTE_CAPABILITY:
        return SPEED_BY_COMPUTE_CAPABILITY[major]
    return UNKNOWN_GPU_SPEED


def classify(info: HardwareInfo, ladder: Ladder) -> ClassMatch:
    """Name the hardware class of the machine; mixed GPUs take the slowest GPU's class."""
    if not info.gpus:
        return ClassMatch(CPU_CLASS, "no GPU found", probes=info.probes)
    warnings: list[str] = []
    per_gpu: list[tuple[str, GpuInfo]] = []
    for gpu in info.gpus:
        name = ladder.classify(gpu.name)
        if name is None:
            speed = estimate_speed(gpu)
            name = ladder.nearest_gpu_class(speed)
            capability = gpu.compute_capability or "unknown"
            warnings.append(
                f"no hardware class matches GPU '{gpu.name}' (compute capability {capability}); "
                f"using '{name}', the nearest class by relative speed ({speed:g}). Add a class "
                "for it to your ladder to choose its budgets yourself."
            )
        per_gpu.append((name, gpu))
    names = {name for name, _ in per_gpu}
    chosen, gpu = min(per_gpu, key=lambda pair: ladder.classes[pair[0]].speed)
    if len(names) > 1:
        warnings.append(
            f"mixed GPUs ({', '.join(sorted(names))}): budgets follow the slowest, '{chosen}'"
        )
    reason = f"GPU {gpu.index} '{gpu.name}' (via {info.source})"
    return ClassMatch(chosen, reason, tuple(warnings), info.probes)


def detect_class(
    ladder: str | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    probes: tuple[str, ...] = PROBES,
) -> tuple[HardwareInfo, ClassMatch]:
    """Load the ladder (its mistakes first), then detect the machine and name its class."""
    loaded = load_ladder(ladder)
    info = hardware.detect(timeout=timeout, probes=probes)
    return info, classify(info, loaded)


def hardware_report(info: HardwareInfo, match: ClassMatch) -> dict[str, Any]:
    """The JSON form of ``dlci hardware --json``: the machine and its class."""
    return {
        **to_dict(info),
        "hardware_class": match.name,
        "class_reason": match.reason,
        "warnings": list(match.warnings),
    }
