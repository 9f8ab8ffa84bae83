"""``dlci memorize`` end to end on the bundled digits example: real training on the CPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlci.cli import main
from dlci.memorization.verdict import training_time

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits"


@pytest.fixture
def in_example(monkeypatch):
    monkeypatch.chdir(EXAMPLE)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def test_the_example_passes_the_pr_tier_and_writes_its_artifacts(
    in_example, tmp_path, monkeypatch, capsys
) -> None:
    outputs = tmp_path / "github_output"
    monkeypatch.setenv("GITHUB_OUTPUT", str(outputs))
    assert main(["memorize", "--out", str(tmp_path), "--budget", "pr"]) == 0
    report = json.loads((tmp_path / "memorization.json").read_text())
    assert (report["schema_version"], report["kind"], report["verdict"]) == (
        1,
        "memorization",
        "pass",
    )
    assert report["tier"]["row"] == "budgets.pr.cpu"
    assert report["config"]["target"] == "digits_example.target:make_target"  # from pyproject.toml
    assert report["steps"] < report["tier"]["max_epochs"]  # early stop
    assert report["best_loss"] < 1.0
    assert report["config"]["changes"] == [
        "dropout off: head.1 (Dropout, p=0.25 -> 0)",
        "dropout off: head.4 (Dropout, p=0.25 -> 0)",
        "weight decay off: param group 0 (0.01 -> 0)",
    ]
    assert (tmp_path / "memorization-curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "report.html").read_text()  # the folder's HTML report, the curve inside
    assert page.count('<img src="data:image/png;base64,') == 1 and ">not run<" in page
    assert "memorization-passed=true" in outputs.read_text()
    out = capsys.readouterr().out
    assert out.startswith("memorization PASS: loss ")


def test_the_tensorboard_events_hold_the_loss_curve_and_the_config(in_example, tmp_path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert main(["memorize", "--out", str(tmp_path), "--quiet"]) == 0
    report = json.loads((tmp_path / "memorization.json").read_text())
    events = EventAccumulator(str(tmp_path / "tensorboard" / "memorize"))
    events.Reload()
    losses = [round(e.value, 4) for e in events.Scalars("memorize/loss")]
    assert losses == [round(v, 4) for v in report["losses"]]
    assert "dlci/config/text_summary" in events.Tags()["tensors"]


def test_a_learning_rate_far_too_small_fails_with_the_best_loss(
    in_example, tmp_path, capsys
) -> None:
    code = main(
        [
            "memorize",
            "--target",
            "digits_example.broken:make_tiny_lr_target",
            "--out",
            str(tmp_path),
            "--quiet",
            "--tracker",
            "none",
        ]
    )
    assert code == 1
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "memorization.json").read_text())
    assert out.startswith(
        f"memorization FAIL: the loss did not fall from its start: from {report['start_loss']:.4g} "
        "at step 1 to at best "
    )
    assert "\n  next: run dlci doctor --target digits_example.broken:" in out
    from dlci.report.memorization import read, render_markdown

    summary = render_markdown(read(report))  # the job summary names the same next step
    assert (
        "**Next:** run dlci doctor --target digits_example.broken:make_tiny_lr_target;" in summary
    )
    # lr 1e-7 on replayed draws: the loss did not move, so the run stopped at once
    assert (report["steps"], report["stopped_by"], report["case"]) == (26, "flat", "flat")
    assert "so more epochs cannot help" in report["reason"]


def test_a_detached_output_fails_with_a_message_that_names_the_bug(
    in_example, tmp_path, capsys
) -> None:
    code = main(
        [
            "memorize",
            "--target",
            "digits_example.broken:make_detached_target",
            "--out",
            str(tmp_path),
            "--quiet",
            "--tracker",
            "none",
        ]
    )
    assert code == 1
    err = capsys.readouterr().err
    changes, error = err.split("error: ", 1)  # what was changed before training, then the error
    assert all(line.startswith("memorize: before training: ") for line in changes.splitlines())
    assert error.startswith("step 1: the loss has no gradient\n  hint: the loss does not depend")
    assert "Traceback" not in err


def test_a_missing_target_module_is_a_clear_error(in_example, tmp_path, capsys) -> None:
    assert main(["memorize", "--target", "nowhere:make", "--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith(
        "error: --target nowhere:make: no module named 'nowhere'"
    )


def run_ddp(out: Path, *extra: str, cwd: Path = EXAMPLE) -> subprocess.CompletedProcess[str]:
    """``dlci memorize --nproc 2`` on the example, for real, under torchrun with gloo (the
    launcher is the console script, as the action's gates run it)."""
    return subprocess.run(
        [
            str(Path(sys.executable).with_name("dlci")),
            "memorize",
            "--nproc",
            "2",
            "--out",
            str(out),
            "--quiet",
            "--tracker",
            "none",
            *extra,
        ],
        cwd=cwd,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_ddp_path_passes_with_two_gloo_processes(tmp_path) -> None:
    # the workspace is the pull request's: a dlci/ folder planted there is never what the
    # workers run (control: `python -m dlci` from that folder imports the plant)
    workspace = tmp_path / "workspace"
    shutil.copytree(EXAMPLE, workspace, ignore=shutil.ignore_patterns("dlci-artifacts"))
    (workspace / "dlci").mkdir()
    (workspace / "dlci" / "__init__.py").write_text("raise SystemExit('PLANTED dlci imported')\n")
    planted = subprocess.run(
        [sys.executable, "-m", "dlci", "--help"], cwd=workspace, capture_output=True, text=True
    )
    assert "PLANTED" in planted.stderr
    done = run_ddp(tmp_path, cwd=workspace)
    assert "PLANTED" not in done.stderr
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "memorization.json").read_text())
    assert (report["verdict"], report["world_size"], report["batch_examples"]) == ("pass", 2, 16)
    assert report["config"]["changes"][0] == "dropout off: module.head.1 (Dropout, p=0.25 -> 0)"
    assert done.stdout.count("memorization PASS") == 1  # only rank 0 reports


