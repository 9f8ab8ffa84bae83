"""The action and the configuration file (issue 20): preflight resolves the trusted configuration
on the host (on a pull request from the base commit, in a real git repository), the containers'
``dlci run`` takes its gates from that snapshot, and the host holds the doctor's waivers, the
GPU gate and the baseline's bounds to it, never to anything a container wrote.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path

import msgspec
import pytest

from dlci.action.host.preflight import trusted_configuration
from dlci.checks import CHECK_IDS
from dlci.errors import DlciError

WAIVER = """
[tool.dlci.doctor.checks.activations]
waive = "warn-only"
reason = "ReLU units of the stem are dead by design"
"""
BASE = '[tool.dlci]\ntarget = "pkg.m:f"\nmin-gpu-util = 40\nmax-utilization-drop = 5\n'


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def pull_request(tmp_path: Path, base_text: str, head_text: str) -> tuple[Path, dict[str, str]]:
    """A repository with a base commit and a pull request's head; the event's variables."""
    repo = tmp_path / "repo"
    (repo / "project").mkdir(parents=True)
    git(repo, "init", "--quiet")
    (repo / "project" / "pyproject.toml").write_text(base_text)
    git(repo, "add", "--all")
    git(repo, "commit", "--quiet", "--message", "base")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "project" / "pyproject.toml").write_text(head_text)
    git(repo, "commit", "--quiet", "--all", "--allow-empty", "--message", "head")
    event = tmp_path / "event.json"
    payload = {"pull_request": {"base": {"sha": base}, "head": {"repo": {"full_name": "o/p"}}}}
    event.write_text(json.dumps({**payload, "repository": {"full_name": "o/p"}}))
    env = {"GITHUB_EVENT_NAME": "pull_request", "GITHUB_EVENT_PATH": str(event)}
    return repo, env


def test_on_a_pull_request_the_gates_and_waivers_come_from_the_base_commit(tmp_path) -> None:
    head = BASE.replace("min-gpu-util = 40", "min-gpu-util = 1") + WAIVER
    repo, env = pull_request(tmp_path, BASE, head)
    config = trusted_configuration(repo / "project", env)
    assert config["values"]["min-gpu-util"] == 40  # not the pull request's 1
    assert config["policy"]["waivers"] == []  # its own waiver does not apply
    notes = " ".join(config["notes"])
    assert "the pull request adds a waiver for activations: it takes effect once merged" in notes
    assert "min-gpu-util from 40 to 1" in notes
    # control: the same tree on a push is trusted as it is
    push = trusted_configuration(repo / "project", {"GITHUB_EVENT_NAME": "push"})
    assert push["values"]["min-gpu-util"] == 1
    assert [w["check"] for w in push["policy"]["waivers"]] == ["activations"]


def test_the_action_input_outranks_the_base_commits_file(tmp_path) -> None:
    repo, env = pull_request(tmp_path, BASE, BASE)
    config = trusted_configuration(repo / "project", {**env, "DLCI_INPUT_MIN_GPU_UTIL": "70"})
    assert config["values"]["min-gpu-util"] == 70 and config["sources"]["min-gpu-util"] == (
        "action input"
    )


def test_preflight_writes_the_configuration_into_its_report(tmp_path, monkeypatch) -> None:
    from dlci.cli import main

    repo, env = pull_request(tmp_path, BASE + WAIVER, BASE + WAIVER)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "outputs.txt"))
    monkeypatch.chdir(repo)
    argv = ["preflight", "--no-docker", "--budget", "pr", "--hardware", "cpu"]
    assert main([*argv, "--out", "art", "--working-directory", "project"]) == 0
    report = json.loads((repo / "art" / "preflight.json").read_text())
    waiver = report["config"]["policy"]["waivers"][0]
    assert waiver["check"] == "activations" and waiver["source"].startswith("base commit ")
    # a working directory that is not there is one clear error, written in the report
    assert main([*argv, "--out", "art2", "--working-directory", "nowhere"]) == 1
    failed = json.loads((repo / "art2" / "preflight.json").read_text())
    assert "working-directory 'nowhere'" in failed["error"]["message"]


# The host's own checks, from its preflight.json (dlci.trust.host)


def preflight_with(
    tmp_path: Path, values: dict, waivers: list[dict] = (), thresholds: dict | None = None
) -> Path:
    from dlci.ladder.tiers import choose_tier

    tier = choose_tier(budget="pr", hardware="cpu").to_dict()
    config = {
        "schema_version": 1, "kind": "config", "values": values, "sources": {},
        "policy": {"origin": "base commit 0123456789ab:pyproject.toml", "waivers": list(waivers),
                   "thresholds": thresholds or {}},
        "notes": ["the pull request adds a waiver for lr-range: it takes effect once merged"],
        "file": "pyproject.toml",
    }  # fmt: skip
    path = tmp_path / "preflight.json"
    tmp_path.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"passed": True, "plan_version": 1, "tier": tier, "config": config}))
    return path


def activations(mode: str = "warn-only", until: str | None = None) -> dict:
    return {"check": "activations", "mode": mode, "reason": "dead by design", "until": until,
            "source": "base commit 0123456789ab:project/pyproject.toml:7"}  # fmt: skip


def job_parts(tmp_path: Path, monkeypatch, preflight: Path, *inner: str):
    from dlci.action.host.gates import Parts

    monkeypatch.setenv("RUNNER_TEMP", str(tmp_path))
    (tmp_path / "ws" / "dlci-artifacts").mkdir(parents=True, exist_ok=True)
    argv = ["--plan", str(preflight), *inner, "--install", "none"]  # no install container
    return Parts(argv, tmp_path / "ws", ".", str(tmp_path / "record.json"))


def test_the_host_asks_for_a_gpu_gate_when_its_config_sets_max_gpu_memory(
    tmp_path, monkeypatch
) -> None:
    job = job_parts(tmp_path, monkeypatch, preflight_with(tmp_path, {"max-gpu-memory": 90.0}))
    assert job.rules()["gpu_gate"] is True
    job.close()
    # control: no gate in the host's configuration (or an older preflight.json) and no option
    plain = job_parts(tmp_path / "b", monkeypatch, preflight_with(tmp_path, {}))
    assert plain.rules()["gpu_gate"] is False
    plain.close()


DOCTOR_WAIVED = {
    "verdict": "pass",
    "checks": [
        {"id": "grad-flow", "status": "pass"},
        {"id": "activations", "status": "warn", "status_without_waiver": "fail",
         "waived": {"mode": "warn-only", "reason": "mine", "until": None, "source": "x"}},
    ],
}  # fmt: skip


def every_check(report: dict) -> dict:
    """The report with each check of the doctor's ladder it does not list added as passed:
    the action's doctor reports them all."""
    listed = {c["id"] for c in report["checks"]}
    more = [{"id": c, "status": "pass"} for c in CHECK_IDS if c not in listed]
    return {**report, "checks": [*report["checks"], *more]}


