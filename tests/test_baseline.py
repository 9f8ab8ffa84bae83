"""``dlci baseline``: this run against its baseline, fetched through a stand-in GitHub API.

GitHub's servers cannot be reached here; tests/github_standin.py serves the endpoints dl-ci
calls on 127.0.0.1 (named a stand-in everywhere). HEAD is a job folder that the host's record
vouches for, as the summary step leaves it; the utilization reports come from synthetic GPU
traces (tests/tracegen.py) whose utilization is known: 80.4 % with a 10 us launch gap, 48.9 %
with 50 us.
"""

from __future__ import annotations

import hashlib
import json
import socket
import urllib.request
import zipfile
from pathlib import Path

import msgspec
import pytest

from dlci.action.github import artifacts as fetching
from dlci.action.github.api import ApiError, GitHub
from dlci.cli import main
from dlci.profiling.metrics import analyze
from dlci.profiling.reader import read_trace
from dlci.report.comparison import MARKER
from github_standin import StandIn, zipped
from tracegen import training_trace

TOKEN = "ghs_standInToken0123456789"  # pragma: allowlist secret (a test value)
TIER = {"budget": "pr", "hardware_class": "cpu", "max_epochs": 100, "max_loss": 1.0}
WORKFLOW_REF = "org/project/.github/workflows/pr.yml@refs/pull/7/merge"
_UTIL: dict[tuple[int, str], bytes] = {}


def utilization(gap: int, gpu: str = "NVIDIA H100 80GB HBM3") -> bytes:
    """A utilization report of 12 synthetic GPU steps (launch gap 10 us: 80.4 %, 50: 48.9 %)."""
    if (gap, gpu) not in _UTIL:
        trace = training_trace(steps=12, launch_gap_us=gap, first_step=2)
        trace.header["deviceProperties"][0]["name"] = gpu
        path = Path(f"/dev/shm/dlci-baseline-{gap}-{abs(hash(gpu))}.json")
        try:
            report = analyze(read_trace(trace.write(path)))
        finally:
            path.unlink(missing_ok=True)
        _UTIL[(gap, gpu)] = msgspec.json.encode(report)  # as utilization.json holds it
    return _UTIL[(gap, gpu)]


def preflight(hardware_class: str = "cpu") -> bytes:
    return json.dumps({"passed": True, "tier": {**TIER, "hardware_class": hardware_class}}).encode()


def memorization(steps: int, torch: str = "2.13.0+cpu", threshold: float = 1.0) -> bytes:
    losses = [2.0 / (1 + i) for i in range(steps)]
    return json.dumps(
        {
            "schema_version": 1,
            "kind": "memorization",
            "verdict": "pass",
            "threshold": threshold,
            "steps": steps,
            "best_loss": losses[-1],
            "final_loss": losses[-1],
            "losses": losses,
            "config": {"versions": {"torch": torch}, "tier": TIER},
            "tier": TIER,
        }
    ).encode()


def head_job(folder: Path, host: Path, files: dict[str, bytes]) -> Path:
    """A job folder as the summary step leaves it, and the host's record vouching for it."""
    folder.mkdir(parents=True)
    host.mkdir(parents=True)
    (folder / "preflight.json").write_bytes(preflight())
    reports = {}
    for name, data in files.items():
        (folder / name).write_bytes(data)
        reports[name] = {"part": name.split(".")[0], "sha256": hashlib.sha256(data).hexdigest()}
    record = {
        "kind": "host-record",
        "tier": TIER,
        "preflight": {"passed": True, "gpu": False, "tier": TIER},
        "isolated_parts": ["memorize", "profile"],
        "reports": reports,
        "run": {"kind": "run", "steps": [], "verdict": "pass"},
    }
    (host / "record.json").write_text(json.dumps(record))
    return host / "record.json"


@pytest.fixture
def standin(monkeypatch):
    server = StandIn(token=TOKEN).start()
    monkeypatch.setenv("GITHUB_API_URL", server.api)
    monkeypatch.setenv("GITHUB_REPOSITORY", "org/project")
    monkeypatch.setenv("GITHUB_WORKFLOW_REF", WORKFLOW_REF)
    monkeypatch.setenv("GITHUB_BASE_REF", "main")
    monkeypatch.setenv("GITHUB_RUN_ID", "5")
    monkeypatch.setenv("DLCI_GITHUB_TOKEN", TOKEN)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    monkeypatch.setenv("GITHUB_OUTPUT", "/dev/null")
    yield server
    server.stop()


def base_run(server: StandIn, files: dict[str, bytes], **run) -> dict:
    made = server.add_run("pr.yml", **run)
    server.add_artifact(made, "dlci-artifacts-cpu-123-1-0000abcd", zipped(files))
    return made


def compare(tmp_path: Path, head: dict[str, bytes], *extra: str) -> tuple[int, str]:
    record = head_job(tmp_path / "art", tmp_path / "host", head)
    md = tmp_path / "summary.md"
    argv = ["baseline", "--artifacts", str(tmp_path / "art"), "--host-record", str(record)]
    code = main([*argv, "--markdown", str(md), *extra])
    return code, md.read_text() if md.exists() else ""


def test_the_summary_shows_base_against_head_from_the_fetched_artifact(
    standin, tmp_path, capsys, monkeypatch
) -> None:
    outputs = tmp_path / "outputs.txt"
    monkeypatch.setenv("GITHUB_OUTPUT", str(outputs))
    run = base_run(
        standin,
        {"utilization.json": utilization(10), "memorization.json": memorization(17),
         "preflight.json": preflight()},
    )  # fmt: skip
    head = {"utilization.json": utilization(10), "memorization.json": memorization(34)}
    code, text = compare(tmp_path, head, "--max-utilization-drop", "10")
    assert code == 0, text
    assert text.startswith(MARKER)
    assert "## ✅ dl-ci against the baseline: passed" in text
    assert f"base: run {run['id']} on `main`" in text
    assert "| memorization: epochs to threshold | 17 | 34 | ↑ +17 | not gated |" in text
    assert "| GPU utilization | 80.4 % | 80.4 % | → +0.0 pt \\[+0.0, +0.0\\] | ok |" in text
    assert "```mermaid" in text and "xychart-beta" in text
    assert f"baseline-run={run['id']}" in outputs.read_text()
    assert "comparison=passed" in outputs.read_text()
    paths = [(s.method, s.path) for s in standin.seen]
    assert paths == [
        ("GET", "/repos/org/project/actions/workflows/pr.yml/runs"),
        ("GET", f"/repos/org/project/actions/runs/{run['id']}/artifacts"),
        ("GET", "/repos/org/project/actions/artifacts/700001/zip"),
        ("GET", "/storage/blob/700001"),
    ]
    assert standin.seen[0].query["branch"] == ["main"]
    assert standin.seen[0].query["status"] == ["success"]
    captured = capsys.readouterr()
    assert TOKEN not in captured.out + captured.err + text


