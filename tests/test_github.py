"""Step outputs and annotations cannot be hijacked by the values they carry."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from dlci.report.github import annotation, format_outputs, write_outputs


def test_a_multiline_value_uses_a_random_delimiter() -> None:
    text = format_outputs({"summary": "line 1\nhacked=true"})
    match = re.fullmatch(r"summary<<(ghadelimiter_[0-9a-f-]+)\nline 1\nhacked=true\n\1\n", text)
    assert match, text


@given(value=st.text())
def test_no_value_can_add_a_second_output(value: str) -> None:
    text = format_outputs({"x": value})
    if "\n" in value or "\r" in value:
        assert text.startswith("x<<ghadelimiter_")
        delimiter = text.split("<<", 1)[1].split("\n", 1)[0]
        assert delimiter not in value
    else:
        assert text == f"x={value}\n"


@given(message=st.text())
def test_an_annotation_is_always_one_line(message: str) -> None:
    line = annotation("error", message, title="t", file="f")
    assert "\n" not in line and "\r" not in line
    assert line.startswith("::error file=f,title=t::")


def test_booleans_and_none_render_as_github_expects() -> None:
    assert format_outputs({"passed": True, "failed": False, "loss": None}) == (
        "passed=true\nfailed=false\nloss=\n"
    )


def test_outputs_are_only_written_inside_actions(monkeypatch, tmp_path) -> None:
    assert write_outputs({"a": 1}) is None
    target = tmp_path / "out"
    monkeypatch.setenv("GITHUB_OUTPUT", str(target))
    assert write_outputs({"a": 1}) == target
    assert target.read_text() == "a=1\n"
