"""dlci bisect on a real consumer repository built here: a dozen commits of a tiny model
package, a silent bug merged in the middle (its unit tests pass; the learning rate it reads
is 0), a flaky tier, and a branch with a commit that cannot be imported.

Every gate run is a real ``dlci memorize`` subprocess (torch on the CPU, one thread) in a
clean worktree of the commit. The bisects run once per module (they are the slow part) and
many assertions read their answers. Each protection has its control: the culprit's parent
passes and the culprit's unit tests pass; without re-runs the flaky gate blames a healthy
commit; a skipped commit counted as bad would be blamed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dlci import cli
from dlci.bisect.search import Answer, Search, Step
from dlci.errors import DlciError
from github_standin import StandIn

# two tiers of one ladder: "nightly" lets every seed of a healthy commit pass; "merge" stops
# at 20 epochs, where an unlucky seed (one in four) of a healthy commit is still falling
LADDER = """\
version: 2
classes:
  cpu: {match: [], speed: 0.02}
budgets:
  pr:
    cpu: {max_epochs: 100, max_relative_loss: 0.1, time_cap_minutes: 1, profile_steps: 3, nproc: 1}
  merge:
    cpu: {max_epochs: 20, max_relative_loss: 0.1, time_cap_minutes: 1, profile_steps: 3, nproc: 1}
  nightly:
    cpu: {max_epochs: 100, max_relative_loss: 0.1, time_cap_minutes: 1, profile_steps: 3, nproc: 1}
"""

PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "tinynet"
version = "0.1.0"

[tool.setuptools.packages.find]
include = ["tinynet*"]

[tool.dlci]
target = "tinynet.target:make_target"
"""

TARGET = '''\
"""What dl-ci trains."""

import os

import torch
from torch import nn

import dlci
from tinynet.data import loader
from tinynet.luck import SALT
from tinynet.model import Net
from tinynet.settings import SETTINGS


def learning_rate():
    {lr_line}


def make_target():
    # the bisect hands a commit's code no token of the job's
    assert "GITHUB_TOKEN" not in os.environ, "the job's token reached a commit's code"
    # one seed in four is unlucky (an initialisation the short tier is too short for),
    # a different one at each commit (SALT): this seed's rate is a fifth of the others'
    unlucky = (torch.initial_seed() + SALT) % 4 == 0
    lr = learning_rate() * (0.2 if unlucky else 1.0)
    return dlci.Target(
        Net(SETTINGS["hidden"]),
        lambda params: torch.optim.Adam(params, lr=lr),
        loader(),
        loss_fn=nn.CrossEntropyLoss(),
        num_classes=4,
    )
'''

GOOD_LR = 'return SETTINGS["lr"]'
BUG_LR = 'return SETTINGS.get("learning_rate", 0.0)  # read the rate by its long name'

FILES = {
    "pyproject.toml": PYPROJECT,
    "ladder.yaml": LADDER,
    "tinynet/__init__.py": '"""A tiny model package."""\n',
    "tinynet/luck.py": "SALT = 1\n",
    "tinynet/settings.py": 'SETTINGS = {"lr": 0.05, "hidden": 32}\n',
    "tinynet/data.py": textwrap.dedent(
        """\
        import torch
        from torch.utils.data import DataLoader, TensorDataset


        def loader():
            g = torch.Generator().manual_seed(0)
            x = torch.randn(64, 8, generator=g)
            y = torch.randint(0, 4, (64,), generator=g)
            return DataLoader(TensorDataset(x, y), batch_size=16)
        """
    ),
    "tinynet/model.py": textwrap.dedent(
        """\
        from torch import nn


        class Net(nn.Sequential):
            def __init__(self, hidden=32):
                super().__init__(nn.Linear(8, hidden), nn.Tanh(), nn.Linear(hidden, 4))
        """
    ),
    "tinynet/target.py": TARGET.replace("{lr_line}", GOOD_LR),
    "tests/test_tinynet.py": textwrap.dedent(
        """\
        import torch

        from tinynet.target import make_target


        def test_the_target_builds_and_runs():
            target = make_target()
            x, y = next(iter(target.train_loader))
            assert target.model(x).shape == (16, 4)
            assert target.optimizer(target.model.parameters()) is not None
        """
    ),
}

# (subject, files changed): c0 is the last green night, c11 tonight's red one
MAIN = [
    ("tinynet: a tiny classifier and its target", FILES),
    ("docs: a README (#2)", {"README.md": "tinynet\n"}),
    ("tests: the target builds (#3)", {"tests/test_more.py": "def test_nothing():\n    pass\n"}),
    ("model: hidden width from the settings (#4)", {"README.md": "tinynet: hidden 32\n"}),
    ("data: a comment on the split (#5)", {"NOTES.md": "the split is fixed\n"}),
    ("model: build the layers in another order (#6)", {"tinynet/luck.py": "SALT = 0\n"}),
    ("settings: read the learning rate by its long name (#7)",
     {"tinynet/target.py": TARGET.replace("{lr_line}", BUG_LR)}),
    ("docs: the settings (#8)", {"README.md": "tinynet: lr and hidden\n"}),
    ("ci: nothing (#9)", {"NOTES.md": "the split is fixed; ci\n"}),
    ("docs: typo (#10)", {"README.md": "tinynet: lr and hidden.\n"}),
    ("tests: one more (#11)", {"tests/test_more.py": "def test_more():\n    pass\n"}),
    ("release 0.2 (#12)", {"NOTES.md": "0.2\n"}),
]  # fmt: skip
CULPRIT = 6

