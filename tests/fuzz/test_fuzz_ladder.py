"""Ladders from hypothesis: a valid structure with hostile values, and raw bytes.

Each example is written to a file and run through ``dlci tier --validate FILE`` and ``dlci
tier --ladder FILE --budget pr --hardware cpu`` in a child process under resource limits
(fuzzchild.py): exit 0, 1 or 2, no traceback, at most one error line, and nothing from the
ladder reaches the output raw: no control character, no line starting with ``::`` (a GitHub
workflow command).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml
from fuzzchild import Answer, assert_clean, run_dlci
from hypothesis import given
from hypothesis import strategies as st

HOSTILE_TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        [
            "::error::pwned",
            "::add-mask::x",
            "a\n::error file=x::pwned",
            "\x1b[31mred",
            "x\ry",
            "\x00\x07\x7f",
            "\u202eevil",
            "\u2028::warning::x",
            "a" * 5000,
        ]
    ),
)
NAMES = st.one_of(st.sampled_from(["cpu", "t4", "a100", "pr", "x.y-z_1"]), HOSTILE_TEXT)
HUGE = st.one_of(
    st.integers(-5, 2000),
    st.sampled_from([2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, 10**400, -(10**400)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 5e-324, 0.0, 1e300]),
    st.sampled_from([None, True, "nan", "12", [], {}]),
    HOSTILE_TEXT,
)
HOLE = "@@hole@@"  # a value replaced in the YAML text by nesting or an alias
HOLES = st.sampled_from(
    ["[" * 25 + "]" * 25, "[" * 3000 + "]" * 3000, "{a: " * 30 + "1" + "}" * 30, "*anchor"]
)
ROW = st.fixed_dictionaries(
    {
        key: st.one_of(st.integers(1, 100), HUGE, st.just(HOLE))
        for key in ("max_epochs", "max_loss", "time_cap_minutes", "profile_steps", "nproc")
    },
    optional={"batch_size": HUGE, "max_los": HUGE},
)
SANE_ROW = st.fixed_dictionaries(
    {key: st.integers(1, 100) for key in ("max_epochs", "profile_steps", "nproc")}
    | {"max_loss": st.floats(0.01, 10), "time_cap_minutes": st.floats(0.1, 60)}
)
ROWS = st.tuples(
    st.one_of(SANE_ROW, ROW),
    st.one_of(st.just({}), st.dictionaries(NAMES, st.one_of(ROW, st.none()), max_size=2)),
).map(lambda pair: {"cpu": pair[0], **pair[1]})
CLASS = st.fixed_dictionaries(
    {
        "match": st.one_of(st.lists(HOSTILE_TEXT, max_size=3), HUGE),
        "speed": st.one_of(st.floats(0.01, 10), HUGE),
    },
    optional={"fallback": NAMES, "description": HOSTILE_TEXT},
)
CPU = st.fixed_dictionaries(
    {"match": st.just([]), "speed": st.just(0.02)}, optional={"description": HOSTILE_TEXT}
)
LADDER = st.fixed_dictionaries(
    {
        "version": st.one_of(st.just(1), st.just(1), HUGE),
        "classes": st.tuples(
            CPU, st.one_of(st.just({}), st.dictionaries(NAMES, CLASS, max_size=2))
        ).map(lambda pair: {"cpu": pair[0], **pair[1]}),
        "budgets": st.fixed_dictionaries({b: ROWS for b in ("pr", "merge", "nightly")}),
    },
    optional={"revision": st.one_of(HOSTILE_TEXT, HUGE, st.just(HOLE)), "::error::top": HUGE},
)


def _text(doc: dict[str, Any], hole: str, anchored: bool) -> bytes:
    text = yaml.safe_dump(doc, width=10**6, allow_unicode=True)
    if anchored:  # an anchor for '*anchor'; a ladder must refuse the alias, not expand it
        text = "anchored: &anchor [1, 2]\n" + text
    return text.replace(f"'{HOLE}'", hole).replace(HOLE, hole).encode("utf-8")


LADDER_BYTES = st.one_of(
    st.builds(_text, LADDER, HOLES, st.booleans()),
    st.binary(max_size=300),
    st.binary(max_size=300).map(lambda raw: b"version: 1\nrevision: " + raw),
)
# a raw control character or a workflow command at the start of an output line
RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x85\u2028\u2029\u202a-\u202e]")


def assert_escaped(answer: Answer) -> None:
    assert_clean(answer)
    for stream in (answer.stderr, answer.stdout):
        for line in stream.split("\n"):
            assert not line.lstrip().startswith("::"), stream[-2000:]
            assert not RAW.search(line), ascii(line[-300:])


@given(ladder=LADDER_BYTES)
def test_any_ladder_is_validated_or_refused_cleanly(ladder: bytes) -> None:
    work = Path(tempfile.mkdtemp(prefix="dlci-fuzz-ladder-"))
    try:
        (work / "ladder.yaml").write_bytes(ladder)
        validate = ["tier", "--validate", "ladder.yaml"]
        assert_escaped(run_dlci(validate, cwd=work, what="ladder (tier --validate)"))
        select = ["tier", "--ladder", "ladder.yaml", "--budget", "pr", "--hardware", "cpu"]
        assert_escaped(run_dlci(select, cwd=work, what="ladder (tier --ladder)"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_control_the_property_catches_a_raw_workflow_command_or_control() -> None:
    for err in ("error: x\n::error::pwned", "error: \x1b[31m", "error: a\u2028b"):
        try:
            assert_escaped(Answer(1, "", err, 0.1, 30.0))
        except AssertionError:
            continue
        raise AssertionError(f"not caught: {err!r}")
    assert_escaped(Answer(1, "", "error: \\x3a:error::pwned \\x1b[31m", 0.1, 30.0))
