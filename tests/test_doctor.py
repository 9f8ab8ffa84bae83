"""The debugging ladder against the bug zoo (tests/zoo.py): each planted bug caught by its
check, no false alarm on the clean targets, and the user's state left as it was."""

from __future__ import annotations

import io
import json
import random
import sys
from pathlib import Path

import pytest
import torch

import zoo
from dlci.checks import CHECK_IDS, run_checks, select
from dlci.checks.base import CheckResult
from dlci.cli import main
from dlci.errors import DlciError
from dlci.ladder.tiers import choose_tier

# the planted (N, 1)-vs-(N,) bug makes torch warn too; the check must catch it anyway
pytestmark = pytest.mark.filterwarnings("ignore:Using a target size:UserWarning")

TIER = choose_tier(budget="pr", hardware="cpu")
TESTS = Path(__file__).resolve().parent
EXAMPLE = TESTS.parent / "examples" / "digits"


def assert_caught(result: CheckResult, fragment: str) -> None:
    """A catch: the check failed on what it measured, not because something raised."""
    assert result.status == "fail", result
    assert fragment in result.measured, (fragment, result.measured)
    assert result.cause and result.fix
    assert not {"traceback", "frames"} & set(result.details), result.details


@pytest.mark.parametrize("bug", list(zoo.BUGS), ids=list(zoo.BUGS))
def test_each_planted_bug_is_caught_by_its_check(bug: str) -> None:
    factory, check = zoo.BUGS[bug]
    results = {r.id: r for r in run_checks(factory(), tier=TIER, factory=factory)}
    assert_caught(results[check], zoo.MEASURED[bug])
    assert "crashed" not in {r.status for r in results.values()}


def test_every_planted_bug_has_its_measured_fragment() -> None:
    assert set(zoo.MEASURED) == set(zoo.BUGS)


def _broken_overlap(train, val):  # a bug planted in dl-ci's own check: widths that differ
    return train, val[:, :3]


def test_control_a_check_that_crashes_is_not_a_catch(monkeypatch) -> None:
    """Before: an error raised inside torch, called by dl-ci's own code, was blamed on the
    target: status fail with a cause and a fix, which the zoo test took for a catch."""
    import dlci.checks.overlap as overlap

    monkeypatch.setattr(overlap, "_embed", _broken_overlap)
    crashes: list[BaseException] = []
    checks = select("shuffle,leakage")
    results = run_checks(zoo.split_overlap(), tier=TIER, checks=checks, crashes=crashes)
    shuffle, leakage = results
    assert shuffle.status == "pass"  # the checks around it still run
    assert leakage.status == "crashed"
    assert leakage.measured.startswith("RuntimeError: ")
    assert leakage.cause.startswith("the check crashed at ")
    assert "no frame of the target's code" in leakage.cause
    assert "Traceback" in leakage.details["traceback"]
    assert [type(e).__name__ for e in crashes] == ["RuntimeError"]
    with pytest.raises(AssertionError):
        assert_caught(leakage, zoo.MEASURED["held-out rows copied from training"])


def test_control_a_bug_in_dl_cis_own_check_crashes_it(monkeypatch) -> None:
    import dlci.checks.overlap as overlap
    from dlci.checks.base import fmt

    monkeypatch.setattr(overlap, "find", lambda train, val: fmt(None))  # raises in dl-ci
    leakage = run_checks(zoo.split_overlap(), tier=TIER, checks=select("leakage"))[0]
    assert (leakage.status, leakage.cause) == (
        "crashed",
        "the check crashed: a bug in dl-ci; this is no finding about the target",
    )


def test_control_the_failure_of_the_targets_own_code_is_no_catch_either() -> None:
    """An exception of the target's code fails the check (the user's code is broken), with a
    cause and a fix: the old zoo test took it for a catch; the fragment and frames do not."""
    target = zoo.eval_without_eval_mode()

    def broken_eval(model, batch):
        raise KeyError("logits")

    target.eval_step = broken_eval
    result = run_checks(target, checks=select("train-eval-mode"), tier=TIER)[0]
    assert (result.status, bool(result.cause), bool(result.fix)) == ("fail", True, True)
    with pytest.raises(AssertionError):
        assert_caught(result, zoo.MEASURED["eval without model.eval()"])


def test_a_pure_torch_model_that_cannot_take_its_data_is_the_targets_failure() -> None:
    """No frame of the user's files, but a frame of the target's own module: not a crash."""
    from torch import nn

    target = zoo.classification(model=nn.Sequential(nn.Linear(7, zoo.CLASSES)))
    result = run_checks(target, checks=select("initial-loss"), tier=TIER)[0]
    assert result.status == "fail"
    assert result.measured.startswith("RuntimeError: mat1 and mat2 shapes cannot be multiplied")


@pytest.mark.parametrize("name", list(zoo.CLEAN))
def test_clean_targets_raise_no_alarm(name: str) -> None:
    results = run_checks(zoo.CLEAN[name](), tier=TIER, factory=zoo.CLEAN[name])
    alarms = [(r.id, r.status, r.measured) for r in results if r.status in ("fail", "warn")]
    assert alarms == []
    assert [r.id for r in results] == list(CHECK_IDS)


