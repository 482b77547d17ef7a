"""Paired statistics of an ablation against the intact model on the same examples.

Every example falls in one cell of a 2x2 table (intact correct?, ablated correct?):

                    ablated right   ablated wrong
    intact right         a           c = damaged
    intact wrong     b = rescued         d

gain = rescued - damaged (a count); as a rate, (b - c) / n = p_ablated - p_intact.

Items are not always independent: items of one cluster (`Item.cluster`: the same country, the
same antonym pair...) share what makes them easy or hard. The held-out statistics therefore take
the cluster as the unit (`clustered_summary`):

Primary test: sign-flip permutation test of the per-cluster net gains g_c = rescued_c -
    damaged_c. Under the null hypothesis that removing the heads changes nothing, intact and
    ablated are exchangeable within a cluster, so each g_c is as likely as -g_c; the two-sided
    p-value is the share of the 2^m sign patterns (m = clusters with g_c != 0) whose |sum|
    reaches the observed |sum|. It is exact: enumerated up to 2^20 patterns, above that counted
    by convolving the distributions of the integer terms +-g_c (the same 2^m patterns, counted
    without listing them). Seeded Monte Carlo with its standard error is the path for
    non-integer statistics (`sign_flip_test(..., method="monte-carlo")`). With one item per
    cluster the g_c are the +-1 discordant items and the test is the exact McNemar test.
Interval: cluster bootstrap (seeded) of the gain rate sum(g_c) / sum(n_c), percentile 95%.
Secondary, item-level: exact McNemar (the two-sided binomial test of `rescued` out of the
    `rescued + damaged` discordant examples at 1/2; p = 1 without discordant pairs) and
    Newcombe's paired interval.

Newcombe's hybrid score interval for a difference of paired proportions (Newcombe 1998, Stat
Med 17:2635-2650, method 10; the form in Fagerland, Lydersen and Laake, Statistical Analysis
of Contingency Tables, 2017, chapter 8): the Wilson score intervals of the two marginal
accuracies combined by "square and add" with the correlation phi of the pairs, where
phi = (ad - bc - n/2) / sqrt((a+b)(c+d)(a+c)(b+d)) if ad - bc > n/2, 0 if 0 <= ad - bc <= n/2,
and (ad - bc) / sqrt(...) if ad - bc < 0 (the continuity correction: without it the interval is
too narrow on small tables). It stays inside [-1, 1] and behaves at 0 or n discordant pairs.

The continuous metric (`clustered_mean`): the mean over a panel's items of the change in the
reference answer's log-probability (removed minus intact), with the same cluster bootstrap
interval as the gain rate.

Several tests at once (`holm`): Holm's step-down adjustment, used across the primary tests of a
multi-run summary.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from cel_numpy.limits import check_whole_numbers

EXACT_LIMIT = 2**20  # sign patterns enumerated one by one; above, counted by convolution
N_BOOTSTRAP = 10_000
N_MONTE_CARLO = 100_000


def wilson_interval(x: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for x successes out of n (Newcombe 1998 method 3)."""
    check_whole_numbers(x=(x, 0), n=(n, 0))  # a -1 or a 2.5 would give an interval
    if x > n:
        raise ValueError(f"x = {x} successes out of n = {n}: x must be at most n")
    if not (isinstance(z, numbers.Real) and math.isfinite(z) and z > 0):
        raise ValueError(f"z must be a positive number, got {z!r}")
    if n == 0:
        return 0.0, 1.0
    p = x / n
    centre = 2 * n * p + z * z
    half = z * math.sqrt(z * z + 4 * n * p * (1 - p))
    denom = 2 * (n + z * z)
    return max(0.0, (centre - half) / denom), min(1.0, (centre + half) / denom)


def mover_difference(
    p1: float, l1: float, u1: float, p2: float, l2: float, u2: float, phi: float = 0.0
) -> tuple[float, float]:
    """Square-and-add interval for p1 - p2 from intervals of p1 and p2 and their correlation phi."""
    theta = p1 - p2
    lower = theta - math.sqrt(
        max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2)
    )
    upper = theta + math.sqrt(
        max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2)
    )
    return max(-1.0, lower), min(1.0, upper)


