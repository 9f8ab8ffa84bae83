"""Script mode: real public training scripts, unchanged, under ``dlci memorize -- python ...``
and ``dlci profile -- python ...`` (docs/script-mode.md).

The scripts are vendored unchanged in tests/data/scripts/ (README.md there: source, commit,
licence) and run by their own argument parsers on tiny synthetic data. A planted bug in each
(a copy of the script with one line changed, outside any step a wrapper would copy: the
loader, the loop) fails the gate; the unchanged script is its control. What script mode
cannot follow gets a located message. The runs through the command line are few (each
imports torch in a child process); the rest run the child's own entry point in this process.
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dlci.errors import DlciError
from dlci.ladder.tiers import TierRequest
from dlci.memorization.request import MemorizeRequest
from dlci.script.command import epoch_arguments, parse_command, raise_hint, split_command

SCRIPTS = Path(__file__).parent / "data" / "scripts"
MAKEMORE = SCRIPTS / "makemore" / "makemore.py"
# minGPT as tests/test_real_code.py vendors it (the same commit, byte for byte): its package
# beside projects/adder/adder.py, which minGPT runs with the repository root on its path
MINGPT = Path(__file__).parent / "data" / "code" / "mingpt"
SHAPES = SCRIPTS / "shapes" / "shapes.py"
DLRM = SCRIPTS / "dlrm" / "dlrm_s_pytorch.py"
# DLRM, small: its own random data generator (no files), 3 embedding tables of 20 rows, a
# batch of 16, MSE on rounded (0/1) click targets
DLRM_ARGS = ["--data-generation=random", "--mini-batch-size=16", "--num-batches=8"]
DLRM_ARGS += ["--nepochs=500", "--arch-sparse-feature-size=4", "--arch-mlp-bot=4-8-4"]
DLRM_ARGS += ["--arch-mlp-top=8-4-1", "--arch-embedding-size=20-20-20", "--loss-function=mse"]
DLRM_ARGS += ["--round-targets=True", "--learning-rate=1.0", "--print-freq=1000"]
ROW = (
    "{max_epochs: 150, max_relative_loss: 0.3, time_cap_minutes: 2, profile_steps: 3, "
    "nproc: 1, batch_size: 16}"
)
# makemore, small: its own parser's options (2 layers of 32, batch 16, no workers)
MAKEMORE_ARGS = ["-n", "0", "--n-layer", "2", "--n-embd", "32", "--n-embd2", "32", "-b", "16"]
MAKEMORE_ARGS += ["-l", "2e-3"]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ladder of 150 epochs (the PR row's goal), names for makemore, a corpus for the word LM."""
    root = tmp_path_factory.mktemp("script-mode")
    lines = ["version: 2", "classes:", "  cpu: {match: [], speed: 0.02}"]
    lines += ["  t4: {match: ['\\bT4\\b'], speed: 1.0}", "budgets:"]
    for budget in ("pr", "merge", "nightly"):
        lines += [f"  {budget}:", f"    cpu: {ROW}", f"    t4: {ROW}"]
    (root / "ladder.yaml").write_text("\n".join(lines) + "\n")
    rng = random.Random(0)
    names = {
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 8)))
        for _ in range(400)
    }
    (root / "names.txt").write_text("\n".join(sorted(names)) + "\n")
    corpus = root / "corpus"
    corpus.mkdir()
    words = [f"w{i}" for i in range(40)]
    for split in ("train", "valid", "test"):
        text = "\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(30))
        (corpus / f"{split}.txt").write_text(text + "\n")
    return root


