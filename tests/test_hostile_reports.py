"""Every field of every gate report, hostile, through every Markdown the host writes (issue 35).

A pull request's code writes its own gate reports, so each field can hold markup: an image
that loads from the attacker's server, raw HTML, ``@org/team`` (the bot would ping the team
on the attacker's behalf), a bare URL, an issue reference, a workflow command; or a value of
the wrong type (a string ``threshold`` crashed ``dlci summary``). One module-scoped run puts
hostile text into every string field of the memorization, doctor and utilization reports and
renders the job summary, the pull request's comment (the baseline comparison) and the
history; then each field in turn gets a value of the wrong type. The controls: the same
render without ``md`` lets every hole through, and without the host's type check a report
of the wrong shape crashes ``dlci summary``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dlci.cli import main

HOSTILE = (
    "@org/team ![x](https://evil.example/p.png) <img src=x> <b>b</b> www.evil.example "
    "see #12 | **bold** \x1b[31m\n::error::x"
)
TIER = {"budget": "pr", "hardware_class": "cpu", "max_epochs": 100, "max_loss": 1.0}
TIER |= {"time_cap_minutes": 3, "profile_steps": 3, "row": "budgets.pr.cpu"}
KEEP = {"kind", "schema_version"}  # read by the host to pick the report up at all


def holes(text: str) -> list[str]:
    """What hostile text must never do in rendered Markdown, each way it could, found.
    GitHub renders no mention, link, image or HTML inside a code span, so spans are left out
    of those checks (``md_code`` keeps a backtick from closing one)."""
    found = []
    text_only = re.sub(r"`[^`\n]*`", "`code`", text)
    if "\x1b" in text:
        found.append("an ANSI escape")
    text = text_only
    if re.search(r"@[0-9A-Za-z]", text):
        found.append("an @mention")
    if re.search(r"(?i)https?://|www\.", text):
        found.append("a bare URL")
    if "![" in text:
        found.append("an image")
    if re.search(r"<(img|b)\b", text):
        found.append("HTML")
    if re.search(r"#[0-9]", text):
        found.append("an issue reference")
    found += [
        f"a workflow command: {line!r}" for line in text.splitlines() if line.startswith("::")
    ]
    width = None
    for line in text.splitlines():
        if not line.startswith("|"):
            width = None
            continue
        cells = len(re.findall(r"(?<!\\)\|", line))
        width = cells if width is None else width
        if cells != width:
            found.append(f"a row split by a pipe: {line!r}")
    return found


def memorization() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "kind": "memorization",
        "created_at": "2026-01-01T00:00:00Z",
        "verdict": "pass",
        "reason": "loss 0.01 < 1 at step 40",
        "threshold": 1.0,
        "config": {
            "target": "pkg.model:make_target",
            "seed": 0,
            "tier": dict(TIER),
            "hardware": {"device": "cpu", "world_size": 1, "gpu_name": "none"},
            "versions": {"dlci": "0.1.0", "python": "3.11", "torch": "2.13.0", "cuda": None},
            "hparams": {"lr": 0.01, "batch_examples": 8},
            "changes": ["dropout off: 2 modules"],
        },
        "tier": dict(TIER),
        "tracking": "none",
        "best_loss": 0.01,
        "best_step": 40,
        "final_loss": 0.01,
        "steps": 40,
        "losses": [1.0, 0.5, 0.01],
        "wall_time_s": 1.25,
        "setup_time_s": 0.5,
        "device": "cpu",
        "world_size": 1,
        "stopped_by": "threshold",
    }


def doctor() -> dict[str, Any]:
    check = {"status": "fail", "measured": "0.0", "expected": "> 0", "cause": "c", "fix": "f"}
    waiver = {"check": "lr", "mode": "warn", "reason": "r", "until": "2027-01-01"}
    waiver |= {"source": "pyproject.toml:3", "expired": False, "applied": True}
    waiver |= {"status_without_waiver": "fail"}
    return {
        "schema_version": 1,
        "kind": "doctor",
        "verdict": "fail",
        "reason": "1 check failed",
        "counts": {"pass": 1, "warn": 1, "fail": 1, "skip": 0},
        "checks": [
            {"id": "zero-grad", **check},
            {"id": "lr", **check, "status": "warn", "waived": {"mode": "warn"}},
        ],
        "waivers": [waiver],
    }


@pytest.fixture(scope="module")
def utilization() -> dict[str, Any]:
    import tempfile

    import msgspec

    from dlci.profiling.metrics import analyze
    from dlci.profiling.reader import read_trace
    from tracegen import training_trace

    with tempfile.TemporaryDirectory() as tmp:
        path = training_trace(steps=2, kernels=2, item_sync=True).write(Path(tmp) / "t.json")
        report = msgspec.to_builtins(analyze(read_trace(path)))  # as utilization.json holds it
    report["gate"] = {"passed": True, "value": 80.0, "minimum": 10.0, "message": "ok"}
    return report


def hostile(value: Any, key: str = "") -> Any:
    """Every string of ``value`` replaced by HOSTILE (keys and types kept)."""
    if isinstance(value, dict):
        return {k: v if k in KEEP else hostile(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [hostile(v) for v in value]
    return HOSTILE if isinstance(value, str) else value


def write_job(folder: Path, reports: dict[str, Any], tier: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    steps = [{"name": n, "status": "passed", "duration_s": 1.0} for n in ("tests", "memorize")]
    files = {"preflight.json": {"passed": True, "gpu": False, "tier": tier}}
    files["run.json"] = {"kind": "run", "steps": steps}
    files |= {f"{key}.json": report for key, report in reports.items()}
    for name, data in files.items():
        (folder / name).write_text(json.dumps(data))
    return folder


@pytest.fixture(scope="module")
def rendered(
    tmp_path_factory: pytest.TempPathFactory, utilization: dict[str, Any]
) -> dict[str, str]:
    """The job summary, the comparison comment and the history, from hostile reports."""
    import msgspec

    from dlci.action.github.baseline import against_baseline
    from dlci.action.github.history import update
    from dlci.report import comparison
    from dlci.report.comparison import LeftOut
    from dlci.report.fields import BaselineSource

    root = tmp_path_factory.mktemp("hostile")
    reports = {"memorization": memorization(), "doctor": doctor(), "utilization": utilization}
    bad = {key: hostile(report) for key, report in reports.items()}
    tier = hostile(TIER)
    head = write_job(root / "head", bad, tier)
    base = write_job(root / "base", bad, tier)
    texts: dict[str, str] = {"head": str(head)}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GITHUB_STEP_SUMMARY", str(root / "summary.md"))
        patch.setenv("GITHUB_OUTPUT", str(root / "outputs.txt"))
        patch.delenv("GITHUB_ACTIONS", raising=False)
        texts["code"] = str(main(["summary", "--artifacts", str(head)]))
        texts["summary"] = (root / "summary.md").read_text()
        compared = against_baseline(
            artifacts=head, host_record=None, spec="", base_dir=base, prefix="dlci", token="",
            max_utilization_drop=None, max_step_time=None, comment=False,
        )  # fmt: skip
        assert compared.result is not None
        # the base run as the API names it (a branch name is the pushers' own text), and
        # what the comparison leaves out of a report: both reach the comment as text
        source = BaselineSource(
            id=HOSTILE, head_branch=HOSTILE, head_sha=HOSTILE, created_at=HOSTILE, artifact=HOSTILE
        )
        result = msgspec.structs.replace(
            compared.result, warnings=[HOSTILE], left_out=LeftOut(base=[HOSTILE]), source=source
        )
        texts["comment"] = comparison.render(result)
        entry = {"date": HOSTILE, "run_id": HOSTILE, "sha": HOSTILE, "hardware_class": HOSTILE}
        entry |= {"torch": HOSTILE, "gpu_utilization_pct": 80.0, "final_loss": 0.1}
        previous = root / "history.json"
        previous.write_text(
            json.dumps({"schema_version": 1, "kind": "history", "entries": [entry]})
        )
        texts["history"] = update(
            previous_spec=str(previous), artifacts=head, out=root / "history", token="",
            artifact="dlci-history", bounds={}, environ={"DLCI_HISTORY_DATE": HOSTILE},
        ).markdown  # fmt: skip
    return texts


@pytest.mark.parametrize("medium", ["summary", "comment", "history"])
def test_hostile_text_in_every_field_renders_as_text(rendered: dict[str, str], medium: str) -> None:
    text = rendered[medium]
    assert holes(text) == []
    assert "@\u200borg/team" in text  # the hostile text did reach it, shown as text


def test_the_summary_shows_every_report_and_names_no_false_problem(rendered) -> None:
    text = rendered["summary"]
    assert rendered["code"] in ("0", "1")  # a verdict, never dl-ci's own crash (3)
    for heading in ("Memorization test", "Debugging checks", "Trace profile"):
        assert heading in text
    assert "not shown" not in text and "is incomplete" not in text


def test_control_without_md_every_hole_is_open(rendered, monkeypatch) -> None:
    import sys

    raw = lambda text, limit=None: str(text)  # noqa: E731
    for name, module in list(sys.modules.items()):
        if name.startswith("dlci.report.") and getattr(module, "md", None) is not None:
            monkeypatch.setattr(module, "md", raw)
    from dlci.action.host.summary import collect
    from dlci.report.summary import render

    found = holes(render(collect(Path(rendered["head"]))))
    for hole in ("an @mention", "a bare URL", "an image", "HTML", "an issue reference"):
        assert hole in found


# ---------------------------------------------------------------- the wrong types


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if path:
        yield path
    if isinstance(value, dict | list):
        children = value.items() if isinstance(value, dict) else enumerate(value)
        for key, child in children:
            if key not in KEEP:
                yield from _paths(child, (*path, key))


def _swapped(report: Any, path: tuple[Any, ...], value: Any) -> Any:
    report = copy.deepcopy(report)
    holder = report
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    return report


def test_a_wrong_type_in_any_field_is_a_problem_never_a_crash(
    utilization: dict[str, Any], tmp_path: Path
) -> None:
    from dlci.action.host.summary import collect, type_problems
    from dlci.report.summary import render

    reports = {"memorization": memorization(), "doctor": doctor(), "utilization": utilization}
    base = collect(write_job(tmp_path, reports, dict(TIER)))
    assert base.problems == [] and base.memorization is not None
    swaps = 0
    for key, report in reports.items():
        for path in _paths(report):
            for wrong in (HOSTILE, [HOSTILE], {"x": HOSTILE}):
                data = dataclasses.replace(base, **{key: None})  # the others as read
                raw: dict[str, Any] = dict.fromkeys(reports)
                raw[key] = _swapped(report, path, wrong)
                data.problems = type_problems(raw, data)
                text = render(data)  # never raises
                assert holes(text) == [], (key, path)
                swaps += 1
    assert swaps > 300  # every field of the three reports, three ways


def test_a_string_threshold_is_named_in_the_summary(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    report = {**memorization(), "threshold": "1.0"}
    folder = write_job(tmp_path / "art", {"memorization": report}, dict(TIER))
    assert main(["summary", "--artifacts", str(folder)]) == 1
    text = (tmp_path / "summary.md").read_text()
    assert "- memorization.json: threshold is text, expected a number" in text
    assert "memorization.json is not shown: its fields are not the types dl-ci writes" in text
    assert "Traceback" not in capsys.readouterr().err


def test_control_without_the_type_check_a_report_of_the_wrong_shape_crashes_the_summary(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    import dlci.action.host.summary as summary

    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    folder = write_job(tmp_path / "art", {"doctor": {**doctor(), "checks": "x"}}, dict(TIER))
    assert main(["summary", "--artifacts", str(folder)]) == 1  # checked: a named problem
    assert "doctor.json: checks is text, expected a list" in (tmp_path / "summary.md").read_text()
    monkeypatch.setattr(summary, "type_problems", lambda data: [])
    assert main(["summary", "--artifacts", str(folder)]) == 3  # dl-ci's own crash


def test_a_report_of_millions_of_wrong_items_is_read_only_to_the_limit(monkeypatch) -> None:
    """The type check stops at the first problem past its limit (a report the pull request's
    code wrote can hold millions), and a key as long as the report is cut in the path."""
    from dlci import schema
    from dlci.report import fields

    walked = 0
    real = schema.mismatches

    def counting(*args: Any) -> Iterator[Any]:
        nonlocal walked
        for found in real(*args):
            walked += 1
            yield found

    monkeypatch.setattr(schema, "mismatches", counting)
    report = {"losses": ["x"] * 100_000, "verdict": "pass"}
    found = fields.problems("memorization", report, limit=5)
    assert found[-1] == "memorization.json: more fields of wrong types" and len(found) == 6
    assert walked == 6  # control: without the limit, the walk would yield 100 000
    assert sum(1 for _ in real(fields.SHAPES["memorization"], report)) == 100_000
    doctor = {"counts": {"k" * 100_000: "many"}}
    (line,) = fields.problems("doctor", doctor)
    assert line == f"doctor.json: counts.{'k' * 37}... is text, expected an integer"


def test_numbers_no_float_holds_and_megabytes_of_text_still_give_a_summary(
    tmp_path: Path, monkeypatch, capsys, utilization: dict[str, Any]
) -> None:
    """The open tables of utilization.json (memory's capture and steps, the shares) take any
    number JSON can spell: 10**400 once crashed the summary (OverflowError, no summary, no
    outputs). A report of megabytes of text gives a summary GitHub still shows (it drops one
    over 1 MiB whole), and 20 annotations of failing checks, not thousands."""
    from dlci.action.host.summary import MAX_SUMMARY_BYTES

    huge = json.loads("1" + "0" * 400)  # what a JSON parser reads from 400 digits
    report = copy.deepcopy(utilization)
    report["memory"] = {
        "source": "trace",
        "capture": {"device": "cuda:0", "peak_allocated_bytes": huge},
        "steps": [{"step": 1, "peak_allocated_bytes": huge}],
        "top_allocations": [{"bytes": huge, "where": "x"}],
    }
    report["breakdown"] = {"pct": {"kernel": huge}}
    report["phases"] = {"pct": {"data_loading": huge}}
    failing = {"id": "zero-grad", "status": "fail", "measured": "m", "expected": "e",
               "cause": "c", "fix": "f"}  # fmt: skip
    big_doctor = {"verdict": "fail", "counts": {"fail": 5000}, "checks": [failing] * 5000,
                  "waivers": []}  # fmt: skip
    big_memorization = {**memorization(), "reason": "x " * 1_500_000}
    reports = {"utilization": report, "doctor": big_doctor, "memorization": big_memorization}
    folder = write_job(tmp_path / "art", reports, dict(TIER))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "outputs.txt"))
    assert main(["summary", "--artifacts", str(folder)]) == 0  # its steps passed: no crash (3)
    summary = (tmp_path / "summary.md").read_bytes()
    assert 0 < len(summary) <= MAX_SUMMARY_BYTES + 200
    assert summary.rstrip().endswith(b"every report is in the artifacts.)")
    assert "verdict" in (tmp_path / "outputs.txt").read_text()  # the outputs were written
    annotated = [line for line in capsys.readouterr().err.splitlines()
                 if line.startswith("error: dlci doctor: ")]  # fmt: skip
    assert len(annotated) == 20  # of 5000 failing checks


@pytest.mark.parametrize(
    ("name", "report", "named"),
    [
        ("run.json", {"steps": "x"}, "run.json: steps is text, expected a list"),
        ("run.json", {"steps": [7]}, "run.json: steps[0] is a number, expected an object"),
        (
            "run.json",
            {"steps": [{"name": "tests", "status": "failed", "log_tail": "x"}]},
            "run.json: steps[0].log_tail is text, expected a list",
        ),
        (
            "run.json",
            {"timing": {"project": {"tests": "lots"}}},
            "run.json: timing.project.tests is text, expected a number",
        ),
        ("run.json", {"threads": {"source": 3}}, "run.json: threads.source is a number"),
        ("cleanup.json", {"gpu_processes": {}}, "cleanup.json: gpu_processes is an object"),
        ("preflight.json", {"error": "x"}, "preflight.json: error is text, expected an object"),
        ("preflight.json", {"passed": True, "tier": "x"}, "preflight.json: tier is text"),
        (
            "cleanup.json",
            {"gpu_processes": [{"used_memory_mib": "lots"}]},
            "cleanup.json: gpu_processes[0].used_memory_mib is text, expected an integer",
        ),
    ],
)
def test_a_run_cleanup_or_preflight_record_of_the_wrong_types_is_named_never_a_crash(
    tmp_path: Path, monkeypatch, capsys, name: str, report: dict, named: str
) -> None:
    """run.json and cleanup.json are read into their classes (report/fields.py), the fields
    of preflight.json the summary reads are checked, before the summary reads them: a field of
    a wrong type is named, and the file is not shown (a step or a preflight error or tier
    that is no object crashed the summary; the other wrong types were passed over)."""
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    folder = write_job(tmp_path / "art", {}, dict(TIER))
    (folder / name).write_text(json.dumps({"kind": name[:-5], **report}))
    assert main(["summary", "--artifacts", str(folder)]) == 1
    text = (tmp_path / "summary.md").read_text().replace("\\", "")  # md's escapes
    assert named in text and f"{name} is not shown" in text
    assert "Traceback" not in capsys.readouterr().err


def test_a_report_too_big_or_beyond_any_number_is_named_quickly(tmp_path: Path) -> None:
    """A run.json of millions of empty steps (63 MB took a minute and 4 GB to walk) is refused
    by its size in values, and a doctor.json holding an integer no field holds (10**400) is
    named: it used to read as merely incomplete, its failing checks unannotated and the job
    passing. Control: the same doctor.json with a sound number is shown."""
    import time

    from dlci.action.host.summary import collect
    from dlci.report.fields import LIMITS

    sound = doctor()
    sound["checks"][0]["seconds"] = 1.5
    data = collect(write_job(tmp_path / "sound", {"doctor": sound}, dict(TIER)))
    assert data.doctor is not None and "doctor" not in data.incomplete
    huge = doctor()
    huge["checks"][0]["seconds"] = 10**400
    folder = write_job(tmp_path / "huge", {"doctor": huge}, dict(TIER))
    steps = ',{"name":"tests","status":"passed"}' * (LIMITS["run"] // 2)
    (folder / "run.json").write_text('{"steps":[{"name":"tests","status":"passed"}' + steps + "]}")
    start = time.monotonic()
    data = collect(folder)
    seconds = time.monotonic() - start
    assert data.doctor is None and "doctor" not in data.incomplete
    assert "doctor.json is not shown: it cannot be read" in data.problems
    assert f"run.json holds more than {LIMITS['run']:,} values: not a report dl-ci writes" in (
        data.problems
    )
    assert data.verdict == "fail"
    print(f"a run.json of {LIMITS['run']:,} values refused in {seconds:.2f} s")
