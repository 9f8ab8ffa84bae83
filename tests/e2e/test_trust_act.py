"""The pull request as the attacker, against the real action.yml under act and the real engine.

One test file in the user's repository plays every attack of the trust boundary from inside
the pull request's own code (docs/security.md, "The boundary between a pull request and the
runner"): it looks for the checkout's token everywhere it can read, plants a file in the
cache, rewrites the tier file and plants a passing memorization report for a target that
cannot memorize, prints workflow commands, and records its IPC namespace. A later trusted
job (a push) looks for the planted cache file; a second pull request is the control that
shows the plant really lands in the (untrusted) cache, and its target (the pull request's
own committed code, `digits_example/hostile.py`) rewrites fields of its gate's report that
the host did not check before issue 35 (`steps`, `best_step`, `world_size`, `device`,
`reason`) into HTML, an image, a team mention and a link; the control renders the rewritten
report without the escaping and finds each of them. The other controls, where a probe
succeeds without its protection, are in test_trust_container.py and test_trust_gates.py
(plain docker runs, faster than act); here the host's own step is the control for the
workflow commands: act does apply an `::add-mask::` printed on the host.
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest
from test_act import git
from test_action import act, job, kit_copy, user_repo

pytestmark = pytest.mark.e2e

# The checkout's token as actions/checkout v4 writes it into .git/config.
TOKEN = "ghs_e2eFakeCheckoutToken0123456789"  # pragma: allowlist secret (a test value)
HEADER = "AUTHORIZATION: basic " + base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()

# The pull request's own test file: the attacker. It never spells the token out (the file is in
# the workspace it searches), it rebuilds it from pieces.
ATTACK = r"""
import base64, json, os, pathlib

TOKEN = "ghs_" + "e2eFakeCheckoutToken" + "0123456789"
NEEDLES = [TOKEN.encode(), base64.b64encode(("x-access-token:" + TOKEN).encode())]
FORGED = {"budget": "pr", "hardware_class": "cpu", "max_epochs": 99999, "max_loss": 100.0,
          "time_cap_minutes": 60, "profile_steps": 2, "nproc": 1}


def _hits():
    hits = []
    for root in ("/workspace", os.path.expanduser("~"), "/tmp", "/dlci", "/run", "/etc"):
        for folder, _, files in os.walk(root):
            for name in files:
                path = os.path.join(folder, name)
                try:
                    with open(path, "rb") as handle:
                        data = handle.read(1 << 20)
                except OSError:
                    continue
                if any(needle in data for needle in NEEDLES):
                    hits.append(path)
    for name in ("environ", "cmdline"):
        with open("/proc/self/" + name, "rb") as handle:
            if any(needle in handle.read() for needle in NEEDLES):
                hits.append("/proc/self/" + name)
    return hits


def _forge():
    done = []
    for path in ("/workspace/dlci-artifacts/preflight.json", "/dlci/host/plan.json"):
        try:
            data = json.loads(pathlib.Path(path).read_text())
            data["tier"] = FORGED
            pathlib.Path(path).write_text(json.dumps(data))
            done.append(path)
        except (OSError, ValueError):
            pass
    fake = {"schema_version": 1, "kind": "memorization", "verdict": "pass", "passed": True,
            "best_loss": 0.01, "threshold": 100.0, "tier": FORGED}
    art = pathlib.Path("/workspace/dlci-artifacts")
    art.mkdir(exist_ok=True)
    (art / "memorization.json").write_text(json.dumps(fake))
    return done


def test_the_pull_request_attacks():
    event = os.environ.get("GITHUB_EVENT_NAME")
    cache = pathlib.Path.home() / ".cache" / "pip" / "dlci-poison.txt"
    found = {"event": event, "poison_seen": cache.exists()}
    if event == "pull_request":
        found["hits"] = _hits()
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text("poison")
        found["forged"] = _forge()
        found["ipc"] = os.readlink("/proc/self/ns/ipc")
        # past pytest's capture: straight to the container's own output (its init's stdout)
        with open("/proc/1/fd/1", "w") as out:
            out.write("::add-mask::pwnedword\npwnedword-visible\n")
            out.write("::error::pwned-by-the-pull-request\n")
        # a nested repository at the submodule's path, for git on the host (issue 42)
        git = pathlib.Path("/workspace/sub/.git")
        (git / "objects").mkdir(parents=True, exist_ok=True)
        (git / "refs").mkdir(exist_ok=True)
        (git / "HEAD").write_text("ref: refs/heads/main\n")
        (git / "config").write_text(
            "[core]\n\trepositoryformatversion = 0\n\tfsmonitor = echo ran >> \"$RUNNER_TEMP/dlci-e2e-ran\"\n"
        )
    art = pathlib.Path("/workspace/dlci-artifacts")  # what the tests leave there comes back
    art.mkdir(exist_ok=True)
    (art / "attack.json").write_text(json.dumps(found))
