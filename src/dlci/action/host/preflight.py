"""What the runner host must have before a job starts: checks that never import torch.

``preflight`` runs them all and writes ``preflight.json``, pass or fail:

- the fork guard: a pull request from a fork on a self-hosted runner is refused unless the
  workflow allows it (docs/security.md);
- the Docker engine, and the NVIDIA container runtime when a GPU is present, each with the
  message users search for (``could not select device driver "" with capabilities: [[gpu]]``);
- the tier, selected from a ladder the pull request cannot raise (``trusted_ladder``,
  ``ceiling``), written with the trusted configuration as the job plan (dlci.ladder.plan);
- with a baseline to compare with and a bound, the tier's profile_steps sized from the
  baseline's step scatter (dlci.action.github.sizing), best effort, before the plan's one
  write: preflight.json is never rewritten.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlci import jsonio
from dlci.action.host.scratch import refuse_links
from dlci.config.trust import trusted_config
from dlci.errors import DlciError
from dlci.fsutil import refuse_link
from dlci.hardware import PIN_VARIABLE, detect, pinned_gpus
from dlci.ladder.model import Ladder, Tier
from dlci.ladder.plan import JobPlan
from dlci.ladder.tiers import choose_tier
from dlci.ladder.trust import cap_tier, ceiling_limits, ladder_at_commit
from dlci.trust.basecommit import Unverifiable

if TYPE_CHECKING:  # a type only: numpy (the sizing's arithmetic) only when a baseline is asked for
    from dlci.action.github.sizing import Sizing

PR_EVENTS = frozenset(
    {"pull_request", "pull_request_target", "pull_request_review", "pull_request_review_comment"}
)
SECURITY_DOC = "docs/security.md"
CDI_SPECS = (Path("/etc/cdi"), Path("/var/run/cdi"))
REPORT_NAME = "preflight.json"


@dataclass(frozen=True)
class PreflightRequest:
    """What ``dlci preflight`` was asked to check."""

    out: Path
    budget: str = "auto"
    hardware: str = "auto"
    ladder: str | None = None
    allow_fork_prs: bool = False
    max_time_cap_minutes: float | None = None
    docker: bool = True
    timeout: float = 10.0
    probes: tuple[str, ...] = ("nvml", "nvidia-smi")
    copies: tuple[str, ...] = field(default=())  # more places for the report ('-': stdout)
    workdir: Path | None = None  # the project's directory: its configuration (None: not read)
    baseline: str = "none"  # the baseline to size the profile from: auto, a run id, or none
    base_dir: Path | None = None  # where the fetched baseline is kept for the comparison
    artifact_prefix: str = "dlci-artifacts"  # the baseline's artifact: PREFIX-<class>-<job id>
    token: str = field(default="", repr=False)  # the job's token, for the baseline's download


def preflight(request: PreflightRequest) -> dict[str, Any]:
    """Every check before a job; the report, also written to OUT/preflight.json, pass or fail.

    A refusal or a broken host is a DlciError, raised after the report (with the error) is
    written, so the job summary can say what happened.
    """
    report: dict[str, Any] = {"schema_version": 1, "kind": "preflight", "passed": False}
    sizing: Sizing | None = None
    start = time.perf_counter()
    try:
        report["fork_guard"] = fork_guard(allow=request.allow_fork_prs)
        if request.workdir is not None:
            refuse_linked_files(request.workdir, CONFIG_FILES, "the configuration file")
            report["config"] = trusted_configuration(request.workdir)
            if not request.ladder:  # the ladder input, else the configuration's (trusted) key
                request = replace(request, ladder=report["config"]["values"].get("ladder"))
        if request.ladder and request.ladder != "default":
            refuse_linked_files(Path("."), [request.ladder], "the ladder")
        # the job plan (plan_version, tier, config), written once here with the report
        report.update(_tier_decision(request, report.get("config")))
        report["warnings"] += (report.get("config") or {}).get("notes", [])
        report["gpu"] = report["tier"]["hardware_class"] != "cpu"
        if pinned_gpus():
            report["runner_gpus"] = runner_gpus(request, report["tier"])
        if request.docker:
            report["docker"] = check_docker(gpu=report["gpu"], timeout=max(request.timeout, 5.0))
        sizing = size_profile(request, report)  # the plan's tier, sized in place
        report["passed"] = True
    except DlciError as exc:
        report["error"] = {"message": exc.message, "hint": exc.hint}
        raise
    finally:
        report["wall_time_s"] = round(time.perf_counter() - start, 3)
        if sizing is not None:
            report["profile_sizing"] = sizing
        for dest in (str(request.out / REPORT_NAME), *request.copies):
            _emit(report, dest)
    return report


def size_profile(request: PreflightRequest, report: dict[str, Any]) -> Sizing | None:
    """Size the report's tier from the baseline (None: no baseline asked for, nothing
    fetched). Best effort, as a step that may fail: whatever goes wrong is the record's
    reason, the tier keeps its own steps, and preflight goes on."""
    if request.baseline == "none":
        return None
    # numpy (the interval's arithmetic): only when a baseline is asked for
    from dlci.action.github.sizing import Sizing, prepare

    if request.base_dir is None:
        return Sizing(reason="not sized: no folder to keep the baseline in (--base-dir)")
    tier = report["tier"]
    kept = {key: tier[key] for key in ("profile_steps", "reasons")}  # sizing replaces, never edits
    try:
        return prepare(report, into=request.base_dir, spec=request.baseline,
                       prefix=request.artifact_prefix, token=request.token)  # fmt: skip
    except Exception as exc:  # a bug in the sizing never fails the preflight: the tier is kept
        tier.update(kept)
        return Sizing(reason=f"not sized: {type(exc).__name__}: {str(exc)[:200]}")


CONFIG_FILES = ("dlci.toml", "pyproject.toml")


def refuse_linked_files(folder: Path, names: Sequence[str], what: str) -> None:
    """Refuse a file of the checkout the host reads (the configuration, the ladder) that is a
    symbolic link, or lies under one, below the working folder: read through it, a host file
    would land in the log in a parse error. A path outside the checkout is the runner's own."""
    for name in names:
        path = folder / name
        if os.path.lexists(path):
            refuse_links(path, what)


