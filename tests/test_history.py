"""``dlci history``: nights appended, the trend plot, drift flagged with statistics.

Histories are written as JSON directly (nights of known figures); tonight's entry comes from
a folder of reports, as the nightly workflow's dlci-artifacts; the previous history is also
fetched through the stand-in GitHub API (tests/github_standin.py).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from dlci.cli import main
from dlci.report import history
from dlci.report.fields import HistoryEntry
from github_standin import StandIn, zipped

TOKEN = "ghs_historyToken0123456789"  # pragma: allowlist secret (a test value)


def night(i: int, *, util: float = 80.0, ms: float = 50.0, epochs: int = 40, klass: str = "a100"):
    wobble = (i % 3 - 1) * 0.3
    return {
        "date": f"2026-11-{1 + i % 28:02d}T03:17Z",
        "run_id": str(1000 + i),
        "sha": f"{i:040x}",
        "hardware_class": klass,
        "torch": "2.5.1",
        "gpu_utilization_pct": util + wobble,
        "step_time_us": ms * 1e3 * (1 + wobble / 100),
        "epochs_to_threshold": epochs + i % 2,
        "final_loss": 0.04,
        "coverage_pct": 87.0,
    }


def write_history(path: Path, entries: list[dict]) -> Path:
    path.write_text(json.dumps({"schema_version": 1, "kind": "history", "entries": entries}))
    return path


def run_history(tmp_path: Path, *argv: str) -> tuple[int, dict, str]:
    out = tmp_path / "out"
    md = tmp_path / "history.md"
    code = main(["history", "--out", str(out), "--markdown", str(md), *argv])
    data = json.loads((out / "history.json").read_text()) if (out / "history.json").exists() else {}
    return code, data, md.read_text() if md.exists() else ""


def test_a_utilization_drop_over_the_last_nights_is_flagged_as_drift(tmp_path, capsys) -> None:
    nights = [night(i) for i in range(17)] + [night(i, util=60.0) for i in range(17, 20)]
    previous = write_history(tmp_path / "h.json", nights)
    code, data, text = run_history(tmp_path, "--previous", str(previous), "--fail-on-drift")
    assert code == 1
    assert len(data["entries"]) == 20
    assert "| a100 | GPU utilization | 2026-11-20T03:17Z | 60.0 % | drift |" in text
    err = capsys.readouterr().err
    assert "warning: a100: GPU utilization drifted: worse by more than 5 pt" in err
    # control: the same nights without the drop show no drift
    steady = write_history(tmp_path / "s.json", [night(i) for i in range(20)])
    (tmp_path / "control").mkdir()
    code, _, text = run_history(tmp_path / "control", "--previous", str(steady), "--fail-on-drift")
    assert code == 0 and "| drift |" not in text and "| a100 | GPU utilization |" in text


def test_fewer_than_six_nights_judge_nothing(tmp_path) -> None:
    previous = write_history(tmp_path / "h.json", [night(i) for i in range(5)])
    code, _, text = run_history(tmp_path, "--previous", str(previous))
    assert code == 0 and "fewer than 6 nights" in text


def test_seventeen_cpu_nights_say_no_data_and_the_plot_has_axes_and_dates(tmp_path) -> None:
    """Before: "fewer than 6 nights" beside 17 entries, and a blank GPU panel with no axes
    and no dates. A CPU runner records no GPU utilization: the table and the plot say so;
    the figures it does record are judged (the control: a trend verdict, not a note)."""
    cpu = [dict(night(i, klass="cpu"), gpu_utilization_pct=None) for i in range(17)]
    code, _, text = run_history(
        tmp_path, "--previous", str(write_history(tmp_path / "h.json", cpu))
    )
    assert code == 0 and "fewer than 6 nights" not in text
    assert "| cpu | GPU utilization | 2026-11-17T03:17Z | - | no data: none of 17 nights" in text
    assert "| cpu | step time (median) | 2026-11-17T03:17Z | 50.00 ms | ok |" in text
    root = ET.fromstring((tmp_path / "out" / "trend.svg").read_text())
    labels = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert any(t.startswith("no data: none of 17 nights recorded GPU utilization") for t in labels)
    assert {"2026-11-01", "2026-11-09", "2026-11-17"} <= set(labels)  # first, middle, last
    assert {"50.15 ms", "40", "41"} & set(labels)  # the ranges in their units
    axes = [
        pl for pl in root.iter("{http://www.w3.org/2000/svg}polyline") if pl.get("stroke") == "#888"
    ]
    assert len(axes) == len(history.FIGURES)


def test_tonights_reports_are_appended_and_a_rerun_replaces_its_entry(
    tmp_path, monkeypatch
) -> None:
    art = tmp_path / "art"
    art.mkdir()
    steps = [{"duration_us": 40e3 + i, "gpu_utilization_pct": 75.0} for i in range(10)]
    report = {"schema_version": 1, "kind": "utilization", "gpu_utilization_pct": 75.0}
    (art / "utilization.json").write_text(json.dumps(report | {"per_step": steps}))
    (art / "preflight.json").write_text(json.dumps({"tier": {"hardware_class": "h100"}}))
    monkeypatch.setenv("GITHUB_RUN_ID", "4242")
    monkeypatch.setenv("DLCI_HISTORY_DATE", "2026-12-01T03:17Z")
    previous = write_history(tmp_path / "h.json", [night(i) for i in range(3)])
    code, data, _ = run_history(tmp_path, "--previous", str(previous), "--append", str(art))
    assert code == 0
    last = data["entries"][-1]
    assert last["hardware_class"] == "h100" and last["run_id"] == "4242"
    assert last["gpu_utilization_pct"] == 75.0 and last["step_time_us"] == pytest.approx(40004.5)
    again = tmp_path / "again"
    again.mkdir()
    code, data, _ = run_history(
        again, "--previous", str(tmp_path / "out" / "history.json"), "--append", str(art)
    )
    assert [e["run_id"] for e in data["entries"]] == ["1000", "1001", "1002", "4242"]


def test_a_broken_history_starts_afresh_with_a_warning(tmp_path, capsys) -> None:
    bad = [night(0), {**night(1), "gpu_utilization_pct": "high"}, {"hardware_class": 3}]
    previous = write_history(tmp_path / "h.json", [*bad, {**night(2), "step_time_us": 1e300}])
    code, data, _ = run_history(tmp_path, "--previous", str(previous))
    assert code == 0 and [e["run_id"] for e in data["entries"]] == ["1000"]
    assert "3 malformed history entries were left out" in capsys.readouterr().err
    (tmp_path / "x.json").write_text("[1, 2")
    code, data, _ = run_history(tmp_path, "--previous", str(tmp_path / "x.json"))
    assert code == 0 and data["entries"] == []
    assert "the previous history is unreadable, starting a new one" in capsys.readouterr().err


def test_each_entry_left_out_is_named_with_its_field(tmp_path, capsys) -> None:
    """history.json comes from an artifact: the warning names why each entry was left out
    (at most five, then a count), by key path, never a traceback."""
    bad = [
        {**night(1), "gpu_utilization_pct": "high"},
        {"hardware_class": 3},
        {**night(2), "epochs_to_threshold": 2.5},
        {**night(3), "step_time_us": 1e300},
        [1],
        {**night(4), "date": {"x": 1}},
        {**night(5), "torch": True},
    ]
    previous = write_history(tmp_path / "h.json", [night(0), *bad])
    code, data, _ = run_history(tmp_path, "--previous", str(previous))
    err = capsys.readouterr().err
    assert code == 0 and [e["run_id"] for e in data["entries"]] == ["1000"]  # the sound one
    assert "7 malformed history entries were left out: " in err
    for named in (
        "history.json: entries[1].gpu_utilization_pct is 'high', expected a number or null",
        "history.json: entries[2].hardware_class is 3, expected text",
        "history.json: entries[3].epochs_to_threshold is 2.5, expected an integer or null",
        "history.json: entries[4].step_time_us is 1e+300, beyond what a history plots",
        "history.json: entries[5] is a list, expected an object",
        "history.json: more entries left out",
    ):
        assert named in err
    assert "entries[6]" not in err and "Traceback" not in err


def test_the_history_keeps_at_most_its_cap(monkeypatch) -> None:
    monkeypatch.setattr(history, "MAX_ENTRIES", 5)
    data = history.empty()
    for i in range(8):
        data = history.append(data, HistoryEntry(**night(i)))
    assert [e.run_id for e in data.entries] == ["1003", "1004", "1005", "1006", "1007"]


def test_the_trend_plot_is_svg_with_one_line_per_class_and_names_escaped(tmp_path) -> None:
    hostile = '<script>alert(1)</script>"&'
    entries = [night(i) for i in range(4)] + [night(i, klass=hostile) for i in range(4, 8)]
    code, _, text = run_history(
        tmp_path, "--previous", str(write_history(tmp_path / "h.json", entries))
    )
    assert code == 0
    svg = (tmp_path / "out" / "trend.svg").read_text()
    root = ET.fromstring(svg)  # well-formed: the hostile name cannot open an element
    lines = root.findall("{http://www.w3.org/2000/svg}polyline")
    assert len([pl for pl in lines if pl.get("stroke") != "#888"]) == 2 * len(history.FIGURES)
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert "<script>" not in text and "&lt;script&gt;" in text


def test_auto_takes_the_history_of_the_last_finished_night(tmp_path, monkeypatch, capsys) -> None:
    standin = StandIn(token=TOKEN).start()
    try:
        monkeypatch.setenv("GITHUB_API_URL", standin.api)
        monkeypatch.setenv("GITHUB_REPOSITORY", "org/project")
        monkeypatch.setenv(
            "GITHUB_WORKFLOW_REF", "org/project/.github/workflows/nightly.yml@refs/heads/main"
        )
        monkeypatch.setenv("GITHUB_REF_NAME", "main")
        monkeypatch.delenv("GITHUB_BASE_REF", raising=False)
        monkeypatch.setenv("DLCI_GITHUB_TOKEN", TOKEN)
        older = standin.add_run("nightly.yml")
        blob = json.dumps({"schema_version": 1, "kind": "history", "entries": [night(0)]})
        standin.add_artifact(older, "nightly-history-a100", zipped({"history.json": blob.encode()}))
        failed = standin.add_run("nightly.yml", conclusion="failure")  # a failed night counts
        two = json.dumps({"schema_version": 1, "kind": "history", "entries": [night(0), night(1)]})
        standin.add_artifact(failed, "nightly-history-a100", zipped({"history.json": two.encode()}))
        argv = ["--previous", "auto", "--artifact-name", "nightly-history-a100"]
        code, data, _ = run_history(tmp_path, *argv)
        assert code == 0 and len(data["entries"]) == 2
        assert standin.seen[0].query["status"] == ["completed"]
        monkeypatch.setenv("DLCI_GITHUB_TOKEN", "ghs_wrong")
        code, data, _ = run_history(tmp_path / "b", *argv)
        assert code == 0 and data["entries"] == []
        err = capsys.readouterr().err
        assert "no previous history, starting a new one:" in err and "HTTP 401" in err
    finally:
        standin.stop()


@pytest.fixture
def nightly(monkeypatch):
    """The stand-in GitHub API, as the nightly workflow's history step sees it."""
    standin = StandIn(token=TOKEN).start()
    monkeypatch.setenv("GITHUB_API_URL", standin.api)
    monkeypatch.setenv("GITHUB_REPOSITORY", "org/project")
    monkeypatch.setenv(
        "GITHUB_WORKFLOW_REF", "org/project/.github/workflows/nightly.yml@refs/heads/main"
    )
    monkeypatch.setenv("GITHUB_REF_NAME", "main")
    monkeypatch.delenv("GITHUB_BASE_REF", raising=False)
    monkeypatch.setenv("DLCI_GITHUB_TOKEN", TOKEN)
    yield standin
    standin.stop()