def test_the_checks_leave_the_model_and_random_state_as_they_found_them() -> None:
    target = zoo.clean_classification()
    model = target.model
    model.eval()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    torch_state, python_state = torch.get_rng_state(), random.getstate()
    loader_state = target.train_loader.generator.get_state()
    run_checks(target, tier=TIER)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert not model.training
    assert model.drop.p == 0.1  # memorize switched dropout off; it is back
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert random.getstate() == python_state
    assert torch.equal(target.train_loader.generator.get_state(), loader_state)


def test_stop_on_fail_skips_the_rest_with_the_reason() -> None:
    results = run_checks(zoo.optimizer_subset(), tier=TIER, stop_on_fail=True)
    assert results[0].status == "fail"
    assert {r.status for r in results[1:]} == {"skip"}
    assert results[1].cause == "--stop-on-fail: an earlier check failed"


def test_only_runs_the_named_checks_in_ladder_order() -> None:
    assert [c.id for c in select("memorize, shuffle")] == ["shuffle", "memorize"]
    with pytest.raises(DlciError) as info:
        select("shufle")
    assert info.value.message == "--only: unknown check 'shufle'"
    assert info.value.hint.startswith("did you mean 'shuffle'?")


def test_an_error_in_the_users_code_fails_that_check_with_the_error() -> None:
    target = zoo.clean_classification()

    def broken_eval(model, batch):
        raise KeyError("logits")

    target.eval_step = broken_eval
    results = {r.id: r for r in run_checks(target, checks=select("train-eval-mode"), tier=TIER)}
    assert results["train-eval-mode"].status == "fail"
    assert results["train-eval-mode"].measured == "KeyError: 'logits'"


def test_checks_that_need_more_of_the_target_are_skipped_with_the_reason() -> None:
    results = {r.id: r for r in run_checks(zoo.clean_regression(), tier=TIER)}
    assert (results["initial-loss"].status, results["initial-loss"].cause) == (
        "skip",
        "num_classes is not given",
    )
    assert results["zero-grad"].cause == "no train_step: dl-ci's own step zeroes gradients"
    assert results["lr-range"].status == "pass"


