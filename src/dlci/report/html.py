"""One self-contained HTML report for a folder of dl-ci's reports (``report.html``).

It reads what the folder holds, written by ``dlci doctor``, ``dlci memorize``, ``dlci profile``
and the action (``doctor.json``, ``figures/*.png``, ``memorization.json`` and its curve,
``utilization.json`` and its PNG, ``comparison.md``, ``trend.svg`` and ``history.md``), and
writes one file with every image inside it (``data:`` URIs) and no network reference, so it
opens from a downloaded artifact. Sections, in order: the verdicts, the memorization curve, the
doctor's checks and figures, utilization and memory, the comparison with the base branch, the
history; a section whose files are not in the folder says so.

Every value comes from files that a pull request's code may have written: the template
escapes all of it (Jinja2's autoescape), a field of the wrong type shows as missing, an image
is embedded only when it is a PNG (or, for the history's trend, an SVG) by its first bytes and
under :data:`MAX_IMAGE` bytes, and shown only through ``<img>``, where nothing in it runs.
No torch and no matplotlib: the host renders the job's report (``dlci summary``).
"""

from __future__ import annotations

import base64
import datetime as dt
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from dlci import jsonio
from dlci.errors import DlciError
from dlci.fsutil import atomic_write_text, is_null_device, read_input
from dlci.report import doctor as doctor_report
from dlci.report import memorization as memorization_report
from dlci.report.fields import DoctorReport, Memorization, read_run
from dlci.report.figures import FOLDER, HEALTHY, TITLES
from dlci.report.text import clean

REPORT_NAME = "report.html"
TEMPLATE = "report.html.j2"
MAX_IMAGE = 8 << 20  # bytes: one embedded image
MAX_TEXT = 64 << 10  # characters of a Markdown file shown as text
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURE_ORDER = ("examples", "lr-range", "grad-flow", "update-ratio", "activations", "weight-norms")


UNREADABLE = "unreadable"  # what _read_json gives for a report that is there but unusable
R = TypeVar("R")


def _read_json(path: Path) -> dict[str, Any] | str | None:
    """A report as a dict; None when it is missing; UNREADABLE when it is a link, too big,
    not JSON or not an object (a report folder is a pull request's output)."""
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_symlink() or not path.is_file():
        return UNREADABLE
    try:
        data = jsonio.decode(read_input(path, what="a report"))
    except (DlciError, OSError, ValueError):
        return UNREADABLE
    return data if isinstance(data, dict) else UNREADABLE


