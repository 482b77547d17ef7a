"""Induction: a random word sequence, then its repeat; predict the next word of the repeat.

    "river lamp horse cloud stone apple\\nriver lamp horse"  -> " cloud"

A sequence of N_WORDS distinct words from WORDS, a newline, and the sequence again up to word p
(1 <= p < N_WORDS); the answer is word p. Nothing but the first pass says what comes next, so
the task needs copying from context (an induction head: from the current word, attend to the
word that followed its earlier occurrence, and copy it). The newline makes the repeat tokenize
like the first pass (each line starts without a space).
Scoring ("generate"): the first whitespace-separated word of the continuation's first line
must equal the answer (the model may go on repeating the sequence: "cloud stone apple").

Clusters (`Item.cluster`, the independent unit): the answer word (100 clusters), so a word a
model finds easy or hard sits in one panel only.

Template space (one subtask, "words"): 100 answer words * 99 * 98 * 97 * 96 * 95 orderings of
the other five words * 5 positions of the answer.

Token roles (`roles`): "target" = the answer's first occurrence (where an induction head
looks), "current" = the first occurrence of the word just before the answer, "first pass" and
"repeat" = the other words of each pass.
"""

from __future__ import annotations

from cel_numpy.tasks.base import Item
from cel_numpy.tasks.template import TemplateTask, n_arrangements, unrank_arrangement

WORDS = (
    "apple", "river", "stone", "cloud", "horse", "table", "green", "music", "paper", "light",
    "water", "glass", "bread", "chair", "dream", "earth", "field", "grass", "heart", "house",
    "money", "night", "ocean", "party", "plant", "power", "queen", "radio", "sheep", "smile",
    "snake", "sugar", "tiger", "train", "truck", "voice", "watch", "whale", "world", "youth",
    "bird", "boat", "book", "bell", "cake", "coat", "door", "duck", "farm", "fire",
    "fish", "flag", "gold", "hand", "hill", "king", "lake", "lamp", "leaf", "lion",
    "milk", "moon", "nose", "park", "pen", "rain", "ring", "road", "rose", "salt",
    "ship", "shoe", "silk", "snow", "song", "star", "sun", "tree", "wall", "wind",
    "wolf", "wood", "corn", "desk", "egg", "frog", "girl", "hat", "iron", "jam",
    "key", "map", "nut", "oil", "pig", "rope", "sand", "tent", "van", "box",
)  # fmt: skip
N_WORDS = 6


class Induction(TemplateTask):
    name = "induction"
    scoring = "generate"
    max_new_tokens = 3
    subtasks = ("words",)

    def _per_cluster(self) -> int:
        return n_arrangements(len(WORDS) - 1, N_WORDS - 1) * (N_WORDS - 1)

    def space_size(self, subtask: str) -> int:
        return len(WORDS) * self._per_cluster()

    def cluster_shape(self, subtask: str) -> tuple[int, int]:
        return len(WORDS), self._per_cluster()

    def item_in_cluster(self, subtask: str, cluster: int, j: int) -> Item:
        return self.item_at(subtask, cluster * self._per_cluster() + j)

    def _sequence(self, index: int) -> tuple[list[str], int]:
        """(the N_WORDS words in order, p = the answer's position) of item `index`."""
        answer, j = divmod(index, self._per_cluster())
        arrangement, p = divmod(j, N_WORDS - 1)
        p += 1  # at least one repeated word comes before the answer
        others = WORDS[:answer] + WORDS[answer + 1 :]
        words = unrank_arrangement(arrangement, others, N_WORDS - 1)
        words.insert(p, WORDS[answer])
        return words, p

    def item_at(self, subtask: str, index: int) -> Item:
        self._check_index(subtask, index)
        words, p = self._sequence(index)
        prompt = " ".join(words) + "\n" + " ".join(words[:p])
        return Item(self.name, subtask, prompt, answer=words[p], cluster=words[p])

    def is_correct(self, item: Item, output: str) -> bool:
        """The first word of the first line of the output equals the answer."""
        line = output.split("\n", 1)[0].split()
        return bool(line) and line[0] == item.answer

    def roles(self, item: Item) -> dict[str, list[tuple[int, int]]]:
        """Character spans [start, end) of each token role in `item.prompt` (module docstring)."""
        first, repeat = item.prompt.split("\n")
        words = first.split(" ")
        p = words.index(item.answer)
        spans = word_spans(first, 0)
        spans_repeat = word_spans(repeat, len(first) + 1)
        return {
            "target": [spans[p]],
            "current": [spans[p - 1]],
            "first pass": [s for i, s in enumerate(spans) if i not in (p - 1, p)],
            "repeat": spans_repeat,
        }


def word_spans(text: str, offset: int) -> list[tuple[int, int]]:
    """[start, end) of each space-separated word of `text`, shifted by `offset`."""
    spans, start = [], 0
    for word in text.split(" "):
        spans.append((offset + start, offset + start + len(word)))
        start += len(word) + 1
    return spans