def doctor_step(
    tmp_path, monkeypatch, waivers: list[dict], report: dict, *, complete: bool = True,
    thresholds: dict | None = None,
) -> dict:  # fmt: skip
    report = every_check(report) if complete else report
    job = job_parts(
        tmp_path, monkeypatch, preflight_with(tmp_path, {}, waivers, thresholds), "--no-memorize",
        "--no-profile",
    )  # fmt: skip
    plan = job.plan()
    job.collect(plan[0], 0)
    assert plan[1].name == "doctor" and plan[1].out is not None
    steps = [{"name": "install", "status": "passed"}, {"name": "doctor", "status": "passed"}]
    (plan[1].out / "run.json").write_text(json.dumps({"steps": steps}))
    (plan[1].out / "doctor.json").write_text(json.dumps(report))
    job.collect(plan[1], 0)
    run = msgspec.to_builtins(job.finish(plan))["run"]
    job.close()
    return next(s for s in run["steps"] if s["name"] == "doctor")


def test_a_waiver_the_trusted_policy_does_not_give_fails_the_doctor_step(
    tmp_path, monkeypatch
) -> None:
    step = doctor_step(tmp_path / "a", monkeypatch, [], DOCTOR_WAIVED)
    assert step["status"] == "failed"
    assert "activations reported as waived (warn-only), not waived so" in step["reason"]
    assert "trusted configuration (base commit 0123456789ab:pyproject.toml)" in step["reason"]
    # a fail turned warn with no waiver claimed at all is caught too
    quiet = {"verdict": "pass", "checks": [{"id": "lr-range", "status": "warn",
                                            "status_without_waiver": "fail"}]}  # fmt: skip
    assert doctor_step(tmp_path / "b", monkeypatch, [], quiet)["status"] == "failed"
    # a skip waiver where the base commit gives warn-only is not the same waiver
    skip = {"verdict": "pass", "checks": [{"id": "activations", "status": "skip",
            "waived": {"mode": "skip"}}]}  # fmt: skip
    assert doctor_step(tmp_path / "c", monkeypatch, [activations()], skip)["status"] == "failed"
    # control: the same report where the trusted policy gives the waiver passes
    step = doctor_step(tmp_path / "d", monkeypatch, [activations()], DOCTOR_WAIVED)
    assert step["status"] == "passed", step