def test_a_planted_thirty_point_utilization_drop_fails_with_confidence(
    standin, tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    base_run(standin, {"utilization.json": utilization(10), "preflight.json": preflight()})
    code, text = compare(
        tmp_path, {"utilization.json": utilization(50)}, "--max-utilization-drop", "10"
    )
    assert code == 1
    assert "## ❌ dl-ci against the baseline: failed" in text
    assert "| GPU utilization | 80.4 % | 48.9 % | ↓ -31.6 pt" in text and "**regressed** |" in text
    assert "::error title=dl-ci baseline::gpu_utilization_pct regressed" in capsys.readouterr().out
    # control: the same drop without a bound is shown, not gated
    code, text = compare(tmp_path / "again", {"utilization.json": utilization(50)})
    assert code == 0 and "| GPU utilization | 80.4 % | 48.9 % |" in text and "not gated" in text


def test_the_token_never_follows_the_redirect_to_storage(standin, tmp_path) -> None:
    base_run(standin, {"utilization.json": utilization(10)})
    api = GitHub.from_environment(TOKEN)
    fetched = fetching.fetch(api, "auto", prefix="dlci-artifacts-cpu-", into=tmp_path / "b")
    assert fetched.problem == "" and (tmp_path / "b" / "utilization.json").is_file()
    (zip_call,) = standin.requests(pattern="/zip$")
    (storage,) = standin.requests(pattern="^/storage/")
    assert zip_call.authorization == f"Bearer {TOKEN}"
    assert storage.authorization is None
    # control: a header added the ordinary way does follow the redirect, and the stand-in sees it
    request = urllib.request.Request(standin.api + zip_call.path)
    request.add_header("Authorization", f"Bearer {TOKEN}")
    urllib.request.urlopen(request, timeout=10).read()
    assert standin.requests(pattern="^/storage/")[-1].authorization == f"Bearer {TOKEN}"


def test_a_token_with_a_control_character_never_reaches_a_message(standin, tmp_path) -> None:
    """A secret saved with its newline made urllib refuse the header and quote it; the
    message went into preflight.json's sizing reason (uploaded) and the log. The newline is
    taken off (a token's own characters are printable); a token with a space inside is refused
    without quoting it; a header urllib refuses is named, never quoted. Control: the stripped
    token is sent as it is."""
    base_run(standin, {"utilization.json": utilization(10)})
    api = GitHub.from_environment(TOKEN + "\n")
    assert api.token == TOKEN
    fetched = fetching.fetch(api, "auto", prefix="dlci-artifacts-cpu-", into=tmp_path / "b")
    assert fetched.problem == ""
    assert standin.requests(pattern="/zip$")[-1].authorization == f"Bearer {TOKEN}"
    with pytest.raises(ApiError) as refused:
        GitHub.from_environment("ghs_part one")
    assert "part" not in str(refused.value)
    raw = GitHub(api.api_url, api.repository, "ghs_secret\r\nX-Evil: 1")  # past the check
    fetched = fetching.fetch(raw, "auto", prefix="dlci-artifacts-cpu-", into=tmp_path / "c")
    assert fetched.problem and "secret" not in fetched.problem, fetched.problem


def test_auto_takes_the_newest_successful_run_on_the_base_branch_never_this_one(
    standin, tmp_path, monkeypatch
) -> None:
    wanted = base_run(standin, {"utilization.json": utilization(10)})
    standin.add_run("pr.yml", branch="feature")  # another branch
    standin.add_run("pr.yml", conclusion="failure")  # failed
    standin.add_run("other.yml")  # another workflow
    base_run(standin, {"utilization.json": utilization(50)}, run_id=5)  # this very run
    api = GitHub.from_environment(TOKEN)
    fetched = fetching.fetch(api, "auto", prefix="dlci-artifacts-cpu-", into=tmp_path / "b")
    assert fetched.run["id"] == wanted["id"], fetched.problem
    # a run id takes that run, whatever its branch
    monkeypatch.delenv("GITHUB_BASE_REF")
    fetched = fetching.fetch(api, "5", prefix="dlci-artifacts-cpu-", into=tmp_path / "c")
    assert fetched.run["id"] == 5 and fetched.problem == ""


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize(
    ("plant", "said"),
    [
        ("wrong token", "HTTP 401 (Bad credentials)"),
        ("403", "HTTP 403 (stand-in failure 403)"),
        ("500", "HTTP 500 (stand-in failure 500)"),
        ("not json", "the answer is not JSON"),
        ("closed port", "Connection refused"),
        ("no runs", "no successful run of pr.yml on main yet"),
        ("other class", "kept no unexpired artifact named dlci-artifacts-cpu-*"),
        ("expired", "kept no unexpired artifact named dlci-artifacts-cpu-*"),
        ("not a zip", "is not a readable zip"),
    ],
)
def test_an_api_problem_is_a_warning_and_no_baseline(
    standin, tmp_path, capsys, monkeypatch, plant, said
) -> None:
    files = {"utilization.json": utilization(10)}
    if plant != "no runs":
        made = standin.add_run("pr.yml")
        name = (
            "dlci-artifacts-a100-1-1-0000abcd"
            if plant == "other class"
            else "dlci-artifacts-cpu-1-1-0000abcd"
        )
        data = b"PK not a zip" if plant == "not a zip" else zipped(files)
        standin.add_artifact(made, name, data, expired=plant == "expired")
    if plant == "wrong token":
        monkeypatch.setenv("DLCI_GITHUB_TOKEN", "ghs_wrong")
    elif plant in ("403", "500"):
        standin.fail["/repos/org/project/actions/runs/"] = int(plant)
    elif plant == "not json":
        standin.raw["/repos/org/project/actions/workflows/"] = b"<html>busy</html>"
    elif plant == "closed port":
        monkeypatch.setenv("GITHUB_API_URL", _closed_port())
    code, text = compare(
        tmp_path, {"utilization.json": utilization(50)}, "--max-utilization-drop", "1"
    )
    assert code == 0
    assert "## ➖ dl-ci against the baseline: no baseline" in text
    err = capsys.readouterr().err
    assert err.startswith("warning: no baseline: ") and said in err, err
    assert TOKEN not in err + text and "ghs_wrong" not in err + text


def test_answers_are_bounded_in_size_and_time(standin, tmp_path, monkeypatch) -> None:
    from dlci.action.github import api as github_api

    base_run(standin, {"utilization.json": utilization(10)})
    api = GitHub.from_environment(TOKEN)
    assert fetching.fetch(api, "auto", prefix="dlci-", into=tmp_path / "a").problem == ""  # control
    monkeypatch.setattr(github_api, "MAX_JSON", 100)
    problem = fetching.fetch(api, "auto", prefix="dlci-", into=tmp_path / "b").problem
    assert problem.endswith("/actions/workflows/pr.yml/runs: the answer is larger than 100 bytes")
    monkeypatch.setattr(github_api, "MAX_JSON", 8 << 20)
    monkeypatch.setattr(github_api, "MAX_SECONDS", -1.0)  # a deadline already past
    problem = fetching.fetch(api, "auto", prefix="dlci-", into=tmp_path / "c").problem
    assert problem.endswith("the answer took longer than -1 s")


def _fetch_zip(standin: StandIn, tmp_path: Path, data: bytes) -> fetching.Fetched:
    standin.add_artifact(standin.add_run("pr.yml"), "dlci-artifacts-cpu-1", data)
    api = GitHub.from_environment(TOKEN)
    return fetching.fetch(api, "auto", prefix="dlci-artifacts-cpu-", into=tmp_path / "base")


def test_a_member_path_is_never_used_as_a_path(standin, tmp_path) -> None:
    """Zip slip: members named ../x or /x, or in a folder, are not the reports."""
    data = zipped(
        {
            "../utilization.json": utilization(10),
            "/preflight.json": preflight(),
            "sub/memorization.json": memorization(3),
            "coverage.xml": b'<coverage line-rate="0.5"/>',
        }
    )
    fetched = _fetch_zip(standin, tmp_path, data)
    assert fetched.problem == ""
    assert sorted(p.name for p in (tmp_path / "base").iterdir()) == ["coverage.xml"]  # control
    assert not (tmp_path / "utilization.json").exists()
    assert not list(tmp_path.rglob("preflight.json"))


def test_a_zip_bomb_expands_no_further_than_the_cap(standin, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(fetching, "MAX_MEMBER", 1 << 20)
    bomb = b"{" + b" " * (8 << 20) + b"}"  # 8 MiB of JSON: about 8 KiB deflated
    fetched = _fetch_zip(
        standin, tmp_path, zipped({"utilization.json": bomb, "preflight.json": preflight()})
    )
    assert fetched.problem == ""
    assert fetched.skipped == ["utilization.json: larger than 1 MiB decompressed"]
    assert (tmp_path / "base" / "preflight.json").is_file()  # control: the small one is taken
    # a header that lies about the size is read through the same cap
    forged = bytearray(zipped({"utilization.json": bomb}))
    for at in range(len(forged) - 4):
        if forged[at : at + 4] in (b"PK\x03\x04", b"PK\x01\x02"):
            offset = at + (22 if forged[at + 2] == 3 else 24)
            forged[offset : offset + 4] = (100).to_bytes(4, "little")
    out = tmp_path / "forged"
    api = GitHub.from_environment(TOKEN)
    standin.add_artifact(standin.add_run("pr.yml"), "dlci-artifacts-cpu-2", bytes(forged))
    fetched = fetching.fetch(api, "auto", prefix="dlci-artifacts-cpu-2", into=out)
    assert (
        not (out / "utilization.json").exists()
        or (out / "utilization.json").stat().st_size <= 1 << 20
    )


def test_too_many_members_or_too_big_an_archive_is_no_baseline(
    standin, tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(fetching, "MAX_ENTRIES", 10)
    many = zipped({f"f{i}": b"" for i in range(11)})
    assert "more than 10 files" in _fetch_zip(standin, tmp_path / "a", many).problem
    few = zipped({f"f{i}": b"" for i in range(9)} | {"preflight.json": preflight()})
    assert _fetch_zip(standin, tmp_path / "b", few).problem == ""  # control
    monkeypatch.setattr(fetching, "MAX_ARCHIVE", 1000)
    big = zipped({"utilization.json": utilization(10)})
    assert "larger than 0 MiB" in _fetch_zip(standin, tmp_path / "c", big).problem


def test_an_unknown_compression_method_is_no_baseline(standin, tmp_path) -> None:
    data = bytearray(zipped({"utilization.json": utilization(10)}))
    for at in range(len(data) - 4):
        if data[at : at + 4] in (b"PK\x03\x04", b"PK\x01\x02"):
            offset = at + (8 if data[at + 2] == 3 else 10)
            data[offset : offset + 2] = (99).to_bytes(2, "little")  # AES: not in zipfile
    fetched = _fetch_zip(standin, tmp_path, bytes(data))
    assert "is not a readable zip (That compression method is not supported)" in fetched.problem
    assert fetched.folder is None and not (tmp_path / "base" / "utilization.json").exists()


def test_two_members_of_one_name_are_left_out(standin, tmp_path) -> None:
    path = tmp_path / "twice.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("utilization.json", utilization(10))
        with pytest.warns(UserWarning, match="Duplicate name"):
            archive.writestr("utilization.json", utilization(50))
    fetched = _fetch_zip(standin, tmp_path, path.read_bytes())
    assert fetched.skipped == ["utilization.json: more than one member has this name"]


def test_a_broken_base_report_is_left_out_with_the_reason(standin, tmp_path, capsys) -> None:
    bad = json.dumps(
        {"kind": "utilization", "schema_version": 1, "per_step": [{"duration_us": "x"}]}
    )
    base_run(standin, {"utilization.json": bad.encode(), "memorization.json": memorization(17)})
    code, text = compare(
        tmp_path, {"utilization.json": utilization(50), "memorization.json": memorization(20)}
    )
    assert code == 0
    assert "base: left out utilization.json: per_step\\[0\\].duration_us: expected a number" in text
    assert "| memorization: epochs to threshold | 17 | 20 |" in text  # the rest is compared


def test_a_head_report_the_host_does_not_vouch_for_is_left_out(standin, tmp_path) -> None:
    base_run(standin, {"utilization.json": utilization(10)})
    record = head_job(tmp_path / "art", tmp_path / "host", {"memorization.json": memorization(9)})
    (tmp_path / "art" / "utilization.json").write_bytes(utilization(50))  # planted, unrecorded
    md = tmp_path / "s.md"
    argv = ["baseline", "--artifacts", str(tmp_path / "art"), "--host-record", str(record)]
    assert main([*argv, "--markdown", str(md), "--max-utilization-drop", "10"]) == 0
    assert "GPU utilization" not in md.read_text()
    # control: without the host's record the planted report counts, and fails the drop
    assert main(["baseline", "--artifacts", str(tmp_path / "art"), "--max-utilization-drop", "10",
                 "--markdown", str(md)]) == 1  # fmt: skip


@pytest.mark.parametrize(
    ("base", "why"),
    [
        ({"preflight.json": preflight("a100")}, "hardware class a100 (base) and cpu (head)"),
        ({"memorization.json": memorization(17, torch="2.4.0")}, "torch 2.4.0 (base)"),
    ],
)
def test_a_baseline_on_other_hardware_or_torch_is_not_comparable(
    standin, tmp_path, base, why
) -> None:
    standin.add_artifact(
        standin.add_run("pr.yml"),
        "dlci-artifacts-cpu-9-1-0000abcd",
        zipped({"utilization.json": utilization(10), **base}),
    )
    head = {"utilization.json": utilization(50), "memorization.json": memorization(17)}
    code, text = compare(tmp_path, head, "--max-utilization-drop", "10")
    assert code == 0
    assert "| GPU utilization | 80.4 % | 48.9 % | - | not comparable |" in text
    assert why in text


def test_memorization_runs_at_another_threshold_are_not_comparable(standin, tmp_path) -> None:
    base_run(standin, {"memorization.json": memorization(17, threshold=0.3)})
    code, text = compare(tmp_path, {"memorization.json": memorization(9)})
    assert code == 0
    assert "| memorization: epochs to threshold | 17 | 9 | ↓ -8 | not comparable |" in text
    assert "memorised means loss &lt; 0.3 (base) and loss &lt; 1 (head): another tier" in text
    # control: the same threshold compares
    code, text = compare(tmp_path / "same", {"memorization.json": memorization(17, threshold=0.3)})
    assert "| memorization: epochs to threshold | 17 | 17 | → +0 | not gated |" in text


def _pr_event(tmp_path: Path, monkeypatch, head_repo: str = "org/project") -> None:
    event = tmp_path / "event.json"
    event.write_text(
        json.dumps(
            {
                "number": 7,
                "pull_request": {
                    "number": 7,
                    "head": {"repo": {"full_name": head_repo}},
                    "base": {"repo": {"full_name": "org/project"}},
                },
                "repository": {"full_name": "org/project"},
            }
        )
    )
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request")
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))


def test_one_sticky_comment_is_posted_then_updated_in_place(
    standin, tmp_path, monkeypatch, capsys
) -> None:
    _pr_event(tmp_path, monkeypatch)
    standin.comment(7, f"{MARKER}\nquoted by a person", login="alice", kind="User")
    base_run(standin, {"utilization.json": utilization(10)})
    head = {"utilization.json": utilization(10)}
    assert compare(tmp_path / "1", head, "--comment", "true")[0] == 0
    assert "baseline: commented on pull request 7" in capsys.readouterr().err
    assert (
        compare(tmp_path / "2", {"utilization.json": utilization(50)}, "--comment", "true")[0] == 0
    )
    assert "baseline: updated the comment on pull request 7" in capsys.readouterr().err
    person, bot = standin.comments[7]
    assert person["body"] == f"{MARKER}\nquoted by a person"  # a person's comment is never edited
    assert bot["user"]["type"] == "Bot" and "| GPU utilization | 80.4 % | 48.9 %" in bot["body"]
    assert len(standin.requests("POST")) == 1 and len(standin.requests("PATCH")) == 1


@pytest.mark.parametrize(
    ("event", "head_repo", "why"),
    [
        ("pull_request", "mallory/project", "a fork's pull request (mallory/project)"),
        ("push", "org/project", "not a pull request"),
    ],
)
def test_no_comment_on_a_fork_or_outside_a_pull_request(
    standin, tmp_path, monkeypatch, capsys, event, head_repo, why
) -> None:
    _pr_event(tmp_path, monkeypatch, head_repo)
    monkeypatch.setenv("GITHUB_EVENT_NAME", event)
    base_run(standin, {"utilization.json": utilization(10)})
    assert compare(tmp_path, {"utilization.json": utilization(10)}, "--comment", "true")[0] == 0
    assert f"baseline: no comment: {why}" in capsys.readouterr().err
    assert standin.requests("POST") == [] and standin.requests("PATCH") == []


def test_a_local_folder_is_a_baseline_without_any_request(standin, tmp_path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "utilization.json").write_bytes(utilization(10))
    code, text = compare(tmp_path, {"utilization.json": utilization(10)}, "--base-dir", str(base))
    assert code == 0 and "base: the reports in" in text
    assert standin.seen == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--baseline", "latest"], "--baseline: auto, none or a run id, got 'latest'"),
        (["--max-utilization-drop", "-1"], "a bound must be a number of 0 or more, got '-1'"),
        (["--max-step-time-regression", "ten"], "a bound must be a number of 0 or more"),
    ],
)
def test_bad_arguments_are_one_error_line(tmp_path, capsys, argv, message) -> None:
    assert main(["baseline", "--artifacts", str(tmp_path), *argv]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_baseline_none_does_nothing(tmp_path, capsys) -> None:
    assert main(["baseline", "--baseline", "none", "--artifacts", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.out == captured.err == ""


def test_the_token_stays_on_the_host_in_the_baseline_step_alone() -> None:
    import yaml

    action = yaml.safe_load((Path(__file__).resolve().parents[1] / "action.yml").read_text())
    holders = [
        step["name"]
        for step in action["runs"]["steps"]
        if "inputs.github-token" in json.dumps(step.get("env", {}))
    ]
    assert holders == [
        "Preflight (fork guard, GPU, tier, Docker)",
        "Bisect a red run (opt-in)",
        "Compare with the baseline",
    ]
    steps = {step["name"]: step for step in action["runs"]["steps"]}
    for name, verb in zip(holders[::2], ("dlci preflight", "dlci baseline"), strict=True):
        assert verb in steps[name]["run"] and "container" not in steps[name]["run"]  # the host
    # preflight fetches the baseline to size the profile: the token only when one is asked for
    assert steps[holders[0]]["env"]["DLCI_GITHUB_TOKEN"] == (
        "${{ inputs.baseline != 'none' && inputs.github-token || '' }}"
    )
    # the bisect's container gets the allowlisted variables only: never the token's
    from dlci.action.host.inputs import ENV_ALLOWLIST

    bisect = next(s for s in action["runs"]["steps"] if s["name"] == holders[1])
    assert bisect["run"].startswith("dlci container bisect ")
    token_names = {k for k, v in bisect["env"].items() if "github-token" in v}
    assert token_names == {"DLCI_GITHUB_TOKEN"} and not token_names & set(ENV_ALLOWLIST)
    assert action["inputs"]["github-token"]["default"] == "${{ github.token }}"
    # control: the check sees an input where it is (the codecov token in its own step)
    uses = [s for s in action["runs"]["steps"] if "inputs.codecov-token" in json.dumps(s)]
    assert [s["name"] for s in uses] == [
        "Upload coverage to Codecov",
        "Upload test results to Codecov",
    ]


def test_baseline_and_history_never_import_torch(tmp_path) -> None:
    """Host-side verbs: the runner host has no torch (nor matplotlib for the trend plot)."""
    import subprocess
    import sys

    for name in ("art", "base"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "utilization.json").write_bytes(utilization(10))
    art, base = str(tmp_path / "art"), str(tmp_path / "base")
    code = (
        "import sys; from dlci.cli import main\n"
        f"assert main(['baseline', '--artifacts', {art!r}, '--base-dir', {base!r},"
        f" '--markdown', {str(tmp_path / 'b.md')!r}]) == 0\n"
        f"assert main(['history', '--append', {art!r}, '--out', {str(tmp_path / 'h')!r}]) == 0\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'matplotlib'))\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "h" / "trend.svg").is_file()


# -- whose runs count: the base branch's own (review round 3, finding 1)
NAME = "dlci-artifacts-cpu-1-1-0000abcd"  # the action's upload: prefix-class-run-attempt-hex8


def _newer_run(server: StandIn, kind: str) -> dict:
    """A run newer than the base's, on a branch named `main`, that is not the base's own."""
    if kind == "fork pull_request":  # a fork's PR from its own main: head_branch "main" too
        return server.add_run("pr.yml", event="pull_request", head_repository="mallory/project")
    if kind == "fork push":  # not a PR event, but another repository's code
        return server.add_run("pr.yml", head_repository="mallory/project")
    return server.add_run("pr.yml", event=kind)  # this repository's PR main -> release


@pytest.mark.parametrize(
    "kind", ["fork pull_request", "pull_request", "pull_request_target", "fork push"]
)
def test_auto_takes_only_the_base_branchs_own_runs(standin, tmp_path, kind) -> None:
    trusted = base_run(standin, {"utilization.json": utilization(10)})
    newer = _newer_run(standin, kind)
    standin.add_artifact(newer, NAME, zipped({"utilization.json": utilization(50)}))
    api = GitHub.from_environment(TOKEN)
    got = fetching.fetch(api, "auto", prefix="dlci-artifacts-cpu-", into=tmp_path / "a")
    assert got.run["id"] == trusted["id"], got.problem
    # control: the same newer run made by a push of this repository is taken
    newer.update(event="push", head_repository=standin._repository(standin.repo))
    got = fetching.fetch(api, "auto", prefix="dlci-artifacts-cpu-", into=tmp_path / "b")
    assert got.run["id"] == newer["id"], got.problem


@pytest.mark.parametrize("event", ["schedule", "workflow_dispatch"])
def test_a_scheduled_or_dispatched_run_of_the_branch_counts(standin, tmp_path, event) -> None:
    base_run(standin, {"utilization.json": utilization(10)})
    newer = base_run(standin, {"utilization.json": utilization(10)}, event=event)
    api = GitHub.from_environment(TOKEN)
    got = fetching.fetch(api, "auto", prefix="dlci-artifacts-cpu-", into=tmp_path)
    assert got.run["id"] == newer["id"], got.problem


def test_a_forks_run_cannot_hide_a_regression(standin, tmp_path) -> None:
    """End to end: a fork's PR run with a poisoned 48.9 % is never the base of the next PR."""
    base_run(standin, {"utilization.json": utilization(10)})
    evil = _newer_run(standin, "fork pull_request")
    standin.add_artifact(evil, NAME, zipped({"utilization.json": utilization(50)}))
    code, text = compare(
        tmp_path, {"utilization.json": utilization(50)}, "--max-utilization-drop", "10"
    )
    assert code == 1 and "| GPU utilization | 80.4 % | 48.9 % |" in text, text


def test_auto_pages_past_other_runs_within_a_bound(standin, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(fetching, "RUNS_PER_PAGE", 5)
    trusted = base_run(standin, {"utilization.json": utilization(10)})
    for _ in range(7):  # more fork runs named main than a page holds
        _newer_run(standin, "fork pull_request")
    api = GitHub.from_environment(TOKEN)
    got = fetching.fetch(api, "auto", prefix="dlci-artifacts-cpu-", into=tmp_path / "a")
    assert got.run["id"] == trusted["id"], got.problem
    pages = standin.requests(pattern="/runs$")
    assert [s.query["page"] for s in pages] == [["1"], ["2"]]
    # the bound: past MAX_RUN_PAGES pages nothing more is asked, and there is no baseline
    for _ in range(10):
        _newer_run(standin, "fork pull_request")
    standin.seen.clear()
    got = fetching.fetch(api, "auto", prefix="dlci-artifacts-cpu-", into=tmp_path / "b")
    assert got.problem.startswith("no successful run of pr.yml on main yet"), got.problem
    assert len(standin.requests(pattern="/runs$")) == fetching.MAX_RUN_PAGES == 3


def test_auto_walks_back_past_runs_without_this_class_artifact(
    standin, tmp_path, monkeypatch, capsys
) -> None:
    """The newest push runs kept no artifact of this class (another class's runner, uploads
    off): the run before them is the baseline, with a warning; at most MAX_RUNS_TRIED runs."""
    trusted = base_run(standin, {"utilization.json": utilization(10)})
    for _ in range(2):
        other = standin.add_run("pr.yml")
        standin.add_artifact(other, "dlci-artifacts-a100-1-1-0000abcd", zipped({}))
    code, text = compare(
        tmp_path, {"utilization.json": utilization(50)}, "--max-utilization-drop", "10"
    )
    assert code == 1 and f"base: run {trusted['id']} on `main`" in text
    assert (
        "warning: baseline: passed over 2 newer run(s) without an artifact"
        in capsys.readouterr().err
    )
    # the bound: with 2 runs tried, the older one is never asked for
    monkeypatch.setattr(fetching, "MAX_RUNS_TRIED", 2)
    standin.seen.clear()
    api = GitHub.from_environment(TOKEN)
    got = fetching.fetch(api, "auto", prefix="dlci-artifacts-cpu-", into=tmp_path / "b")
    assert (
        got.problem
        == "the 2 newest successful runs kept no unexpired artifact named dlci-artifacts-cpu-*"
    )
    assert len(standin.requests(pattern="/artifacts$")) == 2


def test_a_class_whose_name_starts_alike_is_another_class(standin, tmp_path) -> None:
    """Classes a100 and a100-80gb: dlci-artifacts-a100-80gb-... is not an a100 artifact."""
    run = standin.add_run("pr.yml")
    standin.add_artifact(run, "dlci-artifacts-a100-80gb-1-1-0000abcd", zipped({}))
    api = GitHub.from_environment(TOKEN)
    got = fetching.fetch(
        api, "auto", prefix="dlci-artifacts-a100-", into=tmp_path / "a", rest=fetching.JOB_ID
    )
    assert "kept no unexpired artifact named dlci-artifacts-a100-*" in got.problem
    # control: the a100 upload is taken
    standin.add_artifact(run, "dlci-artifacts-a100-1-1-0000abcd", zipped({}))
    got = fetching.fetch(
        api, "auto", prefix="dlci-artifacts-a100-", into=tmp_path / "b", rest=fetching.JOB_ID
    )
    assert got.problem == "" and got.artifact == "dlci-artifacts-a100-1-1-0000abcd"


def test_the_job_id_shape_is_what_the_action_makes(tmp_path) -> None:
    """The action's own DLCI_JOB_ID line (action.yml), run by bash: its ids are JOB_ID's."""
    import subprocess

    text = (Path(__file__).resolve().parents[1] / "action.yml").read_text()
    (line,) = [x.strip() for x in text.splitlines() if x.strip().startswith('echo "DLCI_JOB_ID=')]
    env = {"PATH": "/usr/bin:/bin", "GITHUB_ENV": str(tmp_path / "env")}
    for _ in range(20):  # random hex digits: leading zeros included
        subprocess.run(["bash", "-c", line], env={**env, "GITHUB_RUN_ID": "9000000001",
                       "GITHUB_RUN_ATTEMPT": "2"}, check=True)  # fmt: skip
    ids = [x.split("=", 1)[1] for x in (tmp_path / "env").read_text().split()]
    assert len(ids) == 20 and all(fetching.JOB_ID.fullmatch(i) for i in ids), ids
    assert not fetching.JOB_ID.fullmatch("80gb-" + ids[0])  # control: another class's rest


# -- a bound with nothing compared, folders, hostile numbers (findings 5, 4, 10)


def test_a_gated_comparison_with_nothing_compared_is_inconclusive(
    tmp_path, monkeypatch, capsys
) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "utilization.json").write_text(
        '{"kind": "utilization", "schema_version": 1, "gpu_utilization_pct": 250}'
    )
    outputs = tmp_path / "out.txt"
    monkeypatch.setenv("GITHUB_OUTPUT", str(outputs))
    head = {"utilization.json": utilization(50)}
    code, text = compare(tmp_path, head, "--base-dir", str(base), "--max-utilization-drop", "10")
    assert code == 0
    assert "## ⚠️ dl-ci against the baseline: inconclusive" in text
    assert "comparison=inconclusive" in outputs.read_text()
    assert "nothing was gated: the base has no utilization report" in capsys.readouterr().err
    # control: without a bound, nothing was asked to be gated, and it passes
    code, text = compare(tmp_path / "free", head, "--base-dir", str(base))
    assert code == 0 and "## ✅ dl-ci against the baseline: passed" in text


@pytest.mark.parametrize("flag", ["--base-dir", "--artifacts"])
def test_a_folder_that_is_not_there_is_a_located_error(tmp_path, capsys, flag) -> None:
    there = tmp_path / "there"
    there.mkdir()
    argv = ["baseline", "--artifacts", str(there), "--base-dir", str(there)]
    argv[argv.index(flag) + 1] = str(tmp_path / "typo")
    assert main([*argv, "--markdown", str(tmp_path / "s.md")]) == 1
    assert f"error: {flag} {tmp_path / 'typo'}: not a folder" in capsys.readouterr().err
    # control: both folders there
    assert main(["baseline", "--artifacts", str(there), "--base-dir", str(there),
                 "--markdown", str(tmp_path / "s.md")]) == 0  # fmt: skip


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"losses": [1.0, 10**400]}, "losses[1]: expected a number, got an integer beyond 64 bits"),
        ({"threshold": 10**400}, "threshold: expected a number, got an integer beyond 64 bits"),
        ({"final_loss": -(10**400)}, "final_loss: expected a number"),
        ({"tier": "x"}, "tier: expected an object, got 'x'"),
    ],
)
def test_hostile_numbers_in_a_base_report_are_left_out(tmp_path, capsys, change, why) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "memorization.json").write_text(json.dumps({**json.loads(memorization(5)), **change}))
    head = {"memorization.json": memorization(7)}
    code, text = compare(tmp_path, head, "--base-dir", str(base))
    assert code == 0, capsys.readouterr().err
    assert f"base: left out memorization.json: {why}" in text.replace("\\", "")
    assert "| memorization: epochs to threshold | - | 7 |" in text
    # control: the sound report is compared (a diverged step's loss is written "nan")
    sound = json.loads(memorization(5))
    (base / "memorization.json").write_text(json.dumps({**sound, "losses": [1.0, "nan", None]}))
    code, text = compare(tmp_path / "sound", head, "--base-dir", str(base))
    assert code == 0 and "| memorization: epochs to threshold | 5 | 7 |" in text