"""


# The second pull request's target: the tiny-lr target, whose process rewrites its own gate's
# report on the way out, after dl-ci wrote it (a copy goes to the workspace for the control).
HOSTILE_TARGET = r"""
import atexit, json, pathlib

from digits_example.broken import make_tiny_lr_target

MARKUP = "cpu x <img src=https://evil.example/p.png> @org/team https://evil.example/x"


def _rewrite():
    if not pathlib.Path("/workspace/project/rewrite-report").exists():
        return
    path = pathlib.Path("/dlci/out/memorization.json")
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    for key in ("steps", "best_step", "world_size", "device", "reason"):
        report[key] = MARKUP
    path.write_text(json.dumps(report))


def make_target():
    atexit.register(_rewrite)
    return make_tiny_lr_target()
"""


def workflow(kit_image: str) -> str:
    return job(
        f"""
- uses: actions/checkout@v4
- id: control
  run: |
    echo "::add-mask::hostword"
    echo "hostword-visible"
- id: dlci
  uses: org/dl-ci@v1
  with:
    budget: pr
    working-directory: project
    image: {kit_image}
    target: ${{{{ github.event_name == 'pull_request' && 'digits_example.hostile:make_target' || '' }}}}
    memorize: ${{{{ github.event_name == 'pull_request' }}}}
    doctor: "false"
    profile: "false"
    doctest: "false"
    coverage: "false"
    tests: tests/test_attack.py
    upload-artifacts: "false"
- id: check
  if: always()
  run: |
    echo "attack=$(cat "$GITHUB_WORKSPACE/dlci-artifacts/attack.json")" >> "$GITHUB_OUTPUT"
    echo "host_ipc=$(readlink /proc/self/ns/ipc)" >> "$GITHUB_OUTPUT"
    # the host's copy of the gate's report (the target rewrote it on its way out)
    echo "rewritten=$(tr -d '\\n' < "$GITHUB_WORKSPACE/dlci-artifacts/memorization.json" 2>/dev/null)" >> "$GITHUB_OUTPUT"
    # what actions/checkout's post step runs in the workspace (src/git-auth-helper.ts)
    git -C "$GITHUB_WORKSPACE" submodule foreach --recursive "git config --local --show-origin --name-only --get-regexp remote.origin.url" || true
    git -C "$GITHUB_WORKSPACE" submodule status || true
    echo "fsmonitor=$(cat "$RUNNER_TEMP/dlci-e2e-ran" 2>/dev/null | wc -l)" >> "$GITHUB_OUTPUT"
    echo "git=$(git -C "$GITHUB_WORKSPACE" submodule status >/dev/null 2>&1 && echo works)" >> "$GITHUB_OUTPUT"
    echo "nested=$(test -e "$GITHUB_WORKSPACE/sub/.git" && echo yes || echo no)" >> "$GITHUB_OUTPUT"
