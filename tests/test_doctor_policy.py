"""The project's policy in the doctor: waivers (skip, warn-only, expired) and thresholds, on
real checks of the bug zoo (tests/zoo.py), with a control for each."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import zoo
from dlci import jsonio
from dlci.checks import CHECK_IDS, run_checks, select
from dlci.checks.base import CheckResult
from dlci.checks.doctor import DoctorRequest, run_doctor
from dlci.cli import main
from dlci.ladder.tiers import TierRequest, choose_tier
from dlci.policy import THRESHOLDS, Policy, Waiver
from dlci.report.doctor import read, render_markdown

TIER = choose_tier(budget="pr", hardware="cpu")
TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src" / "dlci" / "checks"
TODAY = dt.date(2026, 6, 1)
SOURCE = "pyproject.toml:14"


def waiver(check: str, mode: str, until: dt.date | None = dt.date(2027, 1, 31)) -> Waiver:
    return Waiver(check, mode, "the model is built this way on purpose", until, SOURCE)


def doctor(tmp_path: Path, target: str, only: str, policy: Policy | None) -> dict:
    """One ``run_doctor`` on a zoo target; the report, with the Markdown under "markdown"."""
    markdown = tmp_path / "doctor.md"
    request = DoctorRequest(
        target=f"zoo:{target}",
        tier=TierRequest(budget="pr", hardware="cpu"),
        only=only,
        device="cpu",
        out=str(tmp_path),
        markdown=str(markdown),
        policy=policy,
        today=TODAY,
    )
    outcome = run_doctor(request)
    report = json.loads((tmp_path / "doctor.json").read_text())
    assert report == json.loads(jsonio.encode(outcome.report))
    assert outcome.exit_code == (1 if report["verdict"] == "fail" else 0)
    return dict(report, markdown=markdown.read_text())


def by_id(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.id: r for r in results}


# ------------------------------------------------------------------------------- waivers


def test_a_failing_check_waived_warn_only_passes_the_doctor_and_is_listed(tmp_path) -> None:
    policy = Policy((waiver("zero-grad", "warn-only"),), origin="pyproject.toml")
    report = doctor(tmp_path, "no_zero_grad", "zero-grad,grad-flow", policy)
    assert report["verdict"] == "pass"
    check = report["checks"][0]
    assert (check["id"], check["status"]) == ("zero-grad", "warn")
    assert "tensors start with last call's gradient" in check["measured"]  # it ran
    assert check["waived"] == {
        "mode": "warn-only",
        "reason": "the model is built this way on purpose",
        "until": "2027-01-31",
        "source": SOURCE,
        "status_without_waiver": "fail",
    }
    assert "waived" not in report["checks"][1]  # grad-flow: no waiver, no key
    assert report["waivers"] == [
        {
            "check": "zero-grad",
            "mode": "warn-only",
            "reason": "the model is built this way on purpose",
            "until": "2027-01-31",
            "source": SOURCE,
            "expired": False,
            "applied": True,
            "status_without_waiver": "fail",
        }
    ]
    assert report["policy"] == {"origin": "pyproject.toml", "thresholds": {}}
    text = report["markdown"]
    assert "| `zero-grad` | ⚠️ warn (waived) |" in text
    assert "#### Waived checks" in text
    assert (
        "| `zero-grad` | warn-only | the model is built this way on purpose | 2027-01-31 | "
        "pyproject.toml:14 | fail read as warn |" in text
    )


def test_control_without_the_waiver_the_doctor_fails(tmp_path) -> None:
    report = doctor(tmp_path, "no_zero_grad", "zero-grad", None)
    assert report["verdict"] == "fail"
    assert report["checks"][0]["status"] == "fail" and "waived" not in report["checks"][0]
    assert report["waivers"] == [] and "Waived checks" not in report["markdown"]


def _counting(target):
    """The target, its train_step counting its calls."""
    calls = []
    step = target.train_step

    def counted(model, batch, optimizer):
        calls.append(1)
        return step(model, batch, optimizer)

    target.train_step = counted
    return target, calls


def test_a_skip_waiver_keeps_the_check_from_running() -> None:
    target, calls = _counting(zoo.no_zero_grad())
    policy = Policy((waiver("zero-grad", "skip"),))
    result = run_checks(target, checks=select("zero-grad"), tier=TIER, policy=policy, today=TODAY)
    assert calls == []
    assert (result[0].status, result[0].cause) == (
        "skip",
        "waived: the model is built this way on purpose (until 2027-01-31)",
    )
    assert result[0].waived is not None and result[0].waived["status_without_waiver"] is None
    # control: the same target without the waiver runs the check, two calls of train_step
    target, calls = _counting(zoo.no_zero_grad())
    assert run_checks(target, checks=select("zero-grad"), tier=TIER)[0].status == "fail"
    assert len(calls) == 2


def test_an_expired_waiver_fails_the_doctor_and_names_itself(tmp_path) -> None:
    """Past its date the waiver stops working: the check runs and fails as usual, and the
    verdict fails with the check, the date, where it is set and what to do."""
    expired = waiver("zero-grad", "warn-only", until=dt.date(2026, 5, 31))
    report = doctor(tmp_path, "no_zero_grad", "zero-grad", Policy((expired,)))
    assert report["verdict"] == "fail"
    assert report["checks"][0]["status"] == "fail" and "waived" not in report["checks"][0]
    assert report["reason"] == (
        "zero-grad failed; the waiver for zero-grad expired on 2026-05-31 (pyproject.toml:14): it no longer "
        "applies; renew it with a new reason and date, or remove it"
    )
    entry = report["waivers"][0]
    assert (entry["expired"], entry["applied"], entry["status_without_waiver"]) == (
        True,
        False,
        "fail",
    )
    assert (
        "Verdict fail: zero-grad failed; the waiver for zero-grad expired on 2026-05-31"
        in report["markdown"]
    )
    assert (
        "| ❌ expired 2026-05-31 | pyproject.toml:14 | expired, so not applied (the check ran "
        "as usual: fail); the verdict fails |" in report["markdown"]
    )


def test_an_expired_waiver_fails_even_where_every_check_passes(tmp_path) -> None:
    expired = waiver("grad-flow", "skip", until=dt.date(2026, 5, 31))
    report = doctor(tmp_path, "no_zero_grad", "grad-flow", Policy((expired,)))
    assert report["checks"][0]["status"] == "pass"  # it ran, as without the waiver
    assert report["verdict"] == "fail"
    assert report["reason"].startswith("the waiver for grad-flow expired on 2026-05-31")


def test_a_waiver_works_through_its_last_day() -> None:
    policy = Policy((waiver("zero-grad", "skip", until=TODAY),))
    skipped = run_checks(zoo.no_zero_grad(), checks=select("zero-grad"), policy=policy, today=TODAY)
    assert skipped[0].cause.startswith("waived: ")
    later = TODAY + dt.timedelta(days=1)
    ran = run_checks(zoo.no_zero_grad(), checks=select("zero-grad"), policy=policy, today=later)
    assert ran[0].status == "fail"


def test_a_waiver_for_a_check_not_selected_is_listed_not_applied(tmp_path) -> None:
    policy = Policy((waiver("leakage", "skip"),))
    report = doctor(tmp_path, "no_zero_grad", "grad-flow", policy)
    assert report["verdict"] == "pass"
    assert [c["id"] for c in report["checks"]] == ["grad-flow"]
    entry = report["waivers"][0]
    assert (entry["check"], entry["applied"], entry["status_without_waiver"]) == (
        "leakage",
        False,
        None,
    )
    assert "not applied: the check was not run" in report["markdown"]


def test_a_crashed_check_is_never_waived_into_a_pass(monkeypatch) -> None:
    import dlci.checks.overlap as overlap

    monkeypatch.setattr(overlap, "_embed", lambda train, val: (train, val[:, :3]))  # dl-ci bug
    policy = Policy((waiver("leakage", "warn-only"),))
    result = run_checks(zoo.split_overlap(), checks=select("leakage"), policy=policy)[0]
    assert result.status == "crashed"
    assert result.waived is not None and result.waived["status_without_waiver"] == "crashed"


def test_a_warn_only_waiver_leaves_a_passing_check_as_it_is() -> None:
    policy = Policy((waiver("grad-flow", "warn-only"),))
    result = run_checks(zoo.no_zero_grad(), checks=select("grad-flow"), policy=policy)[0]
    assert result.status == "pass"


# ---------------------------------------------------------------------------- thresholds


def test_a_threshold_raised_lets_a_planted_bug_pass_and_the_default_still_catches_it() -> None:
    """8-bit pixel values (rms 156) fail input-normalization; with the project's fail-rms
    at 200 they warn, and the expected text states the bound used."""
    checks = select("input-normalization")
    default = run_checks(zoo.unscaled_inputs(), checks=checks, tier=TIER)[0]
    assert default.status == "fail" and "feature 9: rms 156" in default.measured
    raised = {"input-normalization.fail-rms": 200.0}
    policy = Policy(thresholds=raised)
    result = run_checks(zoo.unscaled_inputs(), checks=checks, tier=TIER, policy=policy)[0]
    assert result.status == "warn" and "feature 9: rms 156" in result.measured
    quiet = Policy(thresholds=dict(raised, **{"input-normalization.warn-rms": 200.0}))
    result = run_checks(zoo.unscaled_inputs(), checks=checks, tier=TIER, policy=quiet)[0]
    assert result.status == "pass"
    assert result.expected.startswith("per feature or channel: rms under 200, not constant")


def test_a_threshold_lowered_fails_a_healthy_model(tmp_path) -> None:
    """The blobs' features sit near unit scale (rms up to about 2): they pass by default;
    with a project's rms bound of 1 they fail, and the report lists the threshold."""
    default = doctor(tmp_path / "a", "clean_classification", "input-normalization", None)
    assert default["verdict"] == "pass"
    lowered = {"input-normalization.warn-rms": 1.0, "input-normalization.fail-rms": 1.0}
    thresholds = dict(lowered, **{"activations.fail-share": 0.5})  # a default: not listed
    report = doctor(
        tmp_path / "b",
        "clean_classification",
        "input-normalization",
        Policy(thresholds=thresholds, origin="dlci.toml"),
    )
    assert report["verdict"] == "fail"
    check = report["checks"][0]
    assert check["status"] == "fail" and ": rms " in check["measured"]
    assert check["expected"].startswith("per feature or channel: rms under 1, not constant")
    assert report["policy"] == {"origin": "dlci.toml", "thresholds": lowered}