@pytest.mark.parametrize(
    ("kept", "why"),
    [
        (b"[1, ", "baseline-source.json: unreadable"),
        (b'{"id": {"x": 1}, "head_sha": ["a"]}', "baseline-source.json: id is an object"),
        (b'{"id": 7, "passed_over": [1.5]}', "baseline-source.json: passed_over[0] is a number"),
        (b'{"id": 7, "passed_over": [1e999]}', "baseline-source.json: unreadable"),
    ],
)
def test_a_hostile_baseline_source_is_named_and_the_folder_shown(
    tmp_path, capsys, kept, why
) -> None:
    """baseline-source.json lies beside the reports (outside input): one that is not JSON
    crashed dlci baseline; one of wrong types reached the comment as it was."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "utilization.json").write_bytes(utilization(10))
    (base / "baseline-source.json").write_bytes(kept)
    code, text = compare(tmp_path, {"utilization.json": utilization(10)}, "--base-dir", str(base))
    assert code == 0 and f"base: the reports in `{base}`" in text
    assert f"where it came from is unknown: {why}" in capsys.readouterr().err
    # control: a sound one names the run it came from
    (base / "baseline-source.json").write_text(json.dumps({"id": 7, "artifact": "dlci-a"}))
    code, text = compare(tmp_path / "ok", {"utilization.json": utilization(10)}, "--base-dir",
                         str(base))  # fmt: skip
    assert code == 0 and "base: run 7, artifact `dlci-a`" in text
    assert "where it came from" not in capsys.readouterr().err


@pytest.mark.parametrize("rate", ["1e999", "nan", "-0.5", "1.5"])
def test_a_base_coverage_rate_out_of_range_is_left_out(tmp_path, rate) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "coverage.xml").write_text(f'<coverage line-rate="{rate}"/>')
    code, text = compare(tmp_path, {"utilization.json": utilization(10)}, "--base-dir", str(base))
    assert code == 0 and "base: left out coverage.xml: line-rate" in text, text
    assert "inf %" not in text and "nan %" not in text
    (base / "coverage.xml").write_text('<coverage line-rate="0.5"/>')  # control
    code, text = compare(
        tmp_path / "ok", {"utilization.json": utilization(10)}, "--base-dir", str(base)
    )
    assert "| coverage | 50.0 % |" in text


def test_outside_github_actions_the_warning_says_what_to_pass(
    tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.delenv("GITHUB_REPOSITORY", raising=False)
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    code, _ = compare(tmp_path, {"utilization.json": utilization(10)})
    assert code == 0
    err = capsys.readouterr().err
    assert "no baseline: GITHUB_REPOSITORY is not set" in err
    assert "outside GitHub Actions pass --base-dir DIR" in err


# -- the zip's end records as zipfile reads them (finding 3)


def _zip64(n: int, *, classic: tuple[int, int] | None, pointed: int | None = None) -> bytes:
    """n central directory entries, a zip64 end record right before its locator (which points
    at ``pointed``, default: that record), and a classic end record claiming ``classic``
    (entries, directory bytes), or 0xFFFF/0xFFFFFFFF (a true zip64 archive)."""
    import struct

    entry = struct.pack("<4s4B4HL2L5H2L", b"PK\x01\x02", 20, 3, 20, 0, *[0] * 7,
                        1, 0, 0, 0, 0, 0, 0) + b"x"  # fmt: skip
    directory = entry * n
    record = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, n, n, len(directory), 0)
    at = len(directory) if pointed is None else pointed
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, at, 1)
    count, size = classic or (0xFFFF, 0xFFFFFFFF)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, size, 0, 0)
    return directory + record + locator + end


def test_the_member_count_is_read_where_zipfile_reads_it(tmp_path, monkeypatch) -> None:
    """The classic record claims 1 member; Python 3.11's zipfile reads the zip64 record before
    the locator whatever it says, and would parse all 1000 entries before any check."""
    monkeypatch.setattr(fetching, "MAX_ENTRIES", 100)
    lying = tmp_path / "lying.zip"
    lying.write_bytes(_zip64(1000, classic=(1, 47)))
    assert fetching.directory_size(lying)[0] == 1000
    with pytest.raises(fetching.ApiError, match="more than 100 files"):
        fetching.extract(lying, tmp_path / "out")
    # control: a true zip64 archive of 50 members passes the check (and zipfile reads 50)
    true = tmp_path / "true.zip"
    true.write_bytes(_zip64(50, classic=None))
    assert fetching.directory_size(true) == (50, 50 * 47)
    assert len(zipfile.ZipFile(true).infolist()) == 50
    # a locator pointing at another zip64 record than the one before it: refused
    other = _zip64(50, classic=None, pointed=0)
    twice = tmp_path / "twice.zip"
    record = other[50 * 47 : 50 * 47 + 56]
    twice.write_bytes(record.replace(b"\x32\x00", b"\x33\x00", 1) + other)
    with pytest.raises(zipfile.BadZipFile, match="disagree"):
        fetching.directory_size(twice)


def test_the_directory_is_capped_in_bytes_before_it_is_parsed(tmp_path, monkeypatch) -> None:
    path = tmp_path / "a.zip"
    path.write_bytes(zipped({f"f{i}": b"" for i in range(40)}))
    monkeypatch.setattr(fetching, "MAX_DIRECTORY", 1000)
    with pytest.raises(fetching.ApiError, match="directory is larger than"):
        fetching.extract(path, tmp_path / "out")
    monkeypatch.setattr(fetching, "MAX_DIRECTORY", 10_000)  # control
    assert fetching.extract(path, tmp_path / "out") == []


# -- the sticky comment is dl-ci's own (finding 8)


def test_another_bots_comment_quoting_the_marker_is_never_edited(
    standin, tmp_path, monkeypatch, capsys
) -> None:
    """A summary bot that quotes the comparison has the marker in its comment: not dl-ci's."""
    _pr_event(tmp_path, monkeypatch)
    quote = f"Summary of this PR:\n> {MARKER}\n> ## dl-ci against the baseline"
    standin.comment(7, quote, login="summary-app[bot]", kind="Bot")
    base_run(standin, {"utilization.json": utilization(10)})
    head = {"utilization.json": utilization(10)}
    assert compare(tmp_path / "1", head, "--comment", "true")[0] == 0
    assert "baseline: commented on pull request 7" in capsys.readouterr().err
    copy = standin.comment(7, f"{MARKER}\nan app's copy", login="other-app[bot]", kind="Bot")
    assert (
        compare(tmp_path / "2", {"utilization.json": utilization(50)}, "--comment", "true")[0] == 0
    )
    assert "baseline: updated the comment on pull request 7" in capsys.readouterr().err
    summary, ours, _ = standin.comments[7]
    assert summary["body"] == quote and copy["body"] == f"{MARKER}\nan app's copy"
    assert ours["user"]["login"] == "github-actions[bot]" and "48.9 %" in ours["body"]
    # control: without the job token's own comment, a bot's comment that starts with the
    # marker is dl-ci's (an app token posts as its app), never the quote
    from dlci.action.github.comment import find_comment

    api = GitHub.from_environment(TOKEN)
    standin.comments[7].remove(ours)
    assert find_comment(api, 7, MARKER) == copy["id"]


