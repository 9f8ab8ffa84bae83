"""The budget ladder: loading, extending, selecting, and errors word for word."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlci.errors import DlciError
from dlci.ladder.load import (
    EVENT_BUDGETS,
    load_ladder,
    load_ladder_text,
    resolve_budget,
    select_tier,
)

SMALL = Path(__file__).parent / "data" / "ladders" / "small.yaml"


def test_the_default_ladder_carries_the_measured_numbers() -> None:
    ladder = load_ladder()
    pr = select_tier(ladder, budget="pr", hardware_class="t4")
    nightly = select_tier(ladder, budget="nightly", hardware_class="a100")
    # FSDL's absolute thresholds (1.0 and 0.05 of a start of 4.4) as shares; the epochs that
    # let a transformer at AdamW 5e-5 and SGD at 0.01 pass (docs/budget-ladder.md)
    assert (pr.max_epochs, pr.max_relative_loss, pr.time_cap_minutes) == (1000, 0.3, 5.0)
    assert (nightly.max_epochs, nightly.max_relative_loss) == (3000, 0.02)
    assert nightly.time_cap_minutes == 10.0 and pr.max_loss is None is nightly.max_loss
    assert nightly.row == "budgets.nightly.a100"


def test_every_budget_of_the_default_ladder_covers_every_class() -> None:
    ladder = load_ladder()
    for budget in ("pr", "merge", "nightly"):
        for cls in ladder.classes:
            tier = select_tier(ladder, budget=budget, hardware_class=cls)
            assert tier.max_epochs >= 100
            assert tier.time_cap_minutes > 0


def test_time_caps_shrink_as_classes_get_faster() -> None:
    ladder = load_ladder()
    for budget in ("pr", "merge", "nightly"):
        caps = [
            (ladder.classes[c].speed, select_tier(ladder, budget=budget, hardware_class=c))
            for c in ladder.classes
            if c != "cpu"
        ]
        caps.sort(key=lambda pair: pair[0])
        slow, fast = caps[0][1].time_cap_minutes, caps[-1][1].time_cap_minutes
        assert slow > fast, budget


@pytest.mark.parametrize(("event", "budget"), sorted(EVENT_BUDGETS.items()))
def test_budget_auto_follows_the_github_event(event: str, budget: str) -> None:
    assert resolve_budget("auto", event_name=event)[0] == budget


def test_budget_auto_runs_the_pr_budget_for_other_events() -> None:
    budget, reason = resolve_budget("auto", event_name="issue_comment")
    assert budget == "pr"
    assert reason == (
        "budget auto: GITHUB_EVENT_NAME=issue_comment is not a scheduled, push or PR event; "
        "using pr"
    )


def test_an_explicit_budget_is_taken_as_given() -> None:
    assert resolve_budget("nightly", event_name="pull_request") == (
        "nightly",
        "budget nightly: given",
    )


def test_a_users_ladder_extends_the_default_and_overrides_one_value(write_ladder) -> None:
    path = write_ladder(
        "version: 1\nextends: default\nrevision: team-2026\n"
        "budgets:\n  pr:\n    a100: {max_loss: 0.5}\n"
    )
    ladder = load_ladder(path)
    tier = select_tier(ladder, budget="pr", hardware_class="a100")
    assert (tier.max_loss, tier.max_epochs, tier.ladder_revision) == (0.5, 1000, "team-2026")
    assert select_tier(ladder, budget="pr", hardware_class="t4").max_relative_loss == 0.3
    assert tier.max_relative_loss is None  # a version 1 row keeps its absolute meaning


def test_a_users_ladder_adds_a_class_with_a_fallback(write_ladder) -> None:
    path = write_ladder(
        "version: 1\nextends: default\n"
        "classes:\n  l40s: {match: ['L40S'], speed: 3.0, fallback: a10}\n"
    )
    ladder = load_ladder(path)
    assert ladder.classify("NVIDIA L40S") == "l40s"
    tier = select_tier(ladder, budget="nightly", hardware_class="l40s")
    assert tier.row == "budgets.nightly.a10"
    assert tier.reasons[-1] == "budget nightly has no row for l40s; using its fallback a10"


def test_an_error_in_an_extending_file_names_that_file_and_line(write_ladder) -> None:
    path = write_ladder("version: 1\nextends: default\nbudgets:\n  pr:\n    a100: {max_loss: 0}\n")
    with pytest.raises(DlciError) as info:
        load_ladder(path)
    assert str(info.value) == (
        f"{path}:5: budgets.pr.a100.max_loss: must be greater than 0, got 0\n"
        "  hint: use a positive loss such as 1.0, or state max_relative_loss instead"
    )


def test_extends_can_name_a_file_relative_to_the_extending_one(
    write_ladder, small_ladder_text
) -> None:
    write_ladder(small_ladder_text, "base.yaml")
    child = write_ladder("version: 1\nextends: base.yaml\nrevision: child\n", "child.yaml")
    ladder = load_ladder(child)
    assert (ladder.revision, sorted(ladder.classes)) == ("child", ["cpu", "t4"])
    assert [Path(f).name for f in ladder.files] == ["base.yaml", "child.yaml"]


def test_an_extends_loop_is_an_error(write_ladder) -> None:
    a = write_ladder("version: 1\nextends: b.yaml\n", "a.yaml")
    write_ladder("version: 1\nextends: a.yaml\n", "b.yaml")
    with pytest.raises(DlciError, match="'extends' loops back to this file"):
        load_ladder(a)


def test_a_null_row_forbids_a_budget_on_that_class() -> None:
    ladder = load_ladder(SMALL)
    with pytest.raises(DlciError) as info:
        select_tier(ladder, budget="nightly", hardware_class="cpu")
    assert str(info.value) == (
        f"{SMALL}:13: the ladder does not allow budget 'nightly' on hardware class 'cpu' "
        "(budgets.nightly.cpu is null)\n"
        "  hint: run on a runner of another class, choose another budget, or give that row a "
        "tier in your own ladder (--ladder)"
    )


def test_an_unknown_budget_suggests_the_closest() -> None:
    with pytest.raises(DlciError) as info:
        select_tier(load_ladder(), budget="nighty", hardware_class="t4")
    assert str(info.value) == (
        "ladder 'default': unknown budget 'nighty'; choose from pr, merge, nightly\n"
        "  hint: did you mean 'nightly'? or pass auto, which follows GITHUB_EVENT_NAME"
    )


def test_an_unknown_budget_names_the_ladder_file(write_ladder, small_ladder_text) -> None:
    path = write_ladder(small_ladder_text, "mine.yaml")
    with pytest.raises(DlciError) as info:
        select_tier(load_ladder(path), budget="weekly", hardware_class="t4")
    assert str(info.value) == (
        f"ladder '{path}': unknown budget 'weekly'; choose from pr, merge, nightly\n"
        "  hint: or pass auto, which follows GITHUB_EVENT_NAME"
    )


def test_classification_prefers_the_longest_pattern(write_ladder, small_ladder_text) -> None:
    text = small_ladder_text.replace(
        "  t4: {match: ['\\bT4\\b'], speed: 1.0}",
        "  t4: {match: ['\\bT4\\b'], speed: 1.0}\n  t4x: {match: ['Tesla T4'], speed: 1.1, fallback: t4}",
    )
    ladder = load_ladder(write_ladder(text))
    assert ladder.classify("Tesla T4") == "t4x"
    assert ladder.classify("NVIDIA T4") == "t4"


def test_ladder_text_can_be_loaded_without_a_file(small_ladder_text) -> None:
    assert load_ladder_text(small_ladder_text).source == "ladder.yaml"