# a branch from c4: d1 imports a module only d2 adds (a refactor split in two pull requests),
# and d2 brings the bug too: the first bad commit is d1 or d2, and the bisect must say so
BRANCH = [
    ("target: use the new layers (#22)",
     {"tinynet/target.py": "from tinynet.layers import Block  # noqa\n" + FILES["tinynet/target.py"]}),
    ("layers: the new module (#23)",
     {"tinynet/layers.py": "Block = None\n",
      "tinynet/target.py": "from tinynet.layers import Block  # noqa\n"
      + TARGET.replace("{lr_line}", BUG_LR)}),
    ("docs: layers done (#24)", {"README.md": "layers done\n"}),
    ("release 0.3 (#25)", {"NOTES.md": "0.3\n"}),
]  # fmt: skip

DIRTY = 'SETTINGS = {"lr": 0.0, "hidden": 32}  # trying something\n'
AUTHORS = {CULPRIT: ("Ada Lovelace", "ada@example.org")}
GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_COMMITTER_NAME": "CI",
    "GIT_COMMITTER_EMAIL": "ci@example.org",
}


def _git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **GIT_ENV, **(env or {})},
    ).stdout.strip()


def _commit(repo: Path, subject: str, files: dict[str, str], author: tuple[str, str]) -> str:
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    _git(repo, "add", "-A")
    name, email = author
    _git(repo, "commit", "-q", "-m", subject,
         env={"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email})  # fmt: skip
    return _git(repo, "rev-parse", "HEAD")


def build_repository(root: Path, prefix: str = "") -> dict[str, list[str]]:
    """The consumer's history: main (c0..c11) and the branch (d1..d4) from c4; ``prefix``:
    the project's folder in the repository (a monorepo's), e.g. ``project/``."""
    repo = root / "consumer"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    main = [
        _commit(
            repo,
            subject,
            {prefix + name: text for name, text in files.items()},
            AUTHORS.get(i, ("Bob", "bob@example.org")),
        )
        for i, (subject, files) in enumerate(MAIN)
    ]
    _git(repo, "checkout", "-q", "-b", "refactor", main[4])
    branch = [main[4]] + [
        _commit(repo, subject, {prefix + n: text for n, text in files.items()}, ("Cy", "cy@x.org"))
        for subject, files in BRANCH
    ]
    _git(repo, "checkout", "-q", "main")
    return {"main": main, "branch": branch, "repo": [str(repo)]}


def _bisect(repo: Path, out: Path, *args: str) -> dict[str, Any]:
    """``dlci bisect`` in this process (its gate runs are subprocesses); the JSON, the exit
    code, the console and the wall time."""
    import contextlib
    import io
    import time

    stdout, stderr = io.StringIO(), io.StringIO()
    start = time.monotonic()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(["bisect", "--repo", str(repo), "--json", str(out), *args])
    data = json.loads(out.read_text()) if out.exists() else {}
    return {"code": code, "data": data, "out": stdout.getvalue(), "err": stderr.getvalue(),
            "wall_s": time.monotonic() - start}  # fmt: skip


TOKEN = "bisect-token"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The three bisects, once: the silent bug over a dozen commits (with GitHub's pull
    requests), the flaky tier, and the branch with a commit that cannot be imported."""
    root = tmp_path_factory.mktemp("bisect")
    history = build_repository(root)
    repo = Path(history["repo"][0])
    main, branch = history["main"], history["branch"]
    # the caller's working tree has an edit of its own that would fail every commit (a zero
    # rate): the bisect must never run it (each commit runs in a clean worktree)
    (repo / "tinynet" / "settings.py").write_text(DIRTY, encoding="utf-8")
    pull = {"number": 7, "title": "settings: read the learning rate by its long name",
            "html_url": "https://github.com/org/project/pull/7", "user": {"login": "ada"},
            "merged_at": "2026-12-01T10:00:00Z"}  # fmt: skip
    github = StandIn(token=TOKEN, pulls={main[CULPRIT]: [pull]}).start()
    tier = ["--ladder", str(repo / "ladder.yaml"), "--hardware", "cpu", "--device", "cpu"]
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("OMP_NUM_THREADS", "1")
            env.setenv("MKL_NUM_THREADS", "1")
            env.setenv("GITHUB_API_URL", github.api)
            env.setenv("GITHUB_REPOSITORY", "org/project")
            env.setenv("GITHUB_TOKEN", TOKEN)  # the job's: PRs looked up, none for the gates
            found = _bisect(
                repo, root / "found.json", "--good", main[0], "--bad", main[-1],
                "--budget", "nightly", "--markdown", str(root / "found.md"), *tier,
            )  # fmt: skip
            env.delenv("GITHUB_TOKEN")
            flaky = _bisect(
                repo, root / "flaky.json", "--good", main[4], "--bad", main[8],
                "--budget", "merge", *tier,
            )  # fmt: skip
            skipped = _bisect(
                repo, root / "skipped.json", "--good", branch[0], "--bad", branch[-1],
                "--budget", "nightly", *tier,
            )  # fmt: skip
    finally:
        github.stop()
    timing = {k: round(v["wall_s"], 1) for k, v in
              (("found", found), ("flaky", flaky), ("skipped", skipped))}  # fmt: skip
    print(f"bisect wall times: {timing}", file=sys.stderr)
    return {
        "repo": repo, "main": main, "branch": branch, "github": github,
        "found": found, "flaky": flaky, "skipped": skipped,
        "markdown": (root / "found.md").read_text(encoding="utf-8"),
    }  # fmt: skip


def _tested(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["sha"]: entry for entry in data["tested"]}


def test_the_silent_bug_is_named_within_five_gate_runs(runs: dict[str, Any]) -> None:
    found, main = runs["found"], runs["main"]
    data = found["data"]
    assert found["code"] == 0, found["err"]
    assert data["status"] == "found"
    assert data["first_bad"]["sha"] == main[CULPRIT]
    assert data["last_good"]["sha"] == main[CULPRIT - 1]
    assert data["cost"]["gate_runs"] <= 5
    assert data["cost"]["max_runs"] == 8  # printed before it started (below)
    # every tested commit's verdict and figures
    tested = _tested(data)
    assert tested[main[CULPRIT]]["verdict"] == "fail"
    assert tested[main[CULPRIT - 1]]["verdict"] == "pass"  # the control: its parent passes
    assert tested[main[CULPRIT]]["runs"][0]["figures"]["case"] == "flat"
    assert tested[main[CULPRIT - 1]]["runs"][0]["figures"]["case"] == "memorised"
    # the answer rests on a confirmed fail: re-run on two other seeds
    confirm = tested[main[CULPRIT]]["runs"][-1]
    assert (confirm["purpose"], confirm["seeds"], confirm["verdicts"]) == (
        "confirm",
        [1, 2],
        ["fail", "fail"],
    )
    assert all(entry["verdict"] == "fail" for sha, entry in tested.items()
               if main.index(sha) > CULPRIT)  # fmt: skip


def test_the_cost_is_printed_before_the_first_run(runs: dict[str, Any]) -> None:
    err = runs["found"]["err"]
    cost = err.index("cost: 11 commit(s)")
    assert "stops at 8 gate runs or 60 min" in err
    assert cost < err.index(" test: ")


def test_the_culprits_pull_request_and_author(runs: dict[str, Any]) -> None:
    data, main = runs["found"]["data"], runs["main"]
    first = data["first_bad"]
    assert first["author"] == "Ada Lovelace <ada@example.org>"
    assert first["pull"]["number"] == 7 and first["pull"]["author"] == "ada"
    asked = runs["github"].requests("GET", "/commits/")
    assert [s.path for s in asked] == [f"/repos/org/project/commits/{main[CULPRIT]}/pulls"]
    assert asked[0].authorization == f"Bearer {TOKEN}"
    out = runs["found"]["out"]
    assert out.startswith(f"bisect: first bad commit: {main[CULPRIT][:12]} settings:")
    assert "pull request #7 by @ada" in out


def test_the_markdown_puts_the_culprit_first(runs: dict[str, Any]) -> None:
    text, main = runs["markdown"], runs["main"]
    assert text.startswith(f"### dl-ci bisect: first bad commit `{main[CULPRIT][:12]}`\n")
    assert "pull request \\#" in text and "@" in text
    assert f"| `{main[CULPRIT - 1][:12]}` |" in text and "| pass |" in text


def test_the_culprits_unit_tests_pass(
    runs: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control for the bug being silent: the culprit's own tests pass (in-process: the
    commit's files read from git, its test function called). And the control for the token
    kept from the gate runs: the target refuses to build where the job's token is set."""
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    repo, sha = runs["repo"], runs["main"][CULPRIT]
    tree = tmp_path / "culprit"
    for name in ("tinynet/__init__.py", "tinynet/luck.py", "tinynet/settings.py",
                 "tinynet/data.py", "tinynet/model.py", "tinynet/target.py",
                 "tests/test_tinynet.py"):  # fmt: skip
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(_git(repo, "show", f"{sha}:{name}"), encoding="utf-8")
    assert "learning_rate" in (tree / "tinynet/target.py").read_text()
    sys.path.insert(0, str(tree))
    try:
        import importlib

        module = importlib.import_module("tests.test_tinynet")
        module.test_the_target_builds_and_runs()
        assert module.make_target.__module__ == "tinynet.target"
        from tinynet.target import learning_rate

        assert learning_rate() == 0.0  # the bug: the gate's flat loss is this
        monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
        with pytest.raises(AssertionError, match="the job's token reached"):
            module.make_target()
    finally:
        sys.path.remove(str(tree))
        for name in [
            m
            for m in sys.modules
            if m == "tinynet" or m.startswith(("tinynet.", "tests.test_tinynet"))
        ]:
            del sys.modules[name]


def test_a_flaky_gate_does_not_blame_a_healthy_commit(runs: dict[str, Any]) -> None:
    flaky, main = runs["flaky"], runs["main"]
    data = flaky["data"]
    assert flaky["code"] == 0, flaky["err"]
    assert data["first_bad"]["sha"] == main[CULPRIT]
    healthy = _tested(data)[main[CULPRIT - 1]]
    # its first run failed (seed 0 is this commit's unlucky one) ...
    first, again = healthy["runs"]
    assert (first["purpose"], first["seeds"], first["verdicts"]) == ("test", [0], ["fail"])
    # ... so it was re-run on seeds 1 and 2, which passed: it counts as good. Here at once,
    # being near its threshold (still falling when the short tier's epochs ended); a fail
    # far from it would have been re-run as the answer's confirmation instead
    assert (again["seeds"], again["verdicts"]) == ([1, 2], ["pass", "pass"])
    assert again["purpose"] == ("recheck" if first["near"] else "confirm")
    assert first["near"] and first["figures"]["case"] == "still-falling"  # as measured
    assert healthy["verdict"] == "pass"
    assert data["cost"]["gate_runs"] == 4


def test_without_reruns_the_flaky_gate_blames_the_healthy_commit(runs: dict[str, Any]) -> None:
    """The control: the same search with re-runs off, fed the first verdicts the gate really
    gave on these commits, blames the healthy one."""
    data, main = runs["flaky"]["data"], runs["main"]
    first = {main.index(e["sha"]) - 4: e["runs"][0]["verdicts"] for e in data["tested"]}
    answer = _replay(Search(4, reruns=0), first)
    assert answer.status == "found" and answer.first_bad == CULPRIT - 1 - 4
    assert _replay(Search(4, reruns=2), first, rerun=["pass", "pass"]).first_bad == CULPRIT - 4


def _replay(search: Search, first: dict[int, list[str]], rerun: list[str] | None = None) -> Answer:
    """Run the search on recorded verdicts; a commit it asks for that was not run fails the
    test (the replay would not be the real path)."""
    near = None
    while True:
        step = search.next(near)
        if isinstance(step, Answer):
            return step
        assert step.index in first, f"the replay needs commit {step.index}, never run"
        if step.purpose == "test":
            search.record(step.index, first[step.index])
            near = step.index if first[step.index] == ["fail"] and rerun else None
        else:
            truth = first[step.index] if step.index != CULPRIT - 1 - 4 else rerun
            search.record(step.index, (truth or []) * 2)
            near = None


def test_a_commit_that_cannot_be_imported_is_skipped_and_the_range_said(
    runs: dict[str, Any],
) -> None:
    skipped, branch = runs["skipped"], runs["branch"]
    data = skipped["data"]
    assert skipped["code"] == 0, skipped["err"]
    assert data["status"] == "range" and data["first_bad"] is None
    assert [c["sha"] for c in data["candidates"]] == [branch[1], branch[2]]
    assert data["last_good"]["sha"] == branch[0]
    tested = _tested(data)
    assert tested[branch[1]]["verdict"] == "skip"
    assert "No module named 'tinynet.layers'" in tested[branch[1]]["runs"][0]["reason"]
    assert tested[branch[2]]["verdict"] == "fail"
    assert [r["purpose"] for r in tested[branch[2]]["runs"]] == ["test", "confirm"]
    assert data["cost"]["gate_runs"] == 3
    out = skipped["out"]
    assert out.startswith("bisect: the first bad commit is one of 2: ")
    assert branch[1][:12] in out and branch[2][:12] in out


def test_counted_as_a_fail_the_unimportable_commit_would_be_blamed(runs: dict[str, Any]) -> None:
    """The control: the unimportable commit's run counted as a fail (as ``git bisect run``
    counts any failing exit) names it alone, wrongly."""
    data, branch = runs["skipped"]["data"], runs["branch"]
    first = {branch.index(e["sha"]): e["runs"][0]["verdicts"] for e in data["tested"]}
    as_fail = {i: ["fail" if v == "skip" else v for v in verdicts] for i, verdicts in first.items()}
    answer = _replay(Search(4, reruns=0), as_fail)
    assert answer.status == "found" and answer.first_bad == 1
    assert _replay(Search(4, reruns=0), first).candidates == (1, 2)


def test_the_callers_tree_is_untouched(runs: dict[str, Any]) -> None:
    """Its own edit (which would fail every commit: the control is that commits passed) is
    still there, alone; its branch and worktrees are as they were."""
    repo = runs["repo"]
    assert _git(repo, "status", "--porcelain") == "M tinynet/settings.py"
    assert (repo / "tinynet" / "settings.py").read_text(encoding="utf-8") == DIRTY
    assert any(e["verdict"] == "pass" for e in runs["found"]["data"]["tested"])
    assert _git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert _git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


# --- the parts, without gate runs


def test_the_search_confirms_a_bad_end_that_passes_and_says_not_reproduced() -> None:
    search = Search(3)
    asked = []
    while not isinstance(step := search.next(), Answer):
        asked.append((step.index, step.purpose))
        search.record(step.index, ["pass"] if step.purpose == "test" else ["pass", "pass"])
    assert asked == [(1, "test"), (2, "test"), (3, "test"), (3, "confirm")]
    assert step.status == "not-reproduced" and step.first_bad is None
    # the control: a bad end that fails again is the answer
    search = Search(1)
    assert search.next() == Step(1, "test")
    search.record(1, ["fail"])
    assert search.next() == Step(1, "confirm")
    search.record(1, ["fail", "pass"])
    assert search.next() == Answer("found", 0, 1, (1,))


def test_the_profile_gate_confirms_the_last_good_pass_too() -> None:
    for confirm_passes, expected in ((True, [(1, "confirm"), (2, "confirm")]), (False, [])):
        search = Search(2, confirm_passes=confirm_passes)
        search.record(1, ["pass"])
        search.record(2, ["fail"])
        asked = []
        while not isinstance(step := search.next(), Answer):
            asked.append((step.index, step.purpose))
            search.record(step.index, ["pass", "pass"] if step.index == 1 else ["fail", "fail"])
        assert sorted(asked) == sorted(expected or [(2, "confirm")])
        assert step.first_bad == 2


def test_a_tie_counts_as_a_fail_and_skips_do_not_count() -> None:
    from dlci.bisect.search import Tally

    assert Tally([["pass"], ["fail"]]).verdict == "fail"
    assert Tally([["skip"], ["pass"]]).verdict == "pass"
    assert Tally([["skip"]]).settled and not Tally([["fail"]]).settled


def _report(folder: Path, name: str, data: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(data), encoding="utf-8")
    return folder


def test_the_gates_read_their_reports(tmp_path: Path) -> None:
    from dlci.bisect.gates import Gate

    memorize = Gate()
    tier = {"max_epochs": 100}
    slow_pass = {"verdict": "pass", "steps": 90, "case": "memorised", "tier": tier}
    assert memorize.judge(_report(tmp_path / "a", "memorization.json", slow_pass), 0, 1, "").near
    quick_pass = {**slow_pass, "steps": 10}
    judged = memorize.judge(_report(tmp_path / "b", "memorization.json", quick_pass), 0, 1, "")
    assert judged.verdicts == ["pass"] and not judged.near
    close_fail = {"verdict": "fail", "case": "slow", "relative_loss": 0.12,
                  "relative_threshold": 0.1, "tier": tier}  # fmt: skip
    assert memorize.judge(_report(tmp_path / "c", "memorization.json", close_fail), 1, 1, "").near
    far_fail = {**close_fail, "relative_loss": 0.9}
    assert not memorize.judge(_report(tmp_path / "d", "memorization.json", far_fail), 1, 1, "").near
    seeds = {**far_fail, "seeds": {"runs": [{"verdict": "pass"}, {"verdict": "fail"}]}}
    judged = memorize.judge(_report(tmp_path / "e", "memorization.json", seeds), 1, 2, "")
    assert judged.verdicts == ["pass", "fail"]
    error = {"verdict": "fail", "stopped_by": "error", "reason": "importing 'x' failed"}
    folder = _report(tmp_path / "f", "memorization.json", error)
    assert memorize.judge(folder, 1, 2, "").verdicts == ["skip", "skip"]
    assert Gate(errors_fail=True).judge(folder, 1, 1, "").verdicts == ["fail"]
    missing = memorize.judge(tmp_path / "none", 137, 1, "Killed")
    assert missing.verdicts == ["skip"] and "(exit 137): Killed" in missing.reason

    util = Gate("profile", min_gpu_util=40)
    assert util.argv(tmp_path, 0, 1)[-2:] == ["--min-gpu-util", "40"]  # the profile decides
    for value, verdict, near in ((55.0, "pass", False), (38.0, "fail", True), (20, "fail", False)):
        check = {"name": "min-gpu-util", "passed": verdict == "pass", "judged": True}
        report = {"gpu_utilization_pct": value, "steps": {"mean_step_us": 1000},
                  "gate": {"passed": verdict == "pass", "checks": [check]}}  # fmt: skip
        judged = util.judge(_report(tmp_path / f"u{value}", "utilization.json", report), 0, 1, "")
        assert (judged.verdicts, judged.near) == ([verdict], near), value
    # the verdict is read, never decided again: a gate that failed at 55% fails here too, and
    # a gate that did not judge (not applicable: no GPU) is a skip
    check = {"name": "min-gpu-util", "passed": False, "judged": True}
    report = {"gpu_utilization_pct": 55.0, "steps": {"mean_step_us": 1000},
              "gate": {"passed": False, "checks": [check]}}  # fmt: skip
    assert util.judge(
        _report(tmp_path / "read", "utilization.json", report), 1, 1, ""
    ).verdicts == ["fail"]
    report["gate"]["checks"] = [{"name": "min-gpu-util", "passed": True, "judged": False}]
    assert util.judge(_report(tmp_path / "na", "utilization.json", report), 0, 1, "").verdicts == [
        "skip"
    ]
    step = Gate("profile", max_step_time_ms=2.0)
    report = {"gpu_utilization_pct": None, "steps": {"mean_step_us": 3000}}
    judged = step.judge(_report(tmp_path / "s", "utilization.json", report), 0, 1, "")
    assert judged.verdicts == ["fail"] and judged.figures["step_time_ms"] == 3.0
    nothing = util.judge(_report(tmp_path / "n", "utilization.json", {}), 0, 1, "")
    assert nothing.verdicts == ["skip"]

    doctor = Gate("doctor", check="grad-flow")
    entry = {"id": "grad-flow", "status": "fail", "measured": "0 of 4 reached", "expected": "",
             "cause": "", "fix": ""}  # fmt: skip
    checks = {"verdict": "fail", "counts": {}, "checks": [entry]}  # a whole doctor.json
    judged = doctor.judge(_report(tmp_path / "g", "doctor.json", checks), 1, 1, "")
    assert judged.verdicts == ["fail"] and "0 of 4 reached" in judged.reason
    entry["status"] = "warn"
    assert doctor.judge(_report(tmp_path / "h", "doctor.json", checks), 0, 1, "").verdicts == [
        "pass"
    ]
    assert doctor.judge(
        _report(tmp_path / "i", "doctor.json", {**checks, "checks": []}), 0, 1, ""
    ).verdicts == ["skip"]
    hostile = {**checks, "checks": [{**entry, "status": ["fail"]}]}  # read, never a crash
    judged = doctor.judge(_report(tmp_path / "j", "doctor.json", hostile), 1, 1, "")
    assert judged.verdicts == ["skip"]
    assert judged.reason == ("doctor.json: checks[0].status is a list, expected text (exit 1)")


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"kind": "nothing"}, "choose from"),
        ({"kind": "profile"}, "needs one bound"),
        ({"kind": "profile", "min_gpu_util": 1, "max_step_time_ms": 2}, "needs one bound"),
        ({"kind": "doctor"}, "needs --check"),
        ({"near": 1.5}, "--near"),
    ],
)
def test_a_gate_asked_wrongly_is_refused(kwargs: dict[str, Any], words: str) -> None:
    from dlci.bisect.gates import Gate
    from dlci.errors import DlciError

    with pytest.raises(DlciError, match=words):
        Gate(**kwargs)


