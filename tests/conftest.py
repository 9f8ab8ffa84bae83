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

# other projects' code, vendored unchanged and imported by tests/test_real_code.py only:
# --doctest-modules must not import it as a module of the suite
collect_ignore_glob = ["data/code/*", "data/scripts/*"]

# Under pytest-xdist every worker runs torch: with torch's default of one thread per core, two
# workers on two cores run four busy threads whose OpenMP spin-waits stall each other (the
# doctor's and the memorization tests took 1.45x the wall time measured with one thread each).
# One thread per worker, unless the caller chose a number; subprocesses inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    if "torch" in sys.modules:  # imported before this file (a plugin): set it there too
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
SMALL_LADDER = DATA / "ladders" / "small.yaml"


@pytest.fixture(scope="module")
def one_thread():
    """torch at one intra-op thread for a module of tiny models, where threads only contend
    (16x slower on 2 busy cores); the caller's number back after it."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
# its module-scoped fixtures have put back what they changed for the whole file. sys.path is
# put back there without a failure: dlci.training.target.load_target puts the current
# folder on it by design (as `python -m` does), and tests load targets from tmp_path; so is
# os.environ: dl-ci's memorization sets CUBLAS_WORKSPACE_CONFIG and the KMP_* variables in
# its own process (found by the first run of this guard, in test_calibrate.py and
# test_memorize_command.py), which would otherwise reach every later file.
_VOLATILE_ENV = {"PYTEST_CURRENT_TEST"}


def _process_globals() -> dict[str, object]:
    state: dict[str, object] = {
        "sys.get_int_max_str_digits()": sys.get_int_max_str_digits(),
        "os.getcwd()": os.getcwd(),
        "SIGTERM handler": signal.getsignal(signal.SIGTERM),
        "SIGINT handler": signal.getsignal(signal.SIGINT),
    }
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
_SYS_PATH = pytest.StashKey[list[str]]()
_ENVIRON = pytest.StashKey[dict[str, str]]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    saved = item.session.stash.get(_GLOBALS, None)
    if saved is None or saved[0] != item.path:  # the first of a run of one file's tests
        item.session.stash[_GLOBALS] = (item.path, _process_globals())
        item.session.stash[_SYS_PATH] = list(sys.path)
        item.session.stash[_ENVIRON] = dict(os.environ)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    result = yield
    if nextitem is not None and nextitem.path == item.path:
        return result
    saved = item.session.stash.get(_GLOBALS, None)
    if saved is None or saved[0] != item.path:
        return result
    del item.session.stash[_GLOBALS]
    sys.path[:] = item.session.stash[_SYS_PATH]
    environ = {k: v for k, v in item.session.stash[_ENVIRON].items() if k not in _VOLATILE_ENV}
    for name in set(os.environ) - set(environ) - _VOLATILE_ENV:
        del os.environ[name]
    os.environ.update(environ)
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

# scripts/test.sh runs the suite on two workers (-n 2 --dist loadfile --no-loadscope-reorder):
# each test file is one unit, which one worker runs in order, so a module-scoped fixture (one
# act run shared by the file's tests, one image build) is set up once. No two e2e files need
# to be kept apart: each act run has its own XDG_CACHE_HOME and workspace, each image a test
# builds has a tag only its file uses, and no_job_containers counts only the containers of
# its own worker's jobs. (--dist loadgroup, which could join files, does not group under
# pytest 9.2: pytest-xdist 3.8 renames the items' node IDs in a way pytest 9 no longer sees.)
# The units go out in collection order, which is made largest first by the kept table's
# seconds (benchmarks/test-times.json): the long e2e files start at once, and the short
# files fill in around them.
KEPT_TIMES = ROOT / "benchmarks" / "test-times.json"


def _file_name(item: pytest.Item) -> str:
    try:
        return item.path.relative_to(ROOT).as_posix()
    except ValueError:
        return str(item.path)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    """On a pytest-xdist worker, the files largest first (in the same order on every worker);
    a wrapper, so that the order is in place before any other plugin's hook sees the items."""
    if hasattr(config, "workerinput"):
        kept: dict[str, float] = {}
        if KEPT_TIMES.is_file():
            table = json.loads(KEPT_TIMES.read_text(encoding="utf-8"))["files"]
            kept = {name: float(entry["seconds"]) for name, entry in table.items()}
        first: dict[str, int] = {}
        for index, item in enumerate(items):
            first.setdefault(_file_name(item), index)
        # a stable sort: a file's tests stay together and in their order
        items.sort(key=lambda item: (-kept.get(_file_name(item), 0.0), first[_file_name(item)]))
    return (yield)
