"""Statistics with the cluster as the unit (`cel_numpy.localize.stats`): the sign-flip test
against McNemar and brute force, its Monte Carlo path, the cluster bootstrap, Newcombe's
corrected paired interval against published worked examples, Holm."""

import itertools
import math

import numpy as np
import pytest

from cel_numpy.localize.stats import (
    cluster_bootstrap_interval,
    cluster_gains,
    clustered_summary,
    holm,
    mcnemar_exact,
    newcombe_paired_interval,
    paired_summary,
    sign_flip_test,
    wilson_interval,
)


def _brute_force(gains):
    """Share of all 2^m sign patterns whose |signed sum| reaches |sum(gains)|, listed one by one."""
    observed = abs(sum(gains))
    hits = total = 0
    for signs in itertools.product((-1, 1), repeat=len(gains)):
        total += 1
        hits += abs(sum(s * g for s, g in zip(signs, gains))) >= observed - 1e-9
    return hits / total


# --------------------------------------------------------------------------- Newcombe, corrected


@pytest.mark.parametrize(
    "table, published",
    [
        # Fagerland, Lydersen and Laake, Statistical Analysis of Contingency Tables (2017), ch. 8:
        # airway hyper-responsiveness before/after stem cell transplantation (Bentur et al. 2009),
        # n11, n12, n21, n22 = 1, 1, 7, 12; Newcombe square-and-add: -0.2857 (-0.507 to -0.026)
        ((1, 1, 7, 12), (-0.507, -0.026)),
        # same source: complete response before/after consolidation therapy (Cavo et al. 2012),
        # 59, 6, 16, 80; Newcombe square-and-add: -0.0621 (-0.1186 to -0.0046)
        ((59, 6, 16, 80), (-0.1186, -0.0046)),
    ],
)
def test_newcombe_paired_interval_matches_published_examples(table, published):
    """Newcombe 1998, Stat Med 17:2635-2650, method 10, with its correction of phi. Our cells
    (a, b, c, d) are Fagerland's (n11, n12, n21, n22): the difference is (b - c) / n."""
    lo, hi = newcombe_paired_interval(*table)
    digits = 3 if published[0] == round(published[0], 3) else 4
    assert (round(lo, digits), round(hi, digits)) == published


def test_newcombe_correction_widens_small_tables():
    """ad - bc = 12 - 7 = 5 <= n/2 = 10.5: the corrected phi is 0, and the interval is wider
    than with the uncorrected phi = 5 / sqrt(2 * 19 * 8 * 13) > 0 (the released behaviour)."""
    from cel_numpy.localize.stats import mover_difference, wilson_interval

    a, b, c, d = 1, 1, 7, 12
    n = a + b + c + d
    l1, u1 = wilson_interval(a + b, n)
    l2, u2 = wilson_interval(a + c, n)
    phi = (a * d - b * c) / math.sqrt((a + b) * (c + d) * (a + c) * (b + d))
    old = mover_difference((a + b) / n, l1, u1, (a + c) / n, l2, u2, phi)
    new = newcombe_paired_interval(a, b, c, d)
    assert new[1] - new[0] > old[1] - old[0]


# --------------------------------------------------------------------------- sign-flip test


@pytest.mark.parametrize("rescued, damaged", [(0, 0), (1, 0), (5, 1), (10, 2), (27, 4), (32, 6),
                                              (40, 40), (3, 17), (60, 45)])  # fmt: skip
def test_sign_flip_with_singleton_clusters_is_exact_mcnemar(rescued, damaged):
    """One item per cluster: the gains are the +-1 discordant items (and zeros), the test is the
    exact McNemar test, both on the enumeration path (<= 20 discordant) and above it."""
    items = [1] * rescued + [-1] * damaged + [0] * 7
    result = sign_flip_test(items)
    assert result.method == "exact"
    assert result.p_value == pytest.approx(mcnemar_exact(rescued, damaged), rel=1e-9, abs=1e-15)