def _emit(report: dict[str, Any], dest: str) -> None:
    if dest == "-":
        print(jsonio.encode(report).decode(), end="", flush=True)
    else:
        refuse_link(Path(dest).parent, "report")
        jsonio.write(dest, report)


def _tier_decision(request: PreflightRequest, config: dict[str, Any] | None) -> dict[str, Any]:
    """The ladder to trust, the tier it gives on this host, and the notes on both; the job
    plan (dlci.ladder.plan): that tier with the trusted configuration ``config``."""
    ladder, note, verified = trusted_ladder(request.ladder)
    tier = choose_tier(
        budget=request.budget,
        hardware=request.hardware,
        ladder=ladder,
        timeout=request.timeout,
        probes=request.probes,
    )
    notes = [note] if note else []
    tier = ceiling(tier, request.max_time_cap_minutes, verified, notes)
    used = ladder.source if isinstance(ladder, Ladder) else ladder
    return {
        "ladder": {"used": used, "verified": verified, "notes": notes},
        **JobPlan(tier, config).to_json(),
        "warnings": list(tier.warnings) + notes,
    }


def ceiling(tier: Tier, limit: float | None, verified: bool, notes: list[str]) -> Tier:
    """Cap the tier: at ``limit`` minutes (max-time-cap-minutes) always; and every value of
    an unverified ladder's tier at the default ladder's (ladder.trust.ceiling_limits)."""
    limits = {} if verified else ceiling_limits(tier)
    if limit is not None and limit < limits.get("time_cap_minutes", (limit + 1, ""))[0]:
        limits["time_cap_minutes"] = (limit, "the max-time-cap-minutes input")
    return cap_tier(tier, limits, notes)


