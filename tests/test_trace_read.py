"""What a trace report could not read, it says (issue 48): real traces the reader does not
fully understand, each analysed once through ``dlci analyze`` (JSON, Markdown and console
read from that one run), with a control beside each protection.

- ``rpd_mi_matmul_rpd2tracing``: a rocmProfileData (rpd2tracing) Chrome export of an AMD GPU
  run, no categories: not understood, not "CPU-only"; control: the same events with the
  categories torch.profiler would give them read as a GPU trace with all 29 kernels.
- ``hta_cupti_profiler_range``: an 8-A100 job whose kernels were not recorded (CUPTI range
  profiler) but whose launches were: GPU activity not recorded, the gate cannot pass even
  on a CPU runner; controls: the CPU-only trace stays CPU-only (and its gate is not
  applicable on a CPU runner), the same trace with one kernel per launch is a GPU trace.
- ``hta_nccl_128ranks_merged_by_tracefuse``: two ranks of an NCCL job merged by TraceLens's
  TraceFuse: no steps chained across processes, each process analysed on its own;
  control: each process's figures are those of its rank's own file (cut the same way from
  the corpus trace the merge was made from).
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.util
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dlci.cli import main
from dlci.profiling import metrics
from dlci.profiling.gate import evaluate_gate
from dlci.profiling.reader import read_trace
from dlci.report.utilization import read
from tracegen import Trace


def analyze(cols: Any, **given: Any) -> dict[str, Any]:
    """The report as utilization.json holds it (metrics.analyze builds its classes)."""
    return msgspec.to_builtins(metrics.analyze(cols, **given))  # type: ignore[no-any-return]


REAL = Path(__file__).parent / "data" / "real"
RPD = REAL / "rpd_mi_matmul_rpd2tracing.json.gz"
CUPTI_RANGE = REAL / "hta_cupti_profiler_range.json.gz"
CPU_ONLY = REAL / "hta_cpu_only_rank34.json.gz"
FUSED = REAL / "hta_nccl_128ranks_merged_by_tracefuse.json.gz"
RANKS = [REAL / f"hta_nccl_128ranks_rank{r}.json.gz" for r in (0, 1)]
GATE = "10"  # --min-gpu-util in every run below


@dataclass
class Run:
    code: int
    report: dict[str, Any]
    markdown: str
    console: str


def _analyze(path: Path, out: Path, *extra: str) -> Run:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(
            ["analyze", str(path), "--json", str(out / "u.json"), "--markdown",
             str(out / "u.md"), "--min-gpu-util", GATE, *extra]
        )  # fmt: skip
    report = json.loads((out / "u.json").read_text())
    return Run(code, report, (out / "u.md").read_text(), err.getvalue())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """One `dlci analyze` of each trace, read by every test below."""
    return {
        path.name: _analyze(path, tmp_path_factory.mktemp(path.name.split(".")[0]))
        for path in (RPD, CUPTI_RANGE, CPU_ONLY, FUSED)
    }


def _load(path: Path) -> Any:
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def _write(data: Any, path: Path) -> Path:
    path.write_text(json.dumps(data))
    return path


def _counts_said(run: Run) -> None:
    """The console, the Markdown and the JSON give the same counts."""
    read = run.report["trace"]["read"]
    numbers = [f"{read[k]:,}" for k in ("events", "used", "skipped", "dropped")]
    line = (
        f"read {numbers[0]} events: {numbers[1]} used, {numbers[2]} not needed "
        f"(metadata, flows, marks), {numbers[3]} dropped"
    )
    assert f"analyze: {line}" in run.console
    assert f"_R{line[1:]}" in run.markdown.replace("\\", "")
    for reason, count in read["dropped_by_reason"].items():
        if count:
            assert f"{count:,} {reason}" in run.console
            assert f"{count:,} {reason}" in run.markdown.replace("\\", "")


# ---------------------------------------------------------------------------- not understood


def test_a_trace_without_categories_is_not_understood_not_cpu_only(runs: dict[str, Run]) -> None:
    run = runs[RPD.name]
    trace, read = run.report["trace"], run.report["trace"]["read"]
    assert trace["state"] == "not understood"
    assert trace["understood"] is False and trace["cpu_only"] is False
    # 706 values: 210 complete events and one empty object without a category, dropped;
    # 319 counters, 170 flow arrows and 6 metadata events, not needed
    assert (read["events"], read["used"], read["skipped"]) == (706, 0, 495)
    assert read["dropped_by_reason"]["no category"] == 211 == read["dropped"]
    assert "CPU-only trace" not in run.console + run.markdown
    assert "### Trace profile (trace not understood: 211 of 706 events dropped" in run.markdown
    assert any(w.startswith("trace not understood") for w in run.report["warnings"])
    assert not any("CPU-only trace" in w for w in run.report["warnings"])
    _counts_said(run)


def test_a_trace_not_understood_cannot_pass_the_gate(runs: dict[str, Run]) -> None:
    run = runs[RPD.name]
    gate = run.report["gate"]
    assert run.code == 1 and gate["passed"] is False and gate["judged"] is False
    assert "could not judge" in gate["message"] and "not understood" in gate["message"]
    assert "could not judge" in run.console


def test_control_the_same_events_with_categories_are_a_gpu_trace(tmp_path: Path) -> None:
    """The events were dropped for their missing category only: given the categories
    torch.profiler writes, the same events read as a GPU trace with every kernel."""
    kinds = {"KernelExecution": "kernel", "FillBuffer": "gpu_memset"}
    events = _load(RPD)
    for e in events:
        desc = (e.get("args") or {}).get("desc")
        if e.get("ph") == "X" and e.get("pid") == "2":  # the GPU's timeline
            e["cat"] = kinds.get(desc, "gpu_memcpy")
        elif e.get("ph") == "X":
            e["cat"] = "cuda_runtime"
    report = analyze(read_trace(_write(events, tmp_path / "with_categories.json")))
    assert report["trace"]["state"] == "gpu"
    assert report["trace"]["read"]["dropped_by_reason"]["no category"] == 1  # the {} left
    assert report["devices"][0]["kernels"]["count"] == 29
    assert not any("not understood" in w for w in report["warnings"])


# ---------------------------------------------------------------------------- not recorded


def test_launches_without_device_events_are_gpu_activity_not_recorded(
    runs: dict[str, Run],
) -> None:
    run = runs[CUPTI_RANGE.name]
    trace, read = run.report["trace"], run.report["trace"]["read"]
    assert trace["state"] == "gpu activity not recorded"
    assert trace["cpu_only"] is False and run.report["devices"] == []
    # 77 cudaLaunchKernel, 27 cudaMemcpyAsync/cudaMemsetAsync, counted in plain Python here
    data = _load(CUPTI_RANGE)["traceEvents"]
    runtime = [e["name"] for e in data if e.get("cat") == "cuda_runtime"]
    assert read["host_launches"] == sum(n.startswith("cudaLaunchKernel") for n in runtime)
    assert read["host_copies"] == sum(bool(re.match(r"cudaMem(cpy|set)", n)) for n in runtime)
    assert (read["host_launches"], read["host_copies"]) == (77, 27)
    assert "GPU activity not recorded: 77 kernel launches" in run.console
    assert "### Trace profile (GPU activity not recorded: 77 kernel launches" in run.markdown
    warning = next(w for w in run.report["warnings"] if w.startswith("GPU activity not"))
    assert "CUDA activity was not enabled" in warning
    assert not any("CPU-only" in w for w in run.report["warnings"])
    _counts_said(run)


def test_gpu_activity_not_recorded_cannot_pass_even_on_a_cpu_runner(
    runs: dict[str, Run],
) -> None:
    run = runs[CUPTI_RANGE.name]
    assert run.code == 1 and run.report["gate"]["passed"] is False
    assert run.report["gate"]["judged"] is False
    assert "could not judge" in run.report["gate"]["message"]
    # dlci profile on a machine it takes for a CPU runner: still no pass (not "not applicable")
    on_cpu = evaluate_gate(read(run.report), 10.0, no_gpu="the hardware class is cpu")
    assert on_cpu is not None and on_cpu.passed is False and on_cpu.applicable is msgspec.UNSET


def test_control_a_cpu_only_trace_stays_cpu_only(runs: dict[str, Run]) -> None:
    run = runs[CPU_ONLY.name]
    assert run.report["trace"]["state"] == "cpu-only" and run.report["trace"]["cpu_only"]
    assert run.report["trace"]["read"]["host_launches"] == 0
    assert "### Trace profile (CPU-only trace: no GPU work recorded)" in run.markdown
    assert run.code == 1 and run.report["gate"]["judged"] is False  # analyze: no GPU work
    on_cpu = evaluate_gate(read(run.report), 10.0, no_gpu="the hardware class is cpu")
    assert on_cpu is not None and on_cpu.passed is True and on_cpu.applicable is False
    # 12 of its 15 ops lie outside its one step; the console and the Markdown say so
    assert run.report["trace"]["read"]["outside_steps"] == 12
    assert "12 outside any profiled step" in run.console
    _counts_said(run)


def test_control_the_same_launches_with_their_kernels_are_a_gpu_trace(tmp_path: Path) -> None:
    data = _load(CUPTI_RANGE)
    launches = [
        e
        for e in data["traceEvents"]
        if e.get("cat") == "cuda_runtime" and e["name"].startswith("cudaLaunchKernel")
    ]
    for e in launches:  # the kernel CUPTI would have recorded: after its launch, on GPU 0
        corr = e["args"]["correlation"]
        data["traceEvents"].append(
            {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": e["ts"] + 5,
             "dur": 2, "args": {"device": 0, "stream": 7, "correlation": corr}}
        )  # fmt: skip
    report = analyze(read_trace(_write(data, tmp_path / "with_kernels.json")))
    assert report["trace"]["state"] == "gpu"
    assert report["devices"][0]["kernels"]["count"] == 77
    assert not any("not recorded" in w for w in report["warnings"])
    gate = evaluate_gate(read(report), 0.0)
    assert gate is not None and gate.judged is True and gate.passed is True


# ---------------------------------------------------------------------------- merged ranks


def test_merged_ranks_are_not_chained_into_one_series_of_steps(runs: dict[str, Run]) -> None:
    run = runs[FUSED.name]
    report = run.report
    assert report["steps"]["count"] == 0 and report["steps"]["numbers"] == []
    assert "ProfilerStep markers from 2 processes" in report["steps"]["refused"]
    assert report["steps"]["refused"] in report["warnings"]
    assert [(p["pid"], p["rank"]) for p in report["processes"]] == [(4037, 0), (104045, 1)]
    assert [p["steps"]["numbers"] for p in report["processes"]] == [[551, 552], [551, 552]]
    assert "process 4037 (rank 0): 2 steps" in run.console
    assert "#### Processes (a merged trace" in run.markdown
    _counts_said(run)


def _trim() -> Any:
    spec = importlib.util.spec_from_file_location("trim", REAL / "trim.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("rank", [0, 1])
def test_control_each_process_reads_as_its_ranks_own_file(
    runs: dict[str, Run], rank: int, tmp_path: Path
) -> None:
    """The merge was made from the ranks' files cut with trim.py --steps 2 --head 30000
    (tests/data/real/README.md); the same cut of the corpus file gives the same figures."""
    own_file = _write(_trim().trim(_load(RANKS[rank]), 2, None, 0.0, 30000.0), tmp_path / "r.json")
    own = analyze(read_trace(own_file))
    merged = runs[FUSED.name].report["processes"][rank]
    assert "processes" not in own and "refused" not in own["steps"]  # one process: its steps
    assert merged["steps"] == own["steps"]
    assert merged["gpu_utilization_pct"] == own["gpu_utilization_pct"] > 0
    assert merged["primary_device"] == own["primary_device"] == rank
    assert merged["devices"] == own["devices"]
    assert merged["per_step"] == own["per_step"]
    assert merged["breakdown"] == own["breakdown"] and merged["phases"] == own["phases"]
    # and the top-level figures of its GPU are its own, not the whole merged file's
    top = runs[FUSED.name].report["devices"]
    assert next(d for d in top if d["device"] == rank) == own["devices"][0]


def test_ranks_on_two_machines_sharing_gpu_0_are_still_told_apart(
    runs: dict[str, Run], tmp_path: Path
) -> None:
    """The same merge as if rank 1 ran on GPU 0 of another machine: the processes' figures
    stay their own (through the launches), and the top-level GPU 0, which mixes them, is
    named in a warning. Control: the real merge, one GPU per rank, has no such warning."""
    data = _load(FUSED)
    for e in data["traceEvents"]:
        args = e.get("args") or {}
        if args.get("rank") == 1 and "device" in args:
            args["device"] = 0
    report = analyze(read_trace(_write(data, tmp_path / "one_gpu_index.json")))
    merged = runs[FUSED.name].report
    for mine, real in zip(report["processes"], merged["processes"], strict=True):
        assert mine["primary_device"] == 0
        assert mine["gpu_utilization_pct"] == real["gpu_utilization_pct"]
        assert mine["devices"][0]["temporal_breakdown"] == real["devices"][0]["temporal_breakdown"]
    assert [d["device"] for d in report["devices"]] == [0]
    assert any(w.startswith("GPU 0 holds device work launched by 2 processes") for w in
               report["warnings"])  # fmt: skip
    assert not any("launched by 2 processes" in w for w in merged["warnings"])


def test_ranks_merged_under_one_process_id_have_their_steps_refused(
    runs: dict[str, Run], tmp_path: Path
) -> None:
    """A merger that kept rank 1's events under rank 0's process id: the steps of two ranks
    under one pid cannot be told apart, so they are refused with the reason, not chained.
    Control: the real merge (a pid per rank) is analysed per process."""
    data = _load(FUSED)
    for e in data["traceEvents"]:
        if (e.get("args") or {}).get("rank") == 1 and e.get("pid") == 104045:
            e["pid"] = 4037
    report = analyze(read_trace(_write(data, tmp_path / "one_pid.json")))
    assert report["steps"]["count"] == 0 and "processes" not in report
    assert (
        "ProfilerStep markers of 2 ranks (0, 1) share process id 4037"
        in (report["steps"]["refused"])
    )
    assert len(runs[FUSED.name].report["processes"]) == 2


# ---------------------------------------------------------------------------- phases, categories


def test_async_spans_and_begin_end_pairs_are_counted_and_named(tmp_path: Path) -> None:
    """A serving trace's async spans of a category the reader does not know are dropped as
    an unknown category, and named; begin/end pairs of a category it uses, as a phase it
    does not handle. Control: the complete events beside them are used."""
    t = Trace()
    t.step(1, 0.0, 100.0)
    t.kernel("k", 10.0, 50.0, launch=0.0)
    for i in range(10):
        t.op("aten::add", 60.0 + i, 1.0)
    for i in range(4):
        for ph in ("b", "e"):
            t.events.append({"ph": ph, "cat": "async_llm", "name": "req", "id": i, "pid": 1,
                             "tid": 1, "ts": 5.0 + i})  # fmt: skip
    for ph in ("B", "E"):
        t.events.append({"ph": ph, "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                         "ts": 20.0})  # fmt: skip
    report = analyze(read_trace(t.write(tmp_path / "t.json")))
    read = report["trace"]["read"]
    assert read["dropped_by_reason"]["unknown category"] == 8
    assert read["dropped_by_reason"]["phase not handled"] == 2
    assert read["events"] == read["used"] + read["skipped"] + read["dropped"]
    assert report["trace"]["categories"]["async_llm"] == 8
    text = " ".join(report["warnings"])
    assert "async_llm (8)" in text and "2 events have a phase the reader does not handle" in text
    assert report["trace"]["state"] == "gpu" and report["gpu_utilization_pct"] == 50.0
    # the same drops among fewer used events: more dropped than used is not understood
    t.events = [e for e in t.events if e.get("name") != "aten::add"]
    fewer = analyze(read_trace(t.write(tmp_path / "fewer.json")))
    assert fewer["trace"]["read"]["dropped"] > fewer["trace"]["read"]["used"]
    assert fewer["trace"]["state"] == "not understood"


# ---------------------------------------------------------------------------- the doc


DOC = Path(__file__).parent.parent / "docs" / "profiling.md"
FREE_KEYS = ("categories", "dropped_by_reason", "device_names", "pct")  # keys are data


def _keys(value: Any, out: set[str]) -> set[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            out.add(key)
            if key not in FREE_KEYS:
                _keys(item, out)
    elif isinstance(value, list):
        for item in value:
            _keys(item, out)
    return out


def test_every_key_and_value_of_these_reports_is_in_the_doc(runs: dict[str, Run]) -> None:
    """docs/profiling.md names every key these reports hold (memory's own keys are in
    docs/memory.md), every dropped reason, state and gap cause they can hold. Control:
    a key the doc does not name is found."""
    doc = DOC.read_text()
    keys: set[str] = set()
    for run in runs.values():
        _keys({k: v for k, v in run.report.items() if k != "memory"}, keys)

    def named(key: str) -> bool:  # `key`, `devices[].key`, or a code span starting with it
        return any(form in doc for form in (f"`{key}`", f".{key}`", f"`{key} "))

    assert sorted(k for k in keys if not named(k)) == []
    assert not named("no_such_key_anywhere")
    from dlci.profiling.columns import DROP_REASONS
    from dlci.profiling.readstate import STATES

    values = [*DROP_REASONS, *STATES, "host", "device", "end of window", "unknown"]
    assert [v for v in values if f"`{v}`" not in doc] == []