def test_a_doctor_report_without_every_check_fails_the_doctor_step(tmp_path, monkeypatch) -> None:
    """A doctor run on fewer checks (--only, its command line rewritten by the pull request's
    code) reports a pass on what it ran; the host counts the ladder's checks."""
    only = {"verdict": "pass", "checks": [{"id": "zero-grad", "status": "skip"}]}
    step = doctor_step(tmp_path / "a", monkeypatch, [], only, complete=False)
    assert step["status"] == "failed"
    assert step["reason"].startswith(
        f"doctor.json does not report {len(CHECK_IDS) - 1} of the doctor's {len(CHECK_IDS)} "
        "checks (optimizer-coverage, initial-loss, "
    )
    # control: every check reported, the same verdict passes
    assert doctor_step(tmp_path / "b", monkeypatch, [], only)["status"] == "passed"


def test_an_expired_trusted_waiver_still_applied_fails_the_doctor_step(
    tmp_path, monkeypatch
) -> None:
    old = activations(until="2020-01-31")
    step = doctor_step(tmp_path, monkeypatch, [old], DOCTOR_WAIVED)
    assert step["status"] == "failed" and "expired on 2020-01-31" in step["reason"]


def test_a_doctor_that_ran_with_other_thresholds_or_a_bare_waived_skip_fails_the_step(
    tmp_path, monkeypatch
) -> None:
    # the pull request's code can rewrite the doctor's command line (a .pth file from its
    # install step drops --plan): the doctor then reads the pull request's own file
    looser = {
        "verdict": "pass",
        "checks": [{"id": "shuffle", "status": "pass"}],
        "policy": {"origin": "pyproject.toml", "thresholds": {"shuffle.fail-mix": 0.01}},
    }
    step = doctor_step(tmp_path / "a", monkeypatch, [], looser)
    assert step["status"] == "failed" and "threshold shuffle.fail-mix = 0.01" in step["reason"]
    # a skip that says it was waived, with no waiver claimed beside it
    bare = {
        "verdict": "pass",
        "checks": [{"id": "activations", "status": "skip", "cause": "waived: mine"}],
    }
    step = doctor_step(tmp_path / "b", monkeypatch, [], bare)
    assert step["status"] == "failed" and "activations reported as waived (skip)" in step["reason"]
    # controls: the trusted policy's (default) thresholds, and a skip of another cause
    same = {**looser, "policy": {"origin": "x", "thresholds": {"shuffle.fail-mix": 0.5}}}
    assert doctor_step(tmp_path / "c", monkeypatch, [], same)["status"] == "passed"
    other = {
        "verdict": "pass",
        "checks": [{"id": "shuffle", "status": "skip", "cause": "regression target"}],
    }
    assert doctor_step(tmp_path / "d", monkeypatch, [], other)["status"] == "passed"
    waived = {
        "verdict": "pass",
        "checks": [{"id": "activations", "status": "skip", "cause": "waived: dead by design"}],
    }
    skip = activations(mode="skip")
    assert doctor_step(tmp_path / "e", monkeypatch, [skip], waived)["status"] == "passed"
    # the trusted thresholds claimed as they are, and a seventh loosened: every one compared
    trusted = {"activations.fail-share": 0.6, "activations.warn-share": 0.45,
               "batch-independence.tolerance": 0.001, "grad-flow.warn-norm": 2000.0,
               "initial-loss.fail-high": 4.0, "initial-loss.fail-low": 0.4}  # fmt: skip
    seventh = {
        **looser,
        "policy": {"origin": "x", "thresholds": {**trusted, "shuffle.fail-mix": 0.01}},
    }
    step = doctor_step(tmp_path / "f", monkeypatch, [], seventh, thresholds=trusted)
    assert step["status"] == "failed" and "threshold shuffle.fail-mix = 0.01" in step["reason"]
    same = {**looser, "policy": {"origin": "x", "thresholds": trusted}}  # control
    assert (
        doctor_step(tmp_path / "g", monkeypatch, [], same, thresholds=trusted)["status"] == "passed"
    )


