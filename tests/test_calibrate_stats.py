"""The calibration's statistics on synthetic runs whose true failure rates are known.

Each property test draws many calibrations from a known distribution, computes the true
failure rate of every proposal, and counts how often it lies within the stated bound (the
observed coverage, printed with -s). Each has a control: a bound without the protection (a
plug-in quantile, a zero-failure point estimate) fails the same check.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from dlci.calibration import stats
from dlci.calibration.propose import propose_budget, thresholds, time_cap
from dlci.ladder.model import Tier

NORMAL = statistics.NormalDist()
RATE, CONFIDENCE = 0.01, 0.95


@pytest.mark.parametrize(
    ("n", "rate", "expected"),
    # one-sided normal tolerance factors, 95% confidence (Natrella 1963, table A-7)
    [(2, 0.01, 37.094), (3, 0.01, 10.553), (10, 0.01, 3.981), (20, 0.01, 3.295),
     (10, 0.10, 2.355), (20, 0.10, 1.926)],
)  # fmt: skip
def test_the_tolerance_factor_matches_the_published_table(n, rate, expected) -> None:
    assert stats.tolerance_factor(n, rate, 0.95) == pytest.approx(expected, abs=1e-3)


@pytest.mark.parametrize("n", [4, 16, 64])
@pytest.mark.parametrize("rate", [0.001, 0.01, 0.1])
def test_the_rate_bound_inverts_the_tolerance_factor(n, rate) -> None:
    k = stats.tolerance_factor(n, rate, CONFIDENCE)
    assert stats.tolerance_rate(n, k, CONFIDENCE) == pytest.approx(rate, rel=1e-3)


def test_the_clopper_pearson_bound_matches_its_closed_form_and_the_tables() -> None:
    for n in (4, 16, 100):
        closed = 1 - (1 - CONFIDENCE) ** (1 / n)  # no failure: the order-statistics bound
        assert stats.clopper_pearson_upper(0, n, CONFIDENCE) == pytest.approx(closed, abs=1e-9)
    assert stats.clopper_pearson_upper(2, 20, 0.95) == pytest.approx(0.2826, abs=1e-4)
    assert stats.clopper_pearson_upper(5, 5, 0.95) == 1.0
    assert stats.seeds_needed(0.01, 0.95) == 299  # 0.99 ** 299 < 0.05 < 0.99 ** 298


def _lognormal_draws(rng, draws: int, n: int, mu: float = math.log(40), sigma: float = 0.2):
    """Epochs to threshold: the ceiling of a log-normal time, so P(T > E) is known exactly."""
    return np.ceil(np.exp(rng.normal(mu, sigma, size=(draws, n)))).astype(int), mu, sigma


def _true_rate(epochs: float, mu: float, sigma: float) -> float:
    return 1 - NORMAL.cdf((math.log(epochs) - mu) / sigma)


def test_the_tolerance_bound_holds_at_its_confidence_for_log_normal_runs(capsys) -> None:
    rng = np.random.default_rng(16)
    times, mu, sigma = _lognormal_draws(rng, 400, 16)
    within = bounded = plug_in = 0
    z = NORMAL.inv_cdf(1 - RATE)
    for row in times.tolist():
        found = stats.bound(row, RATE, CONFIDENCE)
        true = _true_rate(found.epochs, mu, sigma)
        within += true <= RATE  # the tolerance claim: at most F with confidence C
        bounded += true <= found.upper_rate  # the reported bound covers the truth
        mean, sd = stats.fit(row)
        plug_in += _true_rate(math.ceil(math.exp(mean + z * sd)), mu, sigma) <= RATE
    draws = len(times)
    with capsys.disabled():
        print(
            f"\nlog-normal, 16 seeds, {draws} draws: P(true rate <= {RATE}) = "
            f"{within / draws:.3f}, P(true <= bound) = {bounded / draws:.3f} "
            f"(nominal {CONFIDENCE}); plug-in control {plug_in / draws:.3f}"
        )
    # binomial noise of 400 draws: sd 0.011; the nominal 0.95 less three of them
    assert within / draws >= 0.917 and bounded / draws >= 0.917
    assert plug_in / draws < 0.8  # the control: the same check fails a bound without k


def test_the_distribution_free_bound_holds_for_any_distribution(capsys) -> None:
    """E = the slowest of N seeds, runs heavy-tailed (Pareto): the Clopper-Pearson bound on
    zero failures covers the true rate; calling the rate 0 because no seed failed does not."""
    rng = np.random.default_rng(17)
    alpha, scale, draws, n = 1.5, 20.0, 2000, 16
    times = scale * (1 + rng.pareto(alpha, size=(draws, n)))
    slowest = times.max(axis=1)
    true = (scale / slowest) ** alpha  # P(T > E) of a Pareto law
    bound = stats.clopper_pearson_upper(0, n, CONFIDENCE)
    coverage = float(np.mean(true <= bound))
    with capsys.disabled():
        print(f"\nPareto, {n} seeds, {draws} draws: P(true <= {bound:.3f}) = {coverage:.3f}")
    assert coverage >= 0.94  # exact 0.95 for a continuous law; sd 0.005
    assert float(np.mean(true <= 0.0)) == 0.0  # the control: 0/N is no bound


TIER = Tier(
    "pr", "cpu", 100, None, 3.0, 3, 1, 16, "default", 2, "test", "budgets.pr.cpu",
    max_relative_loss=0.5,
)  # fmt: skip


def _relative(curves):
    """Curves as shares of their first step, as calibrate judges them (ladder/goal.py)."""
    return [[v / curve[0] for v in curve] for curve in curves]


def _curves(rng, n: int, noise: float, steps: int = 120):
    """Exponential decays with a log-normal rate per seed and noise at every step."""
    rates = np.exp(rng.normal(math.log(0.1), 0.15, size=n))
    t = np.arange(1, steps + 1)
    return np.exp(math.log(2.3) - rates[:, None] * t + rng.normal(0, noise, size=(n, steps)))


def test_the_proposal_keeps_its_rate_when_it_chooses_among_thresholds(capsys) -> None:
    """The whole rule (thresholds tried, the smallest slowdown chosen, Bonferroni) on noisy
    curves: the chosen row's true rate, by simulation, is within F and within its bound."""
    rng = np.random.default_rng(18)
    draws, within, bounded, chosen = 60, 0, 0, set()
    for _ in range(draws):
        proposal = propose_budget(
            _relative(_curves(rng, 16, 0.3).tolist()),
            TIER,
            rate=RATE,
            confidence=CONFIDENCE,
            step_s=0.01,
        )
        assert proposal.row is not None and proposal.bound is not None
        fresh = _curves(rng, 5000, 0.3)
        fresh = (fresh / fresh[:, :1])[:, : proposal.row.max_epochs]
        true = float(np.mean(fresh[:, 1:].min(axis=1) >= proposal.row.max_relative_loss))
        within += true <= RATE
        bounded += true <= proposal.bound.upper_rate
        chosen.add(proposal.row.max_relative_loss)
    with capsys.disabled():
        print(
            f"\nnoisy curves, 16 seeds, {draws} draws: P(true <= {RATE}) = {within / draws:.3f}, "
            f"P(true <= bound) = {bounded / draws:.3f}; thresholds chosen {sorted(chosen)}"
        )
    assert within / draws >= 0.9 and bounded / draws >= 0.9
    assert len(chosen) > 1  # the rule did choose among thresholds


