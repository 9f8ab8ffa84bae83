"""Shared fixtures (small ladder files, a clean GitHub Actions environment, a stand-in docker)
and a guard: a test file may not leave a process global changed (see ``_process_globals``)."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
SMALL_LADDER = DATA / "ladders" / "small.yaml"


@pytest.fixture(autouse=True)
def _no_github_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start outside GitHub Actions unless they set these themselves."""
    for name in (
        "GITHUB_ACTIONS",
        "GITHUB_OUTPUT",
        "GITHUB_EVENT_NAME",
        "GITHUB_STEP_SUMMARY",
        "DLCI_BUDGET",
        "DLCI_HARDWARE",
        "DLCI_LADDER",
        "CUDA_VISIBLE_DEVICES",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def small_ladder_text() -> str:
    return SMALL_LADDER.read_text(encoding="utf-8")


@pytest.fixture
def write_ladder(tmp_path: Path):
    """Write ladder text to ``tmp_path/name`` and return the path."""

    def write(text: str, name: str = "ladder.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture
def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Put a stand-in `docker` first on PATH that runs the given Python body.

    The body runs with ``json``, ``sys`` and ``time`` imported; ``install(body)`` may be called
    again to change what the stand-in does. Its folder is ``tmp_path / "bin"``.
    """

    def install(body: str) -> None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        script = bin_dir / "docker"
        script.write_text(f"#!{sys.executable}\nimport json, sys, time\n{body}\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    return install


# -------------------------------------------------------- process globals stay as they were

# What a test can change for every test after it in the same process. Under pytest-xdist the
# tests that run after a given one differ from run to run, so a change left behind is a
# failure that comes and goes (one left Python's int digit limit at 0, and a later test of
# huge TOML integers passed only in some orders). Each file's tests, taken together, must
# leave these as they found them; the check runs after the file's last test's teardown, when
# its module-scoped fixtures have put back what they changed for the whole file.
_VOLATILE_ENV = {"PYTEST_CURRENT_TEST"}


def _process_globals() -> dict[str, object]:
    state: dict[str, object] = {
        "sys.get_int_max_str_digits()": sys.get_int_max_str_digits(),
        "os.getcwd()": os.getcwd(),
        "sys.path": list(sys.path),
        "SIGTERM handler": signal.getsignal(signal.SIGTERM),
        "SIGINT handler": signal.getsignal(signal.SIGINT),
    }
    for name, value in os.environ.items():
        if name not in _VOLATILE_ENV:
            state[f"os.environ[{name!r}]"] = value
    torch = sys.modules.get("torch")  # never imported for the check itself
    if torch is not None and hasattr(torch, "get_num_threads"):
        state["torch.get_num_threads()"] = torch.get_num_threads()
        state["torch deterministic algorithms"] = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )
        state["torch.get_default_dtype()"] = torch.get_default_dtype()
        state["torch.is_grad_enabled()"] = torch.is_grad_enabled()
    return state


_GLOBALS = pytest.StashKey[tuple[Path, dict[str, object]]]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    saved = item.session.stash.get(_GLOBALS, None)
    if saved is None or saved[0] != item.path:  # the first of a run of one file's tests
        item.session.stash[_GLOBALS] = (item.path, _process_globals())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    result = yield
    if nextitem is not None and nextitem.path == item.path:
        return result
    saved = item.session.stash.get(_GLOBALS, None)
    if saved is None or saved[0] != item.path:
        return result
    del item.session.stash[_GLOBALS]
    before, after = saved[1], _process_globals()
    missing = object()
    changed = [
        f"{key}: {before.get(key, missing)!r} -> {after.get(key, missing)!r}".replace(
            repr(missing), "(unset)"
        )
        for key in sorted(set(before) | set(after))
        if before.get(key, missing) != after.get(key, missing)
        and not (key.startswith("torch") and (key not in before or key not in after))
    ]
    if changed:
        pytest.fail(
            f"the tests of {item.path.name} left process globals changed (put them back, "
            "e.g. with monkeypatch or try/finally): " + "; ".join(changed),
            pytrace=False,
        )
    return result


# ------------------------------------------------------------- pytest-xdist's work units

# scripts/test.sh runs the suite on two workers (-n 2 --dist loadgroup --no-loadscope-reorder).
# Each test file is one unit, run by one worker (a module-scoped fixture is then set up once),
# except that every file whose tests run act or check the action's job containers is in one
# unit, "e2e-act": those jobs share the cache volumes, act's own state and the engine's list of
# job containers, so they never run side by side. The units go out largest first by the kept
# table's seconds (benchmarks/test-times.json), so the long e2e units start at once and the
# short files fill in around them.
ACT_FIXTURES = {"act_bin", "no_job_containers"}
KEPT_TIMES = ROOT / "benchmarks" / "test-times.json"


def _file_name(item: pytest.Item) -> str:
    try:
        return item.path.relative_to(ROOT).as_posix()
    except ValueError:
        return str(item.path)


def _work_units(items: list[pytest.Item]) -> dict[pytest.Item, str]:
    """Each item's unit: its file's name, or "e2e-act"."""
    act_files = {
        item.path for item in items if ACT_FIXTURES & set(getattr(item, "fixturenames", ()))
    }
    return {item: "e2e-act" if item.path in act_files else _file_name(item) for item in items}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # not a pytest-xdist worker: order as collected
        return
    kept: dict[str, float] = {}
    if KEPT_TIMES.is_file():
        for name, entry in json.loads(KEPT_TIMES.read_text(encoding="utf-8"))["files"].items():
            kept[name] = float(entry["seconds"])
    units = _work_units(items)
    files: dict[str, set[str]] = {}
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        item.add_marker(pytest.mark.xdist_group(units[item]))
        files.setdefault(units[item], set()).add(_file_name(item))
        first.setdefault(units[item], index)
    seconds = {unit: sum(kept.get(name, 0.0) for name in names) for unit, names in files.items()}
    # largest first; a unit's tests stay together and in their order (a stable sort)
    items.sort(key=lambda item: (-seconds[units[item]], first[units[item]]))