def test_a_working_directory_through_a_link_fails_the_preflight(tmp_path) -> None:
    repo, env = pull_request(tmp_path, BASE, BASE)
    (repo / "project").rename(repo / "moved")
    (repo / "project").symlink_to("moved")
    with pytest.raises(DlciError, match="symbolic link"):
        trusted_configuration(repo / "project", env)
    assert trusted_configuration(repo / "moved", env)["values"]["min-gpu-util"] is None  # control


def test_the_summary_lists_the_waivers_and_fails_on_an_expired_one(tmp_path) -> None:
    from dlci.action.host.summary import summarize

    art = tmp_path / "art"
    art.mkdir()
    later = (dt.date.today() + dt.timedelta(days=30)).isoformat()
    preflight_with(art, {}, [activations(until=later)])
    summary = summarize(art)
    text = summary.markdown
    assert "### Waived checks" in text
    assert "| `activations` | warn-only | dead by design | " + later in text
    assert "base commit 0123456789ab:project/pyproject.toml:7" in text
    assert "the pull request adds a waiver for lr-range: it takes effect once merged" in text
    assert "expired" not in text
    # an expired waiver fails the job, naming it
    art2 = tmp_path / "art2"
    art2.mkdir()
    preflight_with(art2, {}, [activations(until="2020-01-31")])
    summary = summarize(art2)
    assert summary.verdict == "fail"
    assert any(
        "waiver for activations" in m and "2020-01-31" in m for _, m, _ in summary.annotations
    )
    assert "(**expired**)" in summary.markdown


def test_an_older_preflight_without_config_reads_as_the_defaults(tmp_path) -> None:
    from dlci.trust import host as trusted

    older = {"passed": True, "tier": {"budget": "pr"}}
    assert trusted.gpu_gate(older) is False and trusted.policy(older).waivers == ()
    assert trusted.waiver_rows(older) == [] and trusted.expired(older) == []
    assert trusted.number(older, "max-utilization-drop") is None


# The container's side: dlci run's options from the job plan's snapshot


def test_dlci_run_takes_its_gates_from_the_plan_and_tests_from_the_project(
    tmp_path, monkeypatch
) -> None:
    from dlci.action.job.options import JobOptions, configured
    from dlci.action.job.run import _dlci_steps

    project = tmp_path / "project"
    project.mkdir()
    # the pull request's working tree loosens the gate; the host's snapshot says 40
    (project / "pyproject.toml").write_text(
        '[tool.dlci]\nmin-gpu-util = 1\ntests = ["tests/unit"]\npytest-args = ["-k", "not slow"]\n'
    )
    monkeypatch.chdir(project)
    tier = preflight_with(tmp_path, {"min-gpu-util": 40.0, "max-gpu-memory": 85.0})
    options = configured(JobOptions(out=tmp_path / "out", plan=str(tier)))
    assert (options.min_gpu_util, options.max_gpu_memory) == (40.0, 85.0)
    assert options.tests == "tests/unit" and options.pytest_args == "-k 'not slow'"
    profile = _dlci_steps(options)["profile"]
    assert profile is not None
    assert profile[-4:] == ["--min-gpu-util", "40", "--max-gpu-memory", "85"]
    # every gate gets the host's plan by argument, and nothing to select another one from
    for command in _dlci_steps(options).values():
        assert command is not None
        assert command[command.index("--plan") + 1] == str(tier)
        assert "--budget" not in command and "--ladder" not in command
    # the command line (the action's inputs) outranks both
    given = JobOptions(out=tmp_path / "o", plan=str(tier), min_gpu_util=55.0, tests="t.py")
    options = configured(given)
    assert options.min_gpu_util == 55.0 and options.tests == "t.py"
    # control: without the host's snapshot the working tree's value would be taken
    assert configured(JobOptions(out=tmp_path / "o2")).min_gpu_util == 1.0


