"""The localization routine: statistics, ranking, enumeration, run directory (resume, lock), the
theory-model acceptance test, and a planted harmful head.

Most tests use `FakeEvaluator`, a millisecond stand-in for a model: every item has an intact
score and every head a per-item push; an example is correct iff the score plus the pushes of the
ablated heads is positive. Its results are a pure function of (item id, condition).
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from cel_numpy.cli import UserError
from cel_numpy.localize import rundir as rd
from cel_numpy.localize.evaluate import (
    ExampleResult,
    TheoryEvaluator,
    TheoryTask,
    condition_name,
    evaluate_naive,
    normalize_condition,
)
from cel_numpy.localize.ranking import (
    Scored,
    joint_enumeration,
    joint_key,
    nominees,
    rank_joint,
    rank_singletons,
)
from cel_numpy.localize.routine import STAGES, Localizer, localize
from cel_numpy.localize.stats import (
    mcnemar_exact,
    mover_difference,
    newcombe_paired_interval,
    paired_summary,
    wilson_interval,
)
from cel_numpy.tasks.base import Item

# --------------------------------------------------------------------------- fixtures


class FakeTask:
    name = "fake"
    scoring = "generate"
    max_new_tokens = 4

    def __init__(self, name="fake"):
        self.name = name

    def sample(self, rng, n):
        return [Item(self.name, "s", f"q{int(k)}", f"a{int(k)}") for k in rng.integers(0, 10**6, n)]

    def is_correct(self, item, output):
        return output == item.answer


def _item_rng(item_id: str, salt: int) -> np.random.Generator:
    return np.random.default_rng([int(item_id, 16) % (2**63), salt])


class FakeEvaluator:
    """score(item) + sum of pushes of the ablated heads > 0  <=>  correct.

    planted: {(layer, head): push} added to every item (e.g. a head whose removal helps).
    """

    def __init__(self, n_layers=3, n_heads=5, planted=None, salt=0, flaky=False):
        self.n_layers, self.n_heads = n_layers, n_heads
        self.planted = planted or {}
        self.salt = salt
        self.flaky = flaky
        self.calls = 0

    def identity(self):
        return {"kind": "fake", "spec": "fake", "n_layers": self.n_layers, "n_heads": self.n_heads,
                "planted": sorted([list(k), v] for k, v in self.planted.items()), "salt": self.salt}

    def evaluate_one(self, items, cond):
        self.calls += 1
        out = []
        for it in items:
            r = _item_rng(it.id, self.salt)
            score = r.normal()
            pushes = 0.3 * r.normal(size=(self.n_layers, self.n_heads))
            total = score + sum(pushes[l, h] + self.planted.get((l, h), 0.0) for l, h in cond)
            if self.flaky and self.calls % 2 == 0 and it is items[0]:
                total = -total
            ok = bool(total > 0)
            out.append(ExampleResult(it.id, ok, it.answer if ok else "wrong"))
        return out

    def evaluate_many(self, items, conditions):
        return evaluate_naive(self.evaluate_one, items, conditions)


def fake_factory(**kw):
    ev = FakeEvaluator(**kw)
    return lambda task, reference_items: ev


def run_fake(out, until="report", n_disc=40, n_held=40, seed=0, **kw):
    factory = kw.pop("factory", None) or fake_factory(**kw.pop("ev", {}))
    return localize(out, factory, FakeTask(), n_discovery=n_disc, n_heldout=n_held, seed=seed, until=until,
                    progress=False, command="test", **kw)


# --------------------------------------------------------------------------- statistics


def test_wilson_matches_published_value():
    # Newcombe (1998a), Stat Med 17:857, method 3 on 81/263: 0.2553 to 0.3662.
    lo, hi = wilson_interval(81, 263)
    assert (round(lo, 4), round(hi, 4)) == (0.2553, 0.3662)


def test_square_and_add_matches_published_value():
    # Newcombe (1998b), Stat Med 17:873, method 10 on 56/70 - 48/80: 0.0524 to 0.3339.
    # The paired interval is this construction with the correlation phi of the pairs.
    l1, u1 = wilson_interval(56, 70)
    l2, u2 = wilson_interval(48, 80)
    lo, hi = mover_difference(56 / 70, l1, u1, 48 / 80, l2, u2, phi=0.0)
    assert (round(lo, 4), round(hi, 4)) == (0.0524, 0.3339)


def test_paired_interval_properties():
    for a, b, c, d in [(30, 9, 2, 59), (0, 0, 0, 10), (5, 5, 5, 5), (0, 10, 0, 0), (40, 0, 12, 48)]:
        n = a + b + c + d
        lo, hi = newcombe_paired_interval(a, b, c, d)
        assert -1 <= lo <= (b - c) / n <= hi <= 1, (a, b, c, d, lo, hi)
    # positive correlation of the pairs narrows the interval compared with independent samples
    lo, hi = newcombe_paired_interval(30, 9, 2, 59)
    l1, u1 = wilson_interval(39, 100)
    l2, u2 = wilson_interval(32, 100)
    ilo, ihi = mover_difference(0.39, l1, u1, 0.32, l2, u2, 0.0)
    assert hi - lo < ihi - ilo


def test_paired_interval_coverage_near_nominal():
    rng = np.random.default_rng(0)
    probs = np.array([0.5, 0.15, 0.05, 0.3])  # a, b, c, d: true gain 0.10
    hits = 0
    n_sims = 2000
    for _ in range(n_sims):
        a, b, c, d = rng.multinomial(100, probs)
        lo, hi = newcombe_paired_interval(a, b, c, d)
        hits += lo <= 0.10 <= hi
    assert 0.93 <= hits / n_sims <= 0.975, hits / n_sims


def test_mcnemar_exact_is_binomial_on_discordant_pairs():
    # 2 * P(X >= 10 | Bin(12, 1/2)) = 2 * 79 / 4096
    assert mcnemar_exact(10, 2) == pytest.approx(2 * 79 / 4096)
    assert mcnemar_exact(2, 10) == pytest.approx(2 * 79 / 4096)
    assert mcnemar_exact(0, 0) == 1.0


def test_paired_summary_counts():
    intact = [True, True, False, False, True]
    ablated = [True, False, True, True, True]
    s = paired_summary(intact, ablated)
    assert (s.rescued, s.damaged, s.gain, s.correct, s.intact_correct) == (2, 1, 1, 4, 3)
    assert s.gain_rate == pytest.approx(0.2)


# --------------------------------------------------------------------------- ranking


def S(heads, correct, rescued, damaged):
    return Scored(normalize_condition(heads), correct, rescued, damaged)


def test_singleton_ranking_and_tie_breaks():
    a = S([(0, 1)], 50, 5, 1)  # gain 4
    b = S([(2, 0)], 50, 6, 2)  # gain 4, more damage -> after a
    c = S([(1, 3)], 52, 5, 1)  # gain 4, damage 1, more correct -> before a
    d = S([(0, 0)], 52, 5, 1)  # identical counts to c: head order decides -> before c
    e = S([(3, 3)], 60, 9, 0)  # gain 9 -> first
    ranked = rank_singletons([a, b, c, d, e])
    assert [s.heads for s in ranked] == [((3, 3),), ((0, 0),), ((1, 3),), ((0, 1),), ((2, 0),)]


def test_joint_ranking_prefers_fewer_heads_on_ties():
    triple = S([(0, 0), (0, 1), (0, 2)], 50, 5, 1)
    pair = S([(1, 1), (2, 2)], 50, 5, 1)
    single = S([(5, 5)], 50, 5, 1)
    better = S([(0, 0), (0, 1), (0, 2), ], 51, 5, 1)
    ranked = rank_joint([triple, pair, single])
    assert [len(s.heads) for s in ranked] == [1, 2, 3]
    assert rank_joint([single, better])[0] is better  # -correct comes before the size tie-break
    assert joint_key(pair) < joint_key(triple)


def test_joint_enumeration_is_175_candidates():
    ranked = rank_singletons([S([(l, h)], 10, (7 * l + 3 * h) % 11, 0) for l in range(4) for h in range(5)])
    nom = nominees(ranked, 10)
    assert len(nom) == 10 and len(set(nom)) == 10
    singles, new = joint_enumeration(nom)
    assert len(singles) == 10 and len(new) == 45 + 120
    everything = singles + new
    assert len(everything) == 175 and len(set(everything)) == 175
    assert all(len(set(c)) == len(c) and set(c) <= set(nom) and list(c) == sorted(c) for c in everything)
    assert sum(len(c) == 2 for c in new) == 45 and sum(len(c) == 3 for c in new) == 120


def test_condition_names():
    assert condition_name(()) == "intact"
    assert condition_name(normalize_condition([(7, 1), (3, 5)])) == "L3H5+L7H1"
    with pytest.raises(ValueError):
        normalize_condition([(1, 1), (1, 1)])
