"""The CLI's contract: dispatch, exit codes, no traceback for user mistakes, no torch on the host."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dlci import cli
from dlci.errors import DlciError


def test_help_lists_every_verb(capsys) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for verb in cli.VERBS:
        assert f"\n  {verb} " in out


def test_version(capsys) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip().startswith("dlci 0.")


def test_no_arguments_prints_usage_and_exits_2(capsys) -> None:
    assert cli.main([]) == 2
    assert "usage: dlci" in capsys.readouterr().err


def test_an_unknown_verb_exits_2_and_lists_the_verbs(capsys) -> None:
    assert cli.main(["memorise"]) == 2
    assert capsys.readouterr().err == (
        f"dlci: unknown command 'memorise'; choose from: {', '.join(cli.VERBS)}\n"
    )


def test_a_bad_option_exits_2_with_the_usage_and_a_hint(capsys) -> None:
    assert cli.main(["tier", "--budgett", "pr"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: dlci tier [-h] ")
    assert err.endswith(
        "error: dlci tier: unrecognized arguments: --budgett pr\n"
        "  hint: run 'dlci tier --help' for usage\n"
    )


@pytest.mark.parametrize(
    "argv",
    [[verb] for verb in cli.VERBS]
    + [["container", "build"], ["container", "run"], ["container", "cleanup"]],
    ids=lambda argv: " ".join(argv),
)
def test_every_verb_exits_2_on_an_unknown_flag(argv: list[str], capsys) -> None:
    prog = "dlci " + " ".join(argv)
    assert cli.main([*argv, "--no-such-flag"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {prog} "), err
    # argparse names a missing positional argument first, else the unknown flag
    assert err.splitlines()[-2].startswith(f"error: {prog}: "), err
    assert err.splitlines()[-1] == f"  hint: run '{prog} --help' for usage"


def test_a_value_that_does_not_parse_exits_2(capsys) -> None:
    assert cli.main(["memorize", "--seed", "notanint"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: dlci memorize ")
    assert "error: dlci memorize: argument --seed: invalid int value: 'notanint'\n" in err


@pytest.mark.parametrize(
    "argv",
    [["tier", "--timeout", "-1"], ["hardware", "--timeout", "0"], ["tier", "--budget", "nosuch"]],
)
def test_a_value_that_parses_but_is_wrong_exits_1_without_usage(argv: list[str], capsys) -> None:
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "usage:" not in err


def test_an_unexpected_error_exits_3_with_a_pointer_to_the_log(
    monkeypatch, tmp_path, capsys
) -> None:
    def boom(verb, argv):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(cli, "run_verb", boom)
    monkeypatch.setenv("DLCI_LOG_DIR", str(tmp_path))
    assert cli.main(["hardware"]) == 3
    err = capsys.readouterr().err
    log = tmp_path / "dlci-error.log"
    assert err == (
        "error: dlci hardware failed unexpectedly (ZeroDivisionError: division by zero).\n"
        f"  The traceback is in {log}; please attach it to a bug report.\n"
    )
    text = log.read_text()
    assert "command: dlci hardware" in text
    assert "Traceback (most recent call last)" in text


def test_ctrl_c_exits_130(monkeypatch, capsys) -> None:
    def interrupted(verb, argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_verb", interrupted)
    assert cli.main(["tier"]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_a_user_error_inside_github_actions_is_also_an_error_annotation(
    monkeypatch, capsys
) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")

    def mistake(verb, argv):
        raise DlciError("bad value\n::set-output name=x::1", hint="fix it", file="a,b.yaml", line=3)

    monkeypatch.setattr(cli, "run_verb", mistake)
    assert cli.main(["tier"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1] == (
        "::error file=a%2Cb.yaml,line=3,title=dl-ci::bad value%0A::set-output name=x::1 (hint: fix it)"
    )


REAL_TRACE = Path(__file__).parent / "data" / "real" / "kineto_v100_mlp.json"


def test_host_side_commands_never_import_torch(tmp_path) -> None:
    code = (
        "import sys; from dlci.cli import main\n"
        "assert main(['hardware', '--probes', 'nvml,nvidia-smi', '--json']) == 0\n"
        "assert main(['tier', '--probes', 'nvml,nvidia-smi', '--json']) == 0\n"
        "assert main(['tier', '--hardware', 'a100', '--budget', 'nightly']) == 0\n"
        f"assert main(['analyze', {str(REAL_TRACE)!r}, '--json', '-', '--quiet']) == 0\n"
        f"assert main(['analyze', {str(REAL_TRACE)!r}, '--json', {str(tmp_path / 'utilization.json')!r}, '--markdown', {str(tmp_path / 'u.md')!r}]) == 0\n"
        f"assert main(['preflight', '--no-docker', '--hardware', 'cpu', '--out', {str(tmp_path)!r}]) == 0\n"
        f"assert main(['summary', '--artifacts', {str(tmp_path)!r}, '--no-fail', '--markdown', {str(tmp_path / 's.md')!r}]) == 0\n"
        f"assert main(['baseline', '--base-dir', {str(tmp_path)!r}, '--artifacts', {str(tmp_path)!r}]) == 0\n"
        f"assert main(['history', '--previous', 'none', '--append', {str(tmp_path)!r}, '--out', {str(tmp_path / 'h')!r}]) == 0\n"
        f"assert main(['config', '--dir', {str(tmp_path)!r}, '--json', '-']) == 0\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'matplotlib'))\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_the_console_script_runs(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dlci", "tier", "--hardware", "t4", "--budget", "pr", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert '"row": "budgets.pr.t4"' in done.stdout
