"""The network of the job's containers: Docker's default bridge, or none at all.

Host-side (the runner), never imports torch. What the job needs decides the default: its
``install`` step (``auto``: ``pip install`` of the requirements files and the project) reads a
package index, and so does a target that downloads its data, so ``default`` (Docker's bridge
network, what ``docker run`` gives without ``--network``) keeps a plain workflow working.
``none`` gives every container of the job only a loopback interface: for air-gapped runners,
and for pull requests whose code should reach nothing, with the project's dependencies in the
image (``extra-pip``, a wheelhouse) and ``install: none`` or an install that needs no index.
The host network is not offered: it would hand the pull request's code the runner's own
services on localhost.
"""

from __future__ import annotations

from dlci.errors import DlciError

NETWORK_MODES = ("default", "none")


def network_flags(network: str) -> list[str]:
    """The ``docker run`` flags for the action's ``network`` input (empty: ``default``).

    >>> network_flags("none"), network_flags("default"), network_flags("")
    (['--network', 'none'], [], [])
    """
    value = network.strip()
    if value in ("", "default"):
        return []
    if value == "none":
        return ["--network", "none"]
    raise DlciError(
        f"input network (--network): expected default or none, got {network!r}",
        hint="network: none (no network in the job's containers), or network: default "
        "(Docker's bridge network, which installing from a package index needs)",
    )