def newcombe_paired_interval(a: int, b: int, c: int, d: int) -> tuple[float, float]:
    """95% interval for (b - c) / n, n = a + b + c + d (see the module docstring for the cells)."""
    check_whole_numbers(a=(a, 0), b=(b, 0), c=(c, 0), d=(d, 0))
    n = a + b + c + d
    if n == 0:
        return -1.0, 1.0
    p1, p2 = (a + b) / n, (a + c) / n  # ablated accuracy, intact accuracy
    l1, u1 = wilson_interval(a + b, n)
    l2, u2 = wilson_interval(a + c, n)
    denom = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c
    if denom == 0 or 0 <= cross <= n / 2:
        phi = 0.0
    elif cross > n / 2:
        phi = (cross - n / 2) / math.sqrt(denom)
    else:
        phi = cross / math.sqrt(denom)
    return mover_difference(p1, l1, u1, p2, l2, u2, phi)


def mcnemar_exact(rescued: int, damaged: int) -> float:
    """Two-sided exact McNemar p-value: binomial test of rescued out of rescued + damaged at 1/2."""
    check_whole_numbers(rescued=(rescued, 0), damaged=(damaged, 0))
    k = rescued + damaged
    if k == 0:
        return 1.0
    return float(stats.binomtest(rescued, k, 0.5).pvalue)


@dataclass(frozen=True)
class PairedSummary:
    n: int
    intact_correct: int
    correct: int  # ablated
    rescued: int
    damaged: int
    gain: int  # rescued - damaged
    gain_rate: float  # gain / n
    ci_low: float  # 95% Newcombe interval for gain_rate
    ci_high: float
    p_value: float  # exact McNemar

    def to_dict(self) -> dict:
        return asdict(self)


def paired_summary(intact: list[bool], ablated: list[bool]) -> PairedSummary:
    """Counts, interval and exact test for one condition against its intact comparator."""
    if len(intact) != len(ablated):
        raise ValueError(
            f"paired data of different lengths: {len(intact)} intact vs {len(ablated)} ablated"
        )
    if not len(intact):
        raise ValueError("no paired items: a summary of nothing has no count, interval or test")
    bad = next((v for v in [*intact, *ablated] if not isinstance(v, (bool, np.bool_))), None)
    if bad is not None:  # "no" is truthy: it would count as correct
        raise ValueError(f"each verdict must be True or False, got {bad!r}")
    a = sum(1 for i, j in zip(intact, ablated) if i and j)
    b = sum(1 for i, j in zip(intact, ablated) if not i and j)
    c = sum(1 for i, j in zip(intact, ablated) if i and not j)
    n = len(intact)
    d = n - a - b - c
    lo, hi = newcombe_paired_interval(a, b, c, d)
    return PairedSummary(
        n=n,
        intact_correct=a + c,
        correct=a + b,
        rescued=b,
        damaged=c,
        gain=b - c,
        gain_rate=(b - c) / n if n else 0.0,
        ci_low=lo,
        ci_high=hi,
        p_value=mcnemar_exact(b, c),
    )


# --------------------------------------------------------------------------- clusters as the unit


@dataclass(frozen=True)
class SignFlipResult:
    p_value: float
    method: str  # "exact" | "monte-carlo"
    n_nonzero: int  # clusters with a nonzero net gain (the others cannot change the statistic)
    n_patterns: int  # sign patterns counted (2^n_nonzero) or drawn (Monte Carlo)
    se: float  # Monte Carlo standard error of p (0 when exact)
    seed: int | None  # Monte Carlo seed (None when exact)


