"""GPU detection: NVML first, then nvidia-smi, then torch.cuda; and the hardware class.

Detection never imports torch when NVML or nvidia-smi answer, and every probe runs under a
timeout: ``nvidia-smi`` and NVML hang on a wedged GPU, and a CI step must not hang with them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dlci.errors import DlciError

DEFAULT_TIMEOUT_S = 10.0
PROBES = ("nvml", "nvidia-smi", "torch")  # the default order: cheapest and surest first
#: the runner's own GPUs, by UUID, comma-separated: set in the runner's .env by
#: docker/runner/setup.sh when one machine serves several runners (docs/runner.md)
PIN_VARIABLE = "DLCI_RUNNER_GPUS"


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_mib: int | None = None
    compute_capability: str | None = None  # "8.0"; None where the source cannot tell
    uuid: str | None = None


@dataclass(frozen=True)
class HardwareInfo:
    """What the machine has, and how each probe answered."""

    gpus: tuple[GpuInfo, ...]
    source: str  # "nvml", "nvidia-smi", "torch", or "none"
    driver_version: str | None = None
    cuda_version: str | None = None
    cpu_count: int = 1
    cpu_model: str = ""
    memory_mib: int | None = None
    probes: tuple[str, ...] = ()  # one line per probe tried: "nvml: library not found"

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)


class ProbeFailed(Exception):
    """A probe could not answer; the message says why, for the report."""


# --------------------------------------------------------------------------- probes


def _run_with_timeout(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    """Run ``fn`` in a daemon thread; a call that hangs (a wedged GPU) becomes ProbeFailed."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"dlci-{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise ProbeFailed(f"no answer after {timeout:g} s (a hung driver or a wedged GPU?)")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def probe_nvml() -> tuple[list[GpuInfo], str | None, str | None]:
    """Ask NVML (nvidia-ml-py) for the GPUs, the driver and the CUDA driver version."""
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
        raise ProbeFailed("nvidia-ml-py is not installed") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise ProbeFailed(_text(exc) or "cannot initialise NVML") from None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        try:
            cuda_int = pynvml.nvmlSystemGetCudaDriverVersion()
            cuda = f"{cuda_int // 1000}.{cuda_int % 1000 // 10}"
        except pynvml.NVMLError:
            cuda = None
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                capability: str | None = f"{major}.{minor}"
            except pynvml.NVMLError:
                capability = None
            gpus.append(
                GpuInfo(
                    index=index,
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    memory_mib=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // 2**20,
                    compute_capability=capability,
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                )
            )
        return gpus, driver, cuda
    except pynvml.NVMLError as exc:
        raise ProbeFailed(_text(exc)) from None
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


SMI_FIELDS = ("index", "uuid", "name", "memory.total", "driver_version", "compute_cap")


def probe_nvidia_smi(
    timeout: float, run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run
) -> tuple[list[GpuInfo], str | None, str | None]:
    """Ask ``nvidia-smi --query-gpu`` (drivers before 510 lack ``compute_cap``: retried without)."""
    fields = list(SMI_FIELDS)
    for _attempt in range(2):
        try:
            done = run(
                ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except FileNotFoundError:
            raise ProbeFailed("nvidia-smi is not installed") from None
        except subprocess.TimeoutExpired:
            raise ProbeFailed(
                f"no answer after {timeout:g} s (nvidia-smi hangs on a wedged GPU; "
                "check 'nvidia-smi' by hand and reset or drain the machine)"
            ) from None
        if done.returncode == 0:
            break
        message = (done.stdout + done.stderr).strip().splitlines()
        if "compute_cap" in fields and "compute_cap" in " ".join(message):
            fields.remove("compute_cap")
            continue
        raise ProbeFailed(message[0] if message else f"exit code {done.returncode}")
    gpus, driver = parse_smi_csv(done.stdout, fields)
    return gpus, driver, _smi_cuda_version(timeout, run)


def parse_smi_csv(text: str, fields: list[str]) -> tuple[list[GpuInfo], str | None]:
    """Parse ``nvidia-smi --query-gpu`` CSV (noheader, nounits) in the order of ``fields``.

    >>> gpus, driver = parse_smi_csv("0, GPU-1a2b, NVIDIA A100-SXM4-80GB, 81920, 550.54.15, 8.0",
    ...                              list(SMI_FIELDS))
    >>> gpus[0].name, gpus[0].memory_mib, gpus[0].compute_capability, driver
    ('NVIDIA A100-SXM4-80GB', 81920, '8.0', '550.54.15')
    """
    gpus: list[GpuInfo] = []
    driver: str | None = None
    for line in text.strip().splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(fields):
            continue
        # "[N/A]" and "[Not Supported]" mean the driver cannot tell
        row = {k: (None if v.startswith("[") else v) for k, v in zip(fields, cells, strict=True)}
        driver = driver or row.get("driver_version")
        memory = row.get("memory.total")
        gpus.append(
            GpuInfo(
                index=int(row["index"] or len(gpus)),
                name=row["name"] or "unknown GPU",
                memory_mib=int(float(memory)) if memory else None,
                compute_capability=row.get("compute_cap"),
                uuid=row.get("uuid"),
            )
        )
    return gpus, driver


def _smi_cuda_version(
    timeout: float, run: Callable[..., subprocess.CompletedProcess[str]]
) -> str | None:
    try:
        done = run(["nvidia-smi"], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"CUDA Version:\s*([\d.]+)", done.stdout)
    return found.group(1) if found else None


def probe_torch() -> tuple[list[GpuInfo], str | None, str | None]:
    """Ask torch.cuda (also how ROCm builds of torch report AMD GPUs)."""
    if importlib.util.find_spec("torch") is None:
        raise ProbeFailed("torch is not installed")
    import torch

    if not torch.cuda.is_available():
        raise ProbeFailed("torch.cuda.is_available() is False")
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(
            GpuInfo(
                index=index,
                name=props.name,
                memory_mib=int(props.total_memory) // 2**20,
                compute_capability=f"{props.major}.{props.minor}",
                uuid=str(getattr(props, "uuid", "") or "") or None,
            )
        )
    runtime = torch.version.cuda or getattr(torch.version, "hip", None)
    return gpus, None, runtime


# --------------------------------------------------------------------------- detection


def visible(gpus: list[GpuInfo], cuda_visible_devices: str | None) -> list[GpuInfo]:
    """Keep the GPUs that CUDA_VISIBLE_DEVICES exposes (indices or UUID prefixes).

    NVML and nvidia-smi see every GPU of the machine; a job given one GPU must not count the
    others. As CUDA does, the list ends at the first entry that names no GPU.

    >>> gpus = [GpuInfo(0, "A", uuid="GPU-aa"), GpuInfo(1, "B", uuid="GPU-bb")]
    >>> [g.name for g in visible(gpus, "1")], [g.name for g in visible(gpus, "GPU-b,0")]
    (['B'], ['B', 'A'])
    >>> visible(gpus, "")
    []
    """
    if cuda_visible_devices is None:
        return gpus
    chosen: list[GpuInfo] = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        match = [
            g
            for g in gpus
            if (entry.isdigit() and g.index == int(entry))
            or (entry.startswith("GPU-") and (g.uuid or "").startswith(entry))
        ]
        if len(match) != 1 or match[0] in chosen:
            break
        chosen.append(match[0])
    return chosen


def pinned_gpus(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The UUIDs of the runner's own GPUs (``DLCI_RUNNER_GPUS``); () when it has every GPU.

    >>> pinned_gpus({"DLCI_RUNNER_GPUS": " GPU-aa, GPU-bb ,"})
    ('GPU-aa', 'GPU-bb')
    """
    text = (os.environ if environ is None else environ).get(PIN_VARIABLE, "")
    return tuple(entry.strip() for entry in text.split(",") if entry.strip())


def _uuid_key(uuid: str) -> str:
    """A UUID as NVML and nvidia-smi write it (``GPU-``), lower case; torch's lacks the prefix."""
    text = uuid.strip().lower()
    return text if text.startswith("gpu-") or text.startswith("mig-") else f"gpu-{text}"


def pin(gpus: list[GpuInfo], uuids: tuple[str, ...]) -> tuple[list[GpuInfo], list[str]]:
    """The runner's own GPUs among ``gpus`` (in the pin's order), and the pinned UUIDs that
    name none of them (a GPU gone from the bus, a typo in the runner's .env).

    A machine with several runners pins each to its GPUs: hardware detection, the tier's
    nproc and the GPU checks count those only, never a neighbour's.

    >>> gpus = [GpuInfo(0, "A", uuid="GPU-aa"), GpuInfo(1, "B", uuid="GPU-bb")]
    >>> [g.name for g in pin(gpus, ("GPU-bb",))[0]], pin(gpus, ("GPU-bb", "GPU-cc"))[1]
    (['B'], ['GPU-cc'])
    """
    chosen: list[GpuInfo] = []
    missing: list[str] = []
    for uuid in uuids:
        match = [g for g in gpus if g.uuid and _uuid_key(g.uuid) == _uuid_key(uuid)]
        if match and match[0] not in chosen:
            chosen.append(match[0])
        else:
            missing.append(uuid)
    return chosen, missing


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform  # ~2 ms of the host's preflight, for a host without /proc/cpuinfo only

    return platform.processor() or platform.machine()


def _memory_mib() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        return os.cpu_count() or 1


def parse_probes(text: str) -> tuple[str, ...]:
    """Parse a ``--probes`` list such as ``nvml,nvidia-smi``.

    >>> parse_probes("nvidia-smi, nvml")
    ('nvidia-smi', 'nvml')
    """
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [n for n in names if n not in PROBES]
    if unknown or not names:
        raise DlciError(
            f"--probes: unknown probe {unknown[0]!r}" if unknown else "--probes: empty list",
            hint=f"choose from {', '.join(PROBES)}, comma-separated, in the order to try them",
        )
    return names


def detect(*, timeout: float = DEFAULT_TIMEOUT_S, probes: tuple[str, ...] = PROBES) -> HardwareInfo:
    """Detect the GPUs through the first of ``probes`` that answers; on a runner pinned to
    some of the machine's GPUs (``DLCI_RUNNER_GPUS``), those only."""
    runners: dict[str, Callable[[], tuple[list[GpuInfo], str | None, str | None]]] = {
        "nvml": lambda: _run_with_timeout(probe_nvml, timeout, "nvml"),
        "nvidia-smi": lambda: probe_nvidia_smi(timeout),
        # importing torch alone takes seconds: allow it more than a driver query
        "torch": lambda: _run_with_timeout(probe_torch, max(timeout, 60), "torch"),
    }
    notes: list[str] = []
    skipped = [f"{name}: not tried" for name in PROBES if name not in probes]
    cpu_count, cpu_model, memory_mib = _cpu_count(), _cpu_model(), _memory_mib()
    pinned = pinned_gpus()
    for name in probes:
        try:
            gpus, driver, cuda = runners[name]()
        except ProbeFailed as exc:
            notes.append(f"{name}: {exc}")
            continue
        if pinned:
            gpus, missing = pin(gpus, pinned)
            if missing:
                notes.append(
                    f"{name}: the runner's GPU(s) {', '.join(missing)} ({PIN_VARIABLE}) not found"
                )
                continue
        shown = visible(gpus, os.environ.get("CUDA_VISIBLE_DEVICES")) if name != "torch" else gpus
        if not shown:
            notes.append(f"{name}: no GPU" + (" visible" if gpus else ""))
            continue
        notes.append(f"{name}: {len(shown)} GPU(s)")
        return HardwareInfo(
            gpus=tuple(shown),
            source=name,
            driver_version=driver,
            cuda_version=cuda,
            cpu_count=cpu_count,
            cpu_model=cpu_model,
            memory_mib=memory_mib,
            probes=(*notes, *skipped),
        )
    return HardwareInfo(
        gpus=(),
        source="none",
        cpu_count=cpu_count,
        cpu_model=cpu_model,
        memory_mib=memory_mib,
        probes=(*notes, *skipped),
    )


def to_dict(info: HardwareInfo) -> dict[str, Any]:
    """The JSON form of ``dlci hardware --json``, less the class (``dlci.ladder.classes``)."""
    data = asdict(info)
    data["gpus"] = [asdict(g) for g in info.gpus]
    data["probes"] = list(info.probes)
    data["gpu_count"] = len(info.gpus)
    return {"schema_version": 1, **data}
