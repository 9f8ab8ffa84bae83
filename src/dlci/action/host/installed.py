"""The project installed once per job: the install container's result, kept as an image.

Host-side (the runner), never imports torch. Before, every part of the job (the tests, each
gate) ran the project's install step again in its own fresh container: 3 to 4 installs a job,
2 to 9 s each on a small project, the largest share of the kit's own time. Now the install
step runs once, in a container of its own (``dlci run --phase install``) on its own copy of
the checkout; when it passes, the host commits that stopped container to an image of the job's
own (``docker commit``) and every later part starts fresh from that image, on a fresh copy of
the *installed* checkout (what the install wrote there: an editable install's metadata, an
extension built in place). So each part still starts from the same state, untouched by any
other part: the tests' changes never reach a gate, and one gate's never the next.

What the image must not keep: the values of the environment variables the install container
was given (``-e NAME``: a token the project's install needed), which ``docker commit`` would
write into the image's configuration. Each is blanked at the commit (``--change 'ENV NAME='``);
every later part is given the same names again from the runner's environment. The image is
labelled with the job (``dlci.job``) and removed when the job's parts are done, and again by
``dlci container cleanup`` (a job killed before that).

When the commit fails (an engine that refuses it, no room), each part installs again, as before,
and the log says so: slower, never a different verdict.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import time
from collections.abc import Sequence

from dlci.action.host.image import docker, say
from dlci.action.host.inputs import ENV_ALLOWLIST
from dlci.errors import DlciError

IMAGE_REPOSITORY = "dlci-installed"
#: the label of every container and image of a job (dlci.action.host.container.JOB_LABEL)
JOB_LABEL = "dlci.job"
COMMIT_TIMEOUT_S = 600.0  # a large install (CUDA extensions, many wheels) takes a while
COMMIT_LIMIT = 8 << 30  # bytes the install may add to the container's layer (its SizeRw)
GROWTH_BYTES = 1 << 30  # what the install may add to its copy of the checkout, in bytes
GROWTH_FILES = 200_000  # and in files (an editable install adds a few; a build, thousands)
WHITEOUT = ".wh."  # a name the layer format reads as "deleted": never committed


def image_name(container: str) -> str:
    """A valid image reference for the job's installed image.

    >>> image_name("dlci-Run 42/7-install")
    'dlci-installed:dlci-run-42-7-install'
    """
    tag = re.sub(r"[^a-z0-9_.-]+", "-", container.lower()).strip(".-")[:120] or "job"
    return f"{IMAGE_REPOSITORY}:{tag}"


def passed_names(cmd: Sequence[str]) -> list[str]:
    """The environment variables a ``docker run`` command line passes by name (``-e NAME``),
    among docker's own flags (never the job's arguments after the image).

    >>> passed_names(["docker", "run", "-e", "HF_TOKEN", "-e", "DLCI_IN_CONTAINER=1", "img",
    ...               "dlci", "run", "-e", "X"])
    ['HF_TOKEN']
    """
    flags = list(cmd)
    if "DLCI_IN_CONTAINER=1" in flags:
        flags = flags[: flags.index("DLCI_IN_CONTAINER=1")]
    names = []
    for flag, value in itertools.pairwise(flags):
        if flag == "-e" and "=" not in value:
            names.append(value)
    return names


def refuse(container: str) -> str:
    """Why the stopped install container must not become an image ("" when it may): its
    layer over COMMIT_LIMIT (a sparse file counts whole), or a path named like a whiteout
    (``.wh.NAME`` would delete NAME in the image, whatever the install was allowed to do)."""
    size = _stdout(["container", "inspect", "--size", "--format", "{{.SizeRw}}", container])
    if size is None or not size.strip().isdigit():
        return "its size could not be read"
    if int(size) > COMMIT_LIMIT:
        return f"it wrote {int(size) >> 20} MiB, over {COMMIT_LIMIT >> 30} GiB"
    changed = _stdout(["diff", container])
    if changed is None:
        return "its changes could not be listed"
    for line in changed.splitlines():
        if line.rsplit("/", 1)[-1].startswith(WHITEOUT):
            return f"it wrote a whiteout name ({line.split(maxsplit=1)[-1][:200]})"
    return ""


def kept_values(image: str, names: Sequence[str]) -> list[str]:
    """The passed names whose values an engine kept in the image's stored container config
    (``ContainerConfig``, written by engines before API 1.45) despite the blanking."""
    found = _stdout(["image", "inspect", "--format", "{{json .ContainerConfig}}", image])
    try:
        config = json.loads(found or "null")
    except ValueError:
        return []
    env = config.get("Env") if isinstance(config, dict) else None
    kept = {item.partition("=")[0] for item in env or [] if item.partition("=")[2]}
    return sorted(set(names) & kept)


def _docker(args: list[str], timeout: float = 120.0) -> subprocess.CompletedProcess[str] | None:
    """``docker ARGS`` through the host's one docker runner (image.docker, unchecked); None
    when it could not run (no docker, a time-out): every caller falls back or retries."""
    try:
        return docker(args, timeout=timeout, check=False)
    except (DlciError, OSError):
        return None


def _stdout(args: list[str]) -> str | None:
    done = _docker(args)
    return done.stdout if done is not None and done.returncode == 0 else None


def commit(container: str, job: str, cmd: Sequence[str]) -> tuple[str | None, float, str]:
    """Commit the stopped install container: (image or None, seconds, why not)."""
    image = image_name(container)
    why = refuse(container)
    if why:
        return None, 0.0, why
    changes = [f"LABEL {JOB_LABEL}={job}"] + [f"ENV {name}=" for name in passed_names(cmd)]
    argv = ["commit"]
    for change in changes:
        argv += ["--change", change]
    started = time.monotonic()
    done = _docker([*argv, container, image], timeout=COMMIT_TIMEOUT_S)
    took = time.monotonic() - started
    if done is None:
        return None, took, f"docker commit did not finish within {COMMIT_TIMEOUT_S:g} s"
    if done.returncode != 0:
        return None, took, (done.stderr.strip().splitlines() or ["docker commit failed"])[-1]
    own = [name for name in passed_names(cmd) if name not in ENV_ALLOWLIST]
    kept = kept_values(image, own)
    if kept:  # this engine wrote the values into the image anyway: never keep it
        remove_image(image)
        return None, took, f"this Docker engine keeps the values of {', '.join(kept)} in it"
    return image, took, ""


def remove_container(container: str) -> None:
    """The stopped install container, and its anonymous volumes (a VOLUME in the image would
    otherwise keep what the install wrote there)."""
    _docker(["rm", "-f", "-v", container])


def remove_image(image: str | None) -> None:
    """Remove the job's installed image (its layers go with it: nothing else uses them)."""
    if image:
        done = _docker(["image", "rm", "-f", image])
        if done is None or done.returncode != 0:
            say(f"the job's installed image {image} could not be removed; cleanup retries")


def remove_job_images(job: str) -> list[str]:
    """Every installed image labelled with ``job`` (cleanup after a killed job); their ids."""
    listed = _stdout(["images", "-q", "--filter", f"label={JOB_LABEL}={job}"])
    ids = sorted(set(listed.split())) if listed else []
    if ids:
        _docker(["image", "rm", "-f", *ids])
    return ids