def test_every_threshold_is_in_range_and_read_by_its_check() -> None:
    """A threshold no check reads would be a setting that does nothing."""
    names = [t.name for t in THRESHOLDS]
    assert len(set(names)) == len(names)
    sources = "\n".join(
        path.read_text() for path in SRC.glob("*.py") if path.name not in ("policy.py",)
    )
    for t in THRESHOLDS:
        assert t.check in CHECK_IDS, t
        assert t.low <= t.default <= t.high, t
        assert re.search(rf"[\"']{re.escape(t.key)}[\"']", sources), f"{t.name} is never read"
        assert t.meaning and not t.meaning.endswith("."), t


def test_the_defaults_are_the_modules_own_constants() -> None:
    from dlci.checks import overlap, probe

    policy = Policy()
    assert policy.threshold("leakage", "near-copy") == overlap.NEAR
    assert policy.threshold("leakage", "warn-copies") == overlap.EXCESS_WARN
    assert policy.threshold("leakage", "fail-copies") == overlap.EXCESS_FAIL
    assert policy.threshold("leakage", "warn-skill") == probe.SKILL_WARN
    assert policy.threshold("leakage", "fail-skill") == probe.SKILL_FAIL
    assert policy.threshold("leakage", "warn-r2") == probe.R2_WARN
    assert policy.threshold("leakage", "fail-r2") == probe.R2_FAIL