def test_doctor_on_the_example_passes_and_writes_json_and_markdown(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(EXAMPLE)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    markdown = tmp_path / "doctor.md"
    assert main(["doctor", "--out", str(tmp_path), "--markdown", str(markdown)]) == 0
    report = json.loads((tmp_path / "doctor.json").read_text())
    assert (report["schema_version"], report["kind"], report["verdict"]) == (1, "doctor", "pass")
    assert [c["id"] for c in report["checks"]] == list(CHECK_IDS)
    assert report["counts"]["fail"] == report["counts"]["crashed"] == 0
    assert report["counts"]["ran"] + report["counts"]["skip"] == len(CHECK_IDS)
    assert set(report["checks"][0]) == {
        "id",
        "status",
        "measured",
        "expected",
        "cause",
        "fix",
        "details",
        "seconds",
        "follows",  # the earlier failures this one may follow from (checks/cascade.py)
    }
    text = markdown.read_text()
    assert text.startswith("### ✅ Debugging checks: 0 failed, ")
    assert "| `memorize` | ✅ pass | loss " in text
    assert "dlci doctor" in capsys.readouterr().out


def test_doctor_fails_a_buggy_target_and_names_the_check(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(TESTS)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    code = main(
        [
            "doctor",
            "--target",
            "zoo:no_zero_grad",
            "--out",
            str(tmp_path),
            "--only",
            "zero-grad,grad-flow",
        ]
    )
    assert code == 1
    report = json.loads((tmp_path / "doctor.json").read_text())
    assert [(c["id"], c["status"]) for c in report["checks"]] == [
        ("zero-grad", "fail"),
        ("grad-flow", "pass"),
    ]
    assert report["checks"][0]["cause"].startswith("gradients accumulate across train_step calls")
    out = capsys.readouterr().out
    assert "1 failed, 0 warnings, 1 passed, 0 skipped" in out


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_checks_are_printed_once_in_the_table(
    tmp_path, monkeypatch, capsys
) -> None:
    """The progress is a transient line on a terminal: the table that follows is the one list
    of the checks. Control: in a log (not a terminal) a line a check stays, and on a terminal
    a run that stops with an error (no table) leaves its checks' lines."""
    monkeypatch.chdir(TESTS)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    args = ["--out", str(tmp_path), "--only", "shuffle"]
    assert main(["doctor", "--target", "zoo:split_overlap", *args]) == 0
    assert "shuffle" in capsys.readouterr().out  # the table
    assert "doctor: shuffle" not in terminal.getvalue()

    from dlci.commands.doctor import Progress

    result = CheckResult("shuffle", "pass")
    log = io.StringIO()
    with Progress(1, log) as progress:
        progress(result)
    assert log.getvalue() == "doctor: shuffle              pass\n"
    terminal = Terminal()

    def crash() -> None:
        with Progress(2, terminal) as progress:
            progress(result)
            raise RuntimeError("a crash")

    with pytest.raises(RuntimeError):
        crash()
    assert terminal.getvalue().endswith("doctor: shuffle              pass\n")


def test_a_crashed_check_is_in_the_report_and_the_doctor_exits_3(
    tmp_path, monkeypatch, capsys
) -> None:
    import dlci.checks.overlap as overlap

    monkeypatch.chdir(TESTS)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("DLCI_LOG_DIR", str(tmp_path / "log"))
    monkeypatch.setattr(overlap, "_embed", _broken_overlap)
    markdown = tmp_path / "doctor.md"
    args = ["--out", str(tmp_path), "--only", "shuffle,leakage", "--markdown", str(markdown)]
    assert main(["doctor", "--target", "zoo:split_overlap", *args]) == 3
    report = json.loads((tmp_path / "doctor.json").read_text())
    assert [(c["id"], c["status"]) for c in report["checks"]] == [
        ("shuffle", "pass"),
        ("leakage", "crashed"),
    ]
    counts = {"pass": 1, "warn": 0, "fail": 0, "skip": 0, "crashed": 1, "ran": 2, "following": 0}
    assert report["counts"] == counts
    assert report["verdict"] == "fail"
    assert report["reason"] == "checks crashed, so they gave no verdict: leakage"
    err = capsys.readouterr().err
    assert "doctor: leakage              crashed\n" in err
    assert "error: dlci doctor failed unexpectedly (RuntimeError: " in err
    assert "Traceback" in (tmp_path / "log" / "dlci-error.log").read_text()
    text = markdown.read_text()
    assert text.startswith(
        "### ❌ Debugging checks: 0 failed, 1 crashed, 0 warnings, 1 passed, 0 skipped: "
        "2 of 2 checks ran\n"
    )
    assert "| `leakage` | 💥 crashed | RuntimeError: " in text


def test_a_report_of_before_the_crashed_status_still_renders() -> None:
    from dlci.report.doctor import read, render_markdown

    old = {"verdict": "pass", "counts": {"pass": 1, "warn": 0, "fail": 0, "skip": 1}, "checks": []}
    assert render_markdown(read(old)).startswith(
        "### ✅ Debugging checks: 0 failed, 0 warnings, 1 passed, 1 skipped: 1 of 2 checks ran\n"
    )


def test_the_ids_in_help_and_only_are_the_registrys(capsys) -> None:
    import re

    from dlci import checks

    registry = [c.id for c in checks._registry()]
    assert list(CHECK_IDS) == registry
    with pytest.raises(SystemExit):
        main(["doctor", "--help"])
    text = re.sub(r"\s+", " ", re.sub(r"-\n\s+", "-", capsys.readouterr().out))
    listed = text.split("in ladder order: ")[1].split(" --stop-on-fail")[0]
    assert listed.split(", ") == registry
    for check_id in registry:
        assert [c.id for c in select(check_id)] == [check_id]
    with pytest.raises(DlciError):
        select("not-a-check")


def test_doctor_help_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from dlci.cli import main\n"
        "try:\n"
        "    main(['doctor', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "ok"
    assert "optimizer-coverage, initial-loss" in done.stdout


def test_the_host_s_list_of_checks_is_the_doctor_s_ladder() -> None:
    """policy.CHECK_IDS (what the host's configuration and its bookkeeping of the doctor's
    gate read, without loading the checks) is the ladder the doctor runs, in its order."""
    from dlci.checks import LADDER
    from dlci.policy import CHECK_IDS

    assert tuple(entry[0] for entry in LADDER) == CHECK_IDS


def test_sparse_embedding_gradients_flow_and_a_frozen_row_table_is_still_caught() -> None:
    """An ``EmbeddingBag(sparse=True)`` (DLRM's, a recommender's) gets sparse gradients, which
    have no ``!=`` or ``isfinite``: grad-flow reads their stored values. The control: the same
    model with the embedding detached from the loss fails, naming it."""
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import dlci

    class Recommender(nn.Module):
        def __init__(self, detach: bool = False) -> None:
            super().__init__()
            self.rows = nn.EmbeddingBag(50, 8, mode="sum", sparse=True)
            self.head = nn.Linear(8, 2)
            self.detach = detach

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            bag = self.rows(ids)
            return self.head(bag.detach() if self.detach else bag)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randint(0, 50, (32, 3), generator=g), torch.randint(0, 2, (32,)))

    def target(detach: bool) -> dlci.Target:
        return dlci.Target(
            Recommender(detach), lambda params: torch.optim.SGD(params, lr=0.1),
            DataLoader(data, batch_size=16), loss_fn=nn.CrossEntropyLoss(), num_classes=2,
        )  # fmt: skip

    healthy = run_checks(target(False), checks=select("grad-flow"), tier=TIER)[0]
    assert healthy.status == "pass", healthy
    broken = run_checks(target(True), checks=select("grad-flow"), tier=TIER)[0]
    assert broken.status == "fail" and "rows" in broken.measured, broken
