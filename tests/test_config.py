"""dlci.config: one precedence rule for every key, located errors, the snapshot, the verb."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from pathlib import Path

import jsonschema
import pytest

from dlci import jsonio
from dlci.checks import CHECK_IDS
from dlci.cli import main
from dlci.config import Config, resolve
from dlci.config.keys import KEYS, SCHEMA_FILE, json_schema, key_table, render_schema
from dlci.config.source import CONFIG_LIMIT, key_lines
from dlci.errors import DlciError
from dlci.ladder.tiers import choose_tier
from dlci.policy import THRESHOLDS
from dlci.training.target import target_from_pyproject

ROOT = Path(__file__).resolve().parents[1]
pytest_plugins = ["pytester"]


def project(tmp_path: Path, body: str, name: str = "pyproject.toml") -> Path:
    """A project folder whose configuration file holds ``body`` (under [tool.dlci] in a
    pyproject.toml)."""
    head = '[project]\nname = "p"\n\n[tool.dlci]\n' if name == "pyproject.toml" else ""
    (tmp_path / name).write_text(head + body, encoding="utf-8")
    return tmp_path


def error(tmp_path: Path, body: str, env: dict[str, str] | None = None) -> DlciError:
    with pytest.raises(DlciError) as info:
        resolve(cwd=project(tmp_path, body), env=env or {})
    return info.value


# --------------------------------------------------------------------------- precedence

# one value per layer, for every key: command line, action input, environment, file
SAMPLES = {
    "target": ("a.cli:f", "a.input:f", "a.env:f", "a.file:f"),
    "ladder": ("cli.yaml", "input.yaml", "env.yaml", "file.yaml"),
    "tests": ("cli", "input", "env", "file"),
    "pytest-args": ("-x", "-q", "-v", "-s"),
    "min-gpu-util": ("1", "2", "3", "4"),
    "max-gpu-memory": ("11", "12", "13", "14"),
    "max-utilization-drop": ("21", "22", "23", "24"),
    "max-step-time-regression": ("31", "32", "33", "34"),
}


def test_every_key_has_samples() -> None:
    assert set(SAMPLES) == set(KEYS)


@pytest.mark.parametrize("name", list(KEYS))
def test_each_layer_beats_the_one_below_for_every_key(tmp_path: Path, name: str) -> None:
    key = KEYS[name]
    cli, given, env, in_file = SAMPLES[name]
    text = in_file if key.kind != "number" else None
    project(tmp_path, f"{name} = {json.dumps(text) if text else in_file}\n")
    expected = [("command line", cli), ("action input", given), ("environment", env)]
    expected += [("pyproject.toml:5", in_file)]
    for top, (where, value) in enumerate(expected):  # each layer, the ones above it left out
        variables = {key.input_env: given} if top <= 1 else {}
        variables.update({key.env: env} if top <= 2 else {})
        config = resolve({name: cli} if top == 0 else None, cwd=tmp_path, env=variables)
        assert config.source(name).endswith(where), (name, top)
        joined = os.path.join(str(tmp_path), value)  # a file's ladder: from the file's folder
        want = joined if (name, top) == ("ladder", 3) else key.from_text(value)
        assert config.get(name) == want, (name, top)
    (tmp_path / "pyproject.toml").unlink()  # the control: nothing set, the default
    config = resolve(cwd=tmp_path, env={})
    assert (config.get(name), config.source(name)) == (None, "default")


def test_an_empty_action_input_is_not_given(tmp_path: Path) -> None:
    config = resolve(cwd=tmp_path, env={"DLCI_INPUT_MIN_GPU_UTIL": "", "DLCI_MIN_GPU_UTIL": "7"})
    assert (config.get("min-gpu-util"), config.source("min-gpu-util")) == (7.0, "environment")


def test_dlci_toml_is_read_and_both_files_are_an_error(tmp_path: Path) -> None:
    project(tmp_path, "min-gpu-util = 40\n", name="dlci.toml")
    config = resolve(cwd=tmp_path, env={})
    assert config.source("min-gpu-util") == f"{tmp_path}{os.sep}dlci.toml:1"
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "p"\n')  # no [tool.dlci]: fine
    assert resolve(cwd=tmp_path, env={}).get("min-gpu-util") == 40.0
    project(tmp_path, "target = 'a:b'\n")
    with pytest.raises(DlciError, match=r"both .*dlci\.toml and .*pyproject\.toml"):
        resolve(cwd=tmp_path, env={})


def test_a_relative_ladder_is_relative_to_the_configuration_file(tmp_path: Path) -> None:
    project(tmp_path, "ladder = 'ci/ladder.yaml'\n")
    assert resolve(cwd=tmp_path, env={}).get("ladder") == os.path.join(
        str(tmp_path), "ci/ladder.yaml"
    )
    assert resolve(cwd=tmp_path, env={"DLCI_LADDER": "x.yaml"}).get("ladder") == "x.yaml"


def test_lists_take_a_text_or_a_list(tmp_path: Path) -> None:
    project(tmp_path, "tests = 'tests/a b'\npytest-args = \"-k 'not slow' -x\"\n")
    config = resolve(cwd=tmp_path, env={"DLCI_INPUT_TESTS": ""})
    assert config.get("tests") == ["tests/a b"]  # in the file, a text is one path
    assert config.get("pytest-args") == ["-k", "not slow", "-x"]
    config = resolve(cwd=tmp_path, env={"DLCI_INPUT_TESTS": "tests/u 'tests/a b'"})
    assert config.get("tests") == ["tests/u", "tests/a b"]  # an input is shell-quoted


# --------------------------------------------------------------------------- located errors


@pytest.mark.parametrize(
    ("body", "line", "words", "hint"),
    [
        ("min_gpu_util = 40\n", 5, "min_gpu_util: unknown key", "did you mean 'min-gpu-util'"),
        ("min-gpu-utl = 40\n", 5, "min-gpu-utl: unknown key", "did you mean 'min-gpu-util'"),
        ("\nmin-gpu-util = 'forty'\n", 6, "expected a number from 0 to 100", "percentage"),
        ("min-gpu-util = 140\n", 5, "must be from 0 to 100, got 140", "percentage"),
        ("max-utilization-drop = -1\n", 5, "must be 0 or more", "points"),
        ("min-gpu-util = nan\n", 5, "must be from 0 to 100", "percentage"),
        ("target = 3\n", 5, "target: expected a text, got 3", "package.module:function"),
        ("tests = [1]\n", 5, "expected a list of paths", "tests = ['tests']"),
        (
            "[tool.dlci.doctor.checks.shuffle]\nwaive = 'skip'\n",
            6,
            "a waiver needs a reason",
            "why",
        ),
        (
            "[tool.dlci.doctor.checks.shuffle]\nwaive = 'skip'\nreason = '  '\n",
            7,
            "a waiver needs a reason",
            "why",
        ),
        (
            "[tool.dlci.doctor.checks.shuffle]\nwaive = 'off'\n",
            6,
            "must be 'skip' or 'warn-only'",
            None,
        ),
        (
            "[tool.dlci.doctor.checks.shuffle]\nreason = 'x'\n",
            6,
            "reason: given without waive",
            None,
        ),
        (
            "[tool.dlci.doctor.checks.shufle]\nwaive = 'skip'\n",
            5,
            "shufle: unknown check",
            "did you mean 'shuffle'",
        ),
        (
            "[tool.dlci.doctor.checks.shuffle]\nwaive = 'skip'\nreason = 'r'\nuntil = 'next year'\n",
            8,
            "until: must be a date",
            "2027-01-31",
        ),
        (
            "[tool.dlci.doctor.checks.shuffle]\nwaive = 'skip'\nreason = 'r'\nuntil = 2027-01-31T10:00:00\n",
            8,
            "until: must be a date",
            "2027-01-31",
        ),
        ("[tool.dlci.doctor.checks.shuffle]\nnot-a-threshold = 1\n", 6, "unknown key", "fail-mix"),
        (
            "[tool.dlci.doctor.checks.shuffle]\nfail-mix = 7\n",
            6,
            "shuffle.fail-mix: must be at most 1, got 7",
            "(default 0.5)",
        ),
        ("[tool.dlci.doctor]\nwaive = 1\n", 6, "doctor.waive: unknown key", None),
        ("doctor.checks.shuffle.waive = 'skip'\n", 5, "a waiver needs a reason", None),
        (
            "x = 1\n[tool.dlci.doctor]\nchecks = { grad-flow = { waive = 'warn-only' } }\n",
            5,
            "x: unknown key",
            None,
        ),
        (
            "\n\ndoctor = { checks = { grad-flow = { waive = 'warn-only' } } }\n",
            7,
            "a waiver needs a reason",
            None,
        ),
        ("target = 'a:b\n", 5, "malformed TOML: ", "quoting"),
    ],
)
def test_every_mistake_is_one_located_error(
    tmp_path: Path, body: str, line: int, words: str, hint: str | None
) -> None:
    if "fail-mix" in body or "not-a-threshold" in body:
        assert "shuffle.fail-mix" in {t.name for t in THRESHOLDS}
    exc = error(tmp_path, body)
    assert exc.file == f"{tmp_path}{os.sep}pyproject.toml"
    assert exc.line == line, str(exc)
    assert words in exc.message
    if hint:
        assert hint in (exc.hint or ""), exc.hint


def test_every_mistake_of_a_file_is_reported_at_once_each_located(tmp_path: Path) -> None:
    body = (
        "min-gpu-util = 140\n"  # line 5
        "target = 3\n"
        "min_gpu_memory = 1\n"
        "[tool.dlci.doctor.checks.shuffle]\n"
        "waive = 'off'\n"  # line 9
        "reason = 'ordered on purpose'\n"
        "fail-mix = 7\n"
        "[tool.dlci.doctor.checks.shufle]\n"  # line 12
    )
    exc = error(tmp_path, body)
    file = f"{tmp_path}{os.sep}pyproject.toml"
    assert str(exc) == "\n".join(
        [
            f"{file}:5: min-gpu-util: must be from 0 to 100, got 140 (an integer)",
            "  hint: write a percentage such as min-gpu-util = 40",
            f"{file}:6: target: expected a text, got 3 (an integer)",
            "  hint: write target = 'package.module:function'",
            f"{file}:7: min_gpu_memory: unknown key",
            "  hint: did you mean 'max-gpu-memory'? keys: target, ladder, tests, "
            "pytest-args, min-gpu-util, max-gpu-memory, max-utilization-drop, "
            "max-step-time-regression, doctor (see docs/configuration.md)",
            f"{file}:9: doctor.checks.shuffle.waive: must be 'skip' or 'warn-only', got 'off'",
            "  hint: write waive = 'skip' or waive = 'warn-only'",
            f"{file}:11: doctor.checks.shuffle.fail-mix: must be at most 1, got 7",
            "  hint: classification: fails when a batch holds under this share of the classes a "
            "shuffled batch would (default 0.5)",
            f"{file}:12: doctor.checks.shufle: unknown check",
            "  hint: did you mean 'shuffle'? checks: " + ", ".join(CHECK_IDS),
        ]
    )
    assert (exc.file, exc.line) == (file, 5)  # the first stands for all


def test_a_key_with_no_line_still_names_the_file_and_the_key(tmp_path: Path) -> None:
    from dlci.config.source import TomlSource

    source = TomlSource("dlci.toml", {}, (), {})
    exc = source.error(("doctor", "checks", "shuffle", "waive"), "bad")
    assert str(exc) == "dlci.toml: doctor.checks.shuffle.waive: bad"


def test_a_threshold_the_check_does_not_have_is_refused_even_when_others_are_known(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlci import policy

    monkeypatch.setattr(
        policy, "THRESHOLDS", (policy.Threshold("zero-grad", "ratio", 2, 1, 9, "r"),)
    )
    good = resolve(
        cwd=project(tmp_path, "[tool.dlci.doctor.checks.zero-grad]\nratio = 3\n"), env={}
    )
    assert good.policy.thresholds == {"zero-grad.ratio": 3.0}
    assert good.policy.threshold("zero-grad", "ratio") == 3.0
    exc = error(tmp_path, "[tool.dlci.doctor.checks.grad-flow]\nratio = 3\n")
    assert "unknown key" in exc.message and exc.hint == (
        "did you mean 'reason'? known keys: waive, reason, until"  # grad-flow has no threshold
    )


def test_values_that_do_not_parse_from_the_environment_name_the_variable(tmp_path: Path) -> None:
    for variable, value, words in (
        ("DLCI_INPUT_MIN_GPU_UTIL", "forty", "DLCI_INPUT_MIN_GPU_UTIL: expected a number"),
        ("DLCI_MAX_GPU_MEMORY", "101", "DLCI_MAX_GPU_MEMORY: expected a number from 0 to 100"),
        ("DLCI_INPUT_PYTEST_ARGS", "-k 'open", "DLCI_INPUT_PYTEST_ARGS: cannot be split"),
    ):
        with pytest.raises(DlciError) as info:
            resolve(cwd=tmp_path, env={variable: value})
        assert info.value.message.startswith(words), info.value.message
    assert "action's input" in (info.value.hint or "")
    with pytest.raises(DlciError, match="--min-gpu-util: "):
        resolve({"min-gpu-util": "x"}, cwd=tmp_path, env={})
    # the control: the same variables with good values resolve
    config = resolve(
        cwd=tmp_path, env={"DLCI_INPUT_MIN_GPU_UTIL": "40", "DLCI_MAX_GPU_MEMORY": "90"}
    )
    assert (config.get("min-gpu-util"), config.get("max-gpu-memory")) == (40.0, 90.0)


def test_hostile_files_are_refused_before_they_are_parsed(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_bytes(b"# " + b"x" * CONFIG_LIMIT + b"\n")
    with pytest.raises(DlciError, match="more than the 1 MiB"):
        resolve(cwd=tmp_path, env={})
    (tmp_path / "pyproject.toml").unlink()
    os.mkfifo(tmp_path / "dlci.toml")  # would block a plain open()
    with pytest.raises(DlciError, match="not a regular file"):
        resolve(cwd=tmp_path, env={})
    (tmp_path / "dlci.toml").unlink()
    (tmp_path / "dlci.toml").write_bytes(b"target = '\xff'\n")
    with pytest.raises(DlciError, match=r"not UTF-8"):
        resolve(cwd=tmp_path, env={})
    (tmp_path / "dlci.toml").write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(DlciError):
        resolve(cwd=tmp_path, env={})
    # the TOML reader takes time quadratic in a dotted key's parts: refused before it reads
    (tmp_path / "dlci.toml").write_text("target = 'a:b'\n" + "a." * 100_000 + "b = 1\n")
    for read in (lambda: resolve(cwd=tmp_path, env={}), lambda: target_from_pyproject(tmp_path)):
        with pytest.raises(DlciError, match="more than 32 dotted parts") as info:
            read()
        assert info.value.line == 2
    (tmp_path / "dlci.toml").write_text("target = 'a:b'\n" + "doctor." * 2 + "x = 1\n")
    with pytest.raises(DlciError, match=r"doctor\.doctor: unknown key"):  # the control: read
        resolve(cwd=tmp_path, env={})


def test_the_line_scan_skips_strings_and_comments() -> None:
    text = (
        '[tool.other]\nx = """\n[tool.dlci]\nmin-gpu-util = 1\n"""\n'
        "# min-gpu-util = 2\n"
        "y = [\n  'a',  # [tool.dlci]\n  { k = 1 },\n]\n"
        '[tool.dlci]\n"min-gpu-util" = 3\ndoctor.checks."grad-flow".waive = "skip"\n'
        "z = { a.b = 'c', d = [1, {e = 2}] }\n"
    )
    lines = key_lines(text)
    assert lines[("tool", "dlci")] == 11
    assert lines[("tool", "dlci", "min-gpu-util")] == 12
    assert lines[("tool", "dlci", "doctor", "checks", "grad-flow", "waive")] == 13
    assert lines[("tool", "dlci", "z", "a", "b")] == lines[("tool", "dlci", "z", "d")] == 14
    assert lines[("tool", "other", "y")] == 7 and ("tool", "other", "y", "k") in lines


# --------------------------------------------------------------------------- waivers


def test_an_expired_waiver_is_loaded_and_dlci_config_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = "[tool.dlci.doctor.checks.activations]\nwaive = 'warn-only'\nreason = 'GELU'\n"
    project(tmp_path, body + "until = 2020-01-31\n")
    config = resolve(cwd=tmp_path, env={})
    (waiver,) = config.policy.waivers
    assert waiver.until == dt.date(2020, 1, 31) and waiver.expired()
    assert waiver.source == f"{tmp_path}{os.sep}pyproject.toml:6"
    assert main(["config", "--dir", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "activations: warn-only, EXPIRED (until 2020-01-31)" in out and "GELU" in out
    assert "the waiver for activations expired on 2020-01-31" in err
    project(tmp_path, body + "until = '2999-01-31'\n")  # the control: not expired yet
    assert main(["config", "--dir", str(tmp_path)]) == 0
    assert "until 2999-01-31" in capsys.readouterr().out


# --------------------------------------------------------------------------- the snapshot


def test_a_snapshot_decides_the_trusted_keys_and_the_policy(tmp_path: Path) -> None:
    host = resolve(
        cwd=project(
            tmp_path,
            "min-gpu-util = 40\n[tool.dlci.doctor.checks.shuffle]\nwaive = 'skip'\nreason = 'r'\n",
        ),
        env={},
    )
    snapshot = host.to_json()
    assert Config.from_json(jsonio.decode(jsonio.encode(snapshot))).to_json() == snapshot
    project(tmp_path, "min-gpu-util = 1\ntarget = 'head:make'\n")  # the container's files
    env = {"DLCI_MIN_GPU_UTIL": "2", "DLCI_INPUT_MAX_GPU_MEMORY": "50"}
    inside = resolve(cwd=tmp_path, env=env, trusted=snapshot)
    assert inside.get("min-gpu-util") == 40.0
    assert inside.source("min-gpu-util") == host.source("min-gpu-util")
    assert inside.get("max-gpu-memory") is None  # trusted: the environment cannot set it
    assert inside.get("target") == "head:make"  # untrusted: the layers as usual
    assert [w.check for w in inside.policy.waivers] == ["shuffle"]
    assert (
        resolve({"min-gpu-util": 5}, cwd=tmp_path, env=env, trusted=snapshot).get("min-gpu-util")
        == 5.0
    )
    control = resolve(cwd=tmp_path, env=env)  # no snapshot: the environment's values
    assert (control.get("min-gpu-util"), control.policy.waivers) == (2.0, ())
    report = tmp_path / "preflight.json"
    tier = choose_tier(budget="pr", hardware="cpu").to_dict()
    report.write_bytes(jsonio.encode({"plan_version": 1, "tier": tier, "config": snapshot}))
    through_file = resolve(cwd=tmp_path, env=env, plan=str(report))
    assert through_file.get("min-gpu-util") == 40.0
    # no environment variable carries the plan: named there, it is not read
    assert (
        resolve(cwd=tmp_path, env={**env, "DLCI_TIER_JSON": str(report)}).get("min-gpu-util") == 2.0
    )
    report.write_bytes(jsonio.encode(tier))  # a tier alone (dlci tier --json): no snapshot
    assert resolve(cwd=tmp_path, env=env, plan=str(report)).get("min-gpu-util") == 2.0


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            lambda d: d["values"].update({"min-gpu-util": 500}),
            "values.min-gpu-util: must be from 0 to 100",
        ),
        (lambda d: d["values"].update({"nope": 1}), "values.nope: unknown key"),
        (lambda d: d.update({"kind": "tier"}), "schema_version"),
        (
            lambda d: d["policy"]["waivers"].append(
                {"check": "nope", "mode": "skip", "reason": "r"}
            ),
            "policy.waivers[0]",
        ),
        (
            lambda d: d["policy"]["thresholds"].update({"shuffle.fail-mix": 9}),
            "policy.thresholds.shuffle.fail-mix",
        ),
        (lambda d: d.update({"notes": "x"}), "notes"),
    ],
)
def test_a_bad_snapshot_is_one_error_naming_the_key(tmp_path: Path, change, words: str) -> None:
    data = resolve(cwd=tmp_path, env={}).to_json()
    change(data)
    with pytest.raises(DlciError, match=re.escape(words)):
        Config.from_json(data)


# --------------------------------------------------------------------------- schema and docs


def test_the_committed_schema_is_current_and_valid() -> None:
    committed = (ROOT / "src" / "dlci" / "data" / SCHEMA_FILE).read_text("utf-8")
    assert committed == render_schema(), (
        f"regenerate with: dlci config --schema > src/dlci/data/{SCHEMA_FILE}"
    )
    jsonschema.Draft202012Validator.check_schema(json.loads(committed))


AGREEMENT = [  # (data, the same as dlci.toml, whether both accept it)
    (
        {"min-gpu-util": 40, "tests": ["t"], "doctor": {"checks": {"shuffle": {
            "waive": "skip", "reason": "r", "until": "2027-01-31", "fail-mix": 0.3}}}},
        "min-gpu-util = 40\ntests = ['t']\n[doctor.checks.shuffle]\nwaive = 'skip'\n"
        "reason = 'r'\nuntil = '2027-01-31'\nfail-mix = 0.3\n",
        True,
    ),
    ({"pytest-args": "-x -q"}, "pytest-args = '-x -q'\n", True),
    ({"min-gpu-util": 140}, "min-gpu-util = 140\n", False),
    ({"max-step-time-regression": -1}, "max-step-time-regression = -1\n", False),
    ({"min_gpu_util": 4}, "min_gpu_util = 4\n", False),
    ({"target": ""}, "target = ''\n", False),
    ({"doctor": {"checks": {"shufle": {}}}}, "[doctor.checks.shufle]\n", False),
    ({"doctor": {"checks": {"shuffle": {"waive": "skip"}}}}, "[doctor.checks.shuffle]\nwaive = 'skip'\n", False),
    ({"doctor": {"checks": {"shuffle": {"waive": "off", "reason": "r"}}}}, "[doctor.checks.shuffle]\nwaive = 'off'\nreason = 'r'\n", False),
    ({"doctor": {"checks": {"shuffle": {"reason": "r"}}}}, "[doctor.checks.shuffle]\nreason = 'r'\n", False),
    ({"doctor": {"checks": {"shuffle": {"fail-mix": 2}}}}, "[doctor.checks.shuffle]\nfail-mix = 2\n", False),
    ({"doctor": {"checks": {"shuffle": {"tolerance": 0.1}}}}, "[doctor.checks.shuffle]\ntolerance = 0.1\n", False),
]  # fmt: skip


@pytest.mark.parametrize(("data", "text", "valid"), AGREEMENT)
def test_the_schema_and_the_loader_agree(tmp_path: Path, data, text: str, valid: bool) -> None:
    errors = list(jsonschema.Draft202012Validator(json_schema()).iter_errors(data))
    assert (errors == []) is valid, errors
    (tmp_path / "dlci.toml").write_text(text, encoding="utf-8")
    if valid:
        resolve(cwd=tmp_path, env={})
    else:
        with pytest.raises(DlciError):
            resolve(cwd=tmp_path, env={})


def test_the_configuration_doc_lists_every_key_and_every_threshold() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text("utf-8")
    assert key_table() in doc, "paste dlci.config.keys.key_table() into docs/configuration.md"
    for t in THRESHOLDS:
        assert f"| `{t.check}` | `{t.key}` | {t.default:g} | {t.low:g} to {t.high:g} |" in doc, (
            t.name
        )


def test_dlci_config_prints_json_and_the_schema(tmp_path: Path, capsys) -> None:
    project(tmp_path, "min-gpu-util = 40\n")
    assert main(["config", "--dir", str(tmp_path), "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["values"]["min-gpu-util"] == 40.0 and data["kind"] == "config"
    assert main(["config", "--schema"]) == 0
    assert json.loads(capsys.readouterr().out)["$id"].endswith(SCHEMA_FILE)
    project(tmp_path, "min-gpu-util = 400\n")
    assert main(["config", "--dir", str(tmp_path)]) == 1
    assert "pyproject.toml:5: min-gpu-util: must be from 0 to 100" in capsys.readouterr().err


# --------------------------------------------------------------------------- other readers


def test_the_target_loader_reads_dlci_toml_as_the_configuration_does(tmp_path: Path) -> None:
    project(tmp_path, "target = 'pkg.m:make'\n", name="dlci.toml")
    assert target_from_pyproject(tmp_path) == "pkg.m:make"
    assert resolve(cwd=tmp_path, env={}).get("target") == "pkg.m:make"
    project(tmp_path, "target = 'other:make'\n")
    with pytest.raises(DlciError, match=r"both dlci\.toml and pyproject\.toml"):
        target_from_pyproject(tmp_path)
    (tmp_path / "dlci.toml").unlink()
    assert target_from_pyproject(tmp_path) == "other:make"
    project(tmp_path, "\ntarget = 5\n")
    with pytest.raises(DlciError) as info:
        target_from_pyproject(tmp_path)
    assert (info.value.line, info.value.message.split(",")[0]) == (6, "target: expected a text")


def test_the_pytest_fixture_takes_the_target_through_the_configuration(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makefile(".toml", dlci='target = "nowhere_file:make"\n')
    pytester.makepyfile("def test_t(dlci_target):\n    pass\n")
    result = pytester.runpytest_subprocess()
    result.stdout.fnmatch_lines(["*dl-ci: --target nowhere_file:make*"])
    pytester.makeini("[pytest]\ndlci_target = nowhere_ini:make\n")
    monkeypatch.setenv("DLCI_INPUT_TARGET", "nowhere_input:make")  # the action's input wins
    pytester.runpytest_subprocess().stdout.fnmatch_lines(["*dl-ci: --target nowhere_input:make*"])
    monkeypatch.delenv("DLCI_INPUT_TARGET")  # the control: without it, the ini beats the file
    pytester.runpytest_subprocess().stdout.fnmatch_lines(["*dl-ci: --target nowhere_ini:make*"])


# --------------------------------------------------------------------------- the verbs' defaults


def test_the_verbs_take_the_ladder_and_the_gates_from_the_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("DLCI_LADDER", "DLCI_MIN_GPU_UTIL", "DLCI_MAX_GPU_MEMORY"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "l.yaml").write_text((ROOT / "tests/data/ladders/small.yaml").read_text())
    tier = ["tier", "--hardware", "cpu", "--budget", "pr", "--json"]
    assert main(tier) == 0
    assert json.loads(capsys.readouterr().out)["ladder"] != "l.yaml"  # control: no file
    project(tmp_path, "ladder = 'l.yaml'\n", name="dlci.toml")
    assert main(tier) == 0
    assert json.loads(capsys.readouterr().out)["ladder"] == "l.yaml"
    # the command line, then the environment, rank above the file
    assert main([*tier, "--ladder", str(ROOT / "tests/data/ladders/small.yaml")]) == 0
    assert json.loads(capsys.readouterr().out)["ladder"].endswith("tests/data/ladders/small.yaml")
    monkeypatch.setenv("DLCI_LADDER", "missing.yaml")
    assert main(tier) == 1  # the environment's ladder was taken (and does not exist)
    assert "missing.yaml" in capsys.readouterr().err
    monkeypatch.delenv("DLCI_LADDER")

    trace = str(ROOT / "tests/data/memory/cpu_plant_forward.json.gz")
    analyze = ["analyze", trace, "--out", str(tmp_path / "out")]
    assert main(analyze) == 0  # control: no gate in the file
    project(tmp_path, "max-gpu-memory = 50\n", name="dlci.toml")
    assert main(analyze) == 1  # the file's gate: a CPU trace cannot pass a GPU memory gate
    assert "GPU memory gate" in capsys.readouterr().err


def test_a_warning_bound_past_its_failure_bound_is_refused(tmp_path: Path) -> None:
    table = "[tool.dlci.doctor.checks.input-normalization]\n"
    found = error(tmp_path, table + "fail-rms = 5\n")  # the default warn-rms is 10
    assert "warn-rms = 10 must lie below fail-rms = 5" in found.message
    assert "pyproject.toml:6" in str(found.location)
    found = error(tmp_path, "[tool.dlci.doctor.checks.shuffle]\nwarn-mix = 0.3\n")
    assert "warn-mix = 0.3 must lie above fail-mix = 0.5" in found.message
    # controls: both moved together, equal bounds, and one moved within its side
    for body in ("fail-rms = 5\nwarn-rms = 4\n", "fail-rms = 10\n", "warn-rms = 20\n"):
        config = resolve(cwd=project(tmp_path, table + body), env={})
        assert config.policy.thresholds