def _noisy(report: bytes, scatter: list[float]) -> bytes:
    """The synthetic report with its steps' utilization scattered by ``scatter`` points."""
    data = json.loads(report)
    for step, delta in zip(data["per_step"], scatter, strict=False):
        step["gpu_utilization_pct"] += delta
    return json.dumps(data).encode()


SCATTER = [3.1, -2.8, 0.4, -4.0, 2.2, -0.9, 3.6, -3.3, 1.1, -1.7, 2.9, -2.5]  # ±3 points


def sized_preflight(tmp_path: Path, *extra: str, bound: str = "5") -> tuple[int, dict, Path]:
    """``dlci preflight`` on the CPU path (the default ladder's pr tier: 3 profiled steps) with
    the baseline ``auto`` kept in ``tmp_path/baseline`` and max-utilization-drop ``bound`` (the
    action's input); its exit code, preflight.json and the kept folder."""
    project, out, kept = tmp_path / "project", tmp_path / "art", tmp_path / "baseline"
    project.mkdir(parents=True, exist_ok=True)
    argv = ["preflight", "--no-docker", "--budget", "pr", "--hardware", "cpu", "--out", str(out),
            "--working-directory", str(project), "--baseline", "auto", "--base-dir", str(kept)]  # fmt: skip
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DLCI_INPUT_MAX_UTILIZATION_DROP", bound)
        env.delenv("GITHUB_EVENT_NAME", raising=False)
        code = main([*argv, *extra])
    report = json.loads((out / "preflight.json").read_text()) if out.is_dir() else {}
    return code, report, kept


