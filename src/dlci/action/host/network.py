"""The network of the job's containers and of its image's build: chosen by trust.

Host-side (the runner), never imports torch. ``default`` is Docker's default bridge: it reaches
the internet, and every service of the runner's host that listens on the bridge's gateway
(``172.17.0.1``, the container's own default route) or on ``0.0.0.0``: an exporter, a cache, a
registry, a proxy (issue 35). So the input's default, ``auto``, gives a trusted job (a push to
the default branch, a schedule, ...: dlci.action.host.cache.decide_trust) the bridge as before and a
pull request ``none``: only a loopback interface, in every container of the job and in the
``RUN`` steps of the image it builds. A pull request that needs a package index says
``network: default`` in its workflow, knowing that its code then reaches what the bridge
reaches (docs/security.md), or gets its dependencies into the image another way (a prebuilt
``image``, a wheelhouse). The host network is not offered: it would hand the pull request's
code the runner's own services on localhost.
"""

from __future__ import annotations

from dlci.errors import DlciError

NETWORK_MODES = ("auto", "default", "none")


def resolve_network(network: str, trust: str) -> str:
    """``default`` or ``none`` for the ``network`` input (empty: ``auto``) and the job's trust.

    >>> resolve_network("auto", "untrusted"), resolve_network("", "trusted")
    ('none', 'default')
    >>> resolve_network("default", "untrusted")
    'default'
    """
    value = network.strip() or "auto"
    if value not in NETWORK_MODES:
        raise DlciError(
            f"input network (--network): expected auto, default or none, got {network!r}",
            hint="network: auto (the bridge for trusted jobs, none for pull requests), "
            "network: none (no network in the job's containers), or network: default "
            "(Docker's bridge network, which installing from a package index needs; it also "
            "reaches the runner host's services on the bridge)",
        )
    if value == "auto":
        return "default" if trust == "trusted" else "none"
    return value


def network_flags(network: str, trust: str = "untrusted") -> list[str]:
    """The ``docker run`` flags for the action's ``network`` input and the job's trust.

    >>> network_flags("none"), network_flags("default"), network_flags("auto", "trusted")
    (['--network', 'none'], [], [])
    >>> network_flags("auto")
    ['--network', 'none']
    """
    return [] if resolve_network(network, trust) == "default" else ["--network", "none"]


def build_network_flags(network: str, trust: str) -> list[str]:
    """The ``docker build`` flags: the ``RUN`` steps get the job's network.

    >>> build_network_flags("auto", "untrusted"), build_network_flags("auto", "trusted")
    (['--network', 'none'], [])
    """
    return network_flags(network, trust)