def test_the_max_gpu_memory_input_reaches_dlci_run() -> None:
    from dlci.action.host.inputs import inputs_to_argv

    argv = inputs_to_argv({"DLCI_INPUT_MAX_GPU_MEMORY": "90", "DLCI_INPUT_MIN_GPU_UTIL": ""})
    assert argv == ["--max-gpu-memory", "90"]


# The baseline's bounds: from the host record's preflight, never the workspace's files


def test_the_baseline_bound_comes_from_the_host_records_config(tmp_path, monkeypatch) -> None:
    from dlci.cli import main
    from test_baseline import head_job, utilization

    monkeypatch.setenv("GITHUB_OUTPUT", "/dev/null")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    base = tmp_path / "base"
    base.mkdir()
    (base / "utilization.json").write_bytes(utilization(10))

    def compare(name: str, in_record: bool) -> tuple[int, str]:
        folder = tmp_path / name
        record = head_job(folder / "art", folder / "host", {"utilization.json": utilization(50)})
        config = {"values": {"max-utilization-drop": 10.0}}
        if in_record:
            data = json.loads(record.read_text())
            data["preflight"]["config"] = config
            record.write_text(json.dumps(data))
        else:  # the workspace's copy, which the pull request's code could have written
            pre = json.loads((folder / "art" / "preflight.json").read_text())
            (folder / "art" / "preflight.json").write_text(json.dumps({**pre, "config": config}))
        md = folder / "summary.md"
        argv = ["baseline", "--artifacts", str(folder / "art"), "--host-record", str(record)]
        code = main([*argv, "--base-dir", str(base), "--markdown", str(md)])
        return code, md.read_text()

    code, text = compare("trusted", in_record=True)
    assert code == 1 and "**regressed**" in text
    code, text = compare("workspace", in_record=False)  # control: not a trusted source
    assert code == 0 and "not gated" in text


def profile_step(tmp_path, monkeypatch, values: dict, gate: dict) -> dict:
    job = job_parts(
        tmp_path, monkeypatch, preflight_with(tmp_path, values), "--no-memorize", "--no-doctor"
    )
    plan = job.plan()
    job.collect(plan[0], 0)
    assert plan[1].name == "profile" and plan[1].out is not None
    steps = [{"name": "install", "status": "passed"}, {"name": "profile", "status": "passed"}]
    (plan[1].out / "run.json").write_text(json.dumps({"steps": steps}))
    (plan[1].out / "trace.json.gz").write_bytes(b"")
    report = {"gpu_utilization": 90.0, "gate": {"passed": True, "message": "ok", **gate}}
    (plan[1].out / "utilization.json").write_text(json.dumps(report))
    job.collect(plan[1], 0)
    run = msgspec.to_builtins(job.finish(plan))["run"]
    job.close()
    return next(s for s in run["steps"] if s["name"] == "profile")


