"""Hostile ladders and the last crashes: each runs the CLI in a child process under resource
limits (tests/fuzz/fuzzchild.py) and must answer exit 1 with one located ``error:`` line, no
traceback, in bounded time and memory. Each has a control: the same structure, made sane,
passes; where a protection can be taken away cheaply, its absence is shown to cost."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dlci.cli import main
from dlci.ladder import yamlsource
from dlci.ladder.load import load_ladder_text

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
from fuzzchild import Answer, assert_clean, run_dlci

SMALL = (Path(__file__).parent / "data" / "ladders" / "small.yaml").read_text("utf-8")
MEMORY = 1 << 30  # RLIMIT_AS of each child: a bomb fails the test, not the machine
CPU = 20  # RLIMIT_CPU seconds of each child
PEAK_MIB = 400  # a generous ceiling on a child's peak resident memory (wait4)


def tier(work: Path, ladder: str, *, what: str, validate: bool = False) -> Answer:
    args = ["tier", "--validate", ladder] if validate else ["tier", "--ladder", ladder]
    if not validate:
        args += ["--budget", "pr", "--hardware", "cpu"]
    return run_dlci(args, cwd=work, what=what, memory=MEMORY, cpu=CPU)


def refused(answer: Answer, message: str) -> None:
    """Exit 1, exactly one error line, and it is ``message``; bounded memory."""
    assert_clean(answer, frozenset({1}))
    errors = [line for line in answer.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {message}"], answer.stderr[-2000:]
    assert answer.peak_mib < PEAK_MIB, answer.peak_mib


def passed(answer: Answer) -> None:
    assert_clean(answer, frozenset({0}))
    assert answer.peak_mib < PEAK_MIB, answer.peak_mib


def with_cpu_row(text: str, row: str) -> str:
    old = "cpu: {max_epochs: 100, max_loss: 1.0, time_cap_minutes: 3, profile_steps: 3, nproc: 1}"
    assert old in text
    return text.replace(old, f"cpu: {row}", 1)


# ------------------------------------------------------------------ YAML bombs


def _laughs(levels: int) -> str:
    """The billion laughs in a ladder's revision: 10**levels strings from ~60 bytes a level."""
    lines = ['x0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"x{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "version: 1\nrevision:\n" + "\n".join("  " + line for line in lines) + "\n"


def test_an_alias_bomb_is_refused_at_its_first_alias(tmp_path: Path) -> None:
    """Before: over 1 GB (3 GB and a MemoryError traceback under a 3 GiB limit)."""
    (tmp_path / "bomb.yaml").write_text(_laughs(9) + SMALL.partition("\n")[2])
    for validate in (True, False):
        answer = tier(tmp_path, "bomb.yaml", what="ladder: alias bomb", validate=validate)
        refused(answer, "bomb.yaml:4: aliases (*a0) are not allowed in a ladder")


def test_control_an_anchor_alone_is_fine_and_the_refusal_is_what_stops_the_bomb(
    monkeypatch,
) -> None:
    load_ladder_text(
        with_cpu_row(
            SMALL,
            "&row {max_epochs: 1, max_loss: 1.0, time_cap_minutes: 3, profile_steps: 3, nproc: 1}",
        )
    )
    # without the refusal, aliases are expanded as the key lines are walked: 3 levels of a
    # 200-byte bomb already give 1110 located keys, each level ten times more
    monkeypatch.setattr(
        yamlsource._BoundedLoader, "compose_node", yamlsource.yaml.SafeLoader.compose_node
    )
    source = yamlsource.parse_yaml(_laughs(3), "bomb.yaml")
    assert len(source.lines) == 2 + (1 + 10) + (1 + 10 + 100) + (1 + 10 + 100 + 1000)


def test_nesting_is_bounded_before_recursion(tmp_path: Path) -> None:
    deep = "[" * 50_000 + "]" * 50_000
    (tmp_path / "deep.yaml").write_text(
        f"version: 1\nrevision: {deep}\n" + SMALL.partition("\n")[2]
    )
    answer = tier(tmp_path, "deep.yaml", what="ladder: deep nesting", validate=True)
    refused(answer, "deep.yaml:2: nested deeper than 20 levels; a ladder needs 4")


def test_control_a_ladder_at_its_own_depth_loads() -> None:
    assert load_ladder_text(SMALL).classes["t4"].match == (r"\bT4\b",)


# ------------------------------------------------------------------ size and extends


def test_a_50_mb_ladder_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    """Before: minutes and about 6 GB (killed by a 40 s CPU limit at 1 GB here)."""
    rows = "".join(f"  c{i}: {{match: [], speed: 1.0, fallback: cpu}}\n" for i in range(1_200_000))
    head, _, rest = SMALL.partition("classes:\n")
    (tmp_path / "big.yaml").write_text(f"{head}classes:\n{rows}{rest}")
    answer = tier(tmp_path, "big.yaml", what="ladder: 50 MB", validate=True)
    size = (tmp_path / "big.yaml").stat().st_size / (1 << 20)
    refused(answer, f"big.yaml: {size:.3g} MiB, more than the 1 MiB dl-ci reads as a ladder file")
    assert answer.seconds < 30


def test_a_megabyte_of_values_is_refused_at_the_node_cap(tmp_path: Path) -> None:
    """1 MiB of ``[1,1,...]`` is 500 000 nodes of pure-Python YAML: 20 s and 470 MiB
    without the node cap (measured with the size cap alone)."""
    flat = "[" + "1," * 400_000 + "1]"
    (tmp_path / "flat.yaml").write_text(
        f"version: 1\nrevision: {flat}\n" + SMALL.partition("\n")[2]
    )
    answer = tier(tmp_path, "flat.yaml", what="ladder: 1 MiB of values", validate=True)
    refused(answer, "flat.yaml:2: more than 20000 keys and values; a ladder has a few hundred")


def test_control_ladders_just_under_the_caps_load(tmp_path: Path) -> None:
    """The caps' worst cases pass: a file of almost 1 MiB (one long description), and a
    ladder of almost 20 000 nodes whose classes each fall back to the next (a quadratic
    fallback walk would be slow here)."""
    text = SMALL.replace("cpu: {match: []", "cpu: {description: " + "x" * 1_047_000 + ", match: []")
    (tmp_path / "long.yaml").write_text(text)
    assert (tmp_path / "long.yaml").stat().st_size > yamlsource.LADDER_LIMIT - 2000
    passed(tier(tmp_path, "long.yaml", what="ladder: 1 MiB text (control)"))
    count = (yamlsource.MAX_NODES - 200) // 8  # nodes of one class: key, mapping, 3 keys, 3 values
    rows = [f"  c{i}: {{match: [], speed: 1.0, fallback: c{i + 1}}}\n" for i in range(count)]
    rows[-1] = rows[-1].replace(f"fallback: c{count}", "fallback: cpu")
    head, _, rest = SMALL.partition("classes:\n")
    (tmp_path / "chain.yaml").write_text(f"{head}classes:\n{''.join(rows)}{rest}")
    passed(tier(tmp_path, "chain.yaml", what="ladder: 19 800 nodes, chained (control)"))


@pytest.mark.parametrize("target", ["/dev/zero", "fifo"])
def test_extends_reads_only_a_regular_file(tmp_path: Path, target: str) -> None:
    """Before: ``extends: /dev/zero`` read without end (a MemoryError, exit 3)."""
    if target == "fifo":
        os.mkfifo(tmp_path / "fifo")
    (tmp_path / "l.yaml").write_text(f"version: 1\nextends: {target}\n")
    kind = "a character device" if target == "/dev/zero" else "a FIFO"
    answer = tier(tmp_path, "l.yaml", what=f"ladder: extends {kind}", validate=True)
    refused(answer, f"{target}: not a regular file ({kind})")


def _chain(folder: Path, files: int) -> str:
    for n in range(files):
        parent = f"l{n + 1}.yaml" if n + 1 < files else "default"
        (folder / f"l{n}.yaml").write_text(f"version: 1\nextends: {parent}\n")
    return "l0.yaml"


def test_an_extends_chain_is_bounded(tmp_path: Path) -> None:
    answer = tier(tmp_path, _chain(tmp_path, 17), what="ladder: 17 extends", validate=True)
    refused(answer, "l16.yaml:2: extends: more than 16 files in the 'extends' chain")
    passed(tier(tmp_path, _chain(tmp_path, 16), what="ladder: 16 extends (control)"))


# ------------------------------------------------------------------ numbers


ROW = "{{max_epochs: {e}, max_loss: {l}, time_cap_minutes: {t}, profile_steps: 3, nproc: {n}}}"
NUMBERS = [
    ("max_epochs", dict(e=2**64), "must be at most 9223372036854775807, got 18446744073709551616"),
    ("max_epochs", dict(e=10**30), "must be at most 9223372036854775807, got a 31-digit integer"),
    ("max_epochs", dict(e="1.0e+300"), "must be at most 9223372036854775807, got 1e+300"),
    ("nproc", dict(n=-(10**40)), "must be at least 1, got a 41-digit negative integer"),
    ("max_loss", dict(l=10**400), "must be a finite number, got a 401-digit integer"),
    ("time_cap_minutes", dict(t=10**400), "must be a finite number, got a 401-digit integer"),
    ("time_cap_minutes", dict(t="1.0e+300"), "must be at most 10080, got 1e+300"),
]


@pytest.mark.parametrize(("key", "values", "problem"), NUMBERS)
def test_a_number_out_of_range_is_located(tmp_path: Path, key, values, problem) -> None:
    """Before: an integer beyond a float (speed, max_loss) crashed with exit 3 and one
    beyond 64 bits (max_epochs) passed into the tier."""
    row = ROW.format(**{"e": 100, "l": 1.0, "t": 3, "n": 1, **values})
    (tmp_path / "n.yaml").write_text(with_cpu_row(SMALL, row))
    answer = tier(tmp_path, "n.yaml", what="ladder: number out of range")
    refused(answer, f"n.yaml:7: budgets.pr.cpu.{key}: {problem}")


def test_control_the_largest_numbers_a_key_allows_load(tmp_path: Path) -> None:
    row = ROW.format(e=2**63 - 1, l="1.0e+300", t=10080, n=2**63 - 1)
    (tmp_path / "n.yaml").write_text(with_cpu_row(SMALL, row))
    passed(tier(tmp_path, "n.yaml", what="ladder: numbers at the maximum (control)"))


# ------------------------------------------------------------------ memorize --out


@pytest.mark.parametrize("kind", ["file", "under-a-file", "fifo"])
def test_memorize_out_must_be_a_directory(tmp_path: Path, kind: str) -> None:
    """Before: ``--out EXISTING_FILE`` crashed with exit 3 (NotADirectoryError)."""
    (tmp_path / "f").write_text("x") if kind != "fifo" else os.mkfifo(tmp_path / "f")
    out = str(tmp_path / "f") + ("/sub" if kind == "under-a-file" else "")
    answer = run_dlci(["memorize", "--out", out], cwd=tmp_path, what="memorize --out not a dir")
    problem = {
        "file": "is a file",
        "fifo": "is not a directory",
        "under-a-file": f"cannot be made (its parent {tmp_path / 'f'} is a file)",
    }[kind]
    refused(answer, f"--out {out}: {problem}")


def test_control_a_new_out_directory_passes_the_check(tmp_path: Path) -> None:
    """The check lets a path that can be made through: the next mistake is the target."""
    answer = run_dlci(["memorize", "--out", str(tmp_path / "new" / "dir")], cwd=tmp_path)
    assert answer.code == 1 and "error: no target given" in answer.stderr


# ------------------------------------------------------------------ a closed pipe

CLOSED = "import os, sys; r, w = os.pipe(); os.close(r); os.dup2(w, 1); "
GUARDED = CLOSED + "from dlci.cli import main; raise SystemExit(main())"
UNGUARDED = (
    CLOSED + "from dlci.cli import run_verb; raise SystemExit(run_verb(sys.argv[1], sys.argv[2:]))"
)
PIPED = [
    ["tier", "--budget", "pr", "--hardware", "cpu"],
    ["tier", "--budget", "pr", "--hardware", "cpu", "--json", "-"],
    ["tier", "--budget", "nosuch", "--hardware", "cpu", "--json", "-"],
    ["hardware", "--probes", "nvidia-smi", "--json", "-"],
    ["tier", "--validate", "ladder.yaml"],
    ["tier", "--help"],
    ["--help"],
    ["--version"],
]


CUT_SHORT = [["tier", "--budget", "pr", "--hardware", "cpu"], ["tier", "--validate", "ladder.yaml"]]


@pytest.mark.parametrize("args", PIPED, ids=" ".join)
def test_a_closed_stdout_ends_quietly_with_the_verbs_code(
    tmp_path: Path, args, monkeypatch
) -> None:
    (tmp_path / "ladder.yaml").write_text(SMALL)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: the hardware verb answers at once
    # a verb cut short before its exit code (rich's tables write as they go) has no verdict: 1
    expected = 1 if args in CUT_SHORT else run_dlci(args, cwd=tmp_path).code
    answer = run_dlci(args, cwd=tmp_path, code=GUARDED, what="closed stdout")
    assert_clean(answer, frozenset({expected}))
    assert "BrokenPipe" not in answer.stderr and "Exception ignored" not in answer.stderr


def test_control_without_the_cli_guard_a_closed_stdout_is_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "ladder.yaml").write_text(SMALL)
    answer = run_dlci(["tier", "--validate", "ladder.yaml"], cwd=tmp_path, code=UNGUARDED)
    assert "BrokenPipeError" in answer.stderr


def test_control_a_broken_pipe_elsewhere_is_still_a_bug(tmp_path, monkeypatch, capsys) -> None:
    def broken(verb: str, argv: list[str]) -> int:
        raise BrokenPipeError(32, "a child's stdin")

    monkeypatch.setattr("dlci.cli.run_verb", broken)
    monkeypatch.setenv("DLCI_LOG_DIR", str(tmp_path))
    assert main(["tier"]) == 3
    assert "failed unexpectedly (BrokenPipeError" in capsys.readouterr().err


def test_a_pr_ladder_that_is_a_symlink_to_dev_zero_is_not_read(tmp_path: Path) -> None:
    """Preflight compares the working tree's ladder with the base commit's: a committed symlink
    to /dev/zero must not be read (it would grow until the machine runs out of memory)."""
    from dlci.ladder.trust import _same

    (tmp_path / "ladder.yaml").symlink_to("/dev/zero")
    assert _same(tmp_path / "ladder.yaml", "version: 1\n") is False
    (tmp_path / "plain.yaml").write_text("version: 1\n")  # the control: a regular file is read
    assert _same(tmp_path / "plain.yaml", "version: 1\n") is True
