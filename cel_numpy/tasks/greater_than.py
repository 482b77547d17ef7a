"""Greater-than years (Hanna et al. 2023): name a two-digit year end after a given start.

    "The war lasted from the year 1732 to the year 17" -> "45" (any YY > 32)

One subtask. Start years C YY with C in {11..18} and YY in [02, 98]; the prompt ends with the
century digits, so the continuation carries no leading space.
Scoring ("generate"): the continuation, with no leading whitespace, must start with exactly two
digits (not three: "456" is wrong) forming a number greater than YY; what follows the two
digits is ignored ("45 and", "45.", "45\\n"). The check is on characters, so it does not matter
whether a tokenizer emits "45" as one token (GPT-2) or as "4", "5" (SmolLM2).
`Item.answer` is the criterion written as ">YY" (e.g. ">32"), not a literal string.

Clusters (`Item.cluster`, the independent unit): the two-digit start year YY, which alone
decides the correct answers: 97 clusters of 80 items.

Template space: 10 events * 8 centuries * 97 start years = 7760.
"""

from __future__ import annotations

import re

from cel_numpy.tasks.base import Item
from cel_numpy.tasks.template import TemplateTask

EVENTS = (
    "war", "expedition", "drought", "siege", "famine",
    "rebellion", "voyage", "construction", "occupation", "strike",
)  # fmt: skip
CENTURIES = tuple(range(11, 19))
START_YY = tuple(range(2, 99))
PROMPT = "The {event} lasted from the year {century}{yy:02d} to the year {century}"
_TWO_DIGITS = re.compile(r"(\d\d)(?!\d)")


class GreaterThan(TemplateTask):
    name = "greater_than"
    scoring = "generate"
    max_new_tokens = 3  # two digits, plus one token to see a third digit
    subtasks = ("years",)

    def space_size(self, subtask: str) -> int:
        return len(EVENTS) * len(CENTURIES) * len(START_YY)

    def item_at(self, subtask: str, index: int) -> Item:
        self._check_index(subtask, index)
        index, y = divmod(index, len(START_YY))
        e, c = divmod(index, len(CENTURIES))
        yy = START_YY[y]
        prompt = PROMPT.format(event=EVENTS[e], century=CENTURIES[c], yy=yy)
        return Item(self.name, subtask, prompt, answer=f">{yy:02d}", cluster=f"yy{yy:02d}")

    def cluster_shape(self, subtask: str) -> tuple[int, int]:
        return len(START_YY), len(EVENTS) * len(CENTURIES)

    def item_in_cluster(self, subtask: str, cluster: int, j: int) -> Item:
        return self.item_at(subtask, j * len(START_YY) + cluster)

    def is_correct(self, item: Item, output: str) -> bool:
        match = _TWO_DIGITS.match(output)
        return match is not None and int(match.group(1)) > int(item.answer[1:])
