"""The docs describe the format the code reads: every key, with the code's own words."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from dlci.cli import VERBS
from dlci.ladder.format import CLASS_FIELDS, TIER_FIELDS, TOP_KEYS

ROOT = Path(__file__).resolve().parents[1]


def test_every_ladder_key_is_documented_with_its_description() -> None:
    doc = (ROOT / "docs" / "budget-ladder.md").read_text("utf-8")
    for spec in (*TIER_FIELDS, *CLASS_FIELDS):
        assert f"| `{spec.name}` |" in doc, spec.name
        assert spec.description in doc, spec.name
    for key, description in TOP_KEYS.items():
        assert f"| `{key}` | {description} |" in doc, key


def test_the_architecture_doc_names_every_verb_module() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text("utf-8")
    assert "commands/<verb>.py" in doc
    for verb in VERBS:
        module = verb.replace("-", "_")
        assert (ROOT / "src" / "dlci" / "commands" / f"{module}.py").exists(), verb


def test_ci_runs_the_readmes_test_command() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    assert "\nscripts/test.sh\n" in readme
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text("utf-8")


def test_every_check_id_is_documented() -> None:
    from dlci.checks import CHECK_IDS

    doc = (ROOT / "docs" / "doctor.md").read_text("utf-8")
    for check in CHECK_IDS:
        assert f"| `{check}` |" in doc, check


def test_every_utilization_report_key_is_documented(tmp_path) -> None:
    import msgspec

    from dlci.profiling.metrics import analyze
    from dlci.profiling.reader import read_trace
    from tracegen import training_trace

    path = training_trace(steps=2, kernels=2).write(tmp_path / "t.json")
    report = msgspec.to_builtins(analyze(read_trace(path)))  # as utilization.json holds it
    doc = (ROOT / "docs" / "profiling.md").read_text("utf-8")
    for key in report:
        assert f"`{key}`" in doc, key
    for key in report["devices"][0]:
        if key not in ("device", "name", "gpu_utilization"):
            assert f"`devices[].{key}`" in doc, key


def test_the_architecture_doc_names_every_module() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text("utf-8")
    families = next(line for line in doc.splitlines() if "<family>.py" in line)
    families += next(line for line in doc.splitlines()[doc.splitlines().index(families) + 1 :])
    missing = []
    for path in sorted((ROOT / "src" / "dlci").rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        in_family = path.parent.name == "checks" and re.search(rf"\b{path.stem}\b", families)
        a_verb = path.parent.name == "commands" and path.stem.replace("_", "-") in VERBS
        if path.name not in doc and not in_family and not a_verb:
            missing.append(str(path.relative_to(ROOT)))
    assert missing == []


# --- the README's snippets, as a user copies them


def _blocks(language: str, text: str | None = None) -> list[str]:
    text = text if text is not None else (ROOT / "README.md").read_text("utf-8")
    return re.findall(rf"^```{language}\n(.*?)^```$", text, re.M | re.S)


def test_the_readmes_workflows_run_the_action_with_its_real_inputs(tmp_path) -> None:
    import subprocess

    import yaml

    inputs = yaml.safe_load((ROOT / "action.yml").read_text("utf-8"))["inputs"]
    # the pull-request example the end-to-end tests run (tests/e2e/test_workflows.py)
    tested = yaml.safe_load((ROOT / "examples" / "workflows" / "pr.yml").read_text("utf-8"))
    tested_checkout = tested["jobs"]["dl-ci"]["steps"][0]
    workflows = [yaml.safe_load(b) for b in _blocks("yaml") if "\njobs:" in "\n" + b]
    assert len(workflows) == 2, "the workflow and its CPU variant"
    full, cpu = workflows
    assert full["permissions"] == {"contents": "read"} and set(full[True]) == {
        "pull_request",
        "push",
    }  # YAML 1.1 reads the key `on` as True
    for workflow in workflows:
        (job,) = workflow["jobs"].values()
        checkout, action = job["steps"][:2]
        # as copied it works: the base commit is there, the token is not in .git/config
        assert checkout == tested_checkout, checkout
        assert checkout["with"] == {"persist-credentials": False, "fetch-depth": 2}
        assert action["uses"] == tested["jobs"]["dl-ci"]["steps"][1]["uses"] == "org/dl-ci@v1"
        unknown = set(action["with"]) - set(inputs)
        assert not unknown, f"not inputs of action.yml: {unknown}"
    assert cpu["jobs"]["dl-ci"]["runs-on"] == "ubuntu-latest"
    # and actionlint reads both as workflows (the CPU variant with the full one's header)
    for name, workflow in (("full", full), ("cpu", {**full, "jobs": cpu["jobs"]})):
        path = tmp_path / f"{name}.yml"
        path.write_text(yaml.safe_dump({"on" if k is True else k: v for k, v in workflow.items()}))
        done = subprocess.run(
            [str(Path(sys.executable).parent / "actionlint"), "-config-file",
             str(ROOT / ".github" / "actionlint.yaml"), str(path)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_readmes_target_file_memorises_as_copied(tmp_path, monkeypatch, capsys) -> None:
    """The README's `mypkg/train.py` and `[tool.dlci]`, written as a user would, run through
    `dlci memorize` with no --target: they import, build a dlci.Target and pass."""
    import importlib

    import dlci
    from dlci.cli import main

    (python,) = [b for b in _blocks("python") if "def make_target" in b]
    (toml,) = [b for b in _blocks("toml") if "[tool.dlci]" in b]
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "train.py").write_text(python)
    (tmp_path / "pyproject.toml").write_text(toml)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("DLCI_TARGET", raising=False)
    assert isinstance(importlib.import_module("mypkg.train").make_target(), dlci.Target)
    code = main(["memorize", "--budget", "pr", "--hardware", "cpu", "--quiet"])
    assert code == 0, capsys.readouterr()
    assert (tmp_path / "dlci-artifacts" / "memorization.json").is_file()
    monkeypatch.delitem(sys.modules, "mypkg.train")
    monkeypatch.delitem(sys.modules, "mypkg")


def test_the_readme_says_how_to_install_and_what_to_ignore() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    assert 'pip install "dl-ci[train]"' in readme
    assert 'echo "dlci-artifacts/" >> .gitignore' in readme
    assert "(docs/images/report-failing.png)" in readme
    assert (ROOT / "docs" / "images" / "report-failing.png").read_bytes()[:4] == b"\x89PNG"


COUNT = re.compile(r"\b(?:the|of the|of its|all) (\d+) (?:ordered )?(?:debugging )?checks\b")


def test_every_count_of_the_checks_is_the_registrys() -> None:
    """A number of checks in the docs is the registry's: a check added or removed makes a
    stale count fail here (or say no number)."""
    from dlci.checks import CHECK_IDS

    assert COUNT.findall("the 17 ordered debugging checks, 15 of its 18 checks") == ["17", "18"]
    stale = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number in COUNT.findall(path.read_text("utf-8")):
            if int(number) != len(CHECK_IDS):
                stale.append(f"{path.name}: {number} checks (the registry has {len(CHECK_IDS)})")
    assert stale == []
