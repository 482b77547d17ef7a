"""Is a gain on a two-label task more than a shift of bias between the labels?

On a task whose items all offer the same two choices (BoolQ's " no" / " yes"), a model's
verdict on item i is the sign of its margin m_i = log p(second label) - log p(first label).
Adding one constant b to every margin moves the model along its own ranking of the items and
changes only how often it picks each label. So an ablation that gains on such a task can do it
two ways:

- it shifts the margins as a constant b would (a bias shift): were the ablated margins exactly
  the intact ones plus b, the intact model with that b would gain as much;
- it reorders the items: the items whose reference is the second label move ahead of the
  others, which no constant can do (an item-dependent shift, say one tied to passage length,
  can; a reordering alone does not show that the model reads better).

The two are told apart by a measure that a constant cannot change (`roc_auc`, the chance that a
random second-label item has a larger margin than a random first-label one), by the intact model
with exactly the ablated model's number of second-label picks (`offset_for_picks`: the same
bias shift, so any remaining gain is a reordering), and by the intact model with its best
constant (`best_offset`, chosen on the discovery panel, never on the held-out one).

All functions are pure: margins (n,) float, is_second (n,) bool (the item's reference is the
second label).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cel_numpy.tasks.base import Item


def two_label_choices(items: Sequence[Item]) -> tuple[str, str]:
    """The two labels every item offers, in the items' order; ValueError unless there are."""
    if not items:
        raise ValueError("no items: a label bias needs a panel of two-label items")
    choices = tuple(items[0].choices or ())
    if len(choices) != 2 or any(tuple(it.choices or ()) != choices for it in items):
        raise ValueError(
            "a label bias needs items that all offer the same two choices (e.g. BoolQ's "
            f"' no' / ' yes'); item {items[0].id} offers {list(choices)}"
        )
    if any(it.answer not in choices for it in items):
        raise ValueError("every item's reference must be one of its two choices")
    return choices  # type: ignore[return-value]


def label_margins(items: Sequence[Item], scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(margins (n,), is_second (n,)) from scores (n, 2): log-probabilities of the two labels in
    the items' choice order (`LMEvaluator.choice_logprobs`)."""
    first, second = two_label_choices(items)
    scores = np.asarray(scores, dtype=np.float64)
    if scores.shape != (len(items), 2):
        raise ValueError(f"scores must be (n_items, 2) = ({len(items)}, 2), got {scores.shape}")
    if not np.all(np.isfinite(scores)):
        raise ValueError("a label's log-probability is not finite")
    return scores[:, 1] - scores[:, 0], np.array([it.answer == second for it in items])


def picks_second(margins: np.ndarray, offset: float = 0.0) -> np.ndarray:
    """(n,) bool: the second label is picked. A tie goes to the first label, as the routine's
    first-maximum rule does."""
    return np.asarray(margins, dtype=np.float64) + offset > 0


def correct_with_offset(margins: np.ndarray, is_second: np.ndarray, offset: float = 0.0):
    """(n,) bool: the verdict with every margin shifted by `offset` is right."""
    return picks_second(margins, offset) == np.asarray(is_second, dtype=bool)


def roc_auc(margins: np.ndarray, is_second: np.ndarray) -> float:
    """P(margin of a random second-label item > that of a random first-label item), ties
    counting 1/2 (the Mann-Whitney U / (n_second n_first)). Unchanged by any constant offset."""
    m = np.asarray(margins, dtype=np.float64)
    pos = np.asarray(is_second, dtype=bool)
    a, b = m[pos], m[~pos]
    if not len(a) or not len(b):
        raise ValueError("roc_auc needs items of both labels")
    order = np.sort(b)
    below = np.searchsorted(order, a, side="left")  # first-label margins < each second's
    ties = np.searchsorted(order, a, side="right") - below
    return float((below.sum() + 0.5 * ties.sum()) / (len(a) * len(b)))


def _cut_points(margins: np.ndarray) -> np.ndarray:
    """Offsets that realize every distinct split of the sorted margins: -(midpoints between
    distinct neighbours), and beyond both ends (all first, all second)."""
    u = np.unique(np.asarray(margins, dtype=np.float64))
    mids = (u[:-1] + u[1:]) / 2
    return -np.concatenate([[u[-1] + 1.0], mids[::-1], [u[0] - 1.0]])


def best_offset(margins: np.ndarray, is_second: np.ndarray) -> float:
    """The constant that, added to every margin, makes the most verdicts right; among equally
    good ones, the one nearest 0 (0 itself when no constant beats it; a margin of exactly 0
    then stays on the boundary and picks the first label, as in the routine). Any other result
    is halfway between neighbouring distinct margins; two margins one float apart have no
    float between them, so that one split is never tried."""
    m = np.asarray(margins, dtype=np.float64)
    if not len(m):
        raise ValueError("best_offset needs at least one item")
    candidates = np.concatenate([[0.0], _cut_points(m)])
    right = [int(correct_with_offset(m, is_second, b).sum()) for b in candidates]
    best = max(right)
    if right[0] == best:
        return 0.0
    ties = candidates[np.array(right) == best]
    return float(ties[np.argmin(np.abs(ties))])


def offset_for_picks(margins: np.ndarray, n_second: int) -> float:
    """A constant after which exactly `n_second` items pick the second label: the largest
    margins first. ValueError when tied margins make that count impossible."""
    m = np.sort(np.asarray(margins, dtype=np.float64))[::-1]  # descending
    n = len(m)
    if not 0 <= n_second <= n:
        raise ValueError(f"n_second must be in 0..{n}, got {n_second}")
    if n_second == 0:
        return float(-(m[0] + 1.0))
    if n_second == n:
        return float(-(m[-1] - 1.0))
    hi, lo = m[n_second - 1], m[n_second]
    offset = float(-(hi / 2 + lo / 2))
    if hi == lo or int(picks_second(m, offset).sum()) != n_second:
        raise ValueError(
            f"margins tie (or sit one float apart) at the {n_second}th largest: no constant "
            "picks exactly that many"
        )
    return offset


def auc_difference_interval(
    clusters: Sequence[str],
    margins_a: np.ndarray,
    margins_b: np.ndarray,
    is_second: np.ndarray,
    *,
    n_resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile interval of roc_auc(b) - roc_auc(a) over clusters resampled with replacement
    (the routine's unit of resampling; both models on the same resampled items). A resample
    holding one label only is drawn again."""
    ma, mb = np.asarray(margins_a, np.float64), np.asarray(margins_b, np.float64)
    pos = np.asarray(is_second, dtype=bool)
    if not len(clusters) == len(ma) == len(mb) == len(pos):
        raise ValueError("need one cluster, two margins and one label per item")
    if pos.all() or not pos.any():
        raise ValueError("auc_difference_interval needs items of both labels")
    names = sorted(set(clusters))
    index = {c: k for k, c in enumerate(names)}
    members = [[] for _ in names]
    for i, c in enumerate(clusters):
        members[index[c]].append(i)
    members = [np.array(m) for m in members]
    rng = np.random.default_rng(seed)
    diffs = []
    while len(diffs) < n_resamples:
        pick = np.concatenate([members[k] for k in rng.integers(0, len(names), len(names))])
        if pos[pick].all() or not pos[pick].any():
            continue
        diffs.append(roc_auc(mb[pick], pos[pick]) - roc_auc(ma[pick], pos[pick]))
    alpha = (1 - level) / 2
    lo, hi = np.quantile(diffs, [alpha, 1 - alpha])
    return float(lo), float(hi)
