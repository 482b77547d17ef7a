"""Ranking, nomination and the joint-search enumeration (docs/design.md#ranking-and-tie-breaks),
as pure functions.

Per condition, against the intact comparator on the same examples:
    rescued = became correct, damaged = became wrong, gain = rescued - damaged, correct = # right,
    logprob_change = mean over the items of the change of the reference answer's log-probability
                     (`ExampleResult.ref_logprob`, condition minus intact; None if not recorded).

    singletons:  sort by (-gain, damaged, -correct, [-logprob_change,] heads)
    joint:       sort by (-gain, damaged, -correct, len(heads), [-logprob_change,] heads)

The released protocol (`tie_break="coordinates"`) breaks the remaining ties by `heads`, the
sorted tuple of (layer, head) pairs (lexicographic by layer then head). On small discovery
panels whole groups tie on the integer counts, and the coordinates then choose the heads, which
carries no information. The informed tie-break (`tie_break="logprob"`, the routine's default)
puts the continuous logprob_change first among equals: the condition that raises the reference
answer's log-probability most ranks first; coordinates only decide exact ties of that too (or
when an evaluator records no log-probabilities). `decided_by` counts, for the top slots of a
ranking, which key separated each slot from the next candidate.

The top 10 singletons are the nominees; the joint search evaluates every pair and triple of
nominees (45 + 120) and ranks them with the 10 nominee singletons (reused from the screen): 175
candidates. The top 10 are the finalists.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cel_numpy.errors import OptionError
from cel_numpy.localize.conditions import Condition, Head, normalize_condition

N_NOMINEES = 10
N_FINALISTS = 10
TIE_BREAKS = ("logprob", "coordinates")


@dataclass(frozen=True)
class Scored:
    heads: Condition
    correct: int
    rescued: int
    damaged: int
    logprob_change: float | None = None  # mean change of the reference answer's log-probability

    @property
    def gain(self) -> int:
        return self.rescued - self.damaged


def _check(tie_break: str) -> None:
    if tie_break not in TIE_BREAKS:
        raise ValueError(f"tie_break must be one of {', '.join(TIE_BREAKS)}, got {tie_break!r}")


LOGPROB_RESOLUTION = 6  # decimals (nats) the tie-break reads: smaller differences are ties


def _informed(s: Scored) -> float:
    """Larger increases first; a condition without a recorded change sorts after those with one.

    Read to 1e-6 nats, so that the reference evaluator and the fast engine, whose log-probabilities
    agree to float rounding, rank identically (a difference below that is float noise, not signal).
    """
    if s.logprob_change is None or math.isnan(s.logprob_change):
        return math.inf
    return -round(s.logprob_change, LOGPROB_RESOLUTION)


def key_names(joint: bool, tie_break: str = "coordinates") -> tuple[str, ...]:
    """Names of the components of `singleton_key` / `joint_key`, in order."""
    _check(tie_break)
    names = ["gain", "damaged", "correct"] + (["set size"] if joint else [])
    return tuple(names + (["logprob"] if tie_break == "logprob" else []) + ["coordinates"])


def singleton_key(s: Scored, tie_break: str = "coordinates"):
    _check(tie_break)
    informed = (_informed(s),) if tie_break == "logprob" else ()
    return (-s.gain, s.damaged, -s.correct, *informed, s.heads)


def joint_key(s: Scored, tie_break: str = "coordinates"):
    _check(tie_break)
    informed = (_informed(s),) if tie_break == "logprob" else ()
    return (-s.gain, s.damaged, -s.correct, len(s.heads), *informed, s.heads)


def rank_singletons(scored: Sequence[Scored], tie_break: str = "coordinates") -> list[Scored]:
    return sorted(scored, key=lambda s: singleton_key(s, tie_break))


def rank_joint(scored: Sequence[Scored], tie_break: str = "coordinates") -> list[Scored]:
    return sorted(scored, key=lambda s: joint_key(s, tie_break))


def decided_by(
    ranked: Sequence[Scored], k: int, joint: bool, tie_break: str = "coordinates"
) -> dict[str, int]:
    """For each of the top-k slots of `ranked`: the first key component in which its occupant
    differs from the next-ranked candidate (the one it had to beat). Counts per component name;
    the last candidate of a list no longer than k has no competitor ("uncontested")."""
    key = joint_key if joint else singleton_key
    names = key_names(joint, tie_break)
    counts = {name: 0 for name in names}
    for i in range(min(k, len(ranked))):
        if i + 1 >= len(ranked):
            counts["uncontested"] = counts.get("uncontested", 0) + 1
            continue
        this, nxt = key(ranked[i], tie_break), key(ranked[i + 1], tie_break)
        j = next(j for j, (x, y) in enumerate(zip(this, nxt)) if x != y)
        counts[names[j]] += 1
    return counts


def all_heads(n_layers: int, n_heads: int) -> list[Head]:
    return [(l, h) for l in range(n_layers) for h in range(n_heads)]


def nominees(ranked_singletons: Sequence[Scored], k: int = N_NOMINEES) -> list[Head]:
    """The heads of the top-k singletons, in rank order (all of them if there are fewer than k)."""
    out = []
    for s in ranked_singletons[:k]:
        (head,) = s.heads
        out.append(head)
    return out


def joint_enumeration(nominated: Sequence[Head]) -> tuple[list[Condition], list[Condition]]:
    """(reused singletons, new conditions): the singletons of the nominees, then all
    pairs and triples.

    New conditions are enumerated over the nominees sorted by (layer, head), pairs before triples,
    so the plan (and the records file) does not depend on the screen's tie order.
    """
    heads = sorted(nominated)
    singles = [(h,) for h in heads]
    pairs = [normalize_condition(c) for c in itertools.combinations(heads, 2)]
    triples = [normalize_condition(c) for c in itertools.combinations(heads, 3)]
    return singles, pairs + triples


MAX_NULL_SETS = 10_000  # each one is a held-out evaluation of every item


def check_null_set_count(n_sets: int) -> None:
    """The cost cap on --null-sets, which needs no model."""
    if n_sets > MAX_NULL_SETS:
        raise OptionError(
            f"--null-sets {n_sets}: each set is one more held-out evaluation of every item; "
            f"at most {MAX_NULL_SETS:,} are run"
        )


def check_null_sets(n_sets: int, n_layers: int, n_heads: int, size: int | None = None) -> None:
    """OptionError, before any work, when `n_sets` null sets cannot be drawn or cost too much.

    size: the heads per set (test-heads: the given set); None while the rank-1 set is not known
    yet (localize): then only the count that every size allows, that of single heads (N - 1
    other heads), is accepted.
    """
    check_null_set_count(n_sets)
    n = n_layers * n_heads
    if size is None:
        if n_sets > n - 1:
            raise OptionError(
                f"--null-sets {n_sets}: the rank-1 set may be a single head, and a model of {n} "
                f"heads has only {n - 1} others; ask for at most {n - 1} (or test the found set "
                "with test-heads --null-sets, where its size is known)"
            )
        return
    n_possible = math.comb(n, size) - 1
    if n_sets > n_possible:
        raise OptionError(
            f"--null-sets {n_sets}: a model of {n} heads has only {n_possible} other sets of "
            f"{size} heads"
        )


def draw_null_sets(
    n_layers: int, n_heads: int, size: int, n_sets: int, seed: int, exclude: Condition
) -> list[Condition]:
    """n_sets distinct random head sets of `size` heads (uniform over all heads, without
    replacement within a set), never `exclude` (the primary set), reproducible from `seed`."""
    heads = all_heads(n_layers, n_heads)
    n_possible = math.comb(len(heads), size) - (len(exclude) == size)
    if n_sets > n_possible:
        raise ValueError(
            f"asked for {n_sets} null sets of {size} heads; a model of {len(heads)} heads has "
            f"only {n_possible} other sets of that size"
        )
    rng = np.random.default_rng(seed)
    out: list[Condition] = []
    seen = {normalize_condition(exclude)}
    while len(out) < n_sets:
        pick = rng.choice(len(heads), size, replace=False)
        cond = normalize_condition(heads[int(i)] for i in pick)
        if cond not in seen:
            seen.add(cond)
            out.append(cond)
    return out


def best_of_subsamples(
    ranked: Sequence[int], n_pool: int, budget: int, replicates: int, seed: int
) -> list[int]:
    """The selection-matched null's picks: for each of `replicates` replicates, draw `budget` of
    the `n_pool` pool sets without replacement and keep the best one by the search's ranking.

    `ranked[i]` is pool set i's position in the ranking of the whole pool (0 = best), so the
    best of a subsample is the one with the smallest position. Returns the pool index picked by
    each replicate, reproducible from `seed`.
    """
    if sorted(ranked) != list(range(n_pool)):
        raise ValueError(f"ranked must be a permutation of range({n_pool})")
    if not 1 <= budget <= n_pool:
        raise ValueError(f"budget must be in 1..{n_pool} (the pool), got {budget}")
    position = np.asarray(ranked)  # (P,)
    rng = np.random.default_rng(seed)
    picks = []
    for _ in range(replicates):
        sample = rng.choice(n_pool, budget, replace=False)  # (budget,)
        picks.append(int(sample[np.argmin(position[sample])]))
    return picks


def expected_distinct_picks(n_pool: int, budget: int, replicates: int) -> float:
    """Expected number of distinct pool sets that `best_of_subsamples` picks (each needs one
    held-out evaluation), whatever the pool's scores: the set ranked j-th (1-based) is a
    replicate's pick with probability p_j = C(P - j, B - 1) / C(P, B) (it is drawn, the j - 1
    better ones are not), so E = sum_j 1 - (1 - p_j)^R over j = 1 .. P - B + 1."""
    p = budget / n_pool  # p_1
    total = 0.0
    last = n_pool - budget + 1
    for j in range(1, last + 1):
        total += 1.0 - (1.0 - p) ** replicates
        if j < last:
            p *= (n_pool - j - budget + 1) / (n_pool - j)  # p_{j+1} / p_j
    return total
