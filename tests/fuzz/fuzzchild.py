"""Run ``dlci`` in a child process under resource limits, and check what it answers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from dlci.errors import SHOWN

MEMORY_LIMIT = 2 << 30  # RLIMIT_AS of a child: a memory bomb fails, the machine stays
CPU_LIMIT = 60  # RLIMIT_CPU seconds of a child: a time bomb is killed by SIGXCPU
WALL_LIMIT = 120  # seconds: a child blocked (not using CPU) is killed too
STATS: dict[str, list[tuple[int, float, float]]] = defaultdict(list)  # class -> rows


@dataclass
class Answer:
    code: int
    stdout: str
    stderr: str
    seconds: float
    peak_mib: float


def _peak_mib(peak_file: Path, maxrss_kib: int) -> float:
    """The child's own VmHWM when it wrote it (a normal exit), else wait4's figure."""
    try:
        text = peak_file.read_text().strip()
        peak_file.unlink()
        return int(text) / 1024
    except (OSError, ValueError):
        return maxrss_kib / 1024


def run_dlci(
    args: list[str],
    *,
    cwd: Path,
    what: str = "",
    memory: int = MEMORY_LIMIT,
    cpu: int = CPU_LIMIT,
    code: str = "from dlci.cli import main; raise SystemExit(main())",
) -> Answer:
    """``dlci ARGS`` in a fresh interpreter under RLIMIT_AS and RLIMIT_CPU; its time and
    peak memory come from wait4, so that each child is measured alone."""
    env = {**os.environ, "DLCI_LOG_DIR": str(cwd / "logs"), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("GITHUB_ACTIONS", None)
    start = time.monotonic()
    # the limits are set by the child itself, first thing: a preexec_fn would make subprocess
    # fork this (large, torch-holding) process, whose pages would count in the child's peak
    # Its peak memory is its own VmHWM, written at exit: wait4's ru_maxrss would also count the
    # pages of this (large, torch-holding) process that the fork copied before the exec.
    peak_file = cwd / f".peak-{os.getpid()}-{time.monotonic_ns()}"
    limits = (
        "import resource, atexit\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))\n"
        f"resource.setrlimit(resource.RLIMIT_CPU, ({cpu}, {cpu}))\n"
        "def _peak():\n"
        "    lines = open('/proc/self/status').read().splitlines()\n"
        "    kib = [l.split()[1] for l in lines if l.startswith('VmHWM:')]\n"
        f"    open({str(peak_file)!r}, 'w').write(kib[0] if kib else '')\n"
        "atexit.register(_peak)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", limits + code, *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out: dict[str, bytes] = {}
    pumps = [
        threading.Thread(target=lambda n=n, s=s: out.__setitem__(n, s.read()), daemon=True)
        for n, s in (("out", proc.stdout), ("err", proc.stderr))
    ]
    for pump in pumps:
        pump.start()
    killer = threading.Timer(WALL_LIMIT, proc.kill)  # blocked without using CPU: killed too
    killer.start()
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own time and peak memory
    killer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    for pump in pumps:
        pump.join()
    seconds = time.monotonic() - start
    answer = Answer(
        proc.returncode,
        out.get("out", b"").decode("utf-8", "replace"),
        out.get("err", b"").decode("utf-8", "replace"),
        seconds,
        _peak_mib(peak_file, usage.ru_maxrss),
    )
    if what:
        STATS[what].append((answer.code, seconds, answer.peak_mib))
    return answer


def assert_clean(answer: Answer, codes: frozenset[int] = frozenset({0, 1, 2})) -> None:
    """Exit 0, 1 or 2; no traceback; at most SHOWN error lines and the count of the rest (a
    file's every mistake is reported, the printing is bounded); killed by no limit."""
    assert answer.code in codes, (answer.code, answer.stderr[-2000:])
    assert "Traceback" not in answer.stderr, answer.stderr[-2000:]
    assert "failed unexpectedly" not in answer.stderr, answer.stderr[-2000:]
    errors = [line for line in answer.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) <= SHOWN + 1, answer.stderr[-2000:]
    if len(errors) > SHOWN:
        assert errors[-1].startswith("error: and ") and errors[-1].endswith(" more problems")