""",
        on="[push, pull_request]",
    )


@pytest.fixture(scope="module")
def attacked(tmp_path_factory: pytest.TempPathFactory, kit_image: str, act_bin: Path):
    """Three jobs on one runner: the attacking pull request, a push, a second pull request."""
    tmp_path = tmp_path_factory.mktemp("trust-act")
    kit = kit_copy(tmp_path / "kit")
    repo = user_repo(tmp_path, kit, workflow(kit_image))
    (repo / "project" / "tests" / "test_attack.py").write_text(ATTACK)
    (repo / "project" / "digits_example" / "hostile.py").write_text(HOSTILE_TARGET)
    # a submodule entry (a gitlink and .gitmodules), at whose path the tests plant a repository
    (repo / ".gitmodules").write_text('[submodule "sub"]\n\tpath = sub\n\turl = ../sub\n')
    gitlink = "160000,1234567890123456789012345678901234567890,sub"
    git(repo, "update-index", "--add", "--cacheinfo", gitlink)
    git(repo, "add", "--all")
    git(repo, "commit", "--quiet", "--message", "an innocent-looking test")
    # what actions/checkout leaves behind with persist-credentials left at its default
    git(repo, "config", "http.https://github.com/.extraheader", HEADER)
    event = tmp_path / "event.json"
    event.write_text(
        json.dumps(
            {
                "pull_request": {"head": {"repo": {"full_name": "org/project"}}},
                "repository": {"full_name": "org/project"},
            }
        )
    )
    # a push to the default branch, the one kind of push that may write the trusted cache
    push = tmp_path / "push.json"
    push.write_text(
        json.dumps(
            {
                "ref": "refs/heads/main",
                "repository": {"full_name": "org/project", "default_branch": "main"},
            }
        )
    )
    volumes = ["dlci-cache-trusted", "dlci-cache-untrusted"]
    subprocess.run(["docker", "volume", "rm", "-f", *volumes], capture_output=True, check=False)
    runs = {}
    for name, extra in (
        ("pr", {"event": "pull_request", "payload": event}),
        ("push", {"payload": push}),
        ("pr2", {"event": "pull_request", "payload": event}),
    ):
        folder = tmp_path / name
        folder.mkdir()
        if name == "pr2":  # the pull request's next push: its target rewrites its own report
            (repo / "project" / "rewrite-report").write_text("1\n")
            git(repo, "add", "--all")
            git(repo, "commit", "--quiet", "--message", "a faster target")
        runs[name] = act(act_bin, folder, repo, kit=kit, **extra)
    yield runs
    subprocess.run(["docker", "volume", "rm", "-f", *volumes], capture_output=True, check=False)


def _attack(run) -> dict:
    text = run.outputs("check").get("attack", "")
    assert text, run.explain()
    return json.loads(text)


def test_the_checkout_token_is_nowhere_the_pull_request_can_read(attacked) -> None:
    found = _attack(attacked["pr"])
    assert found["event"] == "pull_request"
    assert found["hits"] == []
    assert TOKEN not in attacked["pr"].log  # nor in anything the job printed


def test_a_forged_tier_and_a_planted_report_do_not_pass_the_gate(attacked) -> None:
    run = attacked["pr"]
    found = _attack(run)
    assert found["forged"] == ["/workspace/dlci-artifacts/preflight.json"]  # /dlci/host is ro
    out = run.outputs("dlci")
    assert out["memorization-passed"] == "false", run.explain()
    assert out["verdict"] == "fail"
    host = json.loads(out["tier"])  # the host's tier (the default: relative), not the forged 100
    assert (host["max_loss"], host["max_relative_loss"], host["max_epochs"]) == (None, 0.3, 1000)
    assert run.job_result() == "failure"


def test_the_pull_requests_output_issues_no_workflow_command(attacked) -> None:
    log = attacked["pr"].log
    assert "pwnedword-visible" in log  # its ::add-mask:: was not applied
    # the control: act applies an ::add-mask:: that the host's own step prints
    assert "hostword-visible" not in log and "***-visible" in log


def test_the_container_has_its_own_ipc_namespace(attacked) -> None:
    run = attacked["pr"]
    assert _attack(run)["ipc"] != run.outputs("check")["host_ipc"]


def test_a_trusted_job_never_sees_what_a_pull_request_planted(attacked) -> None:
    push = _attack(attacked["push"])
    assert push["event"] == "push" and push["poison_seen"] is False
    # the control: the next pull request (the same untrusted cache) does see the plant, so the
    # probe works and the plant really landed
    assert _attack(attacked["pr2"])["poison_seen"] is True
    for name, run in attacked.items():
        print(f"attack job {name} under act: {run.seconds:.1f} s")


def test_a_target_that_rewrites_its_report_puts_no_markup_into_the_summary(attacked) -> None:
    run = attacked["pr2"]
    rewritten = json.loads(run.outputs("check").get("rewritten") or "null")
    assert isinstance(rewritten, dict), run.explain()  # the target did rewrite its report
    summary = "".join(run.summaries())
    assert "memorization.json: steps is text, expected an integer" in summary, summary
    assert "memorization.json is not shown" in summary
    for raw in ("<img", "@org/team", "https://evil.example"):
        assert raw not in summary
    assert run.outputs("dlci")["verdict"] == "fail"


def test_control_the_rewritten_report_rendered_raw_carries_the_markup(
    attacked, monkeypatch
) -> None:
    from dlci.report import memorization

    rewritten = json.loads(attacked["pr2"].outputs("check").get("rewritten") or "null")
    monkeypatch.setattr(memorization, "md", lambda text, limit=None: str(text))
    # the report read into its classes as the host would read it, had its wrong types (the
    # counts as text) not stopped it: its text fields carry the markup as written
    numbers = {"steps": 0, "best_step": 0, "world_size": 1}
    raw = memorization.render_markdown(memorization.read({**rewritten, **numbers}))
    for markup in ("<img src=https://evil.example/p.png>", "@org/team", "https://evil.example"):
        assert markup in raw


def test_the_nested_repository_the_tests_plant_never_reaches_git_on_the_host(attacked) -> None:
    """The tests plant ``sub/.git`` with core.fsmonitor set (issue 42): their container had
    its own copy of the checkout, so the workspace that checkout's post step's ``git submodule
    foreach`` runs in has none, and the job fails naming it. The control (the same commands
    on the workspace the containers shared) is in test_trust_workspace.py."""
    run = attacked["pr"]
    check = run.outputs("check")
    assert check.get("git") == "works", run.explain()  # git ran in the workspace
    assert (check.get("nested"), check.get("fsmonitor")) == ("no", "0")
    summary = "".join(run.summaries())
    assert "the tests step planted git files" in summary and "sub/.git (added)" in summary
