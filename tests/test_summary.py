"""``dlci summary``: the job summary, outputs and annotations from whatever the job wrote."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from dlci.action.host.gates import where_the_time_went
from dlci.cli import main
from dlci.report.fields import read_run
from dlci.report.github import format_outputs

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="4">
<testcase classname="tests.test_a" name="test_ok" file="tests/test_a.py" line="3"/>
<testcase classname="tests.test_a" name="test_ok2" file="tests/test_a.py" line="5"/>
<testcase classname="tests.test_a" name="test_skip"><skipped message="later"/></testcase>
<testcase classname="tests.test_a" name="test_bad" file="tests/test_a.py" line="9">
<failure message="assert 1 == 2">trace</failure></testcase>
</testsuite></testsuites>
"""
COVERAGE = """<?xml version="1.0" ?>
<coverage version="7.6" line-rate="0.8734" branch-rate="0" timestamp="1">
<sources><source>src</source></sources><packages/></coverage>
"""


def tier() -> dict:
    return {
        "budget": "pr",
        "hardware_class": "cpu",
        "max_epochs": 100,
        "max_loss": 1.0,
        "time_cap_minutes": 3,
        "profile_steps": 3,
    }


def write(folder: Path, name: str, data) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    text = data if isinstance(data, str) else json.dumps(data)
    (folder / name).write_text(text)


def step(name: str, status: str, **extra) -> dict:
    return {"name": name, "status": status, "duration_s": 1.5, **extra}


@pytest.fixture
def github(tmp_path: Path, monkeypatch):
    summary, outputs = tmp_path / "summary.md", tmp_path / "outputs.txt"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GITHUB_OUTPUT", str(outputs))
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("DLCI_JOB_ID", "42-1-abcd")
    return summary, outputs


def test_a_passing_job(tmp_path: Path, github, capsys) -> None:
    summary, outputs = github
    art = tmp_path / "art"
    write(art, "preflight.json", {"passed": True, "gpu": False, "tier": tier()})
    steps = [step(n, "passed") for n in ("install", "tests", "memorize", "doctor", "profile")]
    parts = {n: {"copy_s": 0.25, "container_s": 2.5} for n in ("install", "tests", "memorize")}
    parts["install"]["commit_s"] = 0.5
    timing = msgspec.to_builtins(where_the_time_went(parts, read_run({"steps": steps}).steps))
    write(art, "run.json", {"kind": "run", "steps": steps, "verdict": "pass", "timing": timing})
    write(
        art,
        "junit.xml",
        JUNIT.replace('failures="1"', 'failures="0"')
        .replace("<failure", "<x")
        .replace("</failure>", "</x>"),
    )
    write(art, "coverage.xml", COVERAGE)
    assert main(["summary", "--artifacts", str(art), "--artifact-prefix", "dlci"]) == 0
    text = summary.read_text()
    assert text.startswith("## ✅ dl-ci: passed")
    assert "| tier | pr on cpu: up to 100 epochs to loss < 1.0, 3 min, 3 profiled steps |" in text
    assert "| coverage | 87.3% of lines |" in text
    assert "| tests | 3 passed, 0 failed, 0 errors, 1 skipped |" in text
    assert (  # each container 1 s over its step, a copy each, the commit
        "| where the time went | the project's 7.5 s (install 1.5 s, tests 1.5 s, memorize 1.5 s, "
        "doctor 1.5 s, profile 1.5 s); the kit's own 4.2 s (copies of the checkout 0.8 s, "
        "container start and stop 3.0 s, the install's image 0.5 s) |"
    ) in text
    out = outputs.read_text()
    assert "verdict=pass" in out and "coverage=87.34" in out and "hardware-class=cpu" in out
    assert "artifact-name=dlci-cpu-42-1-abcd" in out
    assert "::error" not in capsys.readouterr().out