def test_the_profile_is_sized_from_the_baselines_scatter_before_the_job(
    standin, tmp_path, capsys, monkeypatch
) -> None:
    """12 base steps scattered ±3 points and a 5-point bound: the 95% interval needs about a
    dozen head steps, not the tier's 3. Preflight sizes the plan before its one write; the
    fetched baseline is kept for the comparison after the job, which then asks GitHub for
    nothing more."""
    from dlci.action.github.sizing import needed_steps

    noisy = _noisy(utilization(10), SCATTER)
    run = base_run(standin, {"utilization.json": noisy, "preflight.json": preflight()})
    code, sized, kept = sized_preflight(tmp_path)
    assert code == 0
    values = [s["gpu_utilization_pct"] for s in json.loads(noisy)["per_step"]]
    want, sigma = needed_steps(values, 5.0, log=False)
    assert want is not None and want > 5 and 2.5 < sigma < 4.0
    assert sized["passed"] is True
    assert sized["tier"]["profile_steps"] == want == sized["profile_sizing"]["steps"]
    assert f"profile_steps 3 -> {want}" in sized["tier"]["reasons"][-1]
    assert sized["profile_sizing"]["baseline"] == {"run": run["id"]}  # no runner path uploaded
    assert f"baseline: profile: profile_steps 3 -> {want}" in capsys.readouterr().err
    assert json.loads((kept / "baseline-source.json").read_text())["id"] == run["id"]
    assert standin.requests(pattern="/runs$")[0].authorization == f"Bearer {TOKEN}"
    requests = len(standin.seen)
    outputs = tmp_path / "outputs.txt"
    monkeypatch.setenv("GITHUB_OUTPUT", str(outputs))
    code, _text = compare(tmp_path / "job", {"utilization.json": noisy}, "--base-dir", str(kept))
    assert code == 0 and f"baseline-run={run['id']}" in outputs.read_text()
    assert len(standin.seen) == requests  # the kept baseline: no second download
    # controls: no bound, nothing fetched nor sized; a base too noisy for any head says what
    # would do
    code, unsized, _ = sized_preflight(tmp_path / "b2", bound="")
    assert code == 0 and unsized["tier"]["profile_steps"] == 3
    assert unsized["profile_sizing"] == {"reason": "not sized: no bound set "
                                         "(max-utilization-drop, max-step-time-regression)"}  # fmt: skip
    assert "baseline: profile: not sized: no bound set" in capsys.readouterr().err
    assert len(standin.seen) == requests and not (tmp_path / "b2" / "baseline").exists()
    tier = {**TIER, "hardware_class": "cpu", "profile_steps": 5, "time_cap_minutes": 3}
    wild = _noisy(utilization(10), [5 * d for d in SCATTER])  # ±15 points
    from dlci.action.github.sizing import plan

    record = plan(json.loads(wild), tier, {"gpu_utilization_pct": 5.0})
    assert record.steps == 5 and "too much for a bound of 5pt" in record.reason
    assert "profile more steps on the base branch" in record.reason
    short = {**tier, "time_cap_minutes": 0.001}
    capped = plan(json.loads(noisy), short, {"gpu_utilization_pct": 5.0})
    assert capped.steps == 5 and "capped" in capped.reason  # the time cap wins
    # found by an attacker's review: never fewer steps than the tier's own; a subnormal step
    # time (a well-formed report) or a report nested 200,000 deep is a reason, not a crash
    assert (
        plan(json.loads(noisy), {**tier, "profile_steps": 80}, {"gpu_utilization_pct": 5.0}).steps
        == 80
    )
    tiny = json.loads(noisy)
    for step in tiny["per_step"]:
        step["duration_us"] = 5e-324
    assert plan(tiny, tier, {"duration_us": 5.0}).steps >= 5
    from dlci.action.github.sizing import size_tier

    (kept / "utilization.json").write_text("[" * 200_000 + "]" * 200_000)
    record = size_tier(dict(tier), kept, {"gpu_utilization_pct": 5.0})
    assert record.reason.startswith("not sized") and "DecodeError" in record.reason