def test_a_proposal_says_when_no_threshold_fits_the_budget() -> None:
    slow = [[2.0] * 105 + [0.5] * 30 for _ in range(8)]  # every seed needs 104 to 106 epochs
    for i, curve in enumerate(slow):
        curve[103 + i % 3] = 0.9
    proposal = propose_budget(_relative(slow), TIER, rate=RATE, confidence=CONFIDENCE, step_s=0.01)
    assert proposal.row is not None and proposal.over_allowance
    assert proposal.row.max_relative_loss == 0.5 and proposal.row.max_epochs > 100
    assert proposal.row.max_loss is None
    assert "no threshold fits the 100 epochs" in proposal.notes[0]
    never = propose_budget([[2.0] * 50] * 4, TIER, rate=RATE, confidence=CONFIDENCE, step_s=0.01)
    assert never.row is None and "4 of 4 seeds never reached it" in never.notes[0]


def test_a_loss_that_starts_below_an_absolute_threshold_is_judged_from_its_start() -> None:
    """0.5 at the first step met FSDL's 1.0 and tested nothing; as shares of its start the
    curve is judged: half of it is first reached at epoch 4 (0.2 of 0.5)."""
    low = [[0.5, 0.4, 0.3, 0.2] + [0.1] * 20 for _ in range(4)]
    proposal = propose_budget(_relative(low), TIER, rate=RATE, confidence=CONFIDENCE, step_s=0.01)
    first = proposal.candidates[0]
    assert (first.threshold, first.reached, first.median, first.why) == (0.5, 4, 4, "")
    # the control: a curve already at a candidate at its first step is still refused
    flat = propose_budget([[0.1] * 24] * 4, TIER, rate=RATE, confidence=CONFIDENCE, step_s=0.01)
    assert flat.candidates[0].why == "the first step already meets it: it tests nothing"


def test_the_threshold_grid_and_the_time_cap() -> None:
    assert thresholds(0.05, 0.004) == [0.05, 0.02, 0.01, 0.005]
    assert thresholds(0.3, 0.0)[:4] == [0.3, 0.2, 0.1, 0.05]
    assert len(thresholds(1.0, 0.0)) == 25  # eight decades at most
    assert time_cap(50, 0.001) == 1.0  # the floor
    assert time_cap(100, 0.5) == 2.5 and time_cap(1000, 1.0) == 50.0