def runner_gpus(request: PreflightRequest, tier: dict[str, Any]) -> dict[str, Any]:
    """On a runner pinned to some of the machine's GPUs (``DLCI_RUNNER_GPUS``, one machine
    with several runners: docs/runner.md): its GPUs are found, and the tier's processes (one
    per GPU) fit on them; a neighbour's GPUs are never counted."""
    pinned = list(pinned_gpus())
    info = detect(timeout=request.timeout, probes=request.probes)
    found = [g.uuid or "" for g in info.gpus]
    if request.hardware == "auto" and not found:
        raise DlciError(
            f"this runner is pinned to GPU(s) {', '.join(pinned)} ({PIN_VARIABLE} in its "
            f"environment), but none was found: {'; '.join(info.probes)}",
            hint="check nvidia-smi -L on the machine; after a GPU changed, run "
            "docker/runner/setup.sh again so the runner's .env names the GPUs it has",
        )
    nproc = int(tier.get("nproc") or 1)
    if found and nproc > len(found):
        raise DlciError(
            f"the tier runs {nproc} processes, one per GPU, but this runner has "
            f"{len(found)} GPU(s) of its own ({', '.join(found)}); the machine's other GPUs "
            "belong to other runners",
            hint=f"run this job on a runner with {nproc} GPUs (a gpus-{nproc} label: "
            f"setup.sh --gpus-per-runner {nproc}), or lower nproc in your ladder",
        )
    return {"pinned": pinned, "found": found}


def fork_guard(env: dict[str, str] | None = None, *, allow: bool = False) -> dict[str, Any]:
    """Refuse a fork's pull request on a self-hosted runner, unless ``allow``.

    Returns what was decided: ``{"event", "fork", "self_hosted", "allowed"}``.
    """
    env = dict(os.environ if env is None else env)
    event = env.get("GITHUB_EVENT_NAME", "")
    self_hosted = env.get("RUNNER_ENVIRONMENT", "self-hosted") != "github-hosted"
    decision = {"event": event, "fork": False, "self_hosted": self_hosted, "allowed": True}
    if event not in PR_EVENTS:
        return decision
    payload = _event_payload(env.get("GITHUB_EVENT_PATH", ""))
    pr = payload.get("pull_request") if isinstance(payload, dict) else None
    if not isinstance(pr, dict):
        return decision
    base_repo = (payload.get("repository") or {}).get("full_name") or env.get("GITHUB_REPOSITORY")
    head_repo = ((pr.get("head") or {}).get("repo") or {}).get("full_name")
    # A deleted fork has no head repository: treat it as a fork.
    fork = head_repo is None or head_repo != base_repo
    decision["fork"] = fork
    decision["head_repository"] = head_repo
    if fork and self_hosted and not allow:
        decision["allowed"] = False
        raise DlciError(
            f"refusing to run a pull request from a fork ({head_repo or 'a deleted fork'}) on a "
            "self-hosted runner: its code would run on this machine with its GPUs, caches and "
            "network",
            hint="let a maintainer run it (a label or a trusted branch; see "
            f"{SECURITY_DOC}), or set the action input allow-fork-prs: true "
            "if every fork is trusted",
        )
    return decision


def trusted_ladder(
    ladder: str | None, env: dict[str, str] | None = None
) -> tuple[str | Ladder | None, str | None, bool]:
    """The ladder to trust: on a pull request, its whole ``extends`` chain from the base commit.

    A pull request could otherwise raise its own budgets (hours of GPU time on a shared
    runner). Returns (the ladder or its path, a note for the report, whether it was
    verified). When the chain cannot be read whole from the base commit (a shallow clone, a
    file new in the pull request), the pull request's file is used unverified and the caller
    applies the ceiling.
    """
    env = dict(os.environ if env is None else env)
    if not ladder or ladder == "default" or env.get("GITHUB_EVENT_NAME") not in PR_EVENTS:
        return ladder, None, True

    base = base_commit(env)
    unverified = "the pull request's ladder is used, under the ceiling"
    if not base:
        return ladder, f"the base commit is unknown: {unverified}", False
    try:
        loaded, changed = ladder_at_commit(ladder, base)
    except Unverifiable as exc:
        return (
            ladder,
            f"the ladder cannot be read whole from the base commit ({exc}): {unverified}",
            False,
        )
    if not changed:
        return loaded, None, True
    return (
        loaded,
        f"the pull request changes {', '.join(changed)}: the base commit's ladder is used (a "
        "ladder change takes effect once merged)",
        True,
    )