def test_sign_flip_equals_brute_force_enumeration():
    rng = np.random.default_rng(0)
    for m in range(1, 13):
        gains = [int(x) for x in rng.integers(-3, 4, size=m)]
        assert sign_flip_test(gains).p_value == pytest.approx(_brute_force(gains), abs=1e-12)
        real = [float(x) for x in rng.normal(0.3, 1.0, size=m)]  # non-integer statistics too
        assert sign_flip_test(real).p_value == pytest.approx(_brute_force(real), abs=1e-12)


def test_convolution_equals_enumeration_above_the_limit():
    """The convolution that counts the 2^m patterns of integer gains past 2^20 gives the same p as
    listing them (forced here with a low limit)."""
    rng = np.random.default_rng(1)
    for _ in range(5):
        gains = [int(x) for x in rng.integers(-2, 5, size=18)]
        listed = sign_flip_test(gains, exact_limit=2**20)
        counted = sign_flip_test(gains, exact_limit=2**4)
        assert listed.n_patterns == counted.n_patterns == 2 ** sum(g != 0 for g in gains)
        assert counted.p_value == pytest.approx(listed.p_value, rel=1e-9)


def test_monte_carlo_is_seeded_and_its_error_bound_holds():
    """A case with a known answer (60 singleton +-1 clusters, 38 rescued: exact McNemar); the
    Monte Carlo p is reproducible from its seed and within 4 standard errors of the truth."""
    gains = [1] * 38 + [-1] * 22
    truth = mcnemar_exact(38, 22)
    first = sign_flip_test(gains, method="monte-carlo", n_resamples=40_000, seed=3)
    again = sign_flip_test(gains, method="monte-carlo", n_resamples=40_000, seed=3)
    other = sign_flip_test(gains, method="monte-carlo", n_resamples=40_000, seed=4)
    assert first == again and first.seed == 3 and first.method == "monte-carlo"
    assert other.p_value != first.p_value
    assert first.se == pytest.approx(math.sqrt(first.p_value * (1 - first.p_value) / 40_000))
    for r in (first, other):
        assert abs(r.p_value - truth) <= 4 * r.se, (r.p_value, truth, r.se)


def test_monte_carlo_is_the_auto_path_only_for_non_integer_gains_above_the_limit():
    real = [0.5 + 0.01 * i for i in range(22)]
    auto = sign_flip_test(real, exact_limit=2**10, n_resamples=2000)
    assert auto.method == "monte-carlo" and auto.se > 0
    assert sign_flip_test([1] * 22, exact_limit=2**10).method == "exact"


# --------------------------------------------------------------------------- clusters


def test_cluster_gains_and_summary():
    clusters = ["fr", "fr", "jp", "jp", "eg", "it"]
    intact = [False, False, True, False, True, True]
    ablated = [True, True, False, True, True, False]
    gains, sizes = cluster_gains(clusters, intact, ablated)
    assert gains == [2, 0, 0, -1] and sizes == [2, 2, 1, 1]
    s = clustered_summary(clusters, intact, ablated, seed=0)
    assert (s.n, s.n_clusters, s.rescued, s.damaged, s.gain) == (6, 4, 3, 2, 1)
    assert s.p_value == pytest.approx(_brute_force([2, -1]))  # zeros cannot change the sum
    assert s.item_p_value == pytest.approx(mcnemar_exact(3, 2))


def test_clustered_summary_with_singleton_clusters_matches_item_level():
    rng = np.random.default_rng(2)
    intact = list(rng.random(200) < 0.6)
    ablated = [(not x) if rng.random() < 0.15 else x for x in intact]
    s = clustered_summary([str(i) for i in range(200)], intact, ablated)
    assert s.n_clusters == 200 and s.p_value == pytest.approx(s.item_p_value, rel=1e-9)


def test_cluster_bootstrap_is_seeded_and_brackets_the_estimate():
    rng = np.random.default_rng(5)
    gains = [int(x) for x in rng.integers(-1, 3, size=60)]
    sizes = [int(x) for x in rng.integers(1, 4, size=60)]
    rate = sum(gains) / sum(sizes)
    first = cluster_bootstrap_interval(gains, sizes, seed=7)
    assert first == cluster_bootstrap_interval(gains, sizes, seed=7)
    assert first != cluster_bootstrap_interval(gains, sizes, seed=8)
    assert first[0] < rate < first[1]
    # clusters that all agree leave nothing to resample
    assert cluster_bootstrap_interval([1, 1, 1], [1, 1, 1]) == (1.0, 1.0)