def sign_flip_test(
    gains: Sequence[float],
    *,
    method: str = "auto",
    exact_limit: int = EXACT_LIMIT,
    n_resamples: int = N_MONTE_CARLO,
    seed: int = 0,
) -> SignFlipResult:
    """Two-sided sign-flip permutation test of sum(gains) = 0 (see the module docstring).

    method "auto": exact (enumeration up to `exact_limit` patterns; integer gains above it by
    convolution; other gains above it by Monte Carlo); "exact": enumeration or convolution,
    whatever the size; "monte-carlo": `n_resamples` random patterns from `seed`, p =
    (1 + hits) / (1 + n_resamples), with its binomial standard error.
    """
    if method not in ("auto", "exact", "monte-carlo"):
        raise ValueError(f"method must be auto, exact or monte-carlo, got {method!r}")
    check_whole_numbers(n_resamples=(n_resamples, 1), seed=(seed, 0))
    g = np.asarray([x for x in gains if x != 0], dtype=np.float64)  # (m,)
    if not np.isfinite(g).all():  # a NaN or inf gain would give p = 0
        raise ValueError("gains must be finite numbers; got a NaN or an infinity")
    m = len(g)
    if m == 0:
        return SignFlipResult(1.0, "exact", 0, 1, 0.0, None)
    observed = abs(float(g.sum()))
    tol = 1e-9 * max(1.0, float(np.abs(g).sum()))  # float sums of the same terms may differ by ulps
    integer = bool(np.all(g == np.round(g)))
    if method == "monte-carlo" or (method == "auto" and 2**m > exact_limit and not integer):
        rng = np.random.default_rng(seed)
        hits, done = 0, 0
        while done < n_resamples:
            k = min(n_resamples - done, max(1, 2**22 // m))
            signs = rng.integers(0, 2, size=(k, m), dtype=np.int8) * 2 - 1  # (k, m)
            hits += int(np.count_nonzero(np.abs(signs @ g) >= observed - tol))
            done += k
        p = (1 + hits) / (1 + n_resamples)
        se = math.sqrt(p * (1 - p) / n_resamples)
        return SignFlipResult(min(1.0, p), "monte-carlo", m, n_resamples, se, int(seed))
    if 2**m <= exact_limit:
        p = _enumerate_sign_flips(g, observed, tol)
    elif integer:
        p = _convolve_sign_flips(g.astype(np.int64), int(round(observed)))
    else:
        raise ValueError(
            f"exact sign-flip test of {m} non-integer gains needs 2^{m} patterns; use monte-carlo"
        )
    return SignFlipResult(min(1.0, p), "exact", m, 2**m, 0.0, None)


def _enumerate_sign_flips(g: np.ndarray, observed: float, tol: float) -> float:
    """Share of the 2^m sign patterns with |sum| >= observed, listed in blocks of patterns."""
    m = len(g)
    low, high = g[: min(m, 10)], g[min(m, 10) :]

    def sums(part):  # every signed sum of `part`, (2^len,)
        bits = (np.arange(2 ** len(part))[:, None] >> np.arange(len(part))) & 1
        return (bits * 2 - 1) @ part

    s_low, s_high = sums(low), sums(high) if len(high) else np.zeros(1)
    total = s_low[:, None] + s_high[None, :]  # (2^a, 2^b) every pattern once
    return float(np.count_nonzero(np.abs(total) >= observed - tol)) / total.size


def _convolve_sign_flips(g: np.ndarray, observed: int) -> float:
    """P(|sum of +-g_c| >= observed) for integer g_c, by convolving the two-point distributions."""
    reach = int(np.abs(g).sum())
    prob = np.zeros(2 * reach + 1)  # prob[s + reach] = P(sum = s)
    prob[reach] = 1.0
    for x in np.abs(g):
        x = int(x)
        prob = 0.5 * (np.roll(prob, x) + np.roll(prob, -x))  # no wrap: |sum| <= reach throughout
    values = np.arange(-reach, reach + 1)
    return float(prob[np.abs(values) >= observed].sum())


def cluster_bootstrap_interval(
    gains: Sequence[float],
    sizes: Sequence[int],
    *,
    n_resamples: int = N_BOOTSTRAP,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile interval of sum(gains) / sum(sizes) over clusters resampled with replacement."""
    g = np.asarray(gains, dtype=np.float64)  # (C,)
    n = np.asarray(sizes, dtype=np.float64)  # (C,)
    if len(g) != len(n) or len(g) == 0:
        raise ValueError(f"need one size per cluster, got {len(g)} gains and {len(n)} sizes")
    if not np.isfinite(g).all() or not (n >= 1).all():
        raise ValueError("gains must be finite and every cluster size at least 1")
    check_whole_numbers(n_resamples=(n_resamples, 1), seed=(seed, 0))
    if not (isinstance(level, numbers.Real) and 0 < level < 1):
        raise ValueError(f"level must be between 0 and 1, got {level!r}")
    rng = np.random.default_rng(seed)
    rates = np.empty(n_resamples)
    step = max(1, 2**22 // len(g))
    for start in range(0, n_resamples, step):
        idx = rng.integers(0, len(g), size=(min(step, n_resamples - start), len(g)))  # (k, C)
        rates[start : start + len(idx)] = g[idx].sum(axis=1) / n[idx].sum(axis=1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(rates, [alpha, 1 - alpha])
    return float(lo), float(hi)


@dataclass(frozen=True)
class ClusteredSummary:
    n: int
    n_clusters: int
    intact_correct: int
    correct: int  # ablated
    rescued: int
    damaged: int
    gain: int
    gain_rate: float
    p_value: float  # primary: cluster sign-flip test
    p_method: str  # "exact" | "monte-carlo"
    p_se: float  # Monte Carlo standard error (0 when exact)
    ci_low: float  # primary: cluster bootstrap 95% interval of gain_rate
    ci_high: float
    bootstrap_seed: int
    item_p_value: float  # secondary: exact McNemar on items
    item_ci_low: float  # secondary: Newcombe's paired 95% interval on items
    item_ci_high: float

    def to_dict(self) -> dict:
        return asdict(self)


def cluster_gains(
    clusters: Sequence[str], intact: Sequence[bool], ablated: Sequence[bool]
) -> tuple[list[int], list[int]]:
    """(net gain per cluster, items per cluster), clusters in order of first appearance."""
    if not len(clusters) == len(intact) == len(ablated):
        raise ValueError(
            f"paired data of different lengths: {len(clusters)} clusters, {len(intact)} intact, "
            f"{len(ablated)} ablated"
        )
    gain: dict[str, int] = {}
    size: dict[str, int] = {}
    for c, i, j in zip(clusters, intact, ablated):
        gain[c] = gain.get(c, 0) + int(bool(j)) - int(bool(i))
        size[c] = size.get(c, 0) + 1
    return list(gain.values()), list(size.values())


def clustered_summary(
    clusters: Sequence[str], intact: Sequence[bool], ablated: Sequence[bool], *, seed: int = 0
) -> ClusteredSummary:
    """Held-out statistics of one condition: the cluster as the unit, items as secondary."""
    item = paired_summary(list(intact), list(ablated))
    gains, sizes = cluster_gains(clusters, intact, ablated)
    test = sign_flip_test(gains, seed=seed)
    lo, hi = cluster_bootstrap_interval(gains, sizes, seed=seed)
    return ClusteredSummary(
        n=item.n,
        n_clusters=len(gains),
        intact_correct=item.intact_correct,
        correct=item.correct,
        rescued=item.rescued,
        damaged=item.damaged,
        gain=item.gain,
        gain_rate=item.gain_rate,
        p_value=test.p_value,
        p_method=test.method,
        p_se=test.se,
        ci_low=lo,
        ci_high=hi,
        bootstrap_seed=int(seed),
        item_p_value=item.p_value,
        item_ci_low=item.ci_low,
        item_ci_high=item.ci_high,
    )


@dataclass(frozen=True)
class ClusteredMean:
    """A per-item quantity averaged over a panel, with the cluster as the unit of resampling."""

    n: int
    n_clusters: int
    mean: float  # sum of the values / n
    ci_low: float  # cluster bootstrap 95% interval of the mean (as for the gain rate)
    ci_high: float
    bootstrap_seed: int

    def to_dict(self) -> dict:
        return asdict(self)


def clustered_mean(
    clusters: Sequence[str], values: Sequence[float], *, seed: int = 0
) -> ClusteredMean:
    """Mean of per-item `values` with its cluster bootstrap interval: the per-cluster sums and
    sizes resampled exactly as `clustered_summary` resamples the net gains (same seed, same
    draws), so the gain rate and this mean come from one resampling scheme."""
    if len(clusters) != len(values) or not len(values):
        raise ValueError(f"need one cluster per value, got {len(clusters)} and {len(values)}")
    if not np.isfinite(np.asarray(values, dtype=np.float64)).all():
        raise ValueError("values must be finite numbers; got a NaN or an infinity")
    total: dict[str, float] = {}
    size: dict[str, int] = {}
    for c, v in zip(clusters, values):
        total[c] = total.get(c, 0.0) + float(v)
        size[c] = size.get(c, 0) + 1
    lo, hi = cluster_bootstrap_interval(list(total.values()), list(size.values()), seed=seed)
    return ClusteredMean(
        n=len(values),
        n_clusters=len(total),
        mean=float(sum(values)) / len(values),
        ci_low=lo,
        ci_high=hi,
        bootstrap_seed=int(seed),
    )


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error), in the input order."""
    bad = next((p for p in p_values if not (isinstance(p, numbers.Real) and 0 <= p <= 1)), None)
    if bad is not None or any(isinstance(p, bool) for p in p_values):  # NaN fails 0 <= p
        raise ValueError(f"p-values must be numbers in [0, 1], got {bad!r}")
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
