"""What script mode's parent hands its child, and what the child answers, declared once.

The parent (run.py, no torch) writes a plan to a file named in ``$DLCI_SCRIPT_PLAN``; the
child (``python -m dlci.script.child``) reads it, runs the user's script under the hooks and
writes its answer to the plan's ``result`` file. Both are classes here, tagged by ``mode``
(the plan) and read back whole: a missing or mistyped field is a located message, not a
KeyError in the middle of a run.

>>> plan = ProfilePlan(script="train.py", schedule=Schedule(wait=1, warmup=1, steps=3), out="o")
>>> decode_plan(encode(plan)) == plan
True
>>> decode_answer(b'{"error": "no model", "where": "train.py:3"}').error
'no model'
>>> decode_answer(b'{"error": 3}')  # doctest: +ELLIPSIS
Traceback (most recent call last):
dlci.errors.DlciError: script mode: the child's answer cannot be read: Expected ... at `$.error`
"""

from __future__ import annotations

from typing import Any

import msgspec

from dlci import jsonio
from dlci.errors import DlciError
from dlci.ladder.model import Tier
from dlci.report.fields import DoctorReport, Memorization

PLAN_VARIABLE = "DLCI_SCRIPT_PLAN"  # the plan file's path, for the child


class Plan(msgspec.Struct, kw_only=True, frozen=True, tag_field="mode"):
    """What every mode needs: the command (its script or module and arguments), where the
    answer goes (run_child sets it), the seed and whether to print progress."""

    script: str = ""  # the script's path, or the module's name when ``module``
    module: bool = False  # ``python -m NAME``
    args: list[str] = []
    result: str = ""
    seed: int = 0
    quiet: bool = False


class Settings(msgspec.Struct, kw_only=True, frozen=True):
    """The memorization engine's settings (memorization.engine.MemorizeConfig's fields that
    script mode sets), from the tier and the request."""

    max_epochs: int
    max_loss: float | None
    time_cap_s: float
    batch_size: int = 16
    max_relative_loss: float | None = None
    seed: int = 0
    early_stop: bool = True


class Outputs(msgspec.Struct, kw_only=True, frozen=True):
    """The memorize request's fields the child's report needs (MemorizeRequest's)."""

    out: str = "dlci-artifacts"
    json: str | None = None
    seed: int = 0
    tracker: str = "tensorboard"
    quiet: bool = False
    early_stop: bool = True


class MemorizePlan(Plan, tag="memorize", frozen=True):
    settings: Settings
    label: str
    request: Outputs
    tier: Tier
    spec: str


class Schedule(msgspec.Struct, kw_only=True, frozen=True):
    """torch.profiler's schedule, in the script's optimizer steps."""

    wait: int
    warmup: int
    steps: int


class ProfilePlan(Plan, tag="profile", frozen=True):
    schedule: Schedule
    out: str
    device: str | None = None


class DoctorPlan(Plan, tag="doctor", frozen=True):
    tier: Tier
    spec: str
    only: str | None = None
    stop_on_fail: bool = False
    out: str = "dlci-artifacts"
    json: str | None = None
    markdown: str | None = None
    policy: dict[str, Any] = {}  # dlci.policy.Policy.to_json's form (Policy.from_json reads it)
    today: str = ""  # ISO date: the day the waivers' expiry is judged on


AnyPlan = MemorizePlan | ProfilePlan | DoctorPlan


class MemorizeFound(msgspec.Struct, kw_only=True, frozen=True):
    exit_code: int
    report: Memorization
    json_path: str
    curve: str | None = None


class ProfileFound(msgspec.Struct, kw_only=True, frozen=True):
    trace: str | None
    steps: int
    device: str
    cpu_only: bool
    wall_time_s: float
    log: str | None = None
    steps_taken: int = 0
    error: str | None = None


class DoctorFound(msgspec.Struct, kw_only=True, frozen=True):
    report: DoctorReport
    json_path: str
    exit_code: int
    html: str | None = None


class Answer(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """The child's answer: what script mode cannot follow (``error``, located at ``where``,
    with a ``hint``), the script's own failure, or one mode's result."""

    error: str | None = None
    where: str | None = None
    hint: str | None = None
    failure: str | None = None
    memorize: MemorizeFound | None = None
    profile: ProfileFound | None = None
    doctor: DoctorFound | None = None


def encode(value: AnyPlan | Answer) -> bytes:
    """JSON as jsonio writes it (torch's version strings, NaN as null)."""
    return jsonio.encode(value, indent=False)


def decode_plan(blob: bytes) -> AnyPlan:
    """The plan the parent wrote (ours, so a mistake here is dl-ci's, said as such)."""
    try:
        return msgspec.json.decode(blob, type=AnyPlan)
    except msgspec.DecodeError as exc:
        raise DlciError(f"script mode: the plan cannot be read: {exc}") from None


def decode_answer(blob: bytes) -> Answer:
    """The child's answer (it ran the user's script in its process: read, then checked)."""
    try:
        return msgspec.json.decode(blob, type=Answer)
    except msgspec.DecodeError as exc:
        raise DlciError(f"script mode: the child's answer cannot be read: {exc}") from None
    except RecursionError:  # nested past the interpreter's limit (jsonio.decode's case)
        raise DlciError("script mode: the child's answer is nested too deeply") from None