def _cli(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], Any]:
    """``dlci ARGS`` in a fresh process (one torch thread); the report of its --out, if any."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(cwd)}
    env["PYTHONPATH"] += os.pathsep + os.environ.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "dlci", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = Path(args[args.index("--out") + 1]) if "--out" in args else None
    report = out / "memorization.json" if out else None
    found = json.loads(report.read_text()) if report and report.is_file() else None
    return proc, found


def _memorize(work: Path, out: Path, command: list[str], cwd: Path, *extra: str) -> tuple[Any, Any]:
    args = ["memorize", *extra, "--ladder", str(work / "ladder.yaml"), "--budget", "pr"]
    args += ["--hardware", "cpu", "--tracker", "none", "--out", str(out), "--", *command]
    return _cli(args, cwd)


def _planted(source: Path, folder: Path, old: str, new: str) -> Path:
    """A copy of ``source`` in ``folder`` with the one line ``old`` changed to ``new``."""
    text = source.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {source}"
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / source.name
    copy.write_text(text.replace(old, new))
    return copy


@pytest.fixture(scope="module")
def makemore(work: Path) -> dict[str, Any]:
    """makemore unchanged, through the command line; and in this process a copy whose
    Dataset builds the inputs from the targets before they are filled (every input 0)."""
    names = ["-i", str(work / "names.txt"), "-o", str(work / "makemore-out")]
    args = [*names, "--max-steps", "2000", *MAKEMORE_ARGS]
    bug = _planted(
        MAKEMORE,
        work / "makemore-bug",
        "        x[1:1+len(ix)] = ix\n",
        "        x[1:1+len(ix)] = y[:len(ix)]\n",
    )
    return {
        "control": _memorize(work, work / "mm", ["python", str(MAKEMORE), *args], work),
        "bug": _in_process(work, work / "mm-bug", ["python", str(bug), *args], work),
    }


def test_makemore_unchanged_memorizes_its_first_batch(makemore: dict[str, Any]) -> None:
    proc, report = makemore["control"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["verdict"] == "pass" and report["stopped_by"] == "threshold"
    assert report["script_mode"] is True and report["draws_replayed"] is True
    assert report["config"]["target"].startswith(f"python {MAKEMORE} -i ")  # the command
    assert "weight decay off: param group 0 (0.01 -> 0)" in report["config"]["changes"]
    assert any("makemore.py:" in line and "(16 examples)" in line for line in report["measured"])
    # the script ran its own loop: its own log lines, stopped by dl-ci once memorised
    assert "step 0 | loss" in proc.stdout + proc.stderr
    assert report["steps"] < 150 and report["batch_examples"] == 16
    assert "memorization PASS" in proc.stdout


def test_a_loader_that_zeroes_the_inputs_fails_makemore(makemore: dict[str, Any]) -> None:
    outcome = makemore["bug"]["memorize"]
    report = outcome["report"]
    assert outcome["exit_code"] == 1
    assert report["verdict"] == "fail" and report["case"] in ("slow", "still-falling")
    assert report["relative_loss"] > 0.5  # the control reaches 0.3
    assert "run dlci doctor -- python " in report["next_step"]  # the same command
    assert "dlci doctor --target" not in report["next_step"]


def test_profile_drives_the_schedule_from_the_optimizer_steps(work: Path) -> None:
    out = work / "profile"
    names = ["-i", str(work / "names.txt"), "-o", str(work / "makemore-out")]
    args = ["profile", "--ladder", str(work / "ladder.yaml"), "--budget", "pr"]
    args += ["--hardware", "cpu", "--out", str(out), "--", "python", str(MAKEMORE), *names]
    proc, _ = _cli([*args, "--max-steps", "2000", *MAKEMORE_ARGS], work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    utilization = json.loads((out / "utilization.json").read_text())
    assert (out / "trace.json.gz").is_file() and utilization["steps"]["count"] == 3
    shares = utilization["phases"]["pct"]  # annotated as a Target's steps are
    assert min(shares["forward"], shares["backward"], shares["optimizer"]) > 0
    assert "memory pass was left out (script mode)" in proc.stderr
    assert not (work / "profile" / "memorization.json").exists()


@pytest.fixture(scope="module")
def dlrm(work: Path) -> dict[str, Any]:
    """facebookresearch/dlrm's dlrm_s_pytorch.py unchanged: a recommendation model (embedding
    bags, two MLPs, their feature interaction) on its own random data generator, through a
    DataLoader with its own collate_fn; and a copy whose loss compares the (N, 1) predictions
    with the (N,) targets, which MSE broadcasts to (N, N): each prediction is fitted to every
    target of the batch. Both in this process."""
    folder = work / "dlrm-bug"
    shutil.copytree(SCRIPTS / "dlrm", folder)
    bug = _planted(
        DLRM,
        folder,
        "            return dlrm.loss_fn(Z, T.to(device))\n",
        "            return dlrm.loss_fn(Z, T.to(device).view(-1))\n",
    )
    run = work / "dlrm-run"  # its tensorboard folder goes here
    run.mkdir()
    return {
        "control": _in_process(work, work / "dlrm", ["python", str(DLRM), *DLRM_ARGS], run),
        "bug": _in_process(work, work / "dlrm-bug-out", ["python", str(bug), *DLRM_ARGS], run),
    }


def test_dlrm_unchanged_memorizes_its_first_batch(dlrm: dict[str, Any]) -> None:
    report = dlrm["control"]["memorize"]["report"]
    assert dlrm["control"]["memorize"]["exit_code"] == 0, report["reason"]
    assert report["verdict"] == "pass" and report["stopped_by"] == "threshold"
    assert report["steps"] < 150 and report["batch_examples"] == 16
    assert "dlrm_s_pytorch.py:" in report["measured"][0]


def test_a_loss_that_broadcasts_fails_dlrm(dlrm: dict[str, Any]) -> None:
    """The planted broadcast is in the script's loss_fn_wrap, outside any step a wrapper
    would copy; its best is the targets' variance, about 93% of the start."""
    outcome = dlrm["bug"]["memorize"]
    report = outcome["report"]
    assert outcome["exit_code"] == 1
    assert report["verdict"] == "fail" and report["relative_loss"] > 0.8
    assert report["steps"] == 150  # the control passes long before