def _text(value: Any, limit: int = 400) -> str:
    """Outside text for the page: one line, control characters shown, cut to ``limit``."""
    if value is None or isinstance(value, dict | list):
        return ""
    try:
        return clean(value, limit=limit)
    except ValueError:  # an integer of more digits than Python turns into text
        return ""


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _number(value: Any, spec: str = ".4g") -> str:
    """A number of a report as text, or "" for anything else: a bool, NaN, an integer format
    of a float, a number too large to format (a report's 10**400)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return ""
    if spec.endswith("d") and not isinstance(value, int):
        return ""
    try:
        if not math.isfinite(value):
            return ""
        return format(value, spec)
    except (OverflowError, ValueError):
        return ""


def image(path: Path, *, svg: bool = False) -> str | None:
    """``path`` as a data URI when it is a PNG (or an SVG when ``svg``) within the size limit;
    a link, or a file in a linked folder, is not followed."""
    try:
        if path.is_symlink() or path.parent.is_symlink():
            return None
        if not path.is_file() or path.stat().st_size > MAX_IMAGE:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if data.startswith(PNG_MAGIC):
        kind = "image/png"
    elif svg and data.lstrip()[:5] in (b"<?xml", b"<svg ", b"<svg\n"):
        kind = "image/svg+xml"
    else:
        return None
    return f"data:{kind};base64,{base64.b64encode(data).decode('ascii')}"


def _markdown_text(path: Path) -> str | None:
    try:
        if not path.is_file() or path.is_symlink():
            return None
        with path.open(encoding="utf-8", errors="replace") as handle:
            text = handle.read(MAX_TEXT + 1)
    except OSError:
        return None
    cut = len(text) > MAX_TEXT
    text = "".join(c if c in "\n\t" or c >= " " else "\ufffd" for c in text[:MAX_TEXT])
    return text + ("\n[cut]" if cut else "")


def _verdict(kind: str, report: dict[str, Any] | str | None, what: str) -> dict[str, str]:
    if report is None:
        return {"gate": kind, "verdict": "not run", "reason": f"no {what} in this folder"}
    if not isinstance(report, dict):
        return {"gate": kind, "verdict": "unreadable", "reason": f"{what} is not a report "
                "(a link, too big, not JSON or not an object)"}  # fmt: skip
    verdict = _text(report.get("verdict"), 20) or "unknown"
    return {"gate": kind, "verdict": verdict, "reason": _text(report.get("reason"), 600)}


def _read_typed(raw: dict[str, Any] | str | None, read: Callable[[Any], R]) -> R | str | None:
    """A report of the folder read into its classes by ``read`` (doctor.read,
    memorization.read); None when it is missing, UNREADABLE as _read_json says, or what is
    wrong with it (a field of the wrong type, or missing)."""
    if not isinstance(raw, dict):
        return raw
    try:
        return read(raw)
    except ValueError as exc:
        return str(exc)


def _doctor(folder: Path, report: DoctorReport | str | None) -> dict[str, Any] | None:
    if not isinstance(report, DoctorReport):
        return None
    checks = [
        {"id": _text(c.id, 600), "status": _text(c.status, 600),
         "measured": _text(c.measured, 600), "expected": _text(c.expected, 600),
         "cause": _text(c.cause, 600), "fix": _text(c.fix, 600)}
        for c in report.checks
    ]  # fmt: skip
    figures = []
    by_id = {c.id: c for c in report.checks}
    for kind in FIGURE_ORDER:
        uri = image(folder / FOLDER / f"{kind}.png")
        entry: dict[str, Any] = {
            "id": kind, "title": TITLES[kind], "healthy": HEALTHY[kind], "uri": uri
        }  # fmt: skip
        entry["table"] = (
            _examples_table(folder / FOLDER / "examples.json") if kind == "examples" else None
        )
        if not uri:  # a line that says why, where an empty figure would stand
            if kind == "examples":
                continue  # drawn from the batch, not from a check: nothing to explain
            check = by_id.get(kind)
            if check is None:
                entry["why"] = "the check did not run"
            elif check.status == "skip":
                why = _text(check.cause or check.measured, 300)
                entry["why"] = "the check was skipped" + (f": {why}" if why else "")
            else:
                entry["why"] = "the check recorded nothing to draw"
        figures.append(entry)
    tally = ", ".join(
        f"{_number(report.counts.get(k), 'd') or 0} {k}" for k in ("fail", "warn", "pass", "skip")
    )
    return {"checks": checks, "figures": figures, "tally": tally}


def _examples_table(path: Path) -> dict[str, Any] | None:
    """Tabular training examples (figures/examples.json) as text for an HTML table; None
    when there is none or it is not the shape the doctor writes."""
    data = _read_json(path)
    if not isinstance(data, dict):
        return None
    columns, rows = _list(data.get("columns"))[:12], _list(data.get("rows"))[:20]
    if not columns or not all(isinstance(r, list) for r in rows):
        return None
    return {
        "columns": [_text(c, 40) for c in columns],
        "rows": [[_text(v, 60) for v in r[: len(columns)]] for r in rows],
        "width": _number(data.get("width"), "d"),
    }


def _memorization_verdict(report: Memorization | str | None) -> dict[str, str]:
    if not isinstance(report, Memorization):
        if report is None or report == UNREADABLE:
            return _verdict("memorization", report, "memorization.json")
        return {"gate": "memorization", "verdict": UNREADABLE, "reason": _text(report, 600)}
    verdict = _text(report.verdict, 20) or "unknown"
    return {"gate": "memorization", "verdict": verdict, "reason": _text(report.reason, 600)}


def _memorization(folder: Path, report: Memorization | str | None) -> dict[str, Any] | None:
    if not isinstance(report, Memorization):
        return None
    return {
        "curve": image(folder / "memorization-curve.png"),
        "facts": [
            ("criterion", _text(report.criterion)),
            ("start loss", _number(report.start_loss)),
            ("best loss", _number(report.best_loss)),
            ("steps", _number(report.steps, "d")),
            ("training time (s)", _number(report.wall_time_s, ".3g")),
            ("device", _text(report.device, 40)),
        ],
    }


def _utilization(folder: Path, report: dict[str, Any] | str | None) -> dict[str, Any] | None:
    if not isinstance(report, dict):
        return None
    memory = _dict(report.get("memory"))
    peak = _number(memory.get("peak_allocated_bytes"), ".6g")
    peak_mib = float(peak) / 2**20 if peak else None
    facts = [
        ("GPU utilization (%)", _number(report.get("gpu_utilization_pct"), ".1f") or "no GPU"),
        ("profiled steps", _number(report.get("steps"), "d")),
        ("memory peak allocated (MiB)", _number(peak_mib, ".1f")),
        ("memory peak phase", _text(memory.get("peak_phase"), 40)),
    ]
    lines = []
    for key in ("warnings", "recommendations"):
        for item in _list(report.get(key)):
            text = item.get("message") if isinstance(item, dict) else item
            if _text(text):
                lines.append((key[:-1], _text(text, 600)))
    # no GPU figure (a CPU-only trace): the caption must not ask for a busy GPU
    cpu_only = not _number(report.get("gpu_utilization_pct"), ".1f")
    return {
        "plot": image(folder / "utilization.png"),
        "facts": facts,
        "notes": lines[:20],
        "cpu_only": cpu_only,
    }


def _doctor_verdict(report: DoctorReport | str | None) -> dict[str, str]:
    """The doctor's verdict, with its tally and the root causes it names."""
    if not isinstance(report, DoctorReport):
        if report is None or report == UNREADABLE:
            return _verdict("doctor", report, "doctor.json")
        return {"gate": "doctor", "verdict": UNREADABLE, "reason": _text(report, 600)}
    verdict = _text(report.verdict, 20) or "unknown"
    row = {"gate": "doctor", "verdict": verdict, "reason": _text(report.reason or None, 600)}
    if not row["reason"]:
        counts = report.counts
        parts = [f"{_number(counts.get(k), 'd')} {k}" for k in ("fail", "warn", "pass", "skip")
                 if _number(counts.get(k), "d")]  # fmt: skip
        roots = [_text(r, 40) for r in report.roots]
        row["reason"] = ", ".join(parts) + (f"; root causes: {', '.join(roots)}" if roots else "")
    return row


