"""GPU detection and hardware classes.

No GPU exists on the machines that run this suite, so the GPU paths use stand-ins, named as
such: a fake ``nvidia-smi`` executable (a real process, printing what the real tool prints)
and a fake ``pynvml`` module. The CPU path runs for real.
"""

from __future__ import annotations

import os
import stat
import sys
import types
from pathlib import Path

import pytest

from dlci import hardware
from dlci.hardware import GpuInfo, HardwareInfo, detect
from dlci.ladder import classes
from dlci.ladder.classes import classify
from dlci.ladder.load import load_ladder

# Names as NVML, nvidia-smi and torch report them on real machines.
REAL_GPU_NAMES = [
    ("Tesla T4", "t4"),
    ("NVIDIA T4", "t4"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA A10", "a10"),
    ("NVIDIA A10G", "a10"),
    ("Tesla V100-SXM2-16GB", "v100"),
    ("Tesla V100-PCIE-32GB", "v100"),
    ("Tesla V100S-PCIE-32GB", "v100"),
    ("NVIDIA GeForce RTX 4090", "rtx"),
    ("NVIDIA GeForce RTX 3090 Ti", "rtx"),
    ("NVIDIA GeForce RTX 2080 Ti", "rtx"),
    ("NVIDIA TITAN RTX", "rtx"),
    ("NVIDIA A100-SXM4-40GB", "a100"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A100 80GB PCIe", "a100"),
    ("NVIDIA A100-PCIE-40GB", "a100"),
    ("NVIDIA A800-SXM4-80GB", "a100"),
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100"),
    ("NVIDIA H100 NVL", "h100"),
    ("NVIDIA H800", "h100"),
    ("NVIDIA GH200 480GB", "h100"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA H200 NVL", "h200"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA GB200", "b200"),
    ("AMD Instinct MI210", "mi250"),
    ("AMD Instinct MI250X", "mi250"),
    ("AMD Instinct MI250X / MI250", "mi250"),
    ("AMD Instinct MI300X", "mi300"),
    ("AMD Instinct MI300A", "mi300"),
    ("AMD Instinct MI325X", "mi300"),
]

# Real names that no default class claims: their class comes from the compute capability.
UNNAMED_GPUS = [
    ("NVIDIA RTX A1000 Laptop GPU", "8.6", "a10"),
    ("NVIDIA L40S", "8.9", "rtx"),
    ("NVIDIA A40", "8.6", "a10"),
    ("NVIDIA RTX 6000 Ada Generation", "8.9", "rtx"),
    ("Tesla P100-PCIE-16GB", "6.0", "t4"),
    ("NVIDIA B300 SXM6 AC", "10.3", "b200"),
    ("Some Future GPU", None, "t4"),
]


@pytest.fixture(scope="module")
def ladder():
    return load_ladder()


def machine(*names: str, capability: str | None = None) -> HardwareInfo:
    gpus = tuple(
        GpuInfo(index=i, name=n, memory_mib=81920, compute_capability=capability)
        for i, n in enumerate(names)
    )
    return HardwareInfo(gpus=gpus, source="nvml")


@pytest.mark.parametrize(("name", "expected"), REAL_GPU_NAMES)
def test_real_gpu_names_map_to_their_class(ladder, name: str, expected: str) -> None:
    match = classify(machine(name), ladder)
    assert (match.name, match.warnings) == (expected, ())
    assert match.reason == f"GPU 0 '{name}' (via nvml)"


@pytest.mark.parametrize(("name", "capability", "expected"), UNNAMED_GPUS)
def test_an_unnamed_gpu_falls_back_to_the_nearest_class_by_speed(
    ladder, name: str, capability: str | None, expected: str
) -> None:
    match = classify(machine(name, capability=capability), ladder)
    assert match.name == expected
    speed = classes.estimate_speed(GpuInfo(0, name, compute_capability=capability))
    assert match.warnings == (
        f"no hardware class matches GPU '{name}' (compute capability {capability or 'unknown'}); "
        f"using '{expected}', the nearest class by relative speed ({speed:g}). Add a class for "
        "it to your ladder to choose its budgets yourself.",
    )


def test_mixed_gpus_take_the_slowest_class(ladder) -> None:
    match = classify(machine("NVIDIA A100-SXM4-80GB", "Tesla T4"), ladder)
    assert match.name == "t4"
    assert match.warnings == ("mixed GPUs (a100, t4): budgets follow the slowest, 't4'",)


def test_the_cpu_path_runs_for_real_when_no_gpu_is_visible(ladder, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # hides any GPU from every probe
    info = detect(timeout=5)
    assert (info.gpus, info.source) == ((), "none")
    assert [line.split(":")[0] for line in info.probes] == ["nvml", "nvidia-smi", "torch"]
    assert info.cpu_count >= 1 and info.memory_mib and info.memory_mib > 0
    match = classify(info, ladder)
    assert match.name == "cpu"
    assert match.reason == "no GPU found"
    assert match.probes == info.probes  # said once, next to the class, not inside its reason


def test_probes_that_are_left_out_are_reported_as_not_tried(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    info = detect(timeout=5, probes=("nvidia-smi",))
    assert info.probes[-2:] == ("nvml: not tried", "torch: not tried")


# --------------------------------------------------------------------------- nvidia-smi


FAKE_SMI = """#!/bin/sh
# Stand-in for nvidia-smi on a machine with two A100s (output copied from a real driver 535).
case "$*" in
  *--query-gpu=*)
    if [ -n "$FAKE_SMI_OLD" ] && echo "$*" | grep -q compute_cap; then
      echo 'Field "compute_cap" is not a valid field to query.'; exit 2
    fi
    if [ -n "$FAKE_SMI_OLD" ]; then
      echo "0, GPU-0f6a1e2b-aaaa-bbbb-cccc-000000000000, NVIDIA A100-SXM4-80GB, 81920, 470.82.01"
    else
      echo "0, GPU-0f6a1e2b-aaaa-bbbb-cccc-000000000000, NVIDIA A100-SXM4-80GB, 81920, 535.104.05, 8.0"
      echo "1, GPU-7c3d9e11-aaaa-bbbb-cccc-111111111111, NVIDIA A100-SXM4-80GB, 81920, 535.104.05, 8.0"
    fi ;;
  *)
    echo "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2     |" ;;
esac
"""


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put the stand-in nvidia-smi first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return smi


def test_nvidia_smi_is_parsed_into_gpus(fake_smi) -> None:
    gpus, driver, cuda = hardware.probe_nvidia_smi(timeout=5)
    assert [g.name for g in gpus] == ["NVIDIA A100-SXM4-80GB"] * 2
    assert (gpus[1].index, gpus[1].memory_mib, gpus[1].compute_capability) == (1, 81920, "8.0")
    assert gpus[1].uuid == "GPU-7c3d9e11-aaaa-bbbb-cccc-111111111111"
    assert (driver, cuda) == ("535.104.05", "12.2")


def test_an_old_driver_without_compute_cap_is_retried_without_it(fake_smi, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_SMI_OLD", "1")
    gpus, driver, _ = hardware.probe_nvidia_smi(timeout=5)
    assert [(g.name, g.compute_capability) for g in gpus] == [("NVIDIA A100-SXM4-80GB", None)]
    assert driver == "470.82.01"


def test_a_hanging_nvidia_smi_is_stopped_by_the_timeout(fake_smi) -> None:
    fake_smi.write_text("#!/bin/sh\nsleep 30\n")
    with pytest.raises(hardware.ProbeFailed) as info:
        hardware.probe_nvidia_smi(timeout=0.5)
    assert str(info.value) == (
        "no answer after 0.5 s (nvidia-smi hangs on a wedged GPU; check 'nvidia-smi' by hand "
        "and reset or drain the machine)"
    )


def test_a_failing_nvidia_smi_reports_its_first_line(fake_smi) -> None:
    fake_smi.write_text(
        "#!/bin/sh\necho 'NVIDIA-SMI has failed because it couldn'\"'\"'t communicate with the "
        "NVIDIA driver.'\nexit 9\n"
    )
    with pytest.raises(hardware.ProbeFailed, match="couldn't communicate with the NVIDIA driver"):
        hardware.probe_nvidia_smi(timeout=5)


def test_cuda_visible_devices_limits_what_nvidia_smi_reports(fake_smi, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-7c3d")
    info = detect(timeout=5, probes=("nvidia-smi",))
    assert [g.index for g in info.gpus] == [1]
    assert info.probes == ("nvidia-smi: 1 GPU(s)", "nvml: not tried", "torch: not tried")


# --------------------------------------------------------------------------- NVML


class FakeNvml(types.ModuleType):
    """Stand-in for nvidia-ml-py's ``pynvml`` on a one-H200 machine (no GPU exists here)."""

    class NVMLError(Exception):
        pass

    def __init__(self, *, hang: bool = False) -> None:
        super().__init__("pynvml")
        self.hang = hang
        self.shutdown = False

    def nvmlInit(self) -> None:
        if self.hang:
            import time

            time.sleep(5)

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.86.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12080

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H200"  # older nvidia-ml-py returns bytes

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(total=150_754_820_096)

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return "GPU-e5d1c0de-0000-1111-2222-333333333333"


def test_nvml_answers_first_and_never_imports_torch(monkeypatch, ladder) -> None:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    info = detect(timeout=5)
    assert info.source == "nvml"
    assert info.gpus == (
        GpuInfo(0, "NVIDIA H200", 143771, "9.0", "GPU-e5d1c0de-0000-1111-2222-333333333333"),
    )
    assert (info.driver_version, info.cuda_version) == ("570.86.15", "12.8")
    assert info.probes == ("nvml: 1 GPU(s)",)
    assert fake.shutdown
    assert classify(info, ladder).name == "h200"


def test_a_hanging_nvml_is_abandoned_after_the_timeout(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(hang=True))
    with pytest.raises(hardware.ProbeFailed, match=r"no answer after 0\.2 s"):
        hardware._run_with_timeout(hardware.probe_nvml, 0.2, "nvml")


def test_nvml_errors_become_probe_failures(monkeypatch) -> None:
    fake = FakeNvml()

    def fail() -> None:
        raise FakeNvml.NVMLError("Driver Not Loaded")

    fake.nvmlInit = fail
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with pytest.raises(hardware.ProbeFailed, match="Driver Not Loaded"):
        hardware.probe_nvml()


def test_the_report_is_plain_json_data(ladder) -> None:
    info = machine("NVIDIA L4", capability="8.9")
    data = classes.hardware_report(info, classify(info, ladder))
    assert data["schema_version"] == 1
    assert data["hardware_class"] == "l4"
    assert data["gpu_count"] == 1
    assert data["gpus"][0] == {
        "index": 0,
        "name": "NVIDIA L4",
        "memory_mib": 81920,
        "compute_capability": "8.9",
        "uuid": None,
    }


def test_a_pinned_runner_detects_its_own_gpus_only(fake_smi, monkeypatch) -> None:
    """DLCI_RUNNER_GPUS (a machine with several runners): the other GPUs are not counted;
    a pinned UUID the machine lacks is said, and gives no GPU rather than someone else's."""
    monkeypatch.setenv("DLCI_RUNNER_GPUS", "GPU-7c3d9e11-aaaa-bbbb-cccc-111111111111")
    info = detect(timeout=5, probes=("nvidia-smi",))
    assert [g.index for g in info.gpus] == [1]
    monkeypatch.setenv("DLCI_RUNNER_GPUS", "GPU-0f6a1e2b-aaaa-bbbb-cccc-000000000000,GPU-gone")
    info = detect(timeout=5, probes=("nvidia-smi",))
    assert info.gpus == ()
    assert info.probes[0] == "nvidia-smi: the runner's GPU(s) GPU-gone (DLCI_RUNNER_GPUS) not found"
    monkeypatch.delenv("DLCI_RUNNER_GPUS")  # the control: the whole machine
    assert len(detect(timeout=5, probes=("nvidia-smi",)).gpus) == 2


def test_the_pin_matches_torch_s_uuids_without_the_prefix() -> None:
    gpus = [GpuInfo(0, "A", uuid="0f6a1e2b-aaaa"), GpuInfo(1, "B", uuid="7c3d9e11-bbbb")]
    assert hardware.pin(gpus, ("GPU-7C3D9E11-BBBB",)) == ([gpus[1]], [])