def test_revisions_are_checked(runs: dict[str, Any], tmp_path: Path) -> None:
    repo, main, branch = runs["repo"], runs["main"], runs["branch"]
    for good, bad, words in (
        (main[3], main[3], "the same commit"),
        (main[8], main[3], "not an ancestor"),
        ("no-such-rev", main[3], "names no commit"),
        (branch[2], main[-1], "not an ancestor"),
    ):
        result = _bisect(repo, tmp_path / "x.json", "--good", good, "--bad", bad)
        assert result["code"] == 1 and words in result["err"], (good, bad, result["err"])
        assert not (tmp_path / "x.json").exists()


def test_a_spent_budget_leaves_the_range_open(
    runs: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--max-runs 0 is the plan alone: no gate run, exit 1, the whole range open; --good
    last-green reads the history's newest green night (tonight's red one has no epochs); a
    relative --ladder is the caller's file, for every commit."""
    repo, main = runs["repo"], runs["main"]
    (tmp_path / "mine.yaml").write_text(LADDER, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    history = {
        "schema_version": 1,
        "kind": "history",
        "entries": [
            {"hardware_class": "cpu", "sha": main[1], "epochs_to_threshold": 30},
            {"hardware_class": "cpu", "sha": main[3], "epochs_to_threshold": 31},
            {"hardware_class": "cpu", "sha": main[11], "epochs_to_threshold": None},
        ],
    }
    path = tmp_path / "history.json"
    path.write_text(json.dumps(history), encoding="utf-8")
    result = _bisect(repo, tmp_path / "u.json", "--good", "last-green", "--history", str(path),
                     "--bad", main[-1], "--max-runs", "0", "--ladder", "mine.yaml")  # fmt: skip
    data = result["data"]
    assert f"--ladder {tmp_path / 'mine.yaml'}" in data["gate"]
    assert result["code"] == 1, result["err"]
    assert data["status"] == "unfinished" and data["good"]["sha"] == main[3]
    assert [c["sha"] for c in data["candidates"]] == main[4:]
    assert data["cost"]["gate_runs"] == 0 and data["tested"] == []
    assert "the budget of 0 gate runs is spent" in result["err"]


def test_the_time_cap_cuts_a_run_short_without_a_verdict(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    """A run the bisect's time cap cuts short is no skip: the bisect ends, unfinished."""
    repo, main = runs["repo"], runs["main"]
    result = _bisect(repo, tmp_path / "t.json", "--good", main[5], "--bad", main[7],
                     "--time-cap", "0.01", "--budget", "nightly", "--hardware", "cpu",
                     "--ladder", str(repo / "ladder.yaml"))  # fmt: skip
    data = result["data"]
    assert result["code"] == 1 and data["status"] == "unfinished", result["err"]
    assert data["tested"] == [] and data["cost"]["gate_runs"] == 1
    assert "time cap of 0.01 min cut the run" in result["err"]
    assert [c["sha"] for c in data["candidates"]] == main[6:8]


def test_pip_installs_a_commit_or_says_why_not(tmp_path: Path) -> None:
    from dlci.bisect.install import Unrunnable, install, source_root

    tree = tmp_path / "tree"
    for name in ("pyproject.toml", "tinynet/__init__.py", "tinynet/settings.py"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(FILES[name], encoding="utf-8")
    assert source_root(tree) == tree
    installed = install(tree, "pip", tmp_path / "into")
    env = installed.environment({"PATH": os.environ["PATH"], "PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"] == os.pathsep.join([str(tmp_path / "into"), "/elsewhere"])
    probe = "import tinynet.settings as s; print(s.__file__)"
    where = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert where.startswith(str(tmp_path / "into"))
    (tree / "pyproject.toml").write_text(FILES["pyproject.toml"] + "name = \n", encoding="utf-8")
    with pytest.raises(Unrunnable, match=r"pip install failed: .*Invalid value"):
        install(tree, "pip", tmp_path / "into2")


@pytest.mark.parametrize(
    "gate",
    [
        {"kind": "memorize"},
        {"kind": "profile", "max_step_time_ms": 5.0},
        {"kind": "doctor", "check": "grad-flow"},
    ],
)
def test_each_gates_command_line_is_one_its_verb_accepts(
    gate: dict[str, Any], tmp_path: Path
) -> None:
    """The verb parses the gate's arguments (a refused command line exits 2, and the bisect
    stops on it); the target that does not exist then fails the run with exit 1."""
    import contextlib
    import io

    from dlci.bisect.gates import Gate

    options = ("--target", "no_such_module_for_bisect:make", "--device", "cpu", "--budget",
               "pr", "--hardware", "cpu")  # fmt: skip
    argv = Gate(passthrough=options, **gate).argv(tmp_path, 3, 2)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(argv) == 1
        assert cli.main([*argv, "--no-such-option"]) == 2  # the control


def test_the_markdown_of_a_range_lists_every_suspect(runs: dict[str, Any]) -> None:
    from dlci.bisect.render import markdown
    from dlci.bisect.result import AnswerShape

    data, branch = runs["skipped"]["data"], runs["branch"]
    text = markdown(msgspec.convert(data, AnswerShape))  # bisect.json, as its readers take it
    assert text.startswith("### dl-ci bisect: range\n")
    for sha in branch[1:3]:
        assert f"- `{sha[:12]}` " in text
    assert "| skip |" in text and "tinynet.layers" in text


def test_a_failed_pull_request_lookup_is_said_not_fatal() -> None:
    from dlci.action.github.api import GitHub
    from dlci.bisect.git import Commit
    from dlci.bisect.result import pulls

    said: list[str] = []
    commit = Commit("a" * 40, "subject (#3)", "A <a@x>", "")
    unreachable = GitHub("http://127.0.0.1:9", "org/project", "t", timeout=2.0)
    assert pulls(unreachable, [commit], said.append) == {}
    assert said and said[0].startswith(f"pull request of {commit.short}: not looked up: GET ")
    assert pulls(None, [commit], said.append) == {}  # no token: not asked


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"install": "conda"}, "--install 'conda'"),
        ({"reruns": 11}, "--reruns must be"),
        ({"max_runs": -1}, "--max-runs must be"),
        ({"time_cap_minutes": 0}, "--time-cap must be"),
        ({"run_timeout_minutes": -1}, "--run-timeout must be"),
    ],
)
def test_a_request_out_of_bounds_is_refused(change: dict[str, Any], words: str) -> None:
    from dlci.bisect.run import BisectRequest
    from dlci.errors import DlciError

    with pytest.raises(DlciError, match=re.escape(words)):
        BisectRequest(Path("."), "a", "b", **change).checked()


