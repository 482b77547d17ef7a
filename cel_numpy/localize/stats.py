"""Paired statistics of an ablation against the intact model on the same examples.

Every example falls in one cell of a 2x2 table (intact correct?, ablated correct?):

                    ablated right   ablated wrong
    intact right         a           c = damaged
    intact wrong     b = rescued         d

gain = rescued - damaged (a count); as a rate, (b - c) / n = p_ablated - p_intact.

Test: exact McNemar, i.e. the two-sided binomial test of `rescued` out of the `rescued + damaged`
discordant examples against 1/2 (`scipy.stats.binomtest`); p = 1 when there are no discordant pairs.

Interval: Newcombe's hybrid score interval for a difference of paired proportions (Newcombe
1998, Stat Med 17:2635, method 10). Why this one: it combines the two Wilson score intervals of
the marginal accuracies with the observed correlation phi of the pairs (the "square and add" /
MOVER construction), stays inside [-1, 1], behaves at 0 or n discordant pairs where the Wald
interval collapses to a point, and has coverage close to nominal at the panel sizes we use
(hundreds), unlike the exact conditional interval, which ignores the randomness of the
discordant count. With phi = 0 it is exactly Newcombe's method 10 for independent proportions,
whose published worked example (56/70 vs 48/80 -> 0.0524 to 0.3339) the tests reproduce.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from scipy import stats


def wilson_interval(x: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for x successes out of n (Newcombe 1998 method 3)."""
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
    n = a + b + c + d
    if n == 0:
        return -1.0, 1.0
    p1, p2 = (a + b) / n, (a + c) / n  # ablated accuracy, intact accuracy
    l1, u1 = wilson_interval(a + b, n)
    l2, u2 = wilson_interval(a + c, n)
    denom = (a + b) * (c + d) * (a + c) * (b + d)
    phi = (a * d - b * c) / math.sqrt(denom) if denom > 0 else 0.0
    return mover_difference(p1, l1, u1, p2, l2, u2, phi)


def mcnemar_exact(rescued: int, damaged: int) -> float:
    """Two-sided exact McNemar p-value: binomial test of rescued out of rescued + damaged at 1/2."""
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
