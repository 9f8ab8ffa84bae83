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
import re
import subprocess
import time
from collections.abc import Sequence

from dlci.action.host.image import say

IMAGE_REPOSITORY = "dlci-installed"
#: the label of every container and image of a job (dlci.action.host.container.JOB_LABEL)
JOB_LABEL = "dlci.job"
COMMIT_TIMEOUT_S = 600.0  # a large install (CUDA extensions, many wheels) takes a while


def image_name(container: str) -> str:
    """A valid image reference for the job's installed image.

    >>> image_name("dlci-Run 42/7-install")
    'dlci-installed:dlci-run-42-7-install'
    """
    tag = re.sub(r"[^a-z0-9_.-]+", "-", container.lower()).strip(".-")[:120] or "job"
    return f"{IMAGE_REPOSITORY}:{tag}"


def passed_names(cmd: Sequence[str]) -> list[str]:
    """The environment variables a ``docker run`` command line passes by name (``-e NAME``).

    >>> passed_names(["docker", "run", "-e", "HF_TOKEN", "-e", "DLCI_IN_CONTAINER=1", "img"])
    ['HF_TOKEN']
    """
    names = []
    for flag, value in itertools.pairwise(cmd):
        if flag == "-e" and "=" not in value:
            names.append(value)
    return names


def commit(container: str, job: str, cmd: Sequence[str]) -> tuple[str | None, float, str]:
    """Commit the stopped install container: (image or None, seconds, why not)."""
    image = image_name(container)
    changes = [f"LABEL {JOB_LABEL}={job}"] + [f"ENV {name}=" for name in passed_names(cmd)]
    argv = ["docker", "commit"]
    for change in changes:
        argv += ["--change", change]
    started = time.monotonic()
    try:
        done = subprocess.run(
            [*argv, container, image],
            capture_output=True,
            text=True,
            timeout=COMMIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, time.monotonic() - started, str(exc)
    took = time.monotonic() - started
    if done.returncode != 0:
        return None, took, (done.stderr.strip().splitlines() or ["docker commit failed"])[-1]
    return image, took, ""


def remove_container(container: str) -> None:
    subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False, timeout=120)


def remove_image(image: str | None) -> None:
    """Remove the job's installed image (its layers go with it: nothing else uses them)."""
    if image:
        done = subprocess.run(
            ["docker", "image", "rm", "-f", image], capture_output=True, check=False, timeout=120
        )
        if done.returncode != 0:
            say(f"the job's installed image {image} could not be removed; cleanup retries")


def remove_job_images(job: str) -> list[str]:
    """Every installed image labelled with ``job`` (cleanup after a killed job); their ids."""
    listed = subprocess.run(
        ["docker", "images", "-q", "--filter", f"label={JOB_LABEL}={job}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    ids = sorted(set(listed.stdout.split())) if listed.returncode == 0 else []
    if ids:
        subprocess.run(
            ["docker", "image", "rm", "-f", *ids], capture_output=True, check=False, timeout=120
        )
    return ids
