"""The ladder's JSON schema is generated from the same table as the loader and agrees with it."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import jsonschema
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dlci.errors import DlciError
from dlci.ladder.format import SCHEMA_FILES, json_schema, render_schema
from dlci.ladder.load import default_ladder_path, load_ladder_text

ROOT = Path(__file__).resolve().parents[1]
SMALL_TEXT = (Path(__file__).parent / "data" / "ladders" / "small.yaml").read_text("utf-8")


def test_the_committed_schema_files_are_up_to_date() -> None:
    data = resources.files("dlci") / "data"
    for filename, complete in SCHEMA_FILES.items():
        assert (data / filename).read_text("utf-8") == render_schema(complete), (
            f"regenerate with: python -m dlci.ladder.format  ({filename} is stale)"
        )


def test_the_budgets_folder_points_at_the_shipped_files() -> None:
    for name in ("ladder.yaml", "ladder.schema.json", "ladder-extends.schema.json"):
        assert (ROOT / "budgets" / name).read_bytes() == (
            default_ladder_path().parent / name
        ).read_bytes()


def test_the_default_and_the_small_ladder_are_valid_against_the_schema() -> None:
    validator = jsonschema.Draft202012Validator(json_schema())
    for text in (default_ladder_path().read_text("utf-8"), SMALL_TEXT):
        assert list(validator.iter_errors(yaml.safe_load(text))) == []


def test_the_schema_itself_is_a_valid_draft_2020_12_schema() -> None:
    for complete in (True, False):
        jsonschema.Draft202012Validator.check_schema(json.loads(render_schema(complete)))


def test_an_extending_file_may_leave_out_what_it_inherits() -> None:
    partial = {"version": 1, "extends": "default", "budgets": {"pr": {"a100": {"max_loss": 0.5}}}}
    assert (
        list(jsonschema.Draft202012Validator(json_schema(complete=False)).iter_errors(partial))
        == []
    )
    assert list(jsonschema.Draft202012Validator(json_schema()).iter_errors(partial)) != []


values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=5000),
    st.floats(min_value=-10, max_value=10, allow_nan=False),
    st.text(max_size=4),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(
    key=st.sampled_from(
        [
            "max_epochs",
            "max_loss",
            "time_cap_minutes",
            "profile_steps",
            "nproc",
            "batch_size",
            "max_los",
        ]
    ),
    value=values,
)
def test_schema_and_loader_agree_on_every_tier_value(key, value) -> None:
    doc = yaml.safe_load(SMALL_TEXT)
    doc["budgets"]["pr"]["t4"][key] = value
    schema_ok = not list(jsonschema.Draft202012Validator(json_schema()).iter_errors(doc))
    try:
        load_ladder_text(yaml.safe_dump(doc))
        loader_ok = True
    except DlciError:
        loader_ok = False
    assert schema_ok == loader_ok, (key, value)
