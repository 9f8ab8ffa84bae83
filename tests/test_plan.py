"""The job plan: written once by dlci preflight, read back by one function, every mistake
located with a hint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlci.action.host import preflight as host_preflight
from dlci.errors import DlciError
from dlci.ladder.plan import HINT, PLAN_VERSION, JobPlan, read_plan
from dlci.ladder.tiers import choose_tier

TIER = choose_tier(budget="pr", hardware="cpu").to_dict()


def test_preflight_writes_the_plan_that_every_step_reads_back(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[tool.dlci]\nmin-gpu-util = 40\n")
    monkeypatch.delenv("GITHUB_EVENT_NAME", raising=False)
    request = host_preflight.PreflightRequest(
        out=tmp_path / "art", docker=False, budget="pr", hardware="cpu", workdir=tmp_path
    )
    report = host_preflight.preflight(request)
    plan = read_plan(str(tmp_path / "art" / "preflight.json"))
    assert report["plan_version"] == plan.version == PLAN_VERSION
    assert (plan.tier.budget, plan.tier.hardware_class) == ("pr", "cpu")
    assert plan.tier.to_dict() | {"reasons": None} == report["tier"] | {"reasons": None}
    assert plan.config is not None and plan.config["values"]["min-gpu-util"] == 40.0
    with pytest.raises(AttributeError):  # frozen: read-only once written
        plan.tier = choose_tier(budget="nightly", hardware="cpu")  # type: ignore[misc]


def test_a_tier_alone_is_a_plan_without_configuration(tmp_path: Path) -> None:
    path = tmp_path / "tier.json"
    path.write_text(json.dumps(choose_tier(budget="merge", hardware="cpu").to_dict()))
    plan = read_plan(str(path))
    assert (plan.tier.budget, plan.config, plan.source) == ("merge", None, str(path))
    assert JobPlan(plan.tier).to_json()["config"] is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "{path}: no such job plan\n  hint: " + HINT),
        ("{", "{path}: not valid JSON (*)\n  hint: " + HINT),
        ("[1]", "{path}: holds no job plan (not a JSON object)\n  hint: " + HINT),
        (
            '{"kind": "preflight", "tier": {}}',
            "{path}: holds no plan_version: a preflight report of an older dl-ci\n"
            "  hint: run dlci preflight of this dl-ci again",
        ),
        (
            '{"plan_version": 2, "tier": {}}',
            "{path}: plan_version 2 is not supported (this dl-ci reads 1)\n"
            "  hint: run dlci preflight and the job with the same dl-ci version",
        ),
        ('{"plan_version": 1, "tier": 3}', "{path}: tier: expected an object\n  hint: " + HINT),
        (
            json.dumps({"plan_version": 1, "tier": {**TIER, "max_epochs": "7"}}),
            "{path}: tier.max_epochs: expected an integer, got str\n  hint: " + HINT,
        ),
        (
            json.dumps({"plan_version": 1, "tier": {**TIER, "max_loss": True}}),
            "{path}: tier.max_loss: expected a number or null, got bool\n  hint: " + HINT,
        ),
        (
            '{"plan_version": true, "tier": {}}',
            "{path}: plan_version True is not supported (this dl-ci reads 1)\n"
            "  hint: run dlci preflight and the job with the same dl-ci version",
        ),
        (
            json.dumps({"plan_version": 1, "tier": {**TIER, "time_cap_minutes": -1}}),
            "{path}: tier.time_cap_minutes: must be greater than 0, got -1\n"
            "  hint: use a positive number of minutes such as 5",
        ),
        (
            json.dumps({"plan_version": 1, "tier": {**TIER, "nproc": 0, "batch_size": 0}}),
            "{path}: tier.nproc: must be at least 1, got 0\n"
            "  hint: use 1, or the number of GPUs on the runner\n"
            "{path}: tier.batch_size: must be at least 1, got 0\n"
            "  hint: use a small batch such as 16",
        ),
        (
            '{"plan_version": 1, "tier": {"budget": "pr"}, "config": null}',
            "{path}: the tier lacks batch_size, hardware_class, ladder, ladder_revision, "
            "ladder_version, max_epochs, max_loss, nproc, profile_steps, row, "
            "time_cap_minutes\n  hint: " + HINT,
        ),
    ],
)
def test_a_bad_or_missing_plan_is_one_located_error_with_a_hint(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "preflight.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(DlciError) as caught:
        read_plan(str(path))
    expected = message.format(path=path)
    if "(*)" in expected:  # the decoder's own words
        head, tail = expected.split("(*)")
        assert str(caught.value).startswith(head) and str(caught.value).endswith(tail)
    else:
        assert str(caught.value) == expected


def test_a_good_plan_reads_where_each_bad_one_fails(tmp_path: Path) -> None:
    """The control of the errors above: the same file with every field it needs."""
    path = tmp_path / "preflight.json"
    tier = choose_tier(budget="pr", hardware="cpu").to_dict()
    path.write_text(json.dumps({"plan_version": 1, "tier": tier, "config": None}))
    assert read_plan(str(path)).tier.row == tier["row"]


def test_the_cli_says_a_bad_plan_without_a_traceback(tmp_path: Path, capsys) -> None:
    from dlci.cli import main

    path = tmp_path / "plan.json"
    path.write_text("{")
    assert main(["tier", "--plan", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: not valid JSON" in err and "Traceback" not in err


def test_a_plan_of_millions_of_words_is_read_to_a_bound(tmp_path: Path) -> None:
    """A tier's reasons and warnings are kept to their first 50 lines of 400 characters, and a
    plan file past 4 MiB is refused unread (a hostile one took minutes and gigabytes)."""
    path = tmp_path / "plan.json"
    tier = {**TIER, "reasons": ["r" * 1000] * 3000, "warnings": ["w"] * 5000}
    path.write_text(json.dumps({"plan_version": 1, "tier": tier}))
    plan = read_plan(str(path))
    assert len(plan.tier.reasons) == 51 and len(plan.tier.reasons[0]) == 400  # and its source
    assert len(plan.tier.warnings) == 50
    path.write_text(json.dumps({"plan_version": 1, "tier": {**TIER, "reasons": ["r"] * 2**20}}))
    with pytest.raises(DlciError, match="job plan"):
        read_plan(str(path))