def test_an_old_report_without_waivers_still_renders() -> None:
    old = {"verdict": "pass", "counts": {"pass": 1, "warn": 0, "fail": 0, "skip": 0}}
    text = render_markdown(read(dict(old, checks=[])))
    assert "Waived checks" not in text


# ------------------------------------------------------------------------- the command


def test_the_command_reads_the_waiver_from_pyproject(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    project = tmp_path / "pyproject.toml"
    base = '[project]\nname = "demo"\n\n[tool.dlci]\ntarget = "zoo:no_zero_grad"\n'
    args = ["doctor", "--only", "zero-grad", "--out", str(tmp_path / "out")]
    project.write_text(base, encoding="utf-8")
    assert main(args) == 1  # control: no waiver
    project.write_text(
        base + '\n[tool.dlci.doctor.checks.zero-grad]\nwaive = "warn-only"\n'
        'reason = "accumulates on purpose"\nuntil = 2999-12-31\n',
        encoding="utf-8",
    )
    assert main(args) == 0
    report = json.loads((tmp_path / "out" / "doctor.json").read_text())
    assert report["checks"][0]["status"] == "warn"
    entry = report["waivers"][0]
    assert (entry["reason"], entry["until"], entry["applied"]) == (
        "accumulates on purpose",
        "2999-12-31",
        True,
    )
    assert entry["source"].startswith("pyproject.toml:")
    out = capsys.readouterr().out
    assert "warn (waived)" in out
    assert "waiver: zero-grad warn-only, until 2999-12-31 (pyproject.toml:" in out


def test_the_doctors_doc_lists_every_threshold() -> None:
    doc = (TESTS.parent / "docs" / "doctor.md").read_text("utf-8")
    section = doc.split("## Waivers and thresholds")[1].split("\n## ")[0]
    rows = {line.split(" | ")[0][3:-1]: line for line in section.splitlines() if line[:3] == "| `"}
    for t in THRESHOLDS:
        assert f"`{t.key}` " in rows.get(t.check, ""), t.name