def test_dlrm_profile_drives_the_schedule(work: Path) -> None:
    out = work / "dlrm-profile"
    args = ["profile", "--ladder", str(work / "ladder.yaml"), "--budget", "pr"]
    args += ["--hardware", "cpu", "--out", str(out), "--", "python", str(DLRM), *DLRM_ARGS]
    run = work / "dlrm-profile-run"
    run.mkdir()
    proc, _ = _cli(args, run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    utilization = json.loads((out / "utilization.json").read_text())
    assert utilization["steps"]["count"] == 3
    shares = utilization["phases"]["pct"]  # its collate_fn is data loading
    assert min(shares["data_loading"], shares["forward"], shares["backward"]) > 0


@pytest.fixture(scope="module")
def doctor(work: Path) -> dict[str, Any]:
    """The doctor on makemore: unchanged through the command line; in this process a copy
    whose loop never zeroes the gradients (its zero_grad line commented out)."""
    names = ["-i", str(work / "names.txt"), "-o", str(work / "makemore-out")]
    args = [*names, "--max-steps", "2000", *MAKEMORE_ARGS]
    out = work / "doctor"
    cli = ["doctor", "--ladder", str(work / "ladder.yaml"), "--budget", "pr", "--hardware"]
    cli += ["cpu", "--out", str(out), "--", "python", str(MAKEMORE), *args]
    proc, _ = _cli(cli, work)
    report = json.loads((out / "doctor.json").read_text())
    bug = _planted(
        MAKEMORE,
        work / "makemore-no-zero-grad",
        "        model.zero_grad(set_to_none=True)\n",
        "        # model.zero_grad(set_to_none=True)\n",
    )
    found = _in_process(work, work / "unused", ["python", str(bug), *args], work, doctor=True)
    return {"control": (proc, report), "bug": found["doctor"]["report"]}


def test_the_doctor_runs_its_checks_on_the_scripts_own_steps(doctor: dict[str, Any]) -> None:
    from dlci.script.doctor import IN_SCRIPT_MODE

    proc, report = doctor["control"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["script_mode"] is True and report["verdict"] == "pass"
    assert report["target"].startswith(f"python {MAKEMORE} -i ")
    ran = {c["id"]: c for c in report["checks"] if c["status"] != "skip"}
    assert list(ran) == list(IN_SCRIPT_MODE)  # in the ladder's order
    assert {c["status"] for c in ran.values()} == {"pass"}
    assert ran["initial-loss"]["expected"].startswith("about ln 27 = 3.296")  # its vocabulary
    skipped = {c["id"]: c["cause"] for c in report["checks"] if c["status"] == "skip"}
    assert len(skipped) == 13
    assert skipped["reproducibility"] == (
        "needs a Target in script mode: it builds the target twice from its factory and "
        "compares the runs"
    )
    assert "doctor: zero-grad            pass" in proc.stderr
    assert "figures in " in proc.stderr and "\nhtml   " in proc.stdout  # as for a Target
    assert "step 0 | loss" in proc.stdout + proc.stderr  # the script's own loop ran them


def test_a_forgotten_zero_grad_fails_the_doctor(doctor: dict[str, Any]) -> None:
    """The loop's zero_grad commented out: the gradients accumulate across the script's
    own steps, and zero-grad, run on those steps, says so (the control passes it)."""
    checks = {c["id"]: c for c in doctor["bug"]["checks"]}
    assert doctor["bug"]["verdict"] == "fail"
    assert checks["zero-grad"]["status"] == "fail"
    assert checks["zero-grad"]["measured"] == "29 of 29 tensors start with last call's gradient"
    assert [i for i, c in checks.items() if c["status"] == "fail"] == ["zero-grad"]


def test_a_script_that_ends_before_the_checks_steps_fails_them_and_returns(work: Path) -> None:
    """Five epochs are five steps: step 1 and zero-grad's two, grad-flow's, then the script
    ends while weight-norms waits for its third; it and update-ratio say so, the others
    stand, and the child returns (no check left waiting)."""
    words = ["python", str(SHAPES), "--shape", "scaled", "--epochs", "5"]
    report = _in_process(work, work / "unused", words, work, doctor=True)["doctor"]["report"]
    checks = {c["id"]: c for c in report["checks"]}
    ended = (
        "the script ended after 5 optimizer steps, before the step this check asked for (the "
        "checks take about 20 of the script's steps)"
    )
    assert checks["weight-norms"]["measured"] == ended
    assert checks["update-ratio"]["measured"] == ended
    assert checks["weight-norms"]["fix"] == "raise the script's own epoch or step count"
    assert checks["zero-grad"]["status"] == "pass" and checks["grad-flow"]["status"] != "fail"


def test_a_script_that_takes_batches_by_hand_is_told_so_at_its_line(work: Path) -> None:
    """pytorch/examples' word_language_model slices its batches itself (get_batch)."""
    folder = SCRIPTS / "word_language_model"
    command = ["python", str(folder / "main.py"), "--data", str(work / "corpus"), "--epochs", "1"]
    command += ["--emsize", "8", "--nhid", "8", "--nlayers", "1", "--bptt", "5", "--use-optimizer"]
    proc, report = _memorize(work, work / "wlm", command, work, "--device", "cpu")
    assert proc.returncode == 1
    assert "--device cpu is not used in script mode" in proc.stderr
    assert "main.py:" in proc.stderr and "before any torch.utils.data.DataLoader" in proc.stderr
    assert "hint: write a Target for it (docs/target.md)" in proc.stderr
    assert report["verdict"] == "fail" and report["stopped_by"] == "error"
    assert "main.py:" in report["reason"]


def test_nanogpt_get_batch_is_told_so_at_its_backward(work: Path) -> None:
    """karpathy/nanoGPT's train.py, unchanged: batches from np.memmap by its get_batch, the
    loss through a GradScaler; its own configurator reads the --key=value arguments."""
    import numpy as np

    folder = work / "nanogpt"
    shutil.copytree(SCRIPTS / "nanogpt", folder)
    (folder / "data" / "tiny").mkdir(parents=True)
    tokens = np.random.default_rng(0).integers(0, 60, size=6000).astype(np.uint16)
    tokens.tofile(folder / "data" / "tiny" / "train.bin")
    tokens.tofile(folder / "data" / "tiny" / "val.bin")
    words = ["python", "train.py", "--dataset=tiny", "--device=cpu", "--compile=False"]
    words += ["--dtype=float32", "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=8"]
    words += ["--batch_size=4", "--eval_iters=1", "--max_iters=5", f"--out_dir={work / 'ng'}"]
    found = _in_process(work, work / "nanogpt-out", words, folder)
    backward = next(
        i + 1
        for i, line in enumerate((folder / "train.py").read_text().splitlines())
        if "scaler.scale(loss).backward()" in line
    )
    assert found["where"] == f"train.py:{backward}"
    assert "before any torch.utils.data.DataLoader was iterated" in found["error"]


# -- in this process: the child's entry point on real scripts ----------------------------
SCRIPT_PACKAGES = ("mingpt", "pkg", "data", "model", "configurator", "optim", "tricks")
SCRIPT_PACKAGES += ("dlrm_data_pytorch", "data_utils", "data_loader_terabyte", "mlperf_logger")
SCRIPT_PACKAGES += ("extend_distributed",)


class _Saved:
    """sys.argv, sys.path, the working directory and the modules a script imports, put back.

    A package of the scripts' names that another test of the same worker imported first (the
    full suite's tests/test_real_code.py imports its own vendored ``mingpt``) is set aside
    while the script runs, so the script imports the copy in its own folder (a planted one),
    never the cached module; found when the planted minGPT bugs passed in the full run."""

    def __enter__(self) -> _Saved:
        import builtins

        import numpy as np
        import torch

        self.argv, self.path, self.cwd = list(sys.argv), list(sys.path), os.getcwd()
        # DLRM's extend_distributed replaces print at its import; it sets both print options
        self.print, self.options = builtins.print, np.get_printoptions()
        self.torch_options = copy.copy(torch._tensor_str.PRINT_OPTS.__dict__)
        self.aside = {
            name: sys.modules.pop(name)
            for name in list(sys.modules)
            if name.split(".")[0] in SCRIPT_PACKAGES
        }
        self.modules = set(sys.modules)
        return self

    def __exit__(self, *exc: Any) -> None:
        import builtins

        import numpy as np
        import torch

        builtins.print = self.print
        np.set_printoptions(**self.options)
        torch._tensor_str.PRINT_OPTS.__dict__.update(self.torch_options)
        sys.argv[:], sys.path[:] = self.argv, self.path
        os.chdir(self.cwd)
        for name in set(sys.modules) - self.modules:
            if name.split(".")[0] in SCRIPT_PACKAGES:
                del sys.modules[name]
        sys.modules.update(self.aside)


def _in_process(
    work: Path, out: Path, words: list[str], cwd: Path, doctor: bool = False
) -> dict[str, Any]:
    """What the child answers for ``words``, run here (one torch thread): the memorization
    gate's, or the doctor's (its report not written: returned)."""
    import torch

    from dlci.checks.doctor import DoctorRequest
    from dlci.script.child import run_plan
    from dlci.script.plan import encode
    from dlci.script.run import doctor_plan, memorize_plan

    asked = TierRequest(budget="pr", hardware="cpu", ladder=str(work / "ladder.yaml"))
    tier = asked.choose()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with _Saved():
        os.chdir(cwd)
        sys.path.insert(1, str(cwd))  # as PYTHONPATH=. (minGPT's package); [0] is the script's
        command = parse_command(words)  # from the working folder, as the command line does
        if doctor:
            request = DoctorRequest(tier=asked, out=str(out), json="-")
            plan = doctor_plan(request, command, tier)
        else:
            asked_for = MemorizeRequest(out=str(out), tracker="none", quiet=True)
            plan = memorize_plan(asked_for, command, tier)
        try:
            return json.loads(encode(run_plan(plan)))  # the answer as the parent reads it
        finally:
            torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def mingpt(work: Path) -> dict[str, Any]:
    """minGPT's adder (its own Trainer, CfgNode arguments, dropout, weight decay groups,
    gradient clipping); a copy whose Trainer zeroes the gradients after backward(), and one
    whose model takes the cross-entropy of its probabilities (softmax twice)."""
    args = ["adder.py", f"--system.work_dir='{work / 'adder'}'"]
    args += ["--data.ndigit=1", "--trainer.num_workers=0", "--trainer.batch_size=16"]
    control = _in_process(work, work / "adder-out", ["python", *args], MINGPT)
    bug = work / "mingpt-bug"
    shutil.copytree(MINGPT, bug)
    _planted(
        MINGPT / "mingpt" / "trainer.py",
        bug / "mingpt",
        "            model.zero_grad(set_to_none=True)\n            self.loss.backward()\n",
        "            self.loss.backward()\n            model.zero_grad(set_to_none=True)\n",
    )
    loss_bug = work / "mingpt-loss-bug"
    shutil.copytree(MINGPT, loss_bug)
    _planted(
        MINGPT / "mingpt" / "model.py",
        loss_bug / "mingpt",
        "F.cross_entropy(logits.view(-1, logits.size(-1)),",
        "F.cross_entropy(F.softmax(logits, dim=-1).view(-1, logits.size(-1)),",
    )
    return {
        "control": control,
        "bug": _in_process(work, work / "bug-out", ["python", *args], bug),
        "loss-bug": _in_process(work, work / "loss-bug-out", ["python", *args], loss_bug),
    }


def test_mingpt_adder_unchanged_memorizes(mingpt: dict[str, Any]) -> None:
    report = mingpt["control"]["memorize"]["report"]
    assert mingpt["control"]["memorize"]["exit_code"] == 0, report["reason"]
    assert report["verdict"] == "pass"
    changes = report["config"]["changes"]
    assert "dropout off: transformer.drop (Dropout, p=0.1 -> 0)" in changes
    assert "weight decay off: param group 0 (0.1 -> 0)" in changes
    assert any("mingpt/trainer.py:" in line for line in report["measured"])


def test_zero_grad_after_backward_in_the_loop_fails_mingpt(mingpt: dict[str, Any]) -> None:
    report = mingpt["bug"]["memorize"]["report"]
    assert mingpt["bug"]["memorize"]["exit_code"] == 1
    assert (report["verdict"], report["case"], report["stopped_by"]) == ("fail", "flat", "flat")
    assert report["steps"] == 26  # the engine's flat stop, on the script's own steps


def test_a_loss_on_probabilities_fails_mingpt(mingpt: dict[str, Any]) -> None:
    """The cross-entropy of softmax outputs treated as logits cannot fall far: the loss
    planted in the model's own forward, outside any step a wrapper would copy."""
    report = mingpt["loss-bug"]["memorize"]["report"]
    assert mingpt["loss-bug"]["memorize"]["exit_code"] == 1
    assert report["verdict"] == "fail" and report["relative_loss"] > 0.5


def test_a_script_that_ends_first_is_told_which_argument_to_raise(work: Path) -> None:
    names = ["-i", str(work / "names.txt"), "-o", str(work / "makemore-out")]
    words = ["python", str(MAKEMORE), *names, "--max-steps", "12", *MAKEMORE_ARGS]
    found = _in_process(work, work / "ended", words, work)
    report = found["memorize"]["report"]
    assert report["verdict"] == "fail" and report["stopped_by"] == "ended"
    assert report["steps"] == 12 and "the script ended after 12 steps" in report["reason"]
    assert report["next_step"].startswith(
        "the script ended by its own count: raise --max-steps (now 12) to at least 150"
    )


def test_a_grad_scaler_loss_is_read_unscaled(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = _in_process(work, work / "scaled", ["python", str(SHAPES), "--epochs", "100"], work)
    report = found["memorize"]["report"]
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("loss ")]
    assert report["verdict"] == "pass"
    # the script's own first loss (scaled by 1024 before its backward) is the start
    assert report["start_loss"] == pytest.approx(float(printed[0].split()[1]), abs=1e-5)
    # one memorised batch per epoch, one step each; a step is judged when the next one
    # steps (the same optimizer's?), so the next forward ran, and its update did not
    assert len(printed) == report["steps"] + 1


def test_a_loss_per_example_backward_with_its_gradient_is_read(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``losses.backward(weights)``: the objective is sum(losses * weights), here the mean."""
    words = ["python", str(SHAPES), "--shape", "per-example", "--epochs", "100"]
    report = _in_process(work, work / "per-example", words, work)["memorize"]["report"]
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("loss ")]
    assert report["verdict"] == "pass"
    assert report["start_loss"] == pytest.approx(float(printed[0].split()[1]), abs=1e-5)


def test_accelerate_backward_is_read(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = pytest.importorskip("accelerate.state")
    words = ["python", str(SHAPES), "--shape", "accelerate", "--epochs", "100"]
    try:
        report = _in_process(work, work / "accelerate", words, work)["memorize"]["report"]
    finally:
        state.AcceleratorState._reset_state(reset_partial_state=True)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("loss ")]
    assert report["verdict"] == "pass"
    assert report["start_loss"] == pytest.approx(float(printed[0].split()[1]), abs=1e-5)


@pytest.mark.parametrize(
    ("shape", "line", "says"),
    [
        ("two-optimizers", "(-critic(model(x)).mean()).backward()", "a second optimizer (Adam)"),
        ("no-backward", "parameter.grad = grad", "with no backward() since the last step"),
        ("ddp", "dist.init_process_group(", "starts a torch.distributed process group"),
    ],
)
def test_what_script_mode_cannot_follow_is_located(
    work: Path, shape: str, line: str, says: str
) -> None:
    """Located at the script's own line: the step after the line named, or the call."""
    words = ["python", str(SHAPES), "--shape", shape, "--epochs", "2"]
    found = _in_process(work, work / shape, words, work)
    assert says in found["error"]
    at = _line_of(line) + (0 if shape == "ddp" else 1)
    assert found["where"].endswith(f"shapes.py:{at}")
    assert "docs/target.md" in found["hint"]
    partial = json.loads((work / shape / "memorization.json").read_text())
    assert partial["verdict"] == "fail" and partial["stopped_by"] == "error"


def test_an_epoch_schedule_is_named_in_a_failure(work: Path) -> None:
    """StepLR halving the rate every epoch, and an epoch is one memorised batch: the failure
    says so (the control: the same loop without it passes, test_a_grad_scaler_...)."""
    words = ["python", str(SHAPES), "--shape", "scheduled", "--epochs", "200"]
    report = _in_process(work, work / "scheduled", words, work)["memorize"]["report"]
    assert report["verdict"] == "fail"
    assert report["next_step"].startswith("the script's learning-rate schedule stepped: StepLR (")
    assert any(
        line.startswith("the script's learning-rate schedule") for line in report["measured"]
    )


def test_a_validation_pass_before_training_is_not_memorised(work: Path) -> None:
    """The batch of step 1 is memorised, not the first batch of the first loader iterated
    (here a validation loader, before training); the training loader shuffles, so
    memorising another loader's batch would train on a new batch every epoch."""
    words = ["python", str(SHAPES), "--shape", "eval-first", "--epochs", "200"]
    report = _in_process(work, work / "eval-first", words, work)["memorize"]["report"]
    assert report["verdict"] == "pass", report["reason"]
    at = _line_of("loss_fn(model(x), y).backward()", start="eval-first") - 2  # its for loop
    assert f"from the DataLoader iterated at {SHAPES}:{at} (16 examples)" in report["measured"][0]


def test_a_module_runs_as_python_m_runs_it(work: Path) -> None:
    """``-- python -m pkg.train``: the module found from the working folder, its own name
    ``__main__``, its arguments after it."""
    package = work / "modules" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    shutil.copy(SHAPES, package / "train.py")
    words = ["python", "-m", "pkg.train", "--shape", "scaled", "--epochs", "100"]
    report = _in_process(work, work / "module", words, work / "modules")["memorize"]["report"]
    assert report["verdict"] == "pass"
    assert report["config"]["target"] == " ".join(words)


def test_under_a_launcher_the_child_refuses(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``torchrun ... dlci memorize -- python train.py``: every child sees WORLD_SIZE."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    words = ["python", str(SHAPES), "--epochs", "2"]
    found = _in_process(work, work / "launched", words, work)
    assert "runs under a distributed launcher (WORLD_SIZE > 1)" in found["error"]


def test_shapes_control_passes(work: Path) -> None:
    """The control of the refusals: the same script's plain shape is followed."""
    words = ["python", str(SHAPES), "--shape", "scaled", "--epochs", "100"]
    assert "error" not in _in_process(work, work / "control", words, work)


def _line_of(text: str, start: str = "") -> int:
    """The number of the first line of shapes.py holding ``text`` (after ``start``)."""
    lines = SHAPES.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if start in line)
    return next(i for i, line in enumerate(lines) if i >= first and text in line) + 1


def test_functional_dropout_runs_at_zero_inside_only() -> None:
    import torch
    import torch.nn.functional as F

    from dlci.script.dropout import functional_dropout_off

    x = torch.ones(1, 2, 4, 8)
    with functional_dropout_off() as caught:
        assert torch.equal(F.dropout(x, 0.5, True), x)
        assert torch.equal(torch.dropout(x, p=0.5, train=True), x)
        plain = F.scaled_dot_product_attention(x, x, x)
        assert torch.equal(F.scaled_dot_product_attention(x, x, x, None, 0.9), plain)
        assert torch.equal(F.dropout(x, 0.0, True), x)  # a rate of 0 is not caught
    assert caught == [
        "torch.nn.functional.dropout",
        "torch.dropout",
        "torch.nn.functional.scaled_dot_product_attention",
    ]
    torch.manual_seed(0)
    assert not torch.equal(F.dropout(x, 0.5, True), x)  # the control: outside, it drops


def test_a_wrapper_sharing_its_optimizers_state_is_one_optimizer() -> None:
    """Lightning's LightningAdam shares its Adam's __dict__: one optimizer, the torch class;
    the control: a second Adam of its own is another."""
    import torch

    from dlci.script.hooks import find_optimizers

    weight = torch.nn.Parameter(torch.ones(2))
    adam = torch.optim.Adam([weight])
    lightning_adam = type("LightningAdam", (torch.optim.Adam,), {})
    wrapper = lightning_adam.__new__(lightning_adam)
    wrapper.__dict__ = adam.__dict__
    mine = [o for o in find_optimizers() if o.param_groups[0]["params"][0] is weight]
    assert mine == [adam]
    other = torch.optim.Adam([weight])
    mine = [o for o in find_optimizers() if o.param_groups[0]["params"][0] is weight]
    assert sorted(map(id, mine)) == sorted([id(adam), id(other)])


# -- the command after -- ------------------------------------------------------------------
def test_the_command_after_the_dashes(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    assert split_command(["--budget", "pr"]) == (["--budget", "pr"], [])
    command = parse_command(["python3", "-u", "-W", "ignore", str(script), "--epochs", "3"])
    assert (command.flags, command.module, command.args) == (("-u", "-W", "ignore"), False,
                                                              ("--epochs", "3"))  # fmt: skip
    assert parse_command(["python", "-m", "pkg.train", "--x"]).module is True
    for words, says in (
        (["torchrun", "--nproc-per-node", "2", "train.py"], "distributed launcher"),
        (["python", "-m", "torch.distributed.run", "train.py"], "distributed launcher"),
        (["./train.py"], "not a Python interpreter"),
        (["python", "-c", "pass"], "a script file or a module"),
        (["python", str(tmp_path / "missing.py")], "no such script"),
        ([], "nothing follows --"),
    ):
        with pytest.raises(DlciError, match=says):
            parse_command(words)
    assert epoch_arguments(["--niter", "5", "--lr", "3"], []) == ["--niter 5"]
    assert "no argument of its command line" in raise_hint([], 150)


def test_torchrun_is_refused_before_anything_runs(work: Path) -> None:
    from dlci.cli import main

    args = ["memorize", "--out", str(work / "torchrun"), "--", "torchrun", "train.py"]
    assert main(args) == 1
    assert not (work / "torchrun" / "memorization.json").exists()


EVAL_FAILS = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 4)

    def forward(self, x):
        if not self.training:
            raise RuntimeError("this model has no eval mode")
        return self.layer(x)

model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(32, 8), torch.randint(0, 4, (32,))), batch_size=16)
for epoch in range(50):
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
"""


def test_a_doctor_that_cannot_start_on_the_scripts_objects_says_why(work: Path) -> None:
    """The model's own forward fails in eval mode, where the doctor first calls it (the
    class count): a located error with its reason, no report of checks that never ran."""
    script = work / "eval_fails.py"
    script.write_text(EVAL_FAILS)
    found = _in_process(work, work / "unused", ["python", str(script)], work, doctor=True)
    assert found["error"] == (
        "the doctor could not start on the script's model and batch: RuntimeError: this "
        "model has no eval mode"
    )
    assert found["where"] == str(script) and "docs/target.md" in found["hint"]


def test_the_doctor_refuses_a_target_with_a_script(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dlci.cli import main

    args = ["doctor", "--target", "pkg.train:target", "--out", str(work / "both")]
    assert main([*args, "--", "python", str(SHAPES)]) == 1
    assert capsys.readouterr().err == (
        "error: --target and --device are not used in script mode: the script builds and "
        "places its model\n  hint: leave them out, or drop the command after --\n"
    )
    assert not (work / "both" / "doctor.json").exists()


def test_the_scripts_are_vendored_with_their_source() -> None:
    readme = (SCRIPTS / "README.md").read_text()
    for folder in ("makemore", "nanogpt", "word_language_model", "dlrm"):
        assert (SCRIPTS / folder / "LICENSE").is_file()
        assert f"`{folder}/" in readme
    assert (MINGPT / "LICENSE").is_file() and "tests/data/code/mingpt" in readme  # shared
    assert "`mingpt/" in (MINGPT.parent / "README.md").read_text()


@pytest.fixture(autouse=True)
def _no_leftover_hooks() -> Iterator[None]:
    """Every test leaves torch as it found it: no DataLoader or backward hook stays."""
    import torch
    from torch.utils.data import DataLoader

    before = (DataLoader.__iter__, torch.autograd.backward)
    yield
    assert (DataLoader.__iter__, torch.autograd.backward) == before