def base_commit(env: dict[str, str]) -> str:
    """The pull request's base commit from the event's payload ('': unknown)."""
    payload = _event_payload(env.get("GITHUB_EVENT_PATH", ""))
    base = ((payload.get("pull_request") or {}).get("base") or {}).get("sha")
    return base if isinstance(base, str) else ""


def trusted_configuration(workdir: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The project's configuration as the host trusts it (dlci.config.trust), for the report.

    On a pull request its trusted keys and the doctor's waivers come from the base commit,
    as the ladder does (a base commit that cannot be read gives the defaults, with a note);
    otherwise from the working tree. The action's inputs arrive as DLCI_INPUT_* variables.
    """
    env = dict(os.environ if env is None else env)
    if not workdir.is_dir():
        raise DlciError(
            f"working-directory {str(workdir)[:200]!r}: not a folder of the checkout",
            hint="the project's directory, relative to the repository root",
        )
    pull_request = env.get("GITHUB_EVENT_NAME") in PR_EVENTS
    base = base_commit(env) if pull_request else None
    return trusted_config(base, cwd=workdir, env=env).to_json()


def _event_payload(path: str) -> dict[str, Any]:
    if not path:
        return {}
    try:
        data = jsonio.decode(Path(path).read_bytes())
    except (OSError, jsonio.DecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _docker(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def check_docker(*, gpu: bool, timeout: float = 20.0) -> dict[str, Any]:
    """The engine answers; with a GPU, a runtime that gives containers GPUs is configured."""
    if shutil.which("docker") is None:
        raise DlciError(
            "the docker command is not installed on this runner",
            hint="install Docker Engine (docs/action.md) and add the runner's user to the "
            "docker group",
        )
    try:
        info = _docker(["info", "--format", "{{json .}}"], timeout)
    except subprocess.TimeoutExpired:
        raise DlciError(
            f"the Docker engine did not answer within {timeout:g} s",
            hint="check the daemon: systemctl status docker (a wedged daemon needs a restart)",
        ) from None
    if info.returncode != 0:
        text = (info.stderr or info.stdout).strip().splitlines()
        detail = text[-1] if text else f"exit code {info.returncode}"
        hint = "start it (sudo systemctl start docker)"
        if "permission denied" in detail.lower():
            hint = "add the runner's user to the docker group and restart the runner service"
        raise DlciError(f"the Docker engine is not reachable: {detail}", hint=hint)
    try:
        details = jsonio.decode(info.stdout or "{}")
    except jsonio.DecodeError:
        details = {}
    if not isinstance(details, dict):
        details = {}
    runtimes = sorted((details.get("Runtimes") or {}).keys())
    cdi = sorted(str(p) for d in CDI_SPECS if d.is_dir() for p in d.glob("*nvidia*") if p.is_file())
    result = {
        "server_version": details.get("ServerVersion"),
        "runtimes": runtimes,
        "cdi_specs": cdi,
        "nvidia_runtime": "nvidia" in runtimes or bool(cdi),
    }
    if gpu and not result["nvidia_runtime"]:
        raise DlciError(
            "this runner has a GPU but Docker has no NVIDIA runtime, so `docker run --gpus` "
            'would fail with: could not select device driver "" with capabilities: [[gpu]]',
            hint="install the NVIDIA Container Toolkit, then run "
            "`sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart "
            "docker` (docs/action.md)",
        )
    return result