def test_a_failing_job_names_every_failure(tmp_path: Path, github, capsys) -> None:
    summary, _outputs = github
    art = tmp_path / "art"
    write(art, "preflight.json", {"passed": True, "gpu": False, "tier": tier()})
    steps = [
        step("install", "passed", log_tail=["Successfully installed mypkg"]),
        step("tests", "failed"),
        step("memorize", "failed", log_tail=["epoch 1", "", "RuntimeError: shape `(N, 1)`", " "]),
    ]
    write(art, "run.json", {"kind": "run", "steps": steps, "verdict": "fail"})
    write(art, "junit.xml", JUNIT)
    # a relative goal has no absolute threshold: the summary states the goal, never "None"
    memorized = {"verdict": "fail", "best_loss": 2.0, "threshold": None}
    write(art, "memorization.json", memorized | {"criterion": "loss at or below 30% of its start"})
    assert main(["summary", "--artifacts", str(art)]) == 1
    text = summary.read_text()
    assert text.startswith("## ❌ dl-ci: FAILED")
    assert "- step tests failed\n" in text
    # the cause beside the name, and the step's last lines in a section of their own
    assert "- step memorize failed: RuntimeError: shape \\`(N, 1)\\`" in text
    assert (
        "### The last lines of step memorize\n\n- `epoch 1`\n- `RuntimeError: shape '(N, 1)'`\n"
        in text
    )
    assert "Successfully installed" not in text  # a passed step's log stays out
    assert "FAIL: best loss 2 (goal: loss at or below 30% of its start)" in text
    assert "None" not in text
    assert "`tests.test_a::test_bad`: assert 1 == 2" in text
    out = capsys.readouterr().out
    assert "::error title=dl-ci::step tests failed" in out
    assert "::error title=dl-ci::step memorize failed: RuntimeError" in out
    assert "::error title=test failed::tests.test_a::test_bad: assert 1 == 2" in out
    assert main(["summary", "--artifacts", str(art), "--no-fail"]) == 0


def test_an_interrupted_step_is_named(tmp_path: Path, github) -> None:
    summary, _ = github
    art = tmp_path / "art"
    write(art, "preflight.json", {"passed": True, "tier": tier()})
    # the container was killed while memorize ran: run.json still says running
    steps = [step("install", "passed"), step("tests", "passed"), step("memorize", "running")]
    write(art, "run.json", {"kind": "run", "steps": steps, "verdict": "running"})
    assert main(["summary", "--artifacts", str(art)]) == 1
    text = summary.read_text()
    assert "- step memorize was interrupted" in text
    assert "| memorize | ⛔ interrupted | 1.5 s |" in text


def test_a_refused_preflight_is_the_summary(tmp_path: Path, github) -> None:
    summary, _ = github
    art = tmp_path / "art"
    write(
        art,
        "preflight.json",
        {"passed": False, "error": {"message": "refusing to run a pull request from a fork"}},
    )
    assert main(["summary", "--artifacts", str(art)]) == 1
    assert "- preflight: refusing to run a pull request from a fork" in summary.read_text()


def test_nothing_ran_at_all(tmp_path: Path, github) -> None:
    summary, _ = github
    assert main(["summary", "--artifacts", str(tmp_path / "missing")]) == 1
    assert "did not run" in summary.read_text()


