"""``dlci container``: the docker run command line, the inputs, the build hash, cleanup.

What needs a real engine (building, running, cleanup of real containers) is in tests/e2e/.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlci.action.host.archive import context_hash as input_hash
from dlci.action.host.cache import cache_mount, decide_trust
from dlci.action.host.container import RunRequest, run, run_command
from dlci.action.host.gates import RECORD_VARIABLE
from dlci.action.host.gitview import git_view, sanitise, scan
from dlci.action.host.inputs import ENV_ALLOWLIST, inputs_to_argv
from dlci.cli import main
from dlci.errors import DlciError


def command(tmp_path: Path, **overrides) -> list[str]:
    kwargs = {
        "image": "dl-ci:e2e",
        "name": "dlci-1",
        "job": "1",
        "workspace": tmp_path,
        "workdir": "examples/digits",
        "gpus": "none",
        "shm_size": "",
        "env_names": [],
        "environ": {"CI": "true", "MY_TOKEN": "hunter2", "GITHUB_SHA": "abc", "AWS_SECRET": "x"},
        "inner": ["dlci", "run", "--out", "/workspace/dlci-artifacts"],
        "uid": 1001,
        "gid": 1002,
    }
    kwargs.update(overrides)
    return run_command(**kwargs)


def test_the_run_command_line(tmp_path: Path) -> None:
    cmd = command(tmp_path)
    text = " ".join(cmd)
    assert "--user 1001:1002" in text  # no root-owned files in the workspace
    # its own IPC namespace, with more than Docker's 64 MB /dev/shm for DataLoader workers
    assert "--ipc=private --shm-size 2g" in text and "--ipc=host" not in text
    # no trust given: a pull request's limits (issue 35)
    assert "--security-opt no-new-privileges --cap-drop ALL --pids-limit 8192" in text
    assert f"-v {tmp_path.resolve()}:/workspace" in text
    assert "-w /workspace/examples/digits" in text
    # no trust given: the untrusted cache, never the trusted one
    assert "src=dlci-cache-untrusted,dst=/home/dlci/.cache" in text and "-trusted" not in text
    assert "--label dlci.job=1" in text
    assert "--gpus" not in cmd
    assert cmd[cmd.index("--network") + 1] == "none"  # auto on an untrusted job: no network
    trusted = command(tmp_path, trust="trusted")
    assert "--network" not in trusted and "--pids-limit 32768" in " ".join(trusted)
    # only names from the allowlist, and values never on the command line
    passed = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-e"]
    assert "CI" in passed and "GITHUB_SHA" in passed
    assert "MY_TOKEN" not in passed and "AWS_SECRET" not in passed
    assert "hunter2" not in text
    assert set(passed) - {"DLCI_IN_CONTAINER=1"} <= set(ENV_ALLOWLIST)
    assert cmd[-4:] == ["dlci", "run", "--out", "/workspace/dlci-artifacts"]


def test_gpus_and_shm(tmp_path: Path) -> None:
    cmd = command(tmp_path, gpus="device=1", shm_size="8g")
    text = " ".join(cmd)
    assert "--gpus device=1" in text and "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in text
    assert "--ipc=private --shm-size 8g" in text and "--ipc=host" not in text


def test_the_host_ipc_only_when_asked(tmp_path: Path) -> None:
    cmd = command(tmp_path, ipc="host", shm_size="8g")
    assert "--ipc=host" in cmd and "--shm-size" not in cmd and "--ipc=private" not in cmd
    with pytest.raises(DlciError, match="expected private or host"):
        command(tmp_path, ipc="container:other")


def test_the_network_input_none_gives_the_container_no_network(tmp_path: Path) -> None:
    cmd = command(tmp_path, network="none")
    assert cmd[cmd.index("--network") + 1] == "none"
    assert cmd.index("--network") < cmd.index("dl-ci:e2e")  # a docker flag, not the job's
    for value in ("host", "bridge", "container:db", "None"):
        with pytest.raises(
            DlciError, match=r"input network \(--network\): expected auto, default or none"
        ) as caught:
            command(tmp_path, network=value)
        assert "network: none" in (caught.value.hint or "")


def test_the_job_passes_the_network_to_every_container_and_checks_it_first(
    tmp_path: Path, fake_docker, capsys
) -> None:
    ws, ran = tmp_path / "ws", tmp_path / "docker-ran"
    ws.mkdir()
    fake_docker(_PARTS_DOCKER.format(ran=str(ran), commit=0, install="passed", plant=False))
    with pytest.raises(DlciError, match="input network"):
        run(RunRequest(image="img:1", workspace=str(ws), job="7", network="host"))
    assert not ran.exists()  # refused on the host, before any container
    run(RunRequest(image="img:1", workspace=str(ws), job="7", network="none"))
    starts = [line for line in ran.read_text().splitlines() if line.startswith("run ")]
    phases = [line.split("--phase ")[1].split()[0] for line in starts]
    assert phases == ["install", "tests", "memorize", "doctor", "profile"]
    assert all(" --network none " in line for line in starts)
    capsys.readouterr()


# A stand-in docker for a whole job: every call noted; `run` writes the part's run.json (the
# install's status is {install}); `commit` exits {commit}.
_PARTS_DOCKER = (
    "import json, os\n"
    "args = sys.argv[1:]\n"
    "open({ran!r}, 'a').write(' '.join(args) + chr(10))\n"
    "if args[0] == 'commit':\n"
    "    sys.exit({commit})\n"
    "if args[:3] == ['container', 'inspect', '--size']:\n"
    "    print(os.environ.get('FAKE_SIZE_RW', '4096'))\n"
    "if args[0] == 'diff':\n"
    "    print(os.environ.get('FAKE_DIFF', 'A /opt/dlci/lib/x.pth'))\n"
    "if args[:2] == ['image', 'inspect']:\n"
    "    print(os.environ.get('FAKE_CONTAINER_CONFIG', 'null'))\n"
    "mounted = dict(reversed(a.rsplit(':', 1)) for a in args if a.endswith((':/workspace', ':/dlci/out')))\n"
    "record = {{'steps': [{{'name': 'install', 'status': '{install}', 'exit_code': 0}}]}}\n"
    "if '--phase' in args:\n"
    "    phase = args[args.index('--phase') + 1]\n"
    "    out = mounted.get('/dlci/out') or os.path.join(mounted['/workspace'], 'dlci-artifacts')\n"
    "    os.makedirs(out, exist_ok=True)\n"
    "    if phase == 'install' and {plant}:\n"
    "        os.makedirs(os.path.join(mounted['/workspace'], 'sub', '.git'))\n"
    "        open(os.path.join(mounted['/workspace'], 'sub', '.git', 'config'), 'w').write('x')\n"
    "    if phase != 'install':\n"
    "        record['steps'][0]['status'] = 'skipped'\n"
    "    json.dump(record, open(os.path.join(out, 'run.json'), 'w'))\n"
)


@pytest.mark.parametrize(
    ("commit", "plant"), [(0, False), (1, False), (0, True)],
    ids=["kept", "commit-refused", "install-planted-git-files"],
)  # fmt: skip
def test_the_project_is_installed_once_and_every_part_starts_from_that_image(
    tmp_path: Path, fake_docker, capsys, monkeypatch: pytest.MonkeyPatch, commit: int, plant: bool
) -> None:
    ws, ran = tmp_path / "ws", tmp_path / "docker-ran"
    ws.mkdir()
    (ws / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    monkeypatch.setenv("DATASET_URL", "https://user:pw@data.example")  # pragma: allowlist secret
    fake_docker(_PARTS_DOCKER.format(ran=str(ran), commit=commit, install="passed", plant=plant))
    monkeypatch.setenv(RECORD_VARIABLE, str(tmp_path / "record.json"))
    code = run(RunRequest(image="img:1", workspace=str(ws), job="7", env=["DATASET_URL"]))
    timing = json.loads((tmp_path / "record.json").read_text())["run"]["timing"]
    assert list(timing["parts"]) == ["install", "tests", "memorize", "doctor", "profile"]
    assert all(p["container_s"] > 0 and "copy_s" in p for p in timing["parts"].values())
    assert ("commit_s" in timing["parts"]["install"]) == (not plant)  # timed when tried
    assert timing["kit_s"] > 0 and timing["project_s"] == 0  # the stand-in's steps: no time
    calls = ran.read_text().splitlines()
    starts = [line.split() for line in calls if line.startswith("run ")]
    phases = [a[a.index("--phase") + 1] for a in starts]
    assert phases == ["install", "tests", "memorize", "doctor", "profile"]
    assert "--rm" not in starts[0] and all("--rm" in a for a in starts[1:])  # kept to commit
    later = [a[a.index("-e", a.index("DLCI_IN_CONTAINER=1") - 1) + 2 :] for a in starts[1:]]
    if plant:  # the install's copy is never the source of another part's, nor kept as an image
        assert code == 1 and not any(line.startswith("commit") for line in calls)
        assert all(a[0] == "img:1" and "--installed" not in a for a in later)
        return
    commits = [line.split() for line in calls if line.startswith("commit ")]
    assert len(commits) == 1 and commits[0][-1] == "dlci-installed:dlci-7-install"
    assert "ENV DATASET_URL=" in " ".join(commits[0])  # its value never kept in the image
    assert "LABEL dlci.job=7" in " ".join(commits[0])
    if commit == 0:
        assert all(a[0] == "dlci-installed:dlci-7-install" and "--installed" in a for a in later)
        assert any(line.startswith("image rm -f dlci-installed:dlci-7-install") for line in calls)
    else:  # control: no image, so every part installs again from the job's image
        assert all(a[0] == "img:1" and "--installed" not in a for a in later)
    rm = [line for line in calls if line.startswith("rm -f -v dlci-7-install")]
    assert rm  # the stopped install container (and its volumes) never outlives the job
    assert "commit" in capsys.readouterr().err or commit == 0


def test_when_the_install_fails_no_later_part_runs_and_the_record_says_why(
    tmp_path: Path, fake_docker, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws, ran = tmp_path / "ws", tmp_path / "docker-ran"
    ws.mkdir()
    fake_docker(_PARTS_DOCKER.format(ran=str(ran), commit=0, install="failed", plant=False))
    record = tmp_path / "record.json"
    monkeypatch.setenv(RECORD_VARIABLE, str(record))
    run(RunRequest(image="img:1", workspace=str(ws), job="7"))
    calls = ran.read_text().splitlines()
    assert [c for c in calls if c.startswith("run ")] and not any(
        " --phase tests" in c or c.startswith("commit") for c in calls
    )  # the install ran; nothing was committed, no other part started
    steps = {s["name"]: s for s in json.loads(record.read_text())["run"]["steps"]}
    assert steps["install"]["status"] == "failed"
    assert all(steps[n]["status"] == "skipped" for n in ("tests", "memorize", "doctor", "profile"))
    assert steps["tests"]["reason"] == "not run: the install step failed"
    capsys.readouterr()


@pytest.mark.parametrize(
    ("event", "trust"),
    [
        ("push", "trusted"),
        ("schedule", "trusted"),
        ("workflow_dispatch", "trusted"),
        ("merge_group", "trusted"),
        ("release", "trusted"),
        ("pull_request", "untrusted"),
        ("pull_request_target", "untrusted"),
        ("issue_comment", "untrusted"),
        ("", "untrusted"),
    ],
)
def test_the_cache_volume_follows_the_event(tmp_path: Path, event: str, trust: str) -> None:
    environ = {"GITHUB_REF": "refs/heads/main", "DLCI_DEFAULT_BRANCH": "main"}
    environ |= {"GITHUB_EVENT_NAME": event} if event else {}
    assert decide_trust("auto", environ) == trust
    cmd = command(tmp_path, trust=trust, created=1700000000)
    mount = cmd[cmd.index("--mount") + 1]
    assert mount == (
        f"type=volume,src=dlci-cache-{trust},dst=/home/dlci/.cache,"
        f"volume-label=dlci.cache={trust},volume-label=dlci.cache.created=1700000000"
    )
    assert sum("dlci-cache" in part for part in cmd) == 1  # one cache volume, no other


def test_trusted_is_refused_on_a_pull_request_in_actions() -> None:
    pr = {"GITHUB_EVENT_NAME": "pull_request", "GITHUB_ACTIONS": "true"}
    with pytest.raises(DlciError, match="--trust trusted on a pull_request event"):
        decide_trust("trusted", pr)
    assert decide_trust("untrusted", {"GITHUB_EVENT_NAME": "push"}) == "untrusted"
    assert decide_trust("trusted", {}) == "trusted"  # by hand, outside Actions: the person's call
    with pytest.raises(DlciError, match="not a volume name"):
        cache_mount("trusted", "x,src=dlci-cache-trusted")


def test_hidden_files_are_mounted_read_only_over_the_workspace(tmp_path: Path) -> None:
    copy = tmp_path / "0-config"
    cmd = command(tmp_path, hidden_files=[(copy, ".git/config")])
    text = " ".join(cmd)
    assert f"-v {copy}:/workspace/.git/config:ro" in text
    # after the workspace's own mount, so Docker lays it over the original
    assert text.index(f"{tmp_path.resolve()}:/workspace ") < text.index(f"{copy}:")


@pytest.mark.parametrize("workdir", ["../other", "/etc"])
def test_a_workdir_outside_the_workspace_is_refused(tmp_path: Path, workdir: str) -> None:
    with pytest.raises(DlciError, match="outside the workspace"):
        command(tmp_path, workdir=workdir)


def test_inputs_become_arguments_not_shell() -> None:
    argv = inputs_to_argv(
        {
            "DLCI_INPUT_TARGET": "pkg.m:f; rm -rf /",
            "DLCI_INPUT_PYTEST_ARGS": "-m 'not slow'",
            "DLCI_INPUT_DOCTEST": "false",
            "DLCI_INPUT_PROFILE": "true",
            "DLCI_INPUT_LADDER": "ci/ladder.yaml",
            "DLCI_INPUT_MIN_GPU_UTIL": "",
        }
    )
    assert argv == [
        "--target",
        "pkg.m:f; rm -rf /",  # one argument: the target loader will refuse it, no shell runs it
        "--pytest-args",
        "-m 'not slow'",
        "--ladder",
        "/workspace/ci/ladder.yaml",
        "--no-doctest",
    ]
    with pytest.raises(DlciError, match="input coverage: expected true or false"):
        inputs_to_argv({"DLCI_INPUT_COVERAGE": "maybe"})
    with pytest.raises(DlciError, match="outside the repository"):
        inputs_to_argv({"DLCI_INPUT_LADDER": "../../etc/ladder.yaml"})


def test_the_build_hash_follows_the_inputs(tmp_path: Path) -> None:
    # the context's rules in detail: tests/test_dockerignore.py
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    (tmp_path / ".dockerignore").write_text("*.log\nbuild/\n")
    first = input_hash(tmp_path / "Dockerfile", tmp_path, {})
    assert first == input_hash(tmp_path / "Dockerfile", tmp_path, {})
    (tmp_path / "debug.log").write_text("ignored")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "x").write_text("ignored")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ignored")
    assert input_hash(tmp_path / "Dockerfile", tmp_path, {}) == first
    assert input_hash(tmp_path / "Dockerfile", tmp_path, {"BASE_IMAGE": "x"}) != first
    (tmp_path / "src" / "a.py").write_text("x = 2\n")
    assert input_hash(tmp_path / "Dockerfile", tmp_path, {}) != first


def test_secret_looking_env_names_are_refused(tmp_path: Path, capsys) -> None:
    code = main(
        ["container", "run", "--image", "x", "--env", "GH_TOKEN", "--workspace", str(tmp_path)]
    )
    assert code == 1
    assert "looks like a secret" in capsys.readouterr().err


def test_a_missing_or_unknown_subcommand_is_a_malformed_command_line(capsys) -> None:
    assert main(["container", "launch"]) == 2
    assert "unknown subcommand 'launch'" in capsys.readouterr().err
    assert main(["container"]) == 2
    assert "usage: dlci container {build,run,bisect,cleanup}" in capsys.readouterr().err


def test_the_run_shows_its_command_and_passes_the_exit_code(
    tmp_path: Path, fake_docker, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text(CHECKOUT_V4)
    fake_docker("sys.stderr.write('inside: ' + repr(sys.argv[1:]) + '\\n'); sys.exit(0)")
    args = ["container", "run", "--image", "img:1", "--workspace", str(tmp_path), "--job", "7"]
    assert main([*args, "--", "--install", "none", "--tests", "tests/a b.py"]) == 0
    captured = capsys.readouterr()
    err = captured.err
    assert "container: docker run --rm --init --name dlci-7 --label dlci.job=7" in err
    assert "img:1 dlci run --install none --tests 'tests/a b.py'" in err  # quoted: pasteable
    inside = [line for line in (captured.out + err).splitlines() if line.startswith("inside:")]
    assert inside and "'tests/a b.py'" in inside[0]  # the container's output comes through
    assert "container: cache: volume dlci-cache-untrusted (untrusted job)" in err
    assert "credentials in .git/config hidden from the container: 1 extraheader" in err
    assert ".git/config:ro" in err and BASIC not in err
    fake_docker("sys.exit(3)")
    assert main([*args]) == 1


def test_a_container_that_cannot_start_is_explained(tmp_path: Path, fake_docker, capsys) -> None:
    fake_docker(
        "sys.stderr.write('docker: Error response from daemon: could not select device driver "
        '"" with capabilities: [[gpu]].\\n\'); sys.exit(125)'
    )
    args = ["container", "run", "--image", "img:1", "--workspace", str(tmp_path), "--gpus", "all"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "the NVIDIA container runtime is missing" in err
    assert "NVIDIA Container Toolkit" in err


# ------------------------------------------------------ git's credentials, hidden (gitview)

FAKE = "ghs_FAKEtoken0123456789"  # pragma: allowlist secret
BASIC = "eC1hY2Nlc3MtdG9rZW46Z2hzX0ZBS0V0b2tlbjAxMjM0NTY3ODk="  # pragma: allowlist secret (x-access-token:FAKE, base64)
CHECKOUT_V4 = f"""[core]
\trepositoryformatversion = 0
\tbare = false
[remote "origin"]
\turl = https://github.com/org/repo
\tfetch = +refs/heads/*:refs/remotes/origin/*
[gc]
\tauto = 0
[http "https://github.com/"]
\textraheader = AUTHORIZATION: basic {BASIC}
"""
CHECKOUT_V6 = """[core]
\tbare = false
[includeIf "gitdir:/runner/work/repo/repo/.git"]
\tpath = /runner/_temp/git-credentials-1234.config
[include]
\tpath = creds.config
"""
OTHERS = f"""[credential]
\thelper = store --file=.git/my-credentials
[credential "https://github.com"]
\tusername = x-access-token
[url "https://x-access-token:{FAKE}@github.com/"]
\tinsteadOf = https://github.com/
[remote "origin"]
\turl = https://x-access-token:{FAKE}@github.com/org/repo.git
\tpushurl = https://{FAKE}@github.com/org/repo.git
[remote "mirror"]
\turl = ssh://git@example.com/org/repo.git
[http] extraHeader = Authorization: Bearer {FAKE}
[alias]
\tsecret = "!echo \\
   Authorization: bearer {FAKE}"
"""


def git_list(path: Path) -> str:
    import subprocess

    done = subprocess.run(
        ["git", "config", "--file", str(path), "--no-includes", "--list"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


@pytest.mark.parametrize(
    ("text", "secret", "kinds"),
    [
        (CHECKOUT_V4, BASIC, ["extraheader"]),
        (CHECKOUT_V6, "git-credentials-1234", ["include", "include"]),
        (
            OTHERS,
            FAKE,
            ["credential helper", "credential setting", "url with userinfo"]
            + ["url with userinfo"] * 2
            + ["extraheader", "authorization header"],
        ),
    ],
)
def test_the_sanitiser_on_real_config_texts(
    tmp_path: Path, text: str, secret: str, kinds: list[str]
) -> None:
    raw, clean = tmp_path / "raw", tmp_path / "clean"
    raw.write_text(text)
    assert secret in git_list(raw)  # the control: git reads the secret from the raw file
    result = sanitise(text)
    clean.write_text(result.text)
    assert secret not in result.text and secret not in git_list(clean)
    assert result.hidden == kinds
    listed = git_list(clean)  # still a config git reads, with what is not a credential
    assert "core.bare=false" in listed or "[core]" not in text
    if "remote.origin" in text:
        assert "remote.origin.url=https://github.com/org/repo" in listed


def test_the_sanitiser_keeps_names_and_files() -> None:
    result = sanitise(OTHERS)
    assert "http.https://github.com/.extraheader" not in result.names
    assert "http.extraheader" in result.names and "remote.origin.url" in result.names
    assert result.files == [".git/my-credentials"]
    assert "url = ssh://git@example.com/org/repo.git" in result.text  # a user name, no secret
    assert sanitise(CHECKOUT_V6).files == [
        "/runner/_temp/git-credentials-1234.config",
        "creds.config",
    ]
    assert sanitise("stray line\n[core]\n\tbare = false\n").hidden == ["unreadable line"]


def test_the_git_view_of_a_workspace(tmp_path: Path) -> None:
    ws, into = tmp_path / "ws", tmp_path / "into"
    git = ws / ".git"
    for folder in ("modules/sub", "worktrees/w", "objects/ab"):
        (git / folder).mkdir(parents=True)
    into.mkdir()
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "config").write_text(CHECKOUT_V4 + "[include]\n\tpath = creds.config\n")
    (git / "creds.config").write_text(f"[http]\n\textraheader = {BASIC}\n")
    (git / "modules" / "sub" / "HEAD").write_text("ref: x\n")
    (git / "modules" / "sub" / "config").write_text(CHECKOUT_V4)
    (git / "worktrees" / "w" / "config.worktree").write_text("[core]\n\tsparseCheckout = true\n")
    (git / "objects" / "ab" / "config").write_text(CHECKOUT_V4)  # never walked
    (ws / ".git-credentials").write_text(f"https://x:{FAKE}@github.com\n")
    view = git_view(ws, into)
    covered = {rel: host.read_text() for host, rel in view.mounts}
    assert sorted(covered) == [
        ".git-credentials",
        ".git/config",
        ".git/creds.config",
        ".git/modules/sub/config",
    ]
    assert all(BASIC not in text and FAKE not in text for text in covered.values())
    assert covered[".git-credentials"] == "" and covered[".git/creds.config"] == ""
    assert view.lines()[0] == (
        "credentials in .git/config hidden from the container: 1 extraheader, 1 include"
    )
    assert scan(ws) == view.hidden  # what preflight can report, with nothing left behind


def test_the_git_view_of_odd_workspaces(tmp_path: Path) -> None:
    into = tmp_path / "into"
    into.mkdir()
    plain = tmp_path / "plain"
    plain.mkdir()
    assert git_view(plain, into).mounts == []  # no .git at all
    worktree = tmp_path / "worktree"
    worktree.mkdir()
    (worktree / ".git").write_text("gitdir: /elsewhere/.git/worktrees/w\n")
    assert git_view(worktree, into).mounts == []  # a .git file pointing outside: nothing here
    linked = tmp_path / "linked"
    (linked / ".git").mkdir(parents=True)
    (linked / ".git" / "HEAD").write_text("ref: x\n")
    (linked / ".git" / "config").symlink_to(tmp_path / "host-secret")
    (tmp_path / "host-secret").write_text(f"[http]\n\textraheader = {BASIC}\n")
    view = git_view(linked, into)
    assert [rel for _, rel in view.mounts] == [".git/config"]
    assert view.mounts[0][0].read_text() == ""  # a link is never read through
    assert view.hidden == {".git/config": ["symbolic link"]}


@pytest.mark.parametrize(
    ("ref", "actor", "trusted_refs", "trust"),
    [
        ("refs/heads/main", "alice", "", "trusted"),  # the default branch, from the payload
        ("refs/heads/feature", "alice", "", "untrusted"),  # an unreviewed branch
        ("refs/heads/dependabot/pip/torch-2.14", "dependabot[bot]", "", "untrusted"),
        ("refs/heads/main", "dependabot[bot]", "", "untrusted"),  # a bot, even on main
        ("refs/heads/release/1.x", "alice", "refs/heads/release/1.x", "trusted"),  # protected
    ],
)
def test_a_push_is_trusted_only_on_the_default_branch_or_a_listed_ref(
    tmp_path: Path, ref: str, actor: str, trusted_refs: str, trust: str
) -> None:
    payload = tmp_path / "event.json"
    payload.write_text(json.dumps({"ref": ref, "repository": {"default_branch": "main"}}))
    environ = {"GITHUB_EVENT_NAME": "push", "GITHUB_REF": ref, "GITHUB_ACTOR": actor}
    environ |= {"GITHUB_EVENT_PATH": str(payload), "DLCI_TRUSTED_REFS": trusted_refs}
    assert decide_trust("auto", environ) == trust


def test_a_push_without_a_known_default_branch_is_untrusted(tmp_path: Path) -> None:
    environ = {"GITHUB_EVENT_NAME": "push", "GITHUB_REF": "refs/heads/main"}
    assert decide_trust("auto", environ) == "untrusted"
    (tmp_path / "fifo").mkdir()  # an unreadable payload is no default branch either
    assert decide_trust("auto", {**environ, "GITHUB_EVENT_PATH": str(tmp_path / "fifo")}) == (
        "untrusted"
    )


# ------------------------------------------------------ build arguments and torch's origin

# A stand-in docker for `dlci container build`: no image yet, every call's argv appended to
# calls.jsonl, `cp` answers with the tar stream in record.tar (or fails when there is none).
BUILD_DOCKER = """
import json, os, pathlib
here = pathlib.Path(sys.argv[0]).parent
with open(here / "calls.jsonl", "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
verb = sys.argv[1]
if verb == "image":
    sys.exit(1)
if verb == "build":
    sys.stdin.read() if sys.argv[-1] == "-" else None
    sys.exit(int(os.environ.get("FAKE_BUILD_EXIT", "0")))
if verb == "create":
    print("c0ffee")
if verb == "cp":
    record = here / "record.tar"
    if not record.exists():
        sys.exit(1)
    sys.stdout.buffer.write(record.read_bytes())
"""


def _tar(name: str, data: bytes, *, symlink: bool = False) -> bytes:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(name)
        if symlink:
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
        else:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _calls(tmp_path: Path) -> list[list[str]]:
    lines = (tmp_path / "bin" / "calls.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_pip_options_become_build_arguments_only_when_set(tmp_path: Path) -> None:
    from dlci.action.host.image import build_arguments

    assert build_arguments("", [], EXTRA_PIP="", PIP_INDEX_URL="") == {}
    both = build_arguments("b:1", ["EXTRA_PIP=x"], EXTRA_PIP="a b", PIP_INDEX_URL="https://m/s")
    assert both == {"BASE_IMAGE": "b:1", "EXTRA_PIP": "a b", "PIP_INDEX_URL": "https://m/s"}
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    plain = input_hash(tmp_path / "Dockerfile", tmp_path, build_arguments("", []))
    assert plain == input_hash(tmp_path / "Dockerfile", tmp_path, build_arguments("", [], X=""))
    assert plain != input_hash(tmp_path / "Dockerfile", tmp_path, both)


def test_a_build_labels_the_image_with_its_torch_record(
    tmp_path: Path, fake_docker, capsys
) -> None:
    fake_docker(BUILD_DOCKER)
    record = {"torch": "2.5.1+cu124", "cuda": "12.4", "source": "base", "file": "/x/torch/i.py"}
    (tmp_path / "bin" / "record.tar").write_bytes(_tar("torch.json", json.dumps(record).encode()))
    context = tmp_path / "ctx"  # not the fake docker's folder: its log would change the context
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\n")
    args = ["container", "build", "--dockerfile", str(context / "Dockerfile")]
    args += ["--context", str(context), "--extra-pip", "scikit-learn rich"]
    assert main([*args, "--pip-index-url", "https://mirror.invalid/simple"]) == 0
    captured = capsys.readouterr()
    calls = _calls(tmp_path)
    build = next(c for c in calls if c[0] == "build" and "dlci.built=1" in c)
    assert build[-1] == "-" and build[build.index("-f") + 1] == ".dlci-dockerfile"
    assert "--force-rm" in build  # a failed build leaves no container behind
    assert "EXTRA_PIP=scikit-learn rich" in build
    assert "PIP_INDEX_URL=https://mirror.invalid/simple" in build
    tag = captured.out.strip()
    assert ["create", "--network", "none", tag, "dlci-never-started"] in calls  # never started
    assert ["cp", "c0ffee:/etc/dlci/torch.json", "-"] in calls
    assert ["rm", "--force", "c0ffee"] in calls
    relabel = next(c for c in calls if c[0] == "build" and "dlci.built=1" not in c)
    assert relabel[relabel.index("-t") + 1] == tag
    assert "dlci.torch.version=2.5.1+cu124" in relabel
    assert "dlci.torch.cuda=12.4" in relabel and "dlci.torch.source=base" in relabel
    assert "torch 2.5.1+cu124 (CUDA 12.4), the base image's" in captured.err


def test_an_image_without_a_torch_record_is_not_relabelled(
    tmp_path: Path, fake_docker, capsys
) -> None:
    fake_docker(BUILD_DOCKER)
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\n")
    args = ["container", "build", "--dockerfile", str(context / "Dockerfile")]
    assert main([*args, "--context", str(context)]) == 0
    calls = _calls(tmp_path)
    builds = [c for c in calls if c[0] == "build"]
    assert len(builds) == 1 and "dlci.built=1" in builds[0]  # the main build only
    assert not any("EXTRA_PIP" in " ".join(c) for c in calls)  # no option, no build argument
    assert "no torch labels" in capsys.readouterr().err


def test_a_failed_build_points_to_the_offline_route(
    tmp_path: Path, fake_docker, capsys, monkeypatch
) -> None:
    fake_docker(BUILD_DOCKER)
    monkeypatch.setenv("FAKE_BUILD_EXIT", "1")
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    args = ["container", "build", "--dockerfile", str(tmp_path / "Dockerfile")]
    assert main([*args, "--context", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "docker build of" in err and "offline route in docs/container.md" in err


@pytest.mark.parametrize(
    ("archive", "expected"),
    [
        (_tar("torch.json", b'{"torch": "2.13.0+cpu", "cuda": null, "source": "base"}'), True),
        (_tar("torch.json", b"", symlink=True), False),  # a link is never followed
        (_tar("torch.json", b'{"torch": "' + b"x" * 70000 + b'"}'), False),  # over the cap
        (_tar("torch.json", b"not json"), False),
        (_tar("torch.json", b'{"cuda": "12.4"}'), False),  # no version
        (b"not a tar stream", False),
    ],
)
def test_the_torch_record_is_read_only_when_it_is_sound(archive: bytes, expected: bool) -> None:
    from dlci.action.host.image import parse_torch_record

    record = parse_torch_record(archive)
    assert (record is not None) is expected
    if expected:
        assert record == {"torch": "2.13.0+cpu", "cuda": None, "source": "base"}


def test_the_network_option_and_its_variable_reach_the_job(
    tmp_path: Path, fake_docker, capsys, monkeypatch
) -> None:
    ran = tmp_path / "docker-ran"
    fake_docker(f"open({str(ran)!r}, 'a').write(' '.join(sys.argv[1:]) + chr(10))")
    args = ["container", "run", "--image", "img:1", "--workspace", str(tmp_path), "--job", "7"]
    assert main([*args, "--network", "none"]) == 0
    assert " --network none " in ran.read_text()
    ran.unlink()
    monkeypatch.setenv("DLCI_NETWORK", "none")  # what action.yml sets from the input
    assert main(args) == 0
    assert " --network none " in ran.read_text()
    ran.unlink()
    monkeypatch.setenv("DLCI_NETWORK", "host")
    assert main(args) == 1
    assert "input network (--network): expected auto, default or none" in capsys.readouterr().err
    assert not ran.exists()


def test_a_context_that_changes_while_it_is_sent_leaves_no_image(
    tmp_path: Path, fake_docker, capsys
) -> None:
    """The tag is the hash of the stream the build receives: a file that changes between
    the hash and the send (here when the tag is looked up) is caught, and no image stays."""
    fake_docker(BUILD_DOCKER)
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\nCOPY . /p/\n")
    (context / "app.py").write_text("print(1)\n")
    args = ["container", "build", "--dockerfile", str(context / "Dockerfile")]
    assert main([*args, "--context", str(context)]) == 0  # the control: untouched, it builds
    hook = f"open({str(context / 'app.py')!r}, 'a').write('# changed\\n')\n"
    fake_docker(BUILD_DOCKER.replace('if verb == "image":\n', f'if verb == "image":\n    {hook}'))
    capsys.readouterr()
    assert main([*args, "--context", str(context)]) == 1
    err = capsys.readouterr().err
    assert "error: the build context changed while it was sent" in err
    removed = [c for c in _calls(tmp_path) if c[:2] == ["image", "rm"]]
    assert removed and removed[-1][-1].startswith("dlci-local:untrusted-")


# ------------------------------------------------ links in the pull request's build files (42)

HOST_SECRET = "host-credentials-canary-42"  # pragma: allowlist secret (a test value)


@pytest.mark.parametrize(
    "planted",
    ["Dockerfile", "folder", "Dockerfile.dockerignore", ".dockerignore"],
)
def test_a_dockerfile_or_ignore_file_through_a_link_is_refused_with_its_name(
    tmp_path: Path, monkeypatch, planted: str
) -> None:
    from dlci.action.host.image import build_sources

    secret = tmp_path / "host" / ".credentials"
    secret.parent.mkdir()
    secret.write_text(HOST_SECRET + "\n")
    ws = tmp_path / "ws"
    (ws / "docker").mkdir(parents=True)
    monkeypatch.chdir(ws)
    name = "docker/Dockerfile"
    (ws / name).write_text("FROM scratch\n")
    if planted == "Dockerfile":
        (ws / name).unlink()
        (ws / name).symlink_to(secret)
    elif planted == "folder":
        (ws / "linked").symlink_to(secret.parent)
        (secret.parent / "Dockerfile").write_text(HOST_SECRET)
        name = "linked/Dockerfile"
    elif planted == "Dockerfile.dockerignore":
        (ws / "docker" / planted).symlink_to(secret)
    else:
        (ws / planted).symlink_to(secret)
    with pytest.raises(DlciError, match="is a symbolic link") as caught:
        build_sources(name, ".", "")
    said = caught.value.message + (caught.value.hint or "")
    assert HOST_SECRET not in said and "never read through a link" in said


def test_control_the_old_read_takes_the_host_file_through_the_link(tmp_path: Path) -> None:
    secret = tmp_path / ".credentials"
    secret.write_text(HOST_SECRET)
    (tmp_path / "Dockerfile").symlink_to(secret)
    assert (tmp_path / "Dockerfile").read_bytes().decode() == HOST_SECRET  # the old read
    with pytest.raises(DlciError, match="symbolic link"):  # the stream's read now
        input_hash(tmp_path / "Dockerfile", tmp_path, {})


def test_a_build_s_output_is_read_under_caps_and_issues_no_command(
    tmp_path: Path, fake_docker, capfd, monkeypatch
) -> None:
    """A RUN step of the pull request's Dockerfile prints 96 MiB on one line and a workflow
    command: the host prints a 64 KiB piece of the line, between stop-commands and its token,
    and says how much it dropped (the old reading held the line whole: tests/test_action_scratch.py)."""
    import re

    flood = "os.write(1, b'x' * (96 << 20) + b'\\n::error::from-a-run-step\\n')"
    fake_docker(BUILD_DOCKER.replace("    sys.stdin.read()", f"    {flood}\n    sys.stdin.read()"))
    monkeypatch.setenv("FAKE_BUILD_EXIT", "1")
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    args = ["container", "build", "--dockerfile", str(tmp_path / "Dockerfile")]
    assert main([*args, "--context", str(tmp_path)]) == 1
    err = capfd.readouterr().err
    assert len(err) < 200_000 and "95.9 MiB of this container's output dropped" in err
    token = re.search(r"^::stop-commands::([0-9a-f]{32})$", err, re.MULTILINE)
    assert token is not None
    start, end = err.index(token.group(0)), err.index(f"\n::{token.group(1)}::")
    assert start < err.index("::error::from-a-run-step") < end


# ------------------------------------------- one machine, several runners (issue 51)

PIN = ["GPU-4a2b", "GPU-5a2b", "GPU-6a2b", "GPU-7a2b"]  # the runner's half of eight GPUs


def test_gpus_on_a_pinned_runner_name_its_gpus_only() -> None:
    from dlci.action.host.container import resolve_gpus

    assert resolve_gpus("auto", True, PIN) == "device=" + ",".join(PIN)
    assert resolve_gpus("all", True, PIN) == "device=" + ",".join(PIN)  # all: the runner's
    assert resolve_gpus("device=1,GPU-7a2b", True, PIN) == "device=GPU-5a2b,GPU-7a2b"
    assert resolve_gpus("auto", False, PIN) == resolve_gpus("none", True, PIN) == "none"
    for neighbour in ("device=4", "device=GPU-0a2b", "device=0,GPU-1a2b", "3"):
        with pytest.raises(DlciError) as info:
            resolve_gpus(neighbour, True, PIN)
        assert "this runner has 4 GPU(s) of its own" in info.value.message or (
            "expected auto, all, none or device=" in info.value.message
        )
        assert "belong to other runners" in (info.value.hint or "")
    # the control: a runner with every GPU passes the input through as before
    assert resolve_gpus("auto", True) == "all" and resolve_gpus("device=4", True) == "device=4"


def argv_line(captured: pytest.CaptureResult[str]) -> str:
    """The stand-in docker's argv, as the container's output the host passed on."""
    lines = (captured.out + captured.err).splitlines()
    return next(x for x in lines if x.startswith("argv: "))


def test_a_pinned_runner_s_job_runs_with_its_gpus_and_its_runner_label(
    tmp_path: Path, fake_docker, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("DLCI_RUNNER_GPUS", ",".join(PIN))
    monkeypatch.setenv("DLCI_RUNNER", "box-2")
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "all")  # a workflow's env: would be every GPU
    fake_docker("sys.stderr.write('argv: ' + json.dumps(sys.argv[1:]) + '\\n'); sys.exit(0)")
    args = ["container", "run", "--image", "img:1", "--workspace", str(tmp_path), "--job", "7"]
    assert main([*args, "--gpu-found", "true"]) == 0
    line = argv_line(capsys.readouterr())
    argv = json.loads(line.removeprefix("argv: "))
    assert argv[argv.index("--gpus") + 1] == '"device=' + ",".join(PIN) + '"'  # Docker's CSV
    assert f"NVIDIA_VISIBLE_DEVICES={','.join(PIN)}" in argv
    assert "NVIDIA_VISIBLE_DEVICES" not in argv  # the job's value is never passed
    assert "dlci.runner=box-2" in argv
    assert not [g for g in ("GPU-0a2b", "GPU-1a2b", "GPU-2a2b", "GPU-3a2b") if g in line]
    # the control: without a pin the job's NVIDIA_VISIBLE_DEVICES is passed, --gpus all
    monkeypatch.delenv("DLCI_RUNNER_GPUS")
    assert main([*args, "--gpu-found", "true"]) == 0
    line = argv_line(capsys.readouterr())
    argv = json.loads(line.removeprefix("argv: "))
    assert argv[argv.index("--gpus") + 1] == "all" and "NVIDIA_VISIBLE_DEVICES" in argv


# A stand-in docker whose builds take a second and leave the tag behind; each build is logged.
SLOW_BUILD_DOCKER = """
import pathlib
here = pathlib.Path(sys.argv[0]).parent
have = lambda tag: here / ("have-" + tag.replace("/", "_").replace(":", "_"))
verb = sys.argv[1]
if verb == "image":
    sys.exit(0 if have(sys.argv[-1]).exists() else 1)
if verb == "build":
    sys.stdin.buffer.read()
    tag = sys.argv[sys.argv.index("-t") + 1]
    with open(here / "builds", "a") as log:
        log.write(tag + "\\n")
    time.sleep(1.5)
    have(tag).touch()
if verb == "cp":
    sys.exit(1)
if verb == "create":
    print("c0ffee")
"""


@pytest.mark.parametrize("shared_lock", [True, False], ids=["one-lock", "control-no-lock"])
def test_two_jobs_building_the_same_inputs_build_once(
    tmp_path: Path, fake_docker, monkeypatch, shared_lock: bool
) -> None:
    """Two `dlci container build` at once (two runners' jobs): the second waits for the
    first's build and reuses its image; the control, each with a lock of its own, builds
    twice."""
    import os
    import subprocess
    import sys

    fake_docker(SLOW_BUILD_DOCKER)
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\n")
    argv = [sys.executable, "-m", "dlci", "container", "build", "--dockerfile"]
    argv += [str(context / "Dockerfile"), "--context", str(context)]
    jobs = []
    for k in range(2):
        lock = tmp_path / ("locks" if shared_lock else f"locks-{k}")
        env = {**os.environ, "DLCI_LOCK_DIR": str(lock), "GITHUB_EVENT_NAME": "pull_request"}
        jobs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = [job.communicate(timeout=60) for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0], outs
    tags = {out.decode().strip() for out, _ in outs}
    assert len(tags) == 1  # the same image for both
    builds = (tmp_path / "bin" / "builds").read_text().split()
    if shared_lock:
        assert builds == list(tags)
        assert any(b"waiting for it" in err and b"is up to date" in err for _, err in outs)
    else:
        assert builds == list(tags) * 2


def test_an_image_whose_dlci_predates_the_install_container_still_runs_the_job(
    tmp_path: Path, fake_docker, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pinned image built by an older dl-ci refuses --phase install (argparse, exit 2): each
    part then installs, as before; control: any other exit 2 of the install fails the job."""
    ws, ran = tmp_path / "ws", tmp_path / "docker-ran"
    ws.mkdir()
    older = _PARTS_DOCKER.format(ran=str(ran), commit=0, install="passed", plant=False).replace(
        "if '--phase' in args:\n",
        "if args[-2:] == ['--phase', 'install']:\n"
        "    print(\"dlci run: error: argument --phase: invalid choice: 'install'\")\n"
        "    sys.exit(2)\n"
        "if '--phase' in args:\n",
    )
    fake_docker(older)
    monkeypatch.setenv(RECORD_VARIABLE, str(tmp_path / "record.json"))
    monkeypatch.setenv("DLCI_INPUT_CPU_THREADS", "auto")  # the action's default: not passed
    assert run(RunRequest(image="img:1", workspace=str(ws), job="7")) == 0
    starts = [line.split() for line in ran.read_text().splitlines() if line.startswith("run ")]
    assert [a[a.index("--phase") + 1] for a in starts] == [
        "install", "tests", "memorize", "doctor", "profile"
    ]  # fmt: skip
    assert not any("--installed" in a or "--cpu-threads" in a for a in starts)
    assert "predates the install container" in capsys.readouterr().err
    steps = {
        s["name"]: s for s in json.loads((tmp_path / "record.json").read_text())["run"]["steps"]
    }
    assert steps["install"]["status"] == "skipped"  # the tests container's own record
    # control: an install container that fails otherwise with 2 fails the job
    fake_docker(older.replace("invalid choice: 'install'", "something else"))
    assert run(RunRequest(image="img:1", workspace=str(ws), job="8")) == 2  # its exit code
    steps = {
        s["name"]: s for s in json.loads((tmp_path / "record.json").read_text())["run"]["steps"]
    }
    assert steps["install"]["status"] == "error" and steps["tests"]["status"] == "skipped"


@pytest.mark.parametrize(
    ("variable", "value", "why"),
    [
        ("FAKE_SIZE_RW", str(9 << 30), "it wrote 9216 MiB, over 8 GiB"),
        ("FAKE_DIFF", "A /home/dlci/.wh..config", "whiteout name"),
        ("FAKE_CONTAINER_CONFIG", '{"Env": ["DATASET_URL=https://x"]}', "keeps the values of"),
        ("FAKE_CONTAINER_CONFIG", '{"Env": ["DATASET_URL="]}', ""),  # control: blanked there too
    ],
    ids=["layer-too-large", "whiteout", "engine-kept-the-value", "control-blanked"],
)
def test_an_install_the_host_will_not_keep_falls_back_to_installing_in_every_part(
    tmp_path: Path, fake_docker, capsys, monkeypatch: pytest.MonkeyPatch,
    variable: str, value: str, why: str,
) -> None:  # fmt: skip
    """Found by an attacker's review: a layer of sparse gigabytes, a ``.wh.`` name that would
    delete a file in the image, an engine (API < 1.45) that keeps the blanked values in the
    image's stored container config. Each: no image, every part installs, the log says why."""
    ws, ran = tmp_path / "ws", tmp_path / "docker-ran"
    ws.mkdir()
    monkeypatch.setenv("DATASET_URL", "https://x")
    monkeypatch.setenv(variable, value)
    fake_docker(_PARTS_DOCKER.format(ran=str(ran), commit=0, install="passed", plant=False))
    run(RunRequest(image="img:1", workspace=str(ws), job="7", env=["DATASET_URL"]))
    calls = ran.read_text().splitlines()
    starts = [line.split() for line in calls if line.startswith("run ")]
    err = capsys.readouterr().err
    if not why:
        assert all("--installed" in a for a in starts[1:]) and "kept as the image" in err
        return
    assert not any("--installed" in a for a in starts[1:]), why
    assert why in err and "every part installs the project again" in err
    committed = any(line.startswith("commit ") for line in calls)
    assert committed == (variable == "FAKE_CONTAINER_CONFIG")  # checked after, then removed
    if committed:
        assert any(line.startswith("image rm -f dlci-installed:") for line in calls)
    assert any(line.startswith("rm -f -v dlci-7-install") for line in calls)  # volumes too
