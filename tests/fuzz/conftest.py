"""Hypothesis profiles for the fuzz suite, and the table of what its children cost.

``ci`` (the default) keeps the suite near a minute; ``nightly`` runs many more examples:
``HYPOTHESIS_PROFILE=nightly pytest tests/fuzz``. Every example runs the CLI in a child
process under ``resource`` limits (tests/fuzz/fuzzchild.py), so a time or memory bomb fails the
example instead of taking the machine; the worst time and memory per input class are
printed at the end of the run.
"""

from __future__ import annotations

import os

from fuzzchild import STATS
from hypothesis import HealthCheck, settings

_COMMON = {
    "deadline": None,  # each example starts a process: its time is bounded by RLIMIT_CPU
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    "derandomize": False,
}
settings.register_profile("ci", max_examples=25, **_COMMON)
settings.register_profile("nightly", max_examples=1000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if not STATS:
        return
    terminalreporter.section("dl-ci fuzz: children by input class")
    terminalreporter.write_line(
        "input class | cases tried | exit codes | worst time (s) | peak memory (MiB)"
    )
    for name, rows in sorted(STATS.items()):
        codes = ",".join(str(c) for c in sorted({r[0] for r in rows}))
        worst = max(r[1] for r in rows)
        peak = max(r[2] for r in rows)
        terminalreporter.write_line(f"{name} | {len(rows)} | {codes} | {worst:.2f} | {peak:.0f}")
