"""Resample ablation: a removed head's output taken from another item of the same panel.

Zero ablation sets a head's z to 0, which no input ever produces; mean ablation replaces it by
its mean over the discovery prompts, the same vector for every item. Resample ablation keeps the
item-to-item variation of the head: item i's removed head outputs what it outputs on a donor
item d(i) of the same panel. Prompts differ in length and the answer's positions have no
counterpart in the donor, so the donor's contribution is its mean z over its own prompt
positions (intact model), the same at every position of item i, prompt and answer alike
(`Model.row_mean_z`).

Donors (`resample_donors`, a pure function of the items' clusters and a seed): a seeded
derangement in which no item's donor shares its cluster (a donor asking for the same country or
antonym pair would carry the answer). Items are laid out cluster by cluster, clusters and the
items inside each in seeded random order, and item at place p takes the item at place p + m
(mod N) as donor, m the size of the largest cluster: a cluster occupies at most m consecutive
places, so with N >= 2m no place reaches its own cluster. With N < 2m no such derangement need
exist, and it is an error.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from cel_numpy.errors import UserError


def resample_donors(clusters: Sequence[str], seed: int) -> np.ndarray:
    """(N,) donor index per item: never itself, never its own cluster; seeded."""
    n = len(clusters)
    members: dict[str, list[int]] = defaultdict(list)
    for i, c in enumerate(clusters):
        members[c].append(i)
    m = max((len(v) for v in members.values()), default=0)
    if n < 2 * m or n < 2:
        raise UserError(
            f"resample ablation takes each item's donor from another cluster: the panel has {n} "
            f"items and its largest cluster {m}; it needs at least twice as many items as its "
            "largest cluster holds (use a larger panel or another ablation)"
        )
    rng = np.random.default_rng(seed)
    order: list[int] = []
    names = list(members)
    for k in rng.permutation(len(names)):
        order.extend(rng.permutation(members[names[k]]).tolist())
    donors = np.empty(n, dtype=np.int64)
    for p, i in enumerate(order):
        donors[i] = order[(p + m) % n]
    return donors


def rows_of(fill: np.ndarray | None, rows) -> np.ndarray | None:
    """A fill for a subset of the items: None or (L, H, E) as it is, a fill per item
    (L, N, H, E) at `rows` (a slice or an index list)."""
    return fill if fill is None or fill.ndim == 3 else fill[:, rows]