def test_cluster_bootstrap_coverage_near_nominal():
    """Clusters with a shared random effect: the cluster bootstrap covers the true rate about 95%
    of the time (a check of the construction, 400 simulated panels of 80 clusters)."""
    rng = np.random.default_rng(11)
    true_rate = float(np.mean(np.clip(rng.normal(0.1, 0.4, size=10**6), -0.5, 0.5)))
    hits = 0
    for _ in range(400):
        effect = rng.normal(0.1, 0.4, size=80)  # per-cluster mean gain per item
        sizes = rng.integers(1, 5, size=80)
        gains = [int(rng.binomial(n, 0.5 + np.clip(e, -0.5, 0.5) / 2) * 2 - n)
                 for e, n in zip(effect, sizes)]  # fmt: skip
        lo, hi = cluster_bootstrap_interval(gains, list(sizes), n_resamples=2000, seed=0)
        hits += lo <= true_rate <= hi
    assert 0.90 <= hits / 400 <= 0.985, hits / 400


# --------------------------------------------------------------------------- Holm


def test_holm_step_down():
    # sorted 0.01, 0.03, 0.04, 0.5 -> 4 * 0.01, 3 * 0.03, max(0.09, 2 * 0.04), 0.5
    assert holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert holm([0.2, 0.6]) == pytest.approx([0.4, 0.6])
    assert holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: holm([float("nan"), 0.01]), "p-values must be numbers in \\[0, 1\\], got nan"),
        (lambda: holm([1.5, 0.2]), "got 1.5"),
        (lambda: holm([-0.5, 0.2]), "got -0.5"),
        (lambda: sign_flip_test([float("nan"), 1.0]), "gains must be finite"),
        (lambda: sign_flip_test([float("inf"), 1.0]), "gains must be finite"),
        (lambda: sign_flip_test([1.0, 2.0], method="monte-carlo", n_resamples=-5), "n_resamples"),
    ],
    ids=["holm-nan", "holm-above-1", "holm-negative", "nan-gain", "inf-gain", "no-resamples"],
)
def test_a_value_no_test_can_take_is_refused(call, message):
    """Each used to give a number that looks valid: a NaN gain p = 0, a NaN p-value turning a
    valid 0.01 into 1.0, -5 resamples p = -0.25."""
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: wilson_interval(5, -10), "n must be an integer >= 0, got -10"),
        (lambda: wilson_interval(11, 10), "x must be at most n"),
        (lambda: wilson_interval(5, 10, z=-1.0), "z must be a positive number"),
        (lambda: newcombe_paired_interval(-1, 2, 3, 4), "a must be an integer >= 0, got -1"),
        (lambda: mcnemar_exact(2.5, 1), "rescued must be an integer >= 0, got 2.5"),
        (lambda: paired_summary([], []), "no paired items"),
        (lambda: paired_summary(["no", "yes"], [True, False]), "must be True or False, got 'no'"),
        (lambda: cluster_bootstrap_interval([1.0], [1], n_resamples=0), "n_resamples"),
        (lambda: cluster_bootstrap_interval([1.0], [1], level=2.0), "level must be between"),
        (lambda: cluster_bootstrap_interval([1.0], [0]), "every cluster size at least 1"),
        (lambda: sign_flip_test([1.0, 2.0], method="monte-carlo", seed=1.7), "seed must be"),
    ],
    ids=["negative-n", "x-above-n", "negative-z", "negative-cell", "float-count", "empty",
         "strings", "no-resamples", "level-2", "empty-cluster", "float-seed"],
)  # fmt: skip
def test_impossible_counts_are_refused_not_summarized(call, message):
    """Each returned an interval, p-value or summary that looked valid: (0, -2.05) for 5 of
    -10, n = 0 with p = 1 for no items, two strings counted as correct."""
    with pytest.raises(ValueError, match=message):
        call()