def test_every_key_of_the_answer_is_documented(runs: dict[str, Any]) -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "nightly.md").read_text("utf-8")
    data = runs["found"]["data"]
    keys = (
        set(data) | set(data["cost"]) | set(data["tested"][0]) | set(data["tested"][0]["runs"][0])
    )
    keys -= {"schema_version", "kind", "workdir", "run_timeout_minutes", "reruns", "sha"}
    assert sorted(k for k in keys if f"`{k}`" not in doc) == []


# --- the action's bisect of a red run: its decisions on the host, without a container


def _record(tmp_path: Path, failed: str, checks: list[dict[str, Any]] | None = None) -> Path:
    """A host record whose ``failed`` step failed (and, given, the host's doctor.json)."""
    reports = tmp_path / "record-reports"
    reports.mkdir()
    if checks is not None:
        (reports / "doctor.json").write_text(json.dumps({"checks": checks}))
    record = {
        "run": {"steps": [{"name": "tests", "status": "passed"},
                          {"name": failed, "status": "failed"}]},
        "reports_dir": str(reports),
        "preflight": {"config": {"values": {"min-gpu-util": 40}}},
    }  # fmt: skip
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    return path


def test_the_action_bisects_by_the_gate_that_failed_and_never_on_a_pull_request(
    tmp_path: Path,
) -> None:
    from dlci.action.host import bisect as night
    from dlci.action.host.summary import read_report

    def gate(failed: str, checks: list[dict[str, Any]] | None = None) -> list[str]:
        folder = tmp_path / f"{failed}-{len(checks or [])}"
        folder.mkdir()
        return night.gate_of(read_report(_record(folder, failed, checks)) or {})[0]

    assert gate("memorize") == ["--gate", "memorize"]
    hostile = [{"id": "--target=evil:x", "status": "fail"}, {"id": "zero-grad", "status": "fail"}]
    assert gate("doctor", hostile) == ["--gate", "doctor", "--check", "zero-grad"]
    assert gate("doctor", [{"id": "made-up", "status": "fail"}]) == []  # not the kit's check
    assert gate("profile") == ["--gate", "profile", "--min-gpu-util", "40"]
    assert gate("tests") == []  # a unit test's failure is git bisect run's, not this gate's
    # a pull request's run is refused before anything is asked or run (the control: the same
    # request on a schedule gets as far as the token it lacks for last-green)
    request = night.NightRequest(image="none", record=str(_record(tmp_path, "memorize")))
    assert night.bisect(request, {"GITHUB_EVENT_NAME": "pull_request"}).status == "skipped"
    assert night.bisect(request, {"GITHUB_EVENT_NAME": "merge_group"}).status == "skipped"
    script = night.NightRequest(image="none", record=request.record, target="python train.py")
    assert night.bisect(script, {"GITHUB_EVENT_NAME": "schedule"}).status == "skipped"
    with pytest.raises(DlciError, match="last-green needs the token"):
        night.bisect(request, {"GITHUB_EVENT_NAME": "schedule"})


