"""memorization.json typed end to end: the writer's classes are what every reader reads back."""

from __future__ import annotations

import json
import math
from pathlib import Path

import msgspec
import pytest

from dlci import jsonio
from dlci.cli import main
from dlci.memorization.verdict import partial
from dlci.report import memorization
from dlci.report.fields import SeedRun, SeedRuns

DATA = Path(__file__).parent / "data" / "reports"
TIER = {
    "schema_version": 1, "budget": "pr", "hardware_class": "cpu", "max_epochs": 100,
    "max_loss": None, "time_cap_minutes": 3.0, "profile_steps": 3, "nproc": 1, "batch_size": 16,
    "ladder": "default", "ladder_version": 2, "ladder_revision": "2026.11", "row": "budgets.pr.cpu",
    "reasons": [], "warnings": [], "max_relative_loss": 0.3,
    "criterion": "loss at or below 30% of its start",
}  # fmt: skip


def _built(**known: object) -> memorization.Memorization:
    result = partial(stopped_by="nonfinite", reason="the loss is nan", losses=[2.0, math.nan])
    return memorization.build_report(
        result=result, tier=TIER, seed=0, target="pkg:make", gpu_name=None, tracking="none",
        **known,  # type: ignore[arg-type]
    )  # fmt: skip


def test_the_written_report_reads_back_as_the_same_classes(monkeypatch) -> None:
    monkeypatch.setattr(memorization, "library_versions", lambda: {"dlci": "0", "torch": None})
    report = _built(seeds=SeedRuns(count=1, quorum=1, runs=[SeedRun(seed=0, best_loss="nan")]))
    raw = json.loads(jsonio.encode(report))
    assert raw["tier"] == TIER  # the tier as Tier.to_dict writes it, every key kept
    assert raw["losses"] == [2.0, "nan"] and raw["final_loss"] == "nan"
    assert raw["threshold"] is None and raw["threshold_form"] == "relative"
    assert "script_mode" not in raw and raw["seeds"]["runs"][0]["best_loss"] == "nan"
    assert memorization.read(raw) == report
    assert memorization.missing(raw) == []
    assert "script_mode" not in msgspec.to_builtins(_built(seeds=msgspec.UNSET))


def test_an_older_report_reads_with_defaults() -> None:
    raw = json.loads((DATA / "memorization.json").read_text())
    assert "case" not in raw  # written before the case was recorded
    report = memorization.read(raw)
    assert report.case == "" and report.measured == [] and report.verdict == raw["verdict"]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"best_loss": "low"}, "memorization.json: best_loss is text, expected a number or null"),
        ({"tier": {"budget": 3}}, "memorization.json: tier.budget is a number, expected text"),
        ({"wall_time_s": 10**400}, "memorization.json cannot be read: Number out of range"),
    ],
)
def test_a_report_of_the_wrong_types_is_named_not_read(change: dict, words: str) -> None:
    raw = json.loads((DATA / "memorization.json").read_text()) | change
    with pytest.raises(ValueError, match="^" + words.replace("(", r"\(")):
        memorization.read(raw)


def test_a_run_whose_loss_became_nan_is_shown_in_the_summary(tmp_path: Path, monkeypatch) -> None:
    """A diverged run's report holds "nan" (JSON has no NaN): a loss dl-ci writes, shown."""
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "outputs.txt"))
    raw = json.loads((DATA / "memorization.json").read_text())
    raw |= {"verdict": "fail", "best_loss": "nan", "final_loss": "nan", "losses": [2.0, "nan"]}
    art = tmp_path / "art"
    art.mkdir()
    (art / "memorization.json").write_text(json.dumps(raw))
    (art / "preflight.json").write_text(json.dumps({"passed": True, "tier": raw["tier"]}))
    assert main(["summary", "--artifacts", str(art)]) == 1
    text = (tmp_path / "summary.md").read_text()
    assert "| memorization | FAIL: best loss nan (goal:" in text
    assert "### ❌ Memorization test: fail" in text and "not shown" not in text
    assert "memorization-loss=nan" in (tmp_path / "outputs.txt").read_text()


def test_a_partial_report_keeps_its_facts_and_its_section_is_incomplete(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    art = tmp_path / "art"
    art.mkdir()
    (art / "memorization.json").write_text(json.dumps({"verdict": "pass", "best_loss": 0.5}))
    main(["summary", "--artifacts", str(art)])
    text = (tmp_path / "summary.md").read_text()
    assert "| memorization | PASS: best loss 0.5 (no goal recorded) |" in text
    assert "(memorization.json is incomplete)" in text
