"""Indirect object identification (Wang et al. 2022): who receives the object?

    "When Mary and John went to the store, John gave a drink to" -> " Mary"

Two subtasks by name order in the first clause (IO = indirect object, S = subject, who repeats):
    ABBA  "When {IO} and {S} went to the {place}, {S} gave a {object} to"
    BABA  "When {S} and {IO} went to the {place}, {S} gave a {object} to"
Scoring ("choice"): the two names, in order of first mention, each with a leading space; correct
iff the indirect object has the higher total log-probability. The answer sits first in ABBA and
second in BABA, so position alone scores 50%.

Clusters (`Item.cluster`, the independent unit): the two names (either order, either role) with
the template, shared by both subtasks: 190 name pairs * 4 templates = 760 clusters of 2 * 64
items per subtask.

Template space per subtask: 20 * 19 ordered name pairs * 4 templates * 8 places * 8 objects = 97280.
"""

from __future__ import annotations

import itertools
import re

from cel_numpy.tasks.base import Item
from cel_numpy.tasks.template import TemplateTask

NAMES = (
    "Mary", "John", "Tom", "James", "Sarah", "Anna", "David", "Paul", "Kate", "Lisa",
    "Mark", "Emma", "Mike", "Jack", "Laura", "Peter", "Susan", "Daniel", "Rachel", "Michael",
)  # fmt: skip
TEMPLATES = (
    "When {A} and {B} went to the {place}, {S} gave a {object} to",
    "After {A} and {B} went to the {place}, {S} gave a {object} to",
    "While {A} and {B} were working at the {place}, {S} gave a {object} to",
    "Then, {A} and {B} went to the {place}. {S} gave a {object} to",
)
PLACES = ("store", "park", "school", "office", "station", "restaurant", "hospital", "garden")
OBJECTS = ("drink", "book", "ball", "bag", "ring", "letter", "kiss", "basketball")
NAME_PAIRS = tuple(itertools.combinations(range(len(NAMES)), 2))  # unordered, by table index


class IndirectObject(TemplateTask):
    name = "ioi"
    scoring = "choice"
    max_new_tokens = 2
    subtasks = ("ABBA", "BABA")
    shared_clusters = True  # a name pair and template is one unit in both name orders

    def space_size(self, subtask: str) -> int:
        return len(NAMES) * (len(NAMES) - 1) * len(TEMPLATES) * len(PLACES) * len(OBJECTS)

    def item_at(self, subtask: str, index: int) -> Item:
        self._check_index(subtask, index)
        index, k = divmod(index, len(NAMES) * (len(NAMES) - 1))
        io, s = divmod(k, len(NAMES) - 1)
        s += s >= io  # skip the IO's own name
        index, t = divmod(index, len(TEMPLATES))
        p, o = divmod(index, len(OBJECTS))
        first, second = (NAMES[io], NAMES[s]) if subtask == "ABBA" else (NAMES[s], NAMES[io])
        prompt = TEMPLATES[t].format(
            A=first, B=second, S=NAMES[s], place=PLACES[p], object=OBJECTS[o]
        )
        x, y = sorted((io, s))
        return Item(
            self.name,
            subtask,
            prompt,
            answer=" " + NAMES[io],
            choices=(" " + first, " " + second),
            cluster=f"{NAMES[x]}/{NAMES[y]}/t{t}",
        )

    def roles(self, item: Item) -> dict[str, list[tuple[int, int]]]:
        """Character spans [start, end) of each token role in `item.prompt`: "IO" the indirect
        object's mention (the answer), "S" both mentions of the subject."""
        io, s = item.answer.strip(), next(c for c in item.choices if c != item.answer).strip()
        return {"IO": _mentions(item.prompt, io), "S": _mentions(item.prompt, s)}

    def cluster_shape(self, subtask: str) -> tuple[int, int]:
        return len(NAME_PAIRS) * len(TEMPLATES), 2 * len(PLACES) * len(OBJECTS)

    def item_in_cluster(self, subtask: str, cluster: int, j: int) -> Item:
        pair, t = divmod(cluster, len(TEMPLATES))
        swap, po = divmod(j, len(PLACES) * len(OBJECTS))
        io, s = NAME_PAIRS[pair][::-1] if swap else NAME_PAIRS[pair]
        k = io * (len(NAMES) - 1) + s - (s > io)
        return self.item_at(subtask, (po * len(TEMPLATES) + t) * len(NAMES) * (len(NAMES) - 1) + k)


def _mentions(text: str, name: str) -> list[tuple[int, int]]:
    """[start, end) of every whole-word occurrence of `name` in `text`."""
    return [(m.start(), m.end()) for m in re.finditer(rf"\b{re.escape(name)}\b", text)]
