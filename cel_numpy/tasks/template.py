"""Tasks whose items form a finite, indexed template space, and the scoring helpers they share.

A `TemplateTask` lists its subtasks; subtask s has exactly `space_size(s)` distinct items and
`item_at(s, i)` builds the i-th one (a bijection from range(space_size(s)) onto the items, so
distinct indices give distinct `Item.id`s). Drawing distinct items is then drawing distinct
integers, which is what `make_panels` does; `sample` draws with replacement, equal shares per
subtask (item i belongs to subtask i mod K).

Clusters (the independent units, `Item.cluster`): subtask s has `cluster_shape(s) = (C, m)`, C
clusters of m items each, and `item_in_cluster(s, c, j)` (j < m) is a second indexing of the same
space, cluster by cluster. The default is one item per cluster. `shared_clusters = True` says that
cluster c is the same unit in every subtask (agreement's subject noun "key" in "The key ..." and
"The keys ..."), so a panel takes it whole across subtasks.

Scoring helpers are tokenizer-independent: they look at strings, never at token ids.
"""

from __future__ import annotations

import re

import numpy as np

from cel_numpy.tasks.base import Item, Scoring

_SIGNED_INT = re.compile(r"-?\d+")


class TemplateTask:
    """Base class: subclasses set the class attributes and implement `space_size` and `item_at`."""

    name: str
    scoring: Scoring
    max_new_tokens: int
    subtasks: tuple[str, ...]

    def space_size(self, subtask: str) -> int:
        raise NotImplementedError

    def item_at(self, subtask: str, index: int) -> Item:
        raise NotImplementedError

    shared_clusters: bool = False

    def cluster_shape(self, subtask: str) -> tuple[int, int]:
        """(number of clusters, items per cluster) of a subtask; default: each item
        its own cluster."""
        return self.space_size(subtask), 1

    def item_in_cluster(self, subtask: str, cluster: int, j: int) -> Item:
        """The j-th item of the cluster-th cluster of a subtask (default: singleton clusters)."""
        if j != 0:
            raise IndexError(f"{self.name}/{subtask}: clusters hold one item, got j = {j}")
        return self.item_at(subtask, cluster)

    def sample(self, rng: np.random.Generator, n: int) -> list[Item]:
        """n items drawn uniformly with replacement; item i is from subtask i mod K."""
        items = []
        for i in range(n):
            subtask = self.subtasks[i % len(self.subtasks)]
            index = int(rng.integers(self.space_size(subtask)))
            items.append(self.item_at(subtask, index))
        return items

    def is_correct(self, item: Item, output: str) -> bool:
        """Default: the chosen candidate ("choice") or the stripped first line ("generate")
        equals the answer."""
        if self.scoring == "choice":
            return output == item.answer
        return first_line(output) == item.answer

    def _check_index(self, subtask: str, index: int) -> None:
        if subtask not in self.subtasks:
            raise ValueError(
                f"task {self.name!r} has no subtask {subtask!r}; known: {', '.join(self.subtasks)}"
            )
        size = self.space_size(subtask)
        if not 0 <= index < size:
            raise IndexError(f"{self.name}/{subtask}: index {index} outside [0, {size})")


# --------------------------------------------------------------------------- scoring helpers


def first_line(output: str) -> str:
    """The generated text up to the first newline, with surrounding whitespace stripped."""
    return output.split("\n", 1)[0].strip()


def parse_signed_int(output: str) -> str | None:
    """The first line if it is exactly a signed integer in canonical form (`-?\\d+`, no '+', no
    separators, no trailing punctuation, no leading zeros, no '-0'), else None."""
    text = first_line(output)
    if not _SIGNED_INT.fullmatch(text):
        return None
    if text != str(int(text)):  # "007", "-0"
        return None
    return text


# --------------------------------------------------------------------------- unranking helpers


def unrank_arrangement(index: int, pool: tuple, k: int) -> list:
    """The index-th ordered selection of k distinct elements of pool,
    index in [0, n(n-1)..(n-k+1))."""
    remaining = list(pool)
    chosen = []
    for _ in range(k):
        index, j = divmod(index, len(remaining))
        chosen.append(remaining.pop(j))
    assert index == 0, "arrangement index out of range"
    return chosen


def n_arrangements(n: int, k: int) -> int:
    """n (n-1) ... (n-k+1): the number of ordered selections of k out of n."""
    out = 1
    for i in range(k):
        out *= n - i
    return out