def test_report_text_cannot_inject_workflow_commands(tmp_path: Path, github, capsys) -> None:
    _, outputs = github
    art = tmp_path / "art"
    write(art, "preflight.json", {"passed": True, "tier": tier()})
    write(art, "run.json", {"kind": "run", "steps": [step("memorize", "failed")]})
    evil = "bad\n::set-output name=verdict::pass\n::add-mask::x"
    write(art, "memorization.json", {"verdict": "fail", "reason": evil, "best_loss": 2.0})
    assert main(["summary", "--artifacts", str(art), "--markdown", str(tmp_path / "s.md")]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert not any(
        line.startswith("::set-output") or line.startswith("::add-mask") for line in lines
    )
    assert "bad%0A::set-output name=verdict::pass%0A::add-mask::x" in out
    assert "verdict=fail" in outputs.read_text()


def test_outputs_heredoc_for_multiline_values() -> None:
    text = format_outputs({"tier": "a\nb"})
    assert text.startswith("tier<<")


def test_a_cuda_out_of_memory_failure_is_called_that(tmp_path: Path, github, capsys) -> None:
    art = tmp_path / "art"
    write(art, "preflight.json", {"passed": True, "tier": tier()})
    write(art, "run.json", {"kind": "run", "steps": [step("tests", "failed")]})
    oom = JUNIT.replace(
        'message="assert 1 == 2"',
        'message="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"',
    )
    write(art, "junit.xml", oom)
    assert main(["summary", "--artifacts", str(art)]) == 1
    out = capsys.readouterr().out
    assert (
        "::error title=test ran out of memory::tests.test_a::test_bad: torch.OutOfMemoryError"
        in out
    )


# ---------------------------------------------------------------------------- hostile names

HOSTILE = "\x1b[31m::error::x | # <b>bold</b>\n::warning::y"


def markdown_problems(text: str) -> list[str]:
    """What outside text must never do to the summary: each way it could, found in ``text``."""
    import re

    found = []
    if "\x1b" in text:
        found.append("raw ANSI escape")
    if "<b>" in text:
        found.append("raw HTML")
    found += [f"workflow command: {line!r}" for line in text.splitlines() if line.startswith("::")]
    columns = None  # the pipes of the current table's header row
    for line in text.splitlines():
        if not line.startswith("|"):
            columns = None
            continue
        pipes = len(re.findall(r"(?<!\\)\|", line))
        if columns is None:
            columns = pipes
        elif pipes != columns:
            found.append(f"a row split by a pipe: {line!r}")
    return found


def hostile_artifacts(art: Path) -> None:
    hostile_tier = {**tier(), "budget": HOSTILE, "hardware_class": HOSTILE}
    write(art, "preflight.json", {"passed": True, "gpu": True, "tier": hostile_tier})
    steps = [step(HOSTILE, "failed", reason=HOSTILE), step("tests", "passed")]
    write(art, "run.json", {"kind": "run", "steps": steps})
    junit = JUNIT.replace(
        'classname="tests.test_a" name="test_bad"',
        'classname="x" name="::error::x | # &lt;b&gt;&#10;::y"',
    )
    write(
        art,
        "junit.xml",
        junit.replace('message="assert 1 == 2"', 'message="| # &lt;b&gt;&#10;::error::z"'),
    )


def test_hostile_names_cannot_break_the_summary(tmp_path: Path, github) -> None:
    summary, _ = github
    art = tmp_path / "art"
    hostile_artifacts(art)
    assert main(["summary", "--artifacts", str(art), "--title", HOSTILE]) == 1
    text = summary.read_text()
    assert markdown_problems(text) == []
    # the names are still there, shown as text
    assert r"\\x1b\[31m::error::x \| \# &lt;b&gt;bold&lt;/b&gt;\\n::warning::y" in text
    assert "| hardware | " in text and "(GPU) |" in text
    assert "- `x::::error::x \\| # &lt;b&gt;\\n::y`: \\| \\# &lt;b&gt;\\\\n::error::z" in text


def test_the_hostile_names_check_catches_a_raw_render(tmp_path: Path, monkeypatch) -> None:
    """The control case: the same artifacts rendered without escaping fail every check."""
    import dlci.report.summary as renderer
    from dlci.action.host.summary import collect

    art = tmp_path / "art"
    hostile_artifacts(art)
    data = collect(art)
    assert markdown_problems(renderer.render(data, title=HOSTILE)) == []
    raw = lambda text, limit=None: str(text)  # noqa: E731
    monkeypatch.setattr(renderer, "md", raw)
    monkeypatch.setattr(renderer, "md_code", raw)
    found = markdown_problems(renderer.render(data, title=HOSTILE))
    assert "raw ANSI escape" in found and "raw HTML" in found
    assert any(problem.startswith("workflow command") for problem in found)


def test_the_table_check_catches_a_split_row() -> None:
    assert markdown_problems("| a | b |\n|---|---|\n| x \\| y | z |") == []
    assert markdown_problems("| a | b |\n|---|---|\n| x | y | z |") == [
        "a row split by a pipe: '| x | y | z |'"
    ]


def test_annotations_outside_actions_are_clean_lines(
    tmp_path: Path, github, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "false")
    art = tmp_path / "art"
    hostile_artifacts(art)
    assert main(["summary", "--artifacts", str(art)]) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err
    assert not any(line.startswith("::") for line in err.splitlines())
    assert "error: dl-ci: step \\x1b[31m::error::x | # <b>bold</b>\\n::warning::y failed" in err


# ---------------------------------------------------------------- reports read as claims


def gated_job(art: Path, host: Path, memorization: dict) -> Path:
    """A job whose memorization report the host copied from the gate's own directory."""
    import hashlib

    write(art, "preflight.json", {"passed": True, "tier": {**tier(), "max_loss": 100.0}})
    write(art, "memorization.json", memorization)
    digest = hashlib.sha256((art / "memorization.json").read_bytes()).hexdigest()
    steps = [step(n, "passed") for n in ("install", "tests", "memorize")]
    record = {
        "kind": "host-record",
        "tier": tier(),
        "preflight": {"passed": True, "gpu": False, "tier": tier()},
        "isolated_parts": ["memorize"],
        "reports": {"memorization.json": {"part": "memorize", "sha256": digest}},
        "run": {"kind": "run", "steps": steps, "verdict": "pass"},
    }
    write(host, "record.json", record)
    return host / "record.json"


def memorization(**tier_changes) -> dict:
    return {
        "verdict": "pass",
        "best_loss": 0.5,
        "threshold": 1.0,
        "tier": {**tier(), **tier_changes},
    }


def summary_text(art: Path, record: Path, tmp_path: Path) -> tuple[int, str]:
    md = tmp_path / "out.md"
    argv = ["summary", "--artifacts", str(art), "--markdown", str(md), "--host-record", str(record)]
    return main(argv), md.read_text()


@pytest.mark.parametrize(
    ("key", "value"), [("max_loss", 100.0), ("max_epochs", 1000), ("budget", "nightly")]
)
def test_a_report_at_another_tier_fails(tmp_path: Path, key: str, value: object) -> None:
    art = tmp_path / "art"
    record = gated_job(art, tmp_path / "host", memorization(**{key: value}))
    code, text = summary_text(art, record, tmp_path)
    assert code == 1
    assert "memorization.json: report does not match the tier the host chose" in text
    assert f"{key} {value!r}" in text
    # the host's tier, not the workspace's rewritten preflight.json
    assert "| tier | pr on cpu: up to 100 epochs to loss < 1.0," in text


def test_control_a_report_at_the_hosts_tier_passes(tmp_path: Path) -> None:
    art = tmp_path / "art"
    record = gated_job(art, tmp_path / "host", memorization())
    code, text = summary_text(art, record, tmp_path)
    assert code == 0, text
    assert "does not match" not in text
    assert (
        "| verified by the host | the tier (read-only in every container); memorization.json "
        "from the isolated step directories of memorize |" in text
    )


def test_a_report_the_host_did_not_copy_or_that_changed_fails(tmp_path: Path) -> None:
    art = tmp_path / "art"
    record = gated_job(art, tmp_path / "host", memorization())
    write(art, "memorization.json", memorization(max_loss=1.0) | {"best_loss": 0.01})
    code, text = summary_text(art, record, tmp_path)
    assert code == 1 and "memorization.json was changed after the host collected it" in text
    write(art, "doctor.json", {"counts": {"fail": 0}, "checks": [], "tier": tier()})
    code, text = summary_text(art, record, tmp_path)
    assert "doctor.json did not come from its gate's own step" in text


def test_a_missing_host_record_leaves_the_reports_unverified(tmp_path: Path) -> None:
    art = tmp_path / "art"
    gated_job(art, tmp_path / "host", memorization())
    write(art, "run.json", {"kind": "run", "steps": [step("tests", "passed")]})
    code, text = summary_text(art, tmp_path / "no-such.json", tmp_path)
    assert code == 1
    assert "the host's record of the container run is missing: the reports are unverified" in text


def test_the_checks_row_names_crashed_checks() -> None:
    """A check that crashed (dl-ci's own bug) is named in the summary's row; control: a
    report without crashes (or an older one without the key) reads as before."""
    from dlci.report.doctor import read
    from dlci.report.summary import JobData, _report_facts

    def row(counts: dict) -> str:
        report = read({"verdict": "pass", "checks": [], "counts": counts})
        found = _report_facts(JobData(doctor=report))
        return next(text for name, text in found if name == "debugging checks")

    crashed = row({"fail": 0, "warn": 0, "pass": 15, "crashed": 1})
    assert crashed == "0 failed, 0 warnings, 15 passed, 1 crashed (dl-ci's own bug)"
    assert (
        row({"fail": 0, "warn": 0, "pass": 16, "crashed": 0}) == "0 failed, 0 warnings, 16 passed"
    )
    assert row({"fail": 1, "warn": 0, "pass": 15}) == "1 failed, 0 warnings, 15 passed"


def test_the_summary_states_the_memory_peak_and_the_batch_estimate(tmp_path: Path, github) -> None:
    summary, _ = github
    art = tmp_path / "art"
    write(art, "preflight.json", {"passed": True, "gpu": True, "tier": tier()})
    steps = [step(n, "passed") for n in ("install", "tests", "memorize", "doctor", "profile")]
    write(art, "run.json", {"kind": "run", "steps": steps, "verdict": "pass"})
    memory = {
        "source": "trace", "device": "cuda:0", "peak_reserved_bytes": 12 << 30,
        "peak_percent_of_device": 8.6,
        "batch_estimate": {"batch_size": 64, "largest_batch": 512, "confidence": "high"},
    }  # fmt: skip
    util = {"gpu_utilization_pct": 71.0, "steps": {"count": 3}, "memory": memory}
    write(art, "utilization.json", util)
    main(["summary", "--artifacts", str(art), "--artifact-prefix", "dlci"])
    text = summary.read_text()
    assert (
        "| memory | peak 12.0 GiB on cuda:0, 8.6% of the device; largest batch that fits "
        "about 512 (batch 64, confidence high) |"
    ) in text
    # control: a report written before the memory section had none, and gets no row
    write(art, "utilization.json", {k: v for k, v in util.items() if k != "memory"})
    summary.write_text("")
    main(["summary", "--artifacts", str(art), "--artifact-prefix", "dlci"])
    assert "| memory |" not in summary.read_text()


def test_the_jobs_html_report_is_in_the_upload_folder_and_the_summary_says_so(
    tmp_path: Path,
) -> None:
    """With the host's record, report.html goes into the host's upload folder (from the host's
    copies), never the workspace's folder; without one (a local run), into the folder read."""
    from dlci.action.host.summary import summarize

    art = tmp_path / "art"
    record = gated_job(art, tmp_path / "host", memorization())
    done = summarize(art, host_record=record, artifact_prefix="dlci")
    page = Path(done.outputs["artifacts-dir"]) / "report.html"
    text = page.read_text()
    # verdicts, memorization, doctor, utilization: no comparison or history in this job
    assert text.count("<section id=") == 4 and 'class="status pass">pass<' in text
    assert f"`report.html` in the artifact `{done.outputs['artifact-name']}`" in done.markdown
    assert not (art / "report.html").exists()
    local = summarize(art)
    assert (art / "report.html").is_file() and "`report.html` in " in local.markdown
    # a report that claims a pass the host never collected: the page leads with the host's
    # verdict, not the claim
    write(art, "doctor.json", {"verdict": "pass", "reason": "all good", "checks": []})
    done = summarize(art, host_record=record, artifact_prefix="dlci")
    text = (Path(done.outputs["artifacts-dir"]) / "report.html").read_text()
    assert done.verdict == "fail"
    verdict = text.split('<p id="host-verdict">')[1].split("</p>")[0]
    assert '<strong class="fail">fail</strong>' in verdict