def test_preflight_writes_the_sized_plan_once(standin, tmp_path, monkeypatch, capsys) -> None:
    """The job plan is written strictly once: preflight sizes the tier before its one write of
    preflight.json, which nothing rewrites (the control: without a baseline, the same one
    write, the tier's own steps and no sizing)."""
    from dlci import jsonio

    writes: list[dict] = []
    real = jsonio.write

    def counted(path, data, *args, **kwargs):
        if Path(path).name == "preflight.json":
            writes.append(json.loads(jsonio.encode(data)))
        return real(path, data, *args, **kwargs)

    monkeypatch.setattr(jsonio, "write", counted)
    base_run(standin, {"utilization.json": _noisy(utilization(10), SCATTER)})
    code, sized, _ = sized_preflight(tmp_path / "sized")
    assert code == 0 and len(writes) == 1 and writes[0] == sized
    assert sized["tier"]["profile_steps"] > 3 and "profile_sizing" in sized
    assert "baseline: profile: profile_steps 3 -> " in capsys.readouterr().err
    writes.clear()
    code, plain, kept = sized_preflight(tmp_path / "none", "--baseline", "none")
    assert code == 0 and len(writes) == 1 and writes[0] == plain
    assert plain["tier"]["profile_steps"] == 3 and "profile_sizing" not in plain
    assert not kept.exists()
    assert "baseline: profile" not in capsys.readouterr().err


