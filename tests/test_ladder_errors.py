"""Every mistake of a bad ladder gives a located message with a hint, all of a file at once;
garbage never gives a traceback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlci.cli import main
from dlci.errors import DlciError
from dlci.ladder import patterns
from dlci.ladder.load import load_ladder, load_ladder_text

SMALL_TEXT = (Path(__file__).parent / "data" / "ladders" / "small.yaml").read_text("utf-8")


def edit(text: str, old: str, new: str, count: int = 1) -> str:
    assert old in text, old
    return text.replace(old, new, count)


# (name, how to break the small ladder, the exact message, the exact hint)
CASES = [
    (
        "negative loss",
        lambda t: edit(
            t, "t4: {max_epochs: 100, max_loss: 1.0", "t4: {max_epochs: 100, max_loss: -1"
        ),
        "ladder.yaml:8: budgets.pr.t4.max_loss: must be greater than 0, got -1",
        "use a positive loss such as 1.0, or state max_relative_loss instead",
    ),
    (
        "zero epochs",
        lambda t: edit(t, "max_epochs: 100", "max_epochs: 0"),
        "ladder.yaml:7: budgets.pr.cpu.max_epochs: must be at least 1, got 0",
        "use a whole number of epochs such as 100",
    ),
    (
        "negative epochs",
        lambda t: edit(t, "max_epochs: 100", "max_epochs: -5"),
        "ladder.yaml:7: budgets.pr.cpu.max_epochs: must be at least 1, got -5",
        "use a whole number of epochs such as 100",
    ),
    (
        "epochs as text",
        lambda t: edit(t, "max_epochs: 100", "max_epochs: ten"),
        "ladder.yaml:7: budgets.pr.cpu.max_epochs: expected an integer, got 'ten' (a text)",
        "use a whole number of epochs such as 100",
    ),
    (
        "fractional epochs",
        lambda t: edit(t, "max_epochs: 100", "max_epochs: 1.5"),
        "ladder.yaml:7: budgets.pr.cpu.max_epochs: expected an integer, got 1.5 (a number)",
        "use a whole number of epochs such as 100",
    ),
    (
        "boolean epochs",
        lambda t: edit(t, "max_epochs: 100", "max_epochs: yes"),
        "ladder.yaml:7: budgets.pr.cpu.max_epochs: expected an integer, got True (a boolean)",
        "use a whole number of epochs such as 100",
    ),
    (
        "zero time cap",
        lambda t: edit(t, "time_cap_minutes: 3", "time_cap_minutes: 0"),
        "ladder.yaml:7: budgets.pr.cpu.time_cap_minutes: must be greater than 0, got 0",
        "use a positive number of minutes such as 5",
    ),
    (
        "infinite loss",
        lambda t: edit(t, "max_loss: 1.0", "max_loss: .inf"),
        "ladder.yaml:7: budgets.pr.cpu.max_loss: must be a finite number, got inf",
        "use a positive loss such as 1.0, or state max_relative_loss instead",
    ),
    (
        "unknown key in a tier",
        lambda t: edit(t, "nproc: 1}", "nproc: 1, max_los: 2}"),
        "ladder.yaml:7: budgets.pr.cpu.max_los: unknown key",
        "did you mean 'max_loss'? known keys: max_epochs, max_loss, max_relative_loss, "
        "time_cap_minutes, "
        "profile_steps, nproc, batch_size",
    ),
    (
        "unknown top-level key",
        lambda t: edit(t, "classes:", "clases:"),
        "ladder.yaml:2: clases: unknown key",
        "did you mean 'classes'? known keys: version, revision, extends, classes, budgets",
    ),
    (
        "missing tier key",
        lambda t: edit(t, "max_loss: 1.0, ", ""),
        "ladder.yaml:7: budgets.pr.cpu: missing required key 'max_loss'",
        "max_loss: use a positive loss such as 1.0",
    ),
    (
        "budget missing a class with no fallback",
        lambda t: re.sub(r"  merge:\n    cpu: .*\n    t4: .*\n", "  merge:\n    cpu: null\n", t),
        "ladder.yaml:9: budgets.merge: no tier for hardware class 't4', and the class has no "
        "fallback",
        "add budgets.merge.t4, give classes.t4 a 'fallback', or write 't4: null' if this budget "
        "must not run on it",
    ),
    (
        "a budget row for an undeclared class",
        lambda t: edit(
            t,
            "    t4: {max_epochs: 100, max_loss: 1.0, time_cap_minutes: 5",
            "    t5: {max_epochs: 100, max_loss: 1.0, time_cap_minutes: 5",
        ),
        "ladder.yaml:8: budgets.pr.t5: unknown hardware class 't5'",
        "did you mean 't4'? classes: cpu, t4",
    ),
    (
        "a missing required budget",
        lambda t: edit(t, "  merge:", "  merges:"),
        "ladder.yaml:5: budgets: budget 'merge' is missing",
        "a ladder defines at least the pr, merge and nightly budgets",
    ),
    (
        "unsupported version",
        lambda t: edit(t, "version: 1", "version: 3"),
        "ladder.yaml:1: version: unsupported ladder version 3; this dl-ci reads versions 1 and 2",
        "upgrade dl-ci, or write the file in the version 2 format (docs/budget-ladder.md)",
    ),
    (
        "version as text",
        lambda t: edit(t, "version: 1", "version: one"),
        "ladder.yaml:1: version: expected an integer, got 'one' (a text)",
        "write 'version: 2'",
    ),
    (
        "no version",
        lambda t: edit(t, "version: 1\n", ""),
        "ladder.yaml:1: version: required key is missing",
        "start the file with 'version: 2'",
    ),
    (
        "malformed YAML",
        lambda t: edit(
            t, "  t4: {match: ['\\bT4\\b'], speed: 1.0}", "  t4: {match: ['\\bT4\\b', speed: 1.0}"
        ),
        "ladder.yaml:4: malformed YAML: expected ',' or ']', but got '}' (column 36)",
        "check the indentation and the quoting on that line",
    ),
    (
        "a tab for indentation",
        lambda t: edit(t, "  cpu: {match", "\tcpu: {match"),
        "ladder.yaml:3: malformed YAML: found character '\\t' that cannot start any token "
        "(column 1)",
        "check the indentation and the quoting on that line",
    ),
    (
        "duplicate key",
        lambda t: edit(t, "  t4: {match", "  cpu: {match: [], speed: 1}\n  t4: {match"),
        "ladder.yaml:4: classes.cpu: duplicate key (first on line 3)",
        "YAML keeps only the last value of a repeated key; remove one",
    ),
    (
        "a list instead of a mapping",
        lambda t: "- version: 1\n",
        "ladder.yaml:1: the ladder must be a mapping with version, classes and budgets, got a list",
        "see docs/budget-ladder.md for the format",
    ),
    (
        "an empty file",
        lambda t: "",
        "ladder.yaml:1: the ladder must be a mapping with version, classes and budgets, got empty",
        "see docs/budget-ladder.md for the format",
    ),
    (
        "a class that is not a mapping",
        lambda t: edit(t, "  t4: {match: ['\\bT4\\b'], speed: 1.0}", "  t4: fast"),
        "ladder.yaml:4: classes.t4: expected a mapping, got 'fast' (a text)",
        "see docs/budget-ladder.md for the layout of 'classes'",
    ),
    (
        "a bad regular expression",
        lambda t: edit(t, "match: ['\\bT4\\b']", "match: ['T4(']"),
        "ladder.yaml:4: classes.t4.match[0]: GPU name pattern 'T4(' refused: it is not a valid "
        "regular expression (missing ), unterminated subpattern at position 2)",
        patterns.HINT,
    ),
    (
        "a pattern with nested quantifiers (catastrophic backtracking)",
        lambda t: edit(t, "match: ['\\bT4\\b']", "match: ['(T+)+$']"),
        "ladder.yaml:4: classes.t4.match[0]: GPU name pattern '(T+)+$' refused: a repeated part "
        "contains a repetition (nested quantifiers backtrack exponentially)",
        patterns.HINT,
    ),
    (
        "a pattern whose repetitions multiply (polynomial backtracking)",
        lambda t: edit(t, "match: ['\\bT4\\b']", "match: ['T*T*T*4']"),
        "ladder.yaml:4: classes.t4.match[0]: GPU name pattern 'T*T*T*4' refused: its repetitions "
        "leave too many ways to match a name (about 2.1e+06, at most 166410): each one "
        "multiplies the time a failing match takes",
        patterns.HINT,
    ),
    (
        "a back-reference",
        lambda t: edit(t, "match: ['\\bT4\\b']", "match: ['(T)\\1']"),
        "ladder.yaml:4: classes.t4.match[0]: GPU name pattern '(T)\\\\1' refused: it uses a "
        "back-reference",
        patterns.HINT,
    ),
    (
        "an unknown fallback",
        lambda t: edit(t, "speed: 1.0}", "speed: 1.0, fallback: t3}"),
        "ladder.yaml:4: classes.t4.fallback: unknown hardware class 't3'",
        "did you mean 't4'? classes: cpu, t4",
    ),
    (
        "no cpu class",
        lambda t: edit(t, "  cpu: {match: [], speed: 0.02}\n", ""),
        "ladder.yaml:2: classes: the 'cpu' class is missing",
        "declare 'cpu' (match: [], speed: 0.02); it is the class of a runner with no GPU",
    ),
    (
        "an invalid class name",
        lambda t: edit(t, "  t4: {match", "  T 4: {match"),
        "ladder.yaml:4: classes.T 4: invalid name 'T 4'",
        "use lower-case letters, digits, '-', '_' or '.', such as 'a100' or 'rtx-4090'",
    ),
    (
        "epochs beyond 64 bits",
        lambda t: edit(t, "max_epochs: 100", f"max_epochs: {2**64}"),
        "ladder.yaml:7: budgets.pr.cpu.max_epochs: must be at most 9223372036854775807, "
        "got 18446744073709551616",
        "use a whole number of epochs such as 100",
    ),
    (
        "a speed beyond a float",
        lambda t: edit(t, "speed: 1.0", "speed: " + "9" * 400),
        "ladder.yaml:4: classes.t4.speed: must be a finite number, got a 400-digit integer",
        "use a positive number, such as 4.0 for an A100",
    ),
    (
        "a time cap beyond a week",
        lambda t: edit(t, "time_cap_minutes: 3", "time_cap_minutes: 10081"),
        "ladder.yaml:7: budgets.pr.cpu.time_cap_minutes: must be at most 10080, got 10081",
        "use a positive number of minutes such as 5",
    ),
    (
        "an alias",
        lambda t: edit(t, "nightly:\n    cpu: null", "nightly:\n    cpu: *row").replace(
            "  merge:\n    cpu: {", "  merge:\n    cpu: &row {"
        ),
        "ladder.yaml:13: aliases (*row) are not allowed in a ladder",
        "write the value out; to share values between ladders use 'extends'",
    ),
]


@pytest.mark.parametrize(
    ("breakage", "message", "hint"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_a_bad_ladder_names_the_file_line_and_key(
    write_ladder, small_ladder_text, breakage, message, hint
) -> None:
    path = write_ladder(breakage(small_ladder_text))
    with pytest.raises(DlciError) as info:
        load_ladder(path)
    assert str(info.value) == f"{path.parent}/{message}\n  hint: {hint}"


def test_the_cli_reports_a_bad_ladder_without_a_traceback(
    write_ladder, small_ladder_text, capsys
) -> None:
    path = write_ladder(edit(small_ladder_text, "max_epochs: 100", "max_epochs: 0"))
    code = main(["tier", "--ladder", str(path), "--hardware", "cpu"])
    err = capsys.readouterr().err
    assert code == 1
    assert err == (
        f"error: {path}:7: budgets.pr.cpu.max_epochs: must be at least 1, got 0\n"
        "  hint: use a whole number of epochs such as 100\n"
    )


def test_a_missing_ladder_file_is_named(tmp_path) -> None:
    with pytest.raises(DlciError) as info:
        load_ladder(tmp_path / "nope.yaml")
    assert str(info.value) == (
        f"{tmp_path}/nope.yaml: no such ladder file\n"
        "  hint: check the path given to --ladder or to 'extends'"
    )


def several_mistakes(text: str) -> str:
    text = edit(text, "speed: 1.0}", "speed: -1}")
    text = edit(text, "max_epochs: 100", "max_epochs: 0")
    text = edit(text, "nproc: 1}", "nproc: 1, max_los: 2}", 4)  # merge.t4 is the 4th row
    text = text.replace("nproc: 1, max_los: 2}", "nproc: 1}", 3)
    return edit(text, "    cpu: null", "    cpu: null\n    t5: null")


def test_every_mistake_of_a_ladder_is_reported_at_once_each_located(
    write_ladder, small_ladder_text
) -> None:
    path = write_ladder(several_mistakes(small_ladder_text))
    with pytest.raises(DlciError) as info:
        load_ladder(path)
    assert str(info.value) == "\n".join(
        [
            f"{path}:4: classes.t4.speed: must be greater than 0, got -1",
            "  hint: use a positive number, such as 4.0 for an A100",
            f"{path}:7: budgets.pr.cpu.max_epochs: must be at least 1, got 0",
            "  hint: use a whole number of epochs such as 100",
            f"{path}:11: budgets.merge.t4.max_los: unknown key",
            "  hint: did you mean 'max_loss'? known keys: max_epochs, max_loss, "
            "max_relative_loss, time_cap_minutes, profile_steps, nproc, batch_size",
            f"{path}:14: budgets.nightly.t5: unknown hardware class 't5'",
            "  hint: did you mean 't4'? classes: cpu, t4",
        ]
    )
    assert (info.value.file, info.value.line) == (str(path), 4)  # the first stands for all


def test_the_cli_prints_every_mistake_of_a_ladder(write_ladder, small_ladder_text, capsys) -> None:
    path = write_ladder(several_mistakes(small_ladder_text))
    assert main(["tier", "--ladder", str(path), "--hardware", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}:4: classes.t4.speed: must be greater than 0, got -1\n")
    assert re.findall(r"ladder\.yaml:\d+: (\S+):", err) == [
        "classes.t4.speed",
        "budgets.pr.cpu.max_epochs",
        "budgets.merge.t4.max_los",
        "budgets.nightly.t5",
    ]


# --------------------------------------------------------------------------- garbage

yaml_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
yaml_values = st.recursive(
    yaml_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.sampled_from(
                [
                    "version",
                    "classes",
                    "budgets",
                    "pr",
                    "cpu",
                    "t4",
                    "max_epochs",
                    "max_loss",
                    "match",
                    "speed",
                    "extends",
                    "nproc",
                    "x",
                ]
            )
            | st.text(max_size=6),
            inner,
            max_size=5,
        ),
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=yaml_values)
def test_generated_documents_only_ever_raise_the_user_error(doc) -> None:
    text = yaml.safe_dump(doc)
    try:
        load_ladder_text(text)
    except DlciError as exc:
        assert exc.message and exc.file == "ladder.yaml"


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200))
def test_generated_text_only_ever_raises_the_user_error(text) -> None:
    try:
        load_ladder_text(text)
    except DlciError as exc:
        assert exc.message


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_mutating_one_value_of_a_valid_ladder_never_crashes(data) -> None:
    doc = yaml.safe_load(SMALL_TEXT)
    budget = data.draw(st.sampled_from(["pr", "merge"]))
    cls = data.draw(st.sampled_from(["cpu", "t4"]))
    key = data.draw(st.sampled_from(["max_epochs", "max_loss", "time_cap_minutes", "nproc"]))
    doc["budgets"][budget][cls][key] = data.draw(yaml_values)
    try:
        ladder = load_ladder_text(yaml.safe_dump(doc))
    except DlciError as exc:
        assert exc.message.startswith(f"budgets.{budget}.{cls}")
    else:
        assert ladder.budgets[budget][cls] is not None


@pytest.mark.parametrize("pattern", ["(T+)+$", "T*T*T*T*T*4"])
def test_the_refused_patterns_really_hang_an_unguarded_match(pattern: str) -> None:
    """The control case of the pattern guard: each refused pattern, matched by plain ``re``
    against a 100-character GPU name, is still running after a second (the guard's own
    ``search`` would never see it: the ladder refuses it first)."""
    import subprocess
    import sys

    code = f"import re; re.search({pattern!r}, 'T' * 100 + '!', re.IGNORECASE)"
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", code], timeout=1.0, check=False)
    assert patterns.problem(pattern)


def test_a_gpu_name_is_cut_before_matching() -> None:
    """A name far longer than any GPU's is cut to MAX_NAME characters before the search."""
    name = "x" * patterns.MAX_NAME + "H100"
    assert patterns.search("H100", name) is None
    assert patterns.search("H100", "NVIDIA H100 80GB HBM3") is not None


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"(?>.*.*.*.*X)", "it uses an atomic group"),  # hides its repetitions from a count
        (r"a*+b", "it uses a possessive repetition"),
        (r"(?<=x)T4", "it uses a look-behind"),
        (r"T4(?<=a{0,9})", "it is not a valid regular expression (look-behind requires"),
    ],
)
def test_constructs_a_name_pattern_never_needs_are_refused(pattern: str, why: str) -> None:
    """Only literals, classes, anchors, groups, alternatives, repetitions and look-aheads
    pass; control: the default ladder's patterns (look-aheads among them) all pass."""
    assert (patterns.problem(pattern) or "").startswith(why)
    ladder = load_ladder()
    assert [patterns.problem(p) for c in ladder.classes.values() for p in c.match] == [None] * sum(
        len(c.match) for c in ladder.classes.values()
    )