def test_a_profile_gated_more_loosely_than_the_trusted_configuration_fails_the_step(
    tmp_path, monkeypatch
) -> None:
    # a profile that read the pull request's own file (its code dropped --plan and the gates)
    trusted = {"min-gpu-util": 40.0, "max-gpu-memory": 80.0}
    loose = {"minimum": 1.0, "max_gpu_memory": 99.0}
    step = profile_step(tmp_path / "a", monkeypatch, trusted, loose)
    assert step["status"] == "failed"
    assert "min-gpu-util 1, the trusted configuration's is 40" in step["reason"]
    assert "max-gpu-memory 99, the trusted configuration's is 80" in step["reason"]
    # controls: gated as trusted, or more strictly, passes
    same = {"minimum": 40.0, "max_gpu_memory": 80.0}
    assert profile_step(tmp_path / "b", monkeypatch, trusted, same)["status"] == "passed"
    strict = {"minimum": 60.0, "max_gpu_memory": 50.0}
    assert profile_step(tmp_path / "c", monkeypatch, trusted, strict)["status"] == "passed"
    # one bound kept and the other dropped: the dropped one was not gated at all
    dropped = {"minimum": None, "max_gpu_memory": 80.0}
    step = profile_step(tmp_path / "d", monkeypatch, trusted, dropped)
    assert step["status"] == "failed"
    assert "no min-gpu-util, the trusted configuration's is 40" in step["reason"]
    dropped = {"minimum": 40.0}
    step = profile_step(tmp_path / "e", monkeypatch, trusted, dropped)
    assert "no max-gpu-memory, the trusted configuration's is 80" in step["reason"]


# ------------------------------------------------- links to host files (issue 42)

HOST_LINE = "host-credentials-canary-42 = ["


@pytest.mark.parametrize("planted", ["pyproject.toml", "dlci.toml", "ladder", "ladder-folder"])
def test_the_configuration_or_the_ladder_through_a_link_fails_the_preflight_with_its_name(
    tmp_path, monkeypatch, planted: str
) -> None:
    from dlci.action.host.preflight import PreflightRequest, preflight

    secret = tmp_path / "runner" / ".credentials"
    secret.parent.mkdir()
    secret.write_text(HOST_LINE + "\n")
    repo = tmp_path / "repo"
    repo.mkdir()
    monkeypatch.chdir(repo)
    monkeypatch.setenv("GITHUB_EVENT_NAME", "push")
    ladder = None
    if planted in ("pyproject.toml", "dlci.toml"):
        (repo / planted).symlink_to(secret)
    elif planted == "ladder":
        (repo / "ladder.yaml").symlink_to(secret)
        ladder = "ladder.yaml"
    else:
        (repo / "ladders").symlink_to(secret.parent)
        (secret.parent / "pr.yaml").write_text(HOST_LINE)
        ladder = "ladders/pr.yaml"
    request = PreflightRequest(out=tmp_path / "out", docker=False, workdir=Path("."), ladder=ladder)
    (tmp_path / "out").mkdir()
    with pytest.raises(DlciError, match="is a symbolic link") as caught:
        preflight(request)
    assert HOST_LINE not in caught.value.message
    assert HOST_LINE not in (tmp_path / "out" / "preflight.json").read_text()


def test_control_without_the_check_the_host_file_reaches_the_report(tmp_path, monkeypatch) -> None:
    """The host reads a file of its own through the pull request's link: its values become
    the job's (a ladder of the host's, with its pr row at 4242 epochs)."""
    import dlci.action.host.preflight as host_preflight

    host = tmp_path / "runner" / "ladder.yaml"
    host.parent.mkdir()
    small = Path(__file__).parent / "data" / "ladders" / "small.yaml"
    host.write_text(small.read_text().replace("max_epochs: 100", "max_epochs: 4242", 1))
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "ladder.yaml").symlink_to(host)
    monkeypatch.chdir(repo)
    monkeypatch.setenv("GITHUB_EVENT_NAME", "push")
    request = host_preflight.PreflightRequest(
        out=tmp_path, docker=False, ladder="ladder.yaml", budget="pr", hardware="cpu"
    )
    with pytest.raises(DlciError, match="is a symbolic link"):
        host_preflight.preflight(request)
    monkeypatch.setattr(host_preflight, "refuse_linked_files", lambda *args: None)
    assert host_preflight.preflight(request)["tier"]["max_epochs"] == 4242