def test_sizing_is_best_effort_and_never_fails_the_preflight(
    standin, tmp_path, monkeypatch, capsys
) -> None:
    """No baseline to fetch, a wrong spec, no token, or sizing that crashes: a reason in the
    plan and a line, the tier's own steps, and the preflight passes. A refused preflight (a
    fork's pull request) fetches nothing."""
    import os

    from dlci.action.github import sizing

    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    code, report, kept = sized_preflight(tmp_path / "a")  # the stand-in has no run
    assert code == 0 and report["passed"] is True and report["tier"]["profile_steps"] == 3
    assert report["profile_sizing"]["reason"].startswith("not sized: no baseline: ")
    assert "DLCI_GITHUB_TOKEN" not in os.environ  # read once, kept from git, docker, nvidia-smi
    assert "baseline: profile: not sized: no baseline" in capsys.readouterr().err
    code, report, _ = sized_preflight(tmp_path / "b", "--baseline", "latest")
    assert code == 0 and report["tier"]["profile_steps"] == 3
    assert "auto or a run id, got 'latest'" in report["profile_sizing"]["reason"]
    code, report, _ = sized_preflight(tmp_path / "c")  # the token was taken from the env
    assert code == 0 and report["profile_sizing"]["reason"].startswith("not sized: no token")
    monkeypatch.setenv("DLCI_GITHUB_TOKEN", TOKEN)
    base_run(standin, {"utilization.json": _noisy(utilization(10), SCATTER)})

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the sizing")

    monkeypatch.setattr(sizing, "SizedFrom", broken)  # after the tier was sized: undone
    code, report, kept = sized_preflight(tmp_path / "d")
    assert code == 0 and report["passed"] is True and report["tier"]["profile_steps"] == 3
    assert not any("sized from" in reason for reason in report["tier"]["reasons"])
    reason = report["profile_sizing"]["reason"]
    assert reason == "not sized: RuntimeError: a bug in the sizing"
    assert (kept / "baseline-source.json").is_file()  # fetched and kept all the same
    assert "Traceback" not in capsys.readouterr().err
    # a fork's pull request refused on a self-hosted runner: nothing fetched, no sizing
    seen = len(standin.seen)
    monkeypatch.setenv("DLCI_GITHUB_TOKEN", TOKEN)
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"head": {"repo": {"full_name": "m/r"}}},
                                 "repository": {"full_name": "org/project"}}))  # fmt: skip
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))
    monkeypatch.setenv("RUNNER_ENVIRONMENT", "self-hosted")
    monkeypatch.delenv("DLCI_ALLOW_FORK_PRS", raising=False)
    project, out = tmp_path / "e" / "project", tmp_path / "e" / "art"
    project.mkdir(parents=True)
    argv = ["preflight", "--no-docker", "--hardware", "cpu", "--out", str(out),
            "--working-directory", str(project), "--baseline", "auto",
            "--base-dir", str(tmp_path / "e" / "baseline")]  # fmt: skip
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request")
    monkeypatch.setenv("DLCI_INPUT_MAX_UTILIZATION_DROP", "5")
    assert main(argv) == 1
    refused = json.loads((out / "preflight.json").read_text())
    assert refused["passed"] is False and "profile_sizing" not in refused
    assert refused["error"]["message"].startswith("refusing to run a pull request from a fork")
    assert len(standin.seen) == seen and not (tmp_path / "e" / "baseline").exists()