def _kept(standin: StandIn, entries: list[dict], **run) -> dict:
    made = standin.add_run("nightly.yml", event=run.pop("event", "schedule"), **run)
    blob = json.dumps({"schema_version": 1, "kind": "history", "entries": entries}).encode()
    standin.add_artifact(made, "nightly-history-a100", zipped({"history.json": blob}))
    return made


ARGV = ("--previous", "auto", "--artifact-name", "nightly-history-a100")


def test_auto_never_takes_a_forks_pull_request_run_of_the_nightly(nightly, tmp_path) -> None:
    """A fork's PR can add `on: pull_request` to its copy of nightly.yml and upload a history."""
    _kept(nightly, [night(0), night(1)])
    _kept(nightly, [night(9, util=1.0)], event="pull_request", head_repository="mallory/project")
    code, data, _ = run_history(tmp_path, *ARGV)
    assert code == 0 and [e["run_id"] for e in data["entries"]] == ["1000", "1001"]
    # control: a newer night of this repository's own is taken
    _kept(nightly, [night(2)], event="workflow_dispatch")
    code, data, _ = run_history(tmp_path / "b", *ARGV)
    assert [e["run_id"] for e in data["entries"]] == ["1002"]


def test_a_night_without_its_history_artifact_does_not_wipe_the_history(
    nightly, tmp_path, monkeypatch, capsys
) -> None:
    """The newest night was cancelled before `dlci history`: the night before carries on."""
    from dlci.action.github import artifacts as baseline

    kept = _kept(nightly, [night(i) for i in range(28)])
    nightly.add_run("nightly.yml", event="schedule", conclusion="cancelled")
    code, data, _ = run_history(tmp_path, *ARGV)
    assert code == 0 and len(data["entries"]) == 28
    err = capsys.readouterr().err
    assert "1 newer finished run(s) kept no nightly-history-a100 artifact" in err
    assert f"carried on from run {kept['id']}" in err
    # the walk is bounded: with one run tried, the history starts afresh
    monkeypatch.setattr(baseline, "MAX_RUNS_TRIED", 1)
    code, data, _ = run_history(tmp_path / "b", *ARGV)
    assert code == 0 and data["entries"] == []
    assert "no previous history, starting a new one: run" in capsys.readouterr().err


