"""Loading a target: every way it goes wrong is one clear message."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from dlci.errors import DlciError
from dlci.training.target import Target, load_target, resolve_spec


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A throwaway project directory, importable and the working directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, source: str) -> None:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))

    return write


GOOD = """
    import torch
    from torch import nn
    import dlci

    def make():
        model = nn.Linear(4, 2)
        data = [(torch.randn(8, 4), torch.randint(0, 2, (8,)))]
        return dlci.Target(model, lambda p: torch.optim.SGD(p, lr=0.1), data,
                           loss_fn=nn.CrossEntropyLoss())

    not_a_function = 3

    def returns_model():
        return nn.Linear(2, 2)

    def raises():
        raise ValueError("no data directory")
"""


def test_a_good_target_loads(project) -> None:
    project("proj_good", GOOD)
    target = load_target("proj_good:make")
    assert isinstance(target.model, nn.Linear)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("proj_missing:make", "--target proj_missing:make: no module named 'proj_missing'"),
        ("proj_good:nope", "--target proj_good:nope: module 'proj_good' has no attribute 'nope'"),
        (
            "proj_good:not_a_function",
            "--target proj_good:not_a_function: 'not_a_function' is a int, not a function",
        ),
        (
            "proj_good:returns_model",
            "--target proj_good:returns_model: returns_model() returned Linear, not dlci.Target",
        ),
        (
            "proj_good:raises",
            "--target proj_good:raises: raises() raised ValueError: no data directory",
        ),
        ("proj_good", "--target 'proj_good': expected 'package.module:function'"),
        ("proj good:make", "--target 'proj good:make': expected 'package.module:function'"),
    ],
)
def test_a_bad_target_gives_one_message(project, spec: str, message: str) -> None:
    project("proj_good", GOOD)
    with pytest.raises(DlciError) as info:
        load_target(spec)
    assert info.value.message == message


def test_a_missing_dependency_of_the_module_is_named(project) -> None:
    project("proj_dep", "import not_installed_package_xyz\n")
    with pytest.raises(DlciError) as info:
        load_target("proj_dep:make")
    assert info.value.message == (
        "--target proj_dep:make: importing 'proj_dep' failed: No module named "
        "'not_installed_package_xyz'"
    )
    assert "proj_dep.py" in (info.value.hint or "")


def test_the_spec_comes_from_pyproject_when_not_given(project, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("DLCI_TARGET", raising=False)
    (tmp_path / "pyproject.toml").write_text('[tool.dlci]\ntarget = "proj_good:make"\n')
    assert resolve_spec(None) == "proj_good:make"
    monkeypatch.setenv("DLCI_TARGET", "env_mod:fn")
    assert resolve_spec(None) == "env_mod:fn"
    assert resolve_spec("cli_mod:fn") == "cli_mod:fn"


def test_no_target_anywhere_is_explained(project, monkeypatch) -> None:
    monkeypatch.delenv("DLCI_TARGET", raising=False)
    with pytest.raises(DlciError) as info:
        resolve_spec(None)
    assert info.value.message.startswith("no target given: no --target, no DLCI_TARGET, ")
    assert info.value.message.endswith(f"pyproject.toml's [tool.dlci] in {Path.cwd()}")
    assert "[tool.dlci] target" in (info.value.hint or "")


def test_an_optimizer_instance_instead_of_a_factory_is_refused() -> None:
    model = nn.Linear(2, 2)
    with pytest.raises(DlciError) as info:
        Target(model, torch.optim.SGD(model.parameters(), lr=0.1), [], loss_fn=nn.MSELoss())
    assert "optimizer must be a factory" in info.value.message


def test_every_problem_of_a_target_is_listed_at_once() -> None:
    with pytest.raises(DlciError) as info:
        Target("not a model", 42, 7, num_classes=1)
    assert info.value.message == (
        "invalid dlci.Target: model must be a torch.nn.Module, got str; optimizer must be "
        "callable, got int; give loss_fn (or your own train_step); num_classes must be an "
        "integer >= 2, got 1; train_loader must be iterable, got int"
    )


def test_a_file_in_the_working_folder_does_not_stand_in_for_the_standard_library(
    tmp_path, monkeypatch
) -> None:
    """Issue 42: an earlier phase left ``decimal.py`` in the workspace; the target that
    imports ``decimal`` gets the standard library's. The control: the same folder put first
    on the path (as before) hands it the planted one."""
    import subprocess
    import sys

    (tmp_path / "decimal.py").write_text("raise SystemExit('planted decimal imported')\n")
    (tmp_path / "proj_std.py").write_text(textwrap.dedent(GOOD) + "\nimport decimal\n")
    script = (
        "import sys; sys.path[:] = [p for p in sys.path if p not in ('', {cwd!r})]; {first}"
        "from dlci.training.target import load_target; load_target('proj_std:make'); print('ok')"
    )
    cwd = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", script.format(cwd=cwd, first="")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.strip() == "ok", done.stderr[-2000:]
    control = subprocess.run(
        [sys.executable, "-c", script.format(cwd=cwd, first=f"sys.path.insert(0, {cwd!r}); ")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "planted decimal imported" in control.stdout + control.stderr
