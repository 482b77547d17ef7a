"""Per-condition measures computed from records, shared by the routine, the report and
`summarize --verify` (a module of its own so that none of them imports another for it).

    logprob_change   mean change of the reference answer's log-probability (a ranking key)
    logprob_summary  the same with its cluster bootstrap interval (the continuous metric)
    null_percentile  where the primary set's result falls among null sets' results
"""

from __future__ import annotations

from collections.abc import Sequence

from cel_numpy.localize.conditions import ExampleResult
from cel_numpy.localize.stats import clustered_mean
from cel_numpy.tasks.base import Item


def logprob_change(comparator: list[ExampleResult], results: list[ExampleResult]) -> float | None:
    """Mean over the items of ref_logprob(condition) - ref_logprob(intact); None if not recorded."""
    pairs = [(c.ref_logprob, r.ref_logprob) for c, r in zip(comparator, results)]
    if not pairs or any(a is None or b is None for a, b in pairs):
        return None
    # rounded to 1e-9: the fast and the plain evaluator sum log-probabilities in another order
    # (differences ~1e-15), and a difference that small must not decide a tie
    return round(sum(b - a for a, b in pairs) / len(pairs), 9)


def logprob_summary(
    items: list[Item], comparator: list[ExampleResult], results: list[ExampleResult], seed: int
) -> dict | None:
    """The continuous metric of one condition on a panel: mean change of the reference answer's
    log-probability (condition minus intact, nats) with its cluster bootstrap 95% interval
    (`stats.clustered_mean`, seeded like the gain's interval); None if not recorded."""
    pairs = [(c.ref_logprob, r.ref_logprob) for c, r in zip(comparator, results)]
    if not pairs or any(a is None or b is None for a, b in pairs):
        return None
    s = clustered_mean([it.cluster for it in items], [b - a for a, b in pairs], seed=seed)
    return s.to_dict()


def null_percentile(primary_gain: int, null_gains: Sequence[int]) -> dict:
    """Where the primary set's held-out gain falls among the null sets' gains."""
    n = len(null_gains)
    below = sum(g < primary_gain for g in null_gains)
    ties = sum(g == primary_gain for g in null_gains)
    return {
        "n": n,
        "below": below,
        "ties": ties,
        "percentile": 100.0 * (below + 0.5 * ties) / n if n else None,
        # share of null sets at least as good, counting the primary set itself (a valid p-value
        # for "the primary set is no better than a random set of its size", with ties as hits)
        "p_value": (1 + n - below) / (n + 1) if n else None,
    }