def test_a_history_without_append_says_nothing_was_added(tmp_path, capsys) -> None:
    previous = write_history(tmp_path / "h.json", [night(0)])
    code, data, _ = run_history(tmp_path, "--previous", str(previous))
    assert code == 0 and len(data["entries"]) == 1
    assert "warning: no --append: nothing added tonight" in capsys.readouterr().err
    art = tmp_path / "art"  # control: with --append, no such warning
    art.mkdir()
    (art / "preflight.json").write_text(json.dumps({"tier": {"hardware_class": "h100"}}))
    run_history(tmp_path / "b", "--previous", str(previous), "--append", str(art))
    assert "no --append" not in capsys.readouterr().err


def test_nights_at_another_tier_are_another_tier_not_drift(tmp_path, capsys) -> None:
    """A new ladder revision (a relative threshold, twice the epochs to it) is not drift."""
    old = {"budget": "nightly", "ladder_revision": "2026.11", "threshold_form": "absolute",
           "threshold": 0.05, "max_epochs": 1000}  # fmt: skip
    new = {**old, "ladder_revision": "2026.12", "threshold_form": "relative", "threshold": None,
           "relative_threshold": 0.02}  # fmt: skip
    nights = [night(i) | old for i in range(17)] + [
        night(i, epochs=90) | new for i in range(17, 20)
    ]
    previous = write_history(tmp_path / "h.json", nights)
    code, data, text = run_history(tmp_path, "--previous", str(previous), "--fail-on-drift")
    assert code == 0, capsys.readouterr().err
    assert data["entries"][-1]["ladder_revision"] == "2026.12"
    assert "| a100 | epochs to threshold | 2026-11-20T03:17Z | 91 | another tier |" in text
    assert "a100: another tier since 2026-11-18T03:17Z (ladder revision 2026.12, relative" in text
    # control: the same nights without the tier they were judged at read as drift
    bare = [{k: v for k, v in n.items() if k not in new} for n in nights]
    (tmp_path / "control").mkdir()
    previous = write_history(tmp_path / "control" / "h.json", bare)
    code, _, text = run_history(
        tmp_path / "control", "--previous", str(previous), "--fail-on-drift"
    )
    assert code == 1 and "| a100 | epochs to threshold | 2026-11-20T03:17Z | 91 | drift |" in text
