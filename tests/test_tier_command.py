"""``dlci tier`` and ``dlci hardware`` as a CI step: outputs, JSON files, environment defaults."""

from __future__ import annotations

import json

from dlci.cli import main


def read_outputs(path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def test_tier_appends_its_fields_to_github_output(monkeypatch, tmp_path, capsys) -> None:
    out = tmp_path / "github_output"
    out.write_text("earlier=kept\n")
    monkeypatch.setenv("GITHUB_OUTPUT", str(out))
    monkeypatch.setenv("GITHUB_EVENT_NAME", "schedule")
    assert main(["tier", "--hardware", "a100"]) == 0
    outputs = read_outputs(out)
    assert outputs["earlier"] == "kept"
    keys = ("budget", "hardware-class", "max-epochs", "max-loss", "max-relative-loss")
    assert {k: outputs[k] for k in keys} == {
        "budget": "nightly",
        "hardware-class": "a100",
        "max-epochs": "3000",
        "max-loss": "",
        "max-relative-loss": "0.02",
    }
    assert outputs["criterion"] == "loss at or below 2% of its start"
    assert (outputs["time-cap-minutes"], outputs["nproc"], outputs["batch-size"]) == (
        "10.0",
        "1",
        "16",
    )
    assert json.loads(outputs["tier-json"])["row"] == "budgets.nightly.a100"
    assert "tier nightly / a100" in capsys.readouterr().out


def test_tier_json_goes_to_a_file(tmp_path, capsys) -> None:
    target = tmp_path / "out" / "tier.json"
    assert (
        main(["tier", "--budget", "merge", "--hardware", "NVIDIA L4", "--json", str(target)]) == 0
    )
    data = json.loads(target.read_text())
    assert data == {
        "schema_version": 1,
        "budget": "merge",
        "hardware_class": "l4",
        "max_epochs": 1500,
        "max_loss": None,
        "max_relative_loss": 0.07,
        "time_cap_minutes": 8.0,
        "profile_steps": 10,
        "nproc": 1,
        "batch_size": 16,
        "ladder": "default",
        "ladder_version": 2,
        "ladder_revision": "2026.12.2",
        "criterion": "loss at or below 7% of its start",
        "row": "budgets.merge.l4",
        "reasons": ["budget merge: given", "hardware 'NVIDIA L4': matches class l4"],
        "warnings": [],
    }
    assert capsys.readouterr().out == f"tier merge/l4 written to {target}\n"


def test_tier_reads_its_defaults_from_the_environment(monkeypatch, capsys) -> None:
    monkeypatch.setenv("DLCI_BUDGET", "nightly")
    monkeypatch.setenv("DLCI_HARDWARE", "h100")
    assert main(["tier", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["budget"], data["hardware_class"], data["max_relative_loss"]) == (
        "nightly",
        "h100",
        0.02,
    )


def test_tier_auto_on_this_machine_selects_the_cpu_row(monkeypatch, capsys) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request")
    assert main(["tier", "--json", "--timeout", "5"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["budget"], data["hardware_class"], data["row"]) == ("pr", "cpu", "budgets.pr.cpu")
    assert data["reasons"][0] == "budget auto: GITHUB_EVENT_NAME=pull_request selects pr"
    assert data["reasons"][1] == "hardware auto: cpu, no GPU found"
    assert data["reasons"][2].startswith("probe nvml: ")


def test_an_unknown_hardware_class_is_refused_with_a_suggestion(capsys) -> None:
    assert main(["tier", "--hardware", "a1000"]) == 1
    assert capsys.readouterr().err == (
        "error: --hardware: unknown hardware class 'a1000'\n"
        "  hint: did you mean 'a100'? classes in this ladder: cpu, t4, l4, a10, v100, rtx, a100, "
        "h100, h200, b200, mi250, mi300; or pass auto, or a GPU name that the ladder's patterns "
        "match\n"
    )


def test_a_non_positive_timeout_is_refused(capsys) -> None:
    assert main(["hardware", "--timeout", "0"]) == 1
    assert "--timeout must be a positive number of seconds, got 0" in capsys.readouterr().err


def test_validate_reports_each_file(write_ladder, small_ladder_text, capsys) -> None:
    good = write_ladder(small_ladder_text, "good.yaml")
    bad = write_ladder(small_ladder_text.replace("speed: 1.0", "speed: 0"), "bad.yaml")
    assert main(["tier", "--validate", str(good), str(bad)]) == 1
    captured = capsys.readouterr()
    assert captured.out == f"{good}: ok (version 1, 2 classes, budgets pr, merge, nightly)\n"
    assert captured.err == (
        f"error: {bad}:4: classes.t4.speed: must be greater than 0, got 0\n"
        "  hint: use a positive number, such as 4.0 for an A100\n"
    )


def test_hardware_prints_a_table_and_writes_outputs(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = tmp_path / "github_output"
    monkeypatch.setenv("GITHUB_OUTPUT", str(out))
    assert main(["hardware", "--timeout", "5"]) == 0
    assert read_outputs(out) == {"hardware-class": "cpu", "gpu-count": "0", "gpu-name": ""}
    text = capsys.readouterr().out
    assert text.startswith("hardware class: cpu")
    assert "CPU: " in text and " cores" in text


def test_hardware_json_to_a_file(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    target = tmp_path / "hw.json"
    assert main(["hardware", "--json", str(target), "--probes", "nvml,nvidia-smi"]) == 0
    data = json.loads(target.read_text())
    assert (data["hardware_class"], data["gpu_count"], data["source"]) == ("cpu", 0, "none")
    assert data["probes"][-1] == "torch: not tried"


# --------------------------------------------------------------------------- the console a CI log shows

LONG_NAME = "NVIDIA H100 80GB HBM3 Engineering Sample with a Very Long Marketing Name"
GPU_PROBES = ("nvml: 1 GPU(s)", "nvidia-smi: not tried", "torch: not tried")
NO_GPU_PROBES = (
    "nvml: NVML Shared Library Not Found on this runner (a long reason, kept on one line)",
    "nvidia-smi: nvidia-smi is not installed",
    "torch: not tried",
)


def fake_machine(monkeypatch, *, gpu: bool) -> None:
    """Detection answers at once, as on a GPU runner (or a runner without one); a 40-column log."""
    from dlci import hardware
    from dlci.hardware import GpuInfo, HardwareInfo

    gpus = (GpuInfo(0, LONG_NAME, 81559, "9.0", "GPU-0123"),) if gpu else ()
    info = HardwareInfo(
        gpus=gpus,
        source="nvml" if gpu else "none",
        driver_version="570.86.15" if gpu else None,
        cuda_version="12.8" if gpu else None,
        cpu_count=8,
        cpu_model="AMD EPYC 7R13 Processor",
        memory_mib=65536,
        probes=GPU_PROBES if gpu else NO_GPU_PROBES,
    )
    monkeypatch.setattr(hardware, "detect", lambda **_: info)
    monkeypatch.setenv("COLUMNS", "40")


def test_hardware_on_a_narrow_log_keeps_each_line_whole(monkeypatch, capsys) -> None:
    fake_machine(monkeypatch, gpu=True)
    assert main(["hardware"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"hardware class: h100 (GPU 0 '{LONG_NAME}' (via nvml))"
    assert sum(LONG_NAME in line for line in lines) == 2  # the class line and the table row
    assert any(LONG_NAME in line and "79.6 GiB" in line and "9.0" in line for line in lines)
    assert "driver 570.86.15, CUDA 12.8, found through nvml" in lines
    assert "CPU: 8 cores, AMD EPYC 7R13 Processor, 64.0 GiB" in lines
    for note in GPU_PROBES:
        assert lines.count(f"  probe {note}") == 1
        assert out.count(note) == 1


def test_hardware_without_a_gpu_says_each_probe_once(monkeypatch, capsys) -> None:
    fake_machine(monkeypatch, gpu=False)
    assert main(["hardware"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "hardware class: cpu (no GPU found)"
    for note in NO_GPU_PROBES:
        assert out.splitlines().count(f"  probe {note}") == 1
        assert out.count(note) == 1
    assert main(["hardware", "--json"]) == 0
    text = capsys.readouterr().out
    data = json.loads(text)
    assert (data["class_reason"], data["probes"]) == ("no GPU found", list(NO_GPU_PROBES))
    for note in NO_GPU_PROBES:
        assert text.count(note) == 1


def test_tier_on_a_narrow_log_keeps_each_reason_whole_and_says_each_probe_once(
    monkeypatch, capsys
) -> None:
    fake_machine(monkeypatch, gpu=False)
    monkeypatch.delenv("GITHUB_EVENT_NAME", raising=False)
    assert main(["tier"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "tier pr / cpu" in lines[0]
    assert any("default (version 2, revision 2026.12.2)" in line for line in lines)
    assert "  budget auto: not a GitHub event; pr is the default" in lines
    assert "  hardware auto: cpu, no GPU found" in lines
    for note in NO_GPU_PROBES:
        assert lines.count(f"  probe {note}") == 1
        assert out.count(note) == 1
    assert main(["tier", "--json"]) == 0
    text = capsys.readouterr().out
    for note in NO_GPU_PROBES:
        assert text.count(note) == 1


def test_a_long_gpu_name_in_a_tier_reason_stays_on_one_line(monkeypatch, capsys) -> None:
    fake_machine(monkeypatch, gpu=True)
    assert main(["tier", "--budget", "pr"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"  hardware auto: h100, GPU 0 '{LONG_NAME}' (via nvml)" in lines


def test_an_unknown_budget_is_refused_before_the_gpus_are_probed(monkeypatch, capsys) -> None:
    from dlci import hardware

    def no_probe(**_: object) -> None:
        raise AssertionError("detect ran")

    monkeypatch.setattr(hardware, "detect", no_probe)
    assert main(["tier", "--budget", "nosuch"]) == 1
    assert capsys.readouterr().err == (
        "error: ladder 'default': unknown budget 'nosuch'; choose from pr, merge, nightly\n"
        "  hint: or pass auto, which follows GITHUB_EVENT_NAME\n"
    )
    # the control case: a known budget does probe, so the patch above is in the path
    assert main(["tier", "--budget", "pr"]) == 3
    assert "AssertionError: detect ran" in capsys.readouterr().err