def test_the_ddp_path_fails_on_every_rank_alike(tmp_path) -> None:
    done = run_ddp(tmp_path, "--target", "digits_example.broken:make_tiny_lr_target")
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads((tmp_path / "memorization.json").read_text())
    assert (report["verdict"], report["world_size"], report["steps"]) == ("fail", 2, 26)
    assert done.stdout.startswith("memorization FAIL: the loss did not fall from its start")
    assert "Traceback" not in done.stderr


def test_a_mistake_in_the_target_under_ddp_is_reported_once_without_a_traceback(tmp_path) -> None:
    done = run_ddp(tmp_path, "--target", "digits_example.broken:make_detached_target")
    assert done.returncode == 1
    assert done.stderr.count("error: step 1: the loss has no gradient") == 1
    assert "memorize: 2 of 2 DDP processes failed (their messages are above)" in done.stderr
    assert "Traceback" not in done.stderr


def test_weights_and_biases_runs_offline_without_a_key(
    in_example, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert main(["memorize", "--out", str(tmp_path), "--quiet", "--tracker", "wandb"]) == 0
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    assert runs[0].stat().st_size > 0
    report = json.loads((tmp_path / "memorization.json").read_text())
    assert report["tracking"] == f"wandb: {tmp_path / 'wandb'} (offline)"


def test_the_report_on_standard_output_is_pure_json(in_example, tmp_path, capsys) -> None:
    assert main(["memorize", "--out", str(tmp_path), "--quiet", "--tracker", "none", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["verdict"] == "pass"
    assert "memorization PASS" in captured.err


def test_device_cuda_runs_on_a_gpu_and_is_a_clear_error_without_one(
    in_example, tmp_path, capsys
) -> None:
    import torch

    code = main(
        ["memorize", "--out", str(tmp_path), "--device", "cuda", "--tracker", "none", "--quiet"]
    )
    if torch.cuda.is_available():  # a GPU machine: the same command must run there
        assert code == 0
        assert json.loads((tmp_path / "memorization.json").read_text())["device"].startswith("cuda")
    else:
        assert code == 1
        assert capsys.readouterr().err.startswith(
            "error: --device cuda: no CUDA device is available here"
        )


def test_the_markdown_summary_is_made_from_the_report(in_example, tmp_path) -> None:
    from dlci.report.memorization import read, render_markdown
    from dlci.report.text import md

    assert main(["memorize", "--out", str(tmp_path), "--quiet", "--tracker", "none"]) == 0
    report = json.loads((tmp_path / "memorization.json").read_text())
    text = render_markdown(read(report))
    assert text.startswith("### ✅ Memorization test: pass\n\n" + md(report["reason"]) + "\n")
    assert " -&gt; " in text  # the reason's ">" as Markdown text, not the end of a tag
    assert "| target | `digits_example.target:make_target` |" in text
    assert "| tier | pr / cpu (budgets.pr.cpu) |" in text
    assert "| training time | " in text
    assert f"| best loss | {report['best_loss']:.4g} at step {report['best_step']} |" in text
    assert "| changed | weight decay off: param group 0 (0.01 -&gt; 0) |" in text


def test_the_markdown_escapes_the_outside_text_of_a_report() -> None:
    from dlci.report.memorization import read, render_markdown

    report = {
        "verdict": "pass",
        "reason": "loss 0.5 < 1 at step 3",
        "threshold": 1.0,
        "best_loss": 0.5,
        "best_step": 3,
        "final_loss": 0.5,
        "steps": 3,
        "wall_time_s": 0.1,
        "setup_time_s": 0.2,
        "device": "cpu",
        "world_size": 1,
        "tier": {
            "budget": "pr|<img src=x>",
            "hardware_class": "a100\n## owned",
            "row": "budgets.pr.a100",
            "max_epochs": 10,
            "time_cap_minutes": 1.0,
        },
        "config": {"target": "pkg.mod:make`x", "seed": 0, "changes": ["dropout off: *bold*"]},
    }
    text = render_markdown(read(report))
    assert "| tier | pr\\|&lt;img src=x&gt; / a100\\\\n\\#\\# owned (budgets.pr.a100) |" in text
    assert "| target | `pkg.mod:make'x` |" in text
    assert "| changed | dropout off: \\*bold\\* |" in text
    assert "<img" not in text and "\n## owned" not in text


def test_the_changes_are_printed_before_training_and_the_time_says_what_it_counts(
    in_example, tmp_path, capsys
) -> None:
    assert main(["memorize", "--out", str(tmp_path), "--tracker", "none"]) == 0
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    changes = [i for i, line in enumerate(err) if line.startswith("memorize: before training: ")]
    progress = [i for i, line in enumerate(err) if line.startswith("memorize pr/cpu: step ")]
    assert [err[i] for i in changes][:5] == [
        "memorize: before training: dropout off: head.1 (Dropout, p=0.25 -> 0)",
        "memorize: before training: dropout off: head.4 (Dropout, p=0.25 -> 0)",
        "memorize: before training: weight decay off: param group 0 (0.01 -> 0)",
        "memorize: before training: dropout off, confirmed: two train-mode forward passes on "
        "fresh draws agree",
        "memorize: before training: judged against: floor "
        f"{report_floor(tmp_path)} (measured on the batch), input-blind baseline "
        f"{report_blind(tmp_path)}",
    ]
    assert progress and max(changes) < min(progress)  # before the first step, not after
    # the elapsed time says what it counts, beside the verdict's "in N of training"
    assert all(err[i].endswith(" s in, set-up included)") for i in progress), progress
    report = json.loads((tmp_path / "memorization.json").read_text())
    assert (
        f"memorization PASS: loss {report['start_loss']:.4g} -> {report['final_loss']:.4g} at "
        f"step {report['steps']}, {report['relative_loss'] * 100:.3g}% of the input-blind "
        "baseline " in captured.out.splitlines()[0]
    )
    assert captured.out.splitlines()[0].endswith(
        f"(memorised means {report['criterion']}) "
        + training_time(report["wall_time_s"], report["setup_time_s"])
    )
    assert "before training" not in captured.out  # said once, on stderr, before training


def test_a_failing_run_prints_the_same_changes_its_report_records(
    in_example, tmp_path, capsys
) -> None:
    code = main(
        [
            "memorize",
            "--target",
            "digits_example.broken:make_tiny_lr_target",
            "--out",
            str(tmp_path),
            "--tracker",
            "none",
        ]
    )
    assert code == 1
    report = json.loads((tmp_path / "memorization.json").read_text())
    printed = [
        line.removeprefix("memorize: before training: ")
        for line in capsys.readouterr().err.splitlines()
        if line.startswith("memorize: before training: ")
    ]
    assert printed == report["config"]["changes"] + report["measured"]


def test_running_twice_into_one_folder_leaves_one_events_file(in_example, tmp_path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "tensorboard" / "memorize"
    assert main(["memorize", "--out", str(tmp_path), "--quiet"]) == 0
    first = sorted(run_dir.glob("events.out.tfevents.*"))
    assert len(first) == 1
    assert main(["memorize", "--out", str(tmp_path), "--quiet", "--seed", "1"]) in (0, 1)
    second = sorted(run_dir.glob("events.out.tfevents.*"))
    assert len(second) == 1
    assert list(run_dir.rglob("events.out.tfevents.*")) == second  # none in subfolders either
    report = json.loads((tmp_path / "memorization.json").read_text())
    events = EventAccumulator(str(run_dir))
    events.Reload()
    losses = [round(e.value, 4) for e in events.Scalars("memorize/loss")]
    assert losses == [round(v, 4) for v in report["losses"]]  # the second run's curve only


def _seeds(tmp_path: Path, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "seeds"
    args = ["memorize", "--target", "calibrate_targets:broken_on_seed_1", "--out", str(out)]
    code = main([*args, "--quiet", "--budget", "pr", *extra])
    return code, json.loads((out / "memorization.json").read_text())


def test_seeds_pass_only_when_the_quorum_passes(tmp_path, monkeypatch, capsys) -> None:
    """Seed 1 learns nothing: one seed (0) passes, three fail on all, pass on a quorum of 2."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    code, report = _seeds(tmp_path, "--tracker", "none")
    assert (code, report["verdict"], "seeds" in report) == (0, "pass", False)
    code, report = _seeds(tmp_path, "--seeds", "3")  # TensorBoard: a folder per seed
    folders = sorted(p.name for p in (tmp_path / "seeds" / "tensorboard").iterdir())
    assert folders == ["memorize-seed-0", "memorize-seed-1", "memorize-seed-2"]
    assert (code, report["verdict"], report["config"]["seed"]) == (1, "fail", 1)  # seed 1 shown
    assert report["reason"].startswith(
        "2 of 3 seeds passed (quorum 3); seed 1 failed: the loss did not fall from its start"
    )
    seeds = report["seeds"]
    assert (seeds["count"], seeds["quorum"], seeds["passed"]) == (3, 3, 2)
    assert [r["verdict"] for r in seeds["runs"]] == ["pass", "fail", "pass"]
    code, report = _seeds(tmp_path, "--seeds", "3", "--quorum", "2", "--tracker", "none")
    assert (code, report["verdict"]) == (0, "pass")
    assert report["reason"].startswith("2 of 3 seeds passed (quorum 2); seed 1 failed: ")
    err = capsys.readouterr().err
    assert "memorize: seed 1: FAIL: the loss did not fall from its start" in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--seeds", "0"], "error: --seeds must be from 1 to 1000, got 0"),
        (["--seeds", "2", "--quorum", "3"], "error: --quorum must be from 1 to --seeds (2), got 3"),
        (
            ["--seeds", "2", "--nproc", "2"],
            "error: --seeds 2 with 2 processes (DDP) is not supported",
        ),
    ],
)
def test_seeds_and_quorum_out_of_bounds_are_clear_errors(tmp_path, capsys, extra, message) -> None:
    assert (
        main(["memorize", "--target", "calibrate_targets:tiny", "--out", str(tmp_path), *extra])
        == 1
    )
    assert capsys.readouterr().err.startswith(message)


def report_floor(folder) -> str:
    return f"{json.loads((folder / 'memorization.json').read_text())['loss_floor']:.4g}"


def report_blind(folder) -> str:
    return f"{json.loads((folder / 'memorization.json').read_text())['blind_loss']:.4g}"
