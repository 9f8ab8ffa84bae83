"""What a step's own report says about it, and what the host holds a report's claims against.

``judge`` is shared by ``dlci run`` in the container (its exit code against the report it
wrote) and by the host on the copies it made (dlci.action.host.gates). ``held_to_policy`` is the
host's alone: a doctor report's waivers are claims from the pull request's code, held
against the waivers of the host's trusted configuration (the job plan's ``config``).
Host-side, never imports torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dlci import jsonio
from dlci.action.host.summary import EVIDENCE, evidence
from dlci.errors import DlciError
from dlci.fsutil import read_input
from dlci.policy import CHECK_IDS, Policy, threshold_table

TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off", "")
NO_TESTS = (
    "no tests were collected: {how} (a -k or -m that deselects every test, or test paths "
    "without tests); if the project has none, say so with allow-no-tests: true"
)
MAX_CLAIMS = 5  # the doctor's false claims named in one reason


def as_bool(value: str) -> bool:
    """An action input or option value as a boolean; ValueError for anything else.

    >>> as_bool("True"), as_bool(""), as_bool("off")
    (True, False, False)
    """
    word = value.strip().lower()
    if word in TRUE or word in FALSE:
        return word in TRUE
    raise ValueError(f"expected true or false, got {value!r}")


def judge(
    name: str,
    code: int,
    status: str,
    folder: Path,
    *,
    gpu_gate: bool = False,
    allow_no_tests: bool = False,
    who: str = "",
) -> dict[str, Any]:
    """What a step's evidence changes in its record (``{}``: nothing).

    ``status`` is what the exit code alone says; a step passes only when its report agrees.
    ``who`` exited with ``code``: the step (default), or on the host the gate's container.

    >>> judge("tests", 5, "failed", Path("/nonexistent"))["reason"][:29]
    'no tests were collected: pyte'
    """
    if name not in EVIDENCE or status not in ("passed", "failed"):
        return {}
    if name == "tests" and code == 5:
        if allow_no_tests:
            return {"status": "passed", "reason": "no tests were collected (allow-no-tests)"}
        return {"status": "failed", "reason": NO_TESTS.format(how="pytest exited 5")}
    kind, words = evidence(name, folder, gpu_gate=gpu_gate)
    who = who or ("pytest" if name == "tests" else name)
    if kind == "none" and not allow_no_tests:
        return {"status": "failed", "reason": NO_TESTS.format(how=f"{who} exited {code} {words}")}
    if kind in ("pass", "none"):
        if status == "passed":
            return {}
        return {"reason": f"{who} exited {code} although {EVIDENCE[name]} says it passed"}
    if status == "failed":  # a failing report explains itself; a missing one is named
        return {} if kind == "fail" else {"reason": f"{who} exited {code} {words}"}
    if kind == "fail":
        return {"status": "failed", "reason": f"no positive verdict: {who} exited {code} {words}"}
    lead = "the tests" if name == "tests" else "the target"
    return {
        "status": "failed",
        "reason": f"{lead} exited before a verdict: {who} exited {code} {words}",
    }


def held_to_policy(folder: Path, policy: Policy) -> dict[str, Any]:
    """The doctor step's record changes when doctor.json leaves out checks of the doctor's
    ladder, or claims a waiver the trusted policy does not give (``{}``: neither).

    A check reported as waived that the policy does not waive in that mode, or a fail turned
    warn without a warn-only waiver, or an expired waiver still applied, or thresholds other
    than the policy's (a doctor that read the pull request's file, say because its code
    rewrote the doctor's --plan argument or the plan's copy it reads), fails the step: the
    report came from the pull request's code, the policy from the host's job plan.
    """
    try:
        report = jsonio.decode(read_input(folder / "doctor.json", what="doctor report"))
    except (DlciError, jsonio.DecodeError):
        return {}  # judge has already named a missing or broken report
    if not isinstance(report, dict):
        return {}
    missing = _missing_checks(report)
    if missing:
        return {"status": "failed", "reason": missing}
    found = list(dict.fromkeys(_false_claims(report, policy)))
    found += _threshold_claims(report, policy)
    if not found:
        return {}
    shown = "; ".join(found[:MAX_CLAIMS]) + (
        f"; and {len(found) - MAX_CLAIMS} more" if len(found) > MAX_CLAIMS else ""
    )
    where = policy.origin or "defaults: no waiver"
    return {
        "status": "failed",
        "reason": f"doctor.json claims waivers or thresholds the trusted configuration ({where}) "
        f"does not give: {shown}",
    }


def held_to_gates(
    folder: Path, min_gpu_util: float | None, max_gpu_memory: float | None
) -> dict[str, Any]:
    """The profile step's record changes when utilization.json was gated more loosely than
    the trusted configuration asks (``{}``: not so).

    The profile gates with the trusted values (``dlci run`` passes them from the host's
    plan); a report gated at a lower ``min-gpu-util`` or a higher ``max-gpu-memory`` (a profile
    that read the pull request's own file, its code having dropped the --plan argument or the
    gate's options) fails the step, and so does a gate without a bound the trusted
    configuration sets (the other bound kept, this one dropped). A missing gate is judge's
    to name.
    """
    try:
        report = jsonio.decode(read_input(folder / "utilization.json", what="utilization report"))
    except (DlciError, jsonio.DecodeError):
        return {}
    gate = report.get("gate") if isinstance(report, dict) else None
    if not isinstance(gate, dict):
        return {}
    found = []
    used = _number(gate.get("minimum"))
    if min_gpu_util is not None and (used is None or used < min_gpu_util):
        at = "no min-gpu-util" if used is None else f"min-gpu-util {used:g}"
        found.append(f"{at}, the trusted configuration's is {min_gpu_util:g}")
    used = _number(gate.get("max_gpu_memory"))
    if max_gpu_memory is not None and (used is None or used > max_gpu_memory):
        at = "no max-gpu-memory" if used is None else f"max-gpu-memory {used:g}"
        found.append(f"{at}, the trusted configuration's is {max_gpu_memory:g}")
    if not found:
        return {}
    return {"status": "failed", "reason": "utilization.json was gated at " + "; ".join(found)}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if abs(value) < 1e300 else None


def _missing_checks(report: dict[str, Any]) -> str:
    """The checks of the doctor's ladder that doctor.json does not report: the action's doctor
    runs every one (a check that cannot judge is reported as skipped, with why), so a report
    without some came from a doctor run on fewer (``--only``, the pull request's code having
    rewritten its command line)."""
    checks = report.get("checks")
    listed = checks[:1000] if isinstance(checks, list) else []
    seen = {str(c.get("id")) for c in listed if isinstance(c, dict)}
    missing = [check for check in CHECK_IDS if check not in seen]
    if not missing:
        return ""
    return (
        f"doctor.json does not report {len(missing)} of the doctor's {len(CHECK_IDS)} checks "
        f"({', '.join(missing)}): the action's doctor runs every one, and one that cannot judge "
        "is reported as skipped with why; a report without them came from a doctor run on "
        "fewer (--only)"
    )


def _false_claims(report: dict[str, Any], policy: Policy) -> Iterator[str]:
    """One line per waiver doctor.json applies that the trusted policy does not give."""
    checks = report.get("checks")
    for check in checks[:1000] if isinstance(checks, list) else ():
        if not isinstance(check, dict):
            continue
        name = str(check.get("id") or "?")[:80]
        claimed = check.get("waived")
        mode = claimed.get("mode") if isinstance(claimed, dict) else None
        if claimed is not None:
            yield from _unless_given(name, str(mode)[:20], policy)
        turned = check.get("status") == "warn" and (
            mode == "warn-only" or check.get("status_without_waiver") == "fail"
        )
        if turned and claimed is None:
            yield from _unless_given(name, "warn-only", policy)
        cause = check.get("cause")
        if claimed is None and check.get("status") == "skip" and str(cause).startswith("waived"):
            yield from _unless_given(name, "skip", policy)
    waivers = report.get("waivers")
    for item in waivers[:1000] if isinstance(waivers, list) else ():
        if isinstance(item, dict) and item.get("applied"):
            name = str(item.get("check") or "?")[:80]
            yield from _unless_given(name, str(item.get("mode"))[:20], policy)


def _threshold_claims(report: dict[str, Any], policy: Policy) -> Iterator[str]:
    """One line per threshold doctor.json ran with that the trusted policy does not set."""
    claimed = report.get("policy")
    found = claimed.get("thresholds") if isinstance(claimed, dict) else None
    if not isinstance(found, dict):
        return
    table = threshold_table()

    def changed(values: Any) -> dict[str, Any]:
        return {
            str(k)[:80]: v
            for k, v in list(values.items())[:1000]
            if k not in table or v != table[k].default
        }

    used, trusted = changed(found), changed(policy.thresholds)
    for name in sorted(set(used) | set(trusted)):  # every one compared; the caller cuts
        if used.get(name) != trusted.get(name):
            yield (
                f"threshold {name} = {str(used.get(name, 'default'))[:20]}, the trusted "
                f"configuration's is {trusted.get(name, 'the default')}"
            )


def _unless_given(check: str, mode: str, policy: Policy) -> Iterator[str]:
    trusted = policy.waiver(check)
    if trusted is None or trusted.mode != mode:
        yield f"{check} reported as waived ({mode}), not waived so by the trusted configuration"
    elif trusted.expired():
        yield f"{check} waived by a waiver that expired on {trusted.until} ({trusted.source})"