def test_a_hostile_answer_is_a_line_at_the_summarys_top_not_a_crash(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    from dlci.action.host.summary import bisect_top

    assert bisect_top(tmp_path) == ""  # no bisect: nothing on top
    (tmp_path / "bisect.json").write_text(json.dumps(runs["found"]["data"]))
    assert bisect_top(tmp_path).startswith("### dl-ci bisect: first bad commit")
    for broken in (
        {**runs["found"]["data"], "status": "`rm -rf`"},
        {**runs["found"]["data"], "tested": [{"sha": "x" * 40}]},
        [1, 2],
    ):
        (tmp_path / "bisect.json").write_text(json.dumps(broken))
        top = bisect_top(tmp_path)
        assert top.startswith("dl-ci bisect: its answer cannot be shown: "), top
        assert "not a bisect answer" in top


def test_the_hosts_checks_of_an_answer_it_did_not_write(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    """The container's answer is a claim: a commit id with a newline, a found without its
    commit, a verdict of its own are refused; the comment goes only where GitHub places the
    culprit between the good and bad commits (the control: a place GitHub confirms)."""
    from dlci.action.host.bisect import _between
    from dlci.bisect.result import read_answer

    data = runs["found"]["data"]
    path = tmp_path / "bisect.json"
    for broken in (
        {**data, "good": {**data["good"], "sha": data["good"]["sha"] + "\n"}},
        {**data, "first_bad": None},
        {**data, "tested": [{**data["tested"][0], "verdict": "::error::x"}]},
    ):
        path.write_text(json.dumps(broken))
        with pytest.raises(DlciError, match="not a bisect answer"):
            read_answer(path)
    path.write_text(json.dumps({**data, "cost": {**data["cost"], "surprise": 1}, "x": [1]}))
    kept = msgspec.to_builtins(read_answer(path))
    assert "x" not in kept and "surprise" not in kept["cost"]  # nothing undeclared kept

    class Api:
        def __init__(self, states: dict[str, str]) -> None:
            self.states = states

        def get(self, path: str) -> dict[str, str]:
            return {"status": self.states.get(path.rsplit("/", 1)[-1], "diverged")}

    good, bad, culprit = "a" * 40, "b" * 40, "c" * 40
    placed = {f"{good}...{culprit}": "ahead", f"{culprit}...{bad}": "ahead"}
    assert _between(Api(placed), good, culprit, bad) == ""  # type: ignore[arg-type]
    elsewhere = {**placed, f"{culprit}...{bad}": "behind"}  # after tonight's: not bisected
    assert "does not place" in _between(Api(elsewhere), good, culprit, bad)  # type: ignore[arg-type]
    assert _between(None, good, culprit, bad).startswith("no comment: no token")
