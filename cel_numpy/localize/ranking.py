"""Ranking, nomination and the joint-search enumeration (docs/design.md#ranking-and-tie-breaks), as pure functions.

Per condition, against the intact comparator on the same examples:
    rescued = became correct, damaged = became wrong, gain = rescued - damaged, correct = # right.

    singletons:  sort by (-gain, damaged, -correct, heads)
    joint:       sort by (-gain, damaged, -correct, len(heads), heads)   (fewer heads first on ties)

`heads` is the sorted tuple of (layer, head) pairs, so the last tie-break is lexicographic by
layer then head. The top 10 singletons are the nominees; the joint search evaluates every pair
and triple of nominees (45 + 120) and ranks them with the 10 nominee singletons (reused from
the screen): 175 candidates. The top 10 are the finalists.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from cel_numpy.localize.conditions import Condition, Head, normalize_condition

N_NOMINEES = 10
N_FINALISTS = 10


@dataclass(frozen=True)
class Scored:
    heads: Condition
    correct: int
    rescued: int
    damaged: int

    @property
    def gain(self) -> int:
        return self.rescued - self.damaged


def singleton_key(s: Scored):
    return (-s.gain, s.damaged, -s.correct, s.heads)


def joint_key(s: Scored):
    return (-s.gain, s.damaged, -s.correct, len(s.heads), s.heads)


def rank_singletons(scored: Sequence[Scored]) -> list[Scored]:
    return sorted(scored, key=singleton_key)


def rank_joint(scored: Sequence[Scored]) -> list[Scored]:
    return sorted(scored, key=joint_key)


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
    """(reused singletons, new conditions): the singletons of the nominees, then all pairs and triples.

    New conditions are enumerated over the nominees sorted by (layer, head), pairs before triples,
    so the plan (and the records file) does not depend on the screen's tie order.
    """
    heads = sorted(nominated)
    singles = [(h,) for h in heads]
    pairs = [normalize_condition(c) for c in itertools.combinations(heads, 2)]
    triples = [normalize_condition(c) for c in itertools.combinations(heads, 3)]
    return singles, pairs + triples