def _profile_verdict(report: dict[str, Any] | str | None) -> dict[str, str]:
    """The profile's gates (``report["gate"]``) when any was asked for, else what it measured."""
    if not isinstance(report, dict):
        return _verdict("profile", report, "utilization.json")
    util = _number(report.get("gpu_utilization_pct"), ".1f")
    measured = f"GPU utilization {util}%" if util else "GPU utilization not measured (no GPU)"
    gate = report.get("gate")
    if not isinstance(gate, dict):
        return {"gate": "profile", "verdict": "no gate", "reason": measured}
    if gate.get("applicable") is False:
        verdict = "not applicable"
    else:
        verdict = "pass" if gate.get("passed") is True else "fail"
    return {
        "gate": "profile",
        "verdict": verdict,
        "reason": _text(gate.get("message"), 600) or measured,
    }


def build_context(folder: str | Path, job: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the template shows, from what ``folder`` holds (every value made safe here).
    ``job``: the host's own verdict on the job (``verdict``, ``problems``), shown above the
    gates' reports, which are their claims about themselves."""
    folder = Path(folder)
    host = None
    if job is not None:
        host = {
            "verdict": _text(job.get("verdict"), 20) or "unknown",
            "problems": [_text(p, 600) for p in _list(job.get("problems"))[:30]],
        }
    doctor = _read_typed(_read_json(folder / "doctor.json"), doctor_report.read)
    memorization = _read_typed(_read_json(folder / "memorization.json"), memorization_report.read)
    utilization = _read_json(folder / "utilization.json")
    comparison = _markdown_text(folder / "comparison.md")
    trend = image(folder / "trend.svg", svg=True)
    history = _markdown_text(folder / "history.md")
    return {
        "title": f"dl-ci report: {clean(folder.resolve().name, limit=80)}",
        "host": host,
        "created": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "verdicts": [
            _memorization_verdict(memorization),
            _doctor_verdict(doctor),
            _profile_verdict(utilization),
        ],
        "memorization": _memorization(folder, memorization),
        "doctor": _doctor(folder, doctor),
        "utilization": _utilization(folder, utilization),
        "comparison": comparison,
        "history": {"trend": trend, "text": history} if trend or history else None,
        "timing": _timing(_read_json(folder / "run.json")),
    }


KIT_PARTS = {"copies_s": "copies of the checkout", "containers_s": "container start and stop",
             "commit_s": "the install's image"}  # fmt: skip


def _timing(run: dict[str, Any] | str | None) -> list[dict[str, str]]:
    """Where the job's container time went (run.json's timing, the host's): one row each for
    the project's steps and the kit's own parts; nothing for a run without it, or a run.json
    with a field of a wrong type (read_run)."""
    try:
        timing = read_run(run).timing if isinstance(run, dict) else None
    except ValueError:
        return []
    if not timing:
        return []
    rows = []
    for name, value in list(timing.project.items())[:10]:
        if _number(value, ".1f"):
            rows.append({"who": "the project", "what": _text(name, 40),
                         "seconds": _number(value, ".1f")})  # fmt: skip
    for key, words in KIT_PARTS.items():
        seconds = _number(getattr(timing.kit, key), ".1f")
        if seconds:
            rows.append({"who": "the kit", "what": words, "seconds": seconds})
    return rows


def render(context: dict[str, Any]) -> str:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("dlci.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env.get_template(TEMPLATE).render(**context)


def report_folder(json_path: str, out: str | os.PathLike[str] | None) -> bool:
    """Whether the figures and report.html go into ``out``: the report is a file there (not
    standard output, the null device or a file elsewhere, which a page of ``out`` would not
    show)."""
    if json_path == "-" or not out or is_null_device(json_path):
        return False
    return Path(json_path).resolve().parent == Path(out).resolve()


def write_report(
    folder: str | Path, path: str | Path | None = None, *, job: dict[str, Any] | None = None
) -> Path:
    """Render ``folder``'s report.html (or ``path``) and return where it went; ``job`` as in
    :func:`build_context`."""
    target = Path(path) if path is not None else Path(folder) / REPORT_NAME
    return atomic_write_text(target, render(build_context(folder, job)))
