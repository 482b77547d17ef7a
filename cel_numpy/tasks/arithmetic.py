"""Plain-text arithmetic: "Question: What is 48 plus 76?\\nAnswer:" -> " 124".

The EleutherAI question wording as a raw continuation (no instruction, no chat template): the
format a base model sees. The paper's released protocol for chat models is `arithmetic_chat`.

Ten subtasks, equal shares:
    add2 add3 add4 add5   n-digit addition, both operands uniform in [10^(n-1), 10^n - 1]
    sub2 sub3 sub4 sub5   n-digit subtraction, uniform over the pairs of n-digit operands with
                          minuend >= subtrahend, so every answer is >= 0 (a small model's sign
                          errors would otherwise swamp the arithmetic)
    mul2                  2-digit multiplication, both operands uniform in [10, 99]
    comp1                 one-digit composites, GPT-3's convention with the grouping written out:
                          "What is 6 plus (4 times 8)?" = 6 + (4 * 8) = 38; digits uniform in
                          [0, 9], both operations uniform in {plus, minus, times}; the
                          parentheses always enclose the last two digits, so there is no
                          precedence question; answers may be negative ("1 minus (9 times 9)" = -80)

Scoring ("generate"): the greedy continuation up to the first newline, stripped of surrounding
whitespace, must be exactly the answer as a canonical signed integer (`-?\\d+`): " 124" and
"124\\n..." are correct; "+124", "124." (no trailing period tolerated), "1,240", "0124",
"124 apples" are wrong.

Clusters (`Item.cluster`, the independent unit): the problem, its expression ("48 plus 76");
every item is a cluster of its own.

Template space: add_n = (9 * 10^(n-1))^2 (8100 for n=2), sub_n = N (N + 1) / 2 with N = 9 * 10^(n-1)
(4095 for n=2), mul2 = 8100, comp1 = 10^3 * 3^2 = 9000.

`arithmetic_2shot` is the same questions after two solved examples of the same subtask, in the
same format, separated by a blank line ("Question: ...\nAnswer: 47\n\nQuestion: ...\nAnswer:").
The two examples are fixed per subtask (a constant context, so they never vary across items) and
are removed from that subtask's query space (2 fewer items per subtask). Zero-shot, an
instruction-tuned 135M model answers with the equation ("67 + 33 = ...") and scores 0; the
examples show the format.
"""

from __future__ import annotations

import hashlib
import math

from cel_numpy.tasks.base import Item
from cel_numpy.tasks.template import TemplateTask, parse_signed_int

PROMPT = "Question: What is {expression}?\nAnswer:"
OPS = {"plus": lambda x, y: x + y, "minus": lambda x, y: x - y, "times": lambda x, y: x * y}
COMPOSITE_OPS = ("plus", "minus", "times")


def _n_values(n_digits: int) -> int:
    return 9 * 10 ** (n_digits - 1)


class Arithmetic(TemplateTask):
    """Zero-shot ("arithmetic") or with two fixed solved examples per subtask
    ("arithmetic_2shot")."""

    name = "arithmetic"
    scoring = "generate"
    max_new_tokens = 8  # " " + up to 6 digits (5-digit sums) + one token to see a stray extra digit
    subtasks = ("add2", "add3", "add4", "add5", "sub2", "sub3", "sub4", "sub5", "mul2", "comp1")

    def __init__(self, n_shots: int = 0):
        if n_shots not in (0, 2):
            raise ValueError(f"n_shots must be 0 or 2, got {n_shots}")
        self.n_shots = n_shots
        self.name = "arithmetic" if n_shots == 0 else f"arithmetic_{n_shots}shot"

    def space_size(self, subtask: str) -> int:
        return self._full_size(subtask) - self.n_shots

    def shot_indices(self, subtask: str) -> tuple[int, ...]:
        """Indices (in the full zero-shot space) of the fixed solved examples, distinct, ascending.

        Spread by a hash of the subtask name (fixed forever, unlike an RNG stream across NumPy
        versions); evenly spaced indices would give degenerate examples like "60 plus 10".
        """
        size = self._full_size(subtask)
        digest = int(hashlib.sha256(subtask.encode()).hexdigest(), 16)
        first = digest % size
        second = (first + 1 + (digest >> 64) % (size - 1)) % size  # never equal to first
        return tuple(sorted((first, second)))[: self.n_shots] if self.n_shots else ()

    def item_at(self, subtask: str, index: int) -> Item:
        self._check_index(subtask, index)
        for shot in self.shot_indices(subtask):  # skip the examples: ascending, so shift in order
            index += index >= shot
        prompt, answer = self._question(subtask, index)
        shots = [self._question(subtask, i) for i in self.shot_indices(subtask)]
        context = "".join(f"{p} {a}\n\n" for p, a in shots)
        expression = prompt.removeprefix("Question: What is ").removesuffix("?\nAnswer:")
        return Item(self.name, subtask, context + prompt, answer=answer, cluster=expression)

    def _full_size(self, subtask: str) -> int:
        kind, n = subtask[:-1], int(subtask[-1])
        if kind in ("add", "mul"):
            return _n_values(n) ** 2
        if kind == "sub":
            return _n_values(n) * (_n_values(n) + 1) // 2
        if kind == "comp":
            return 10**3 * len(COMPOSITE_OPS) ** 2
        raise ValueError(
            f"arithmetic has no subtask {subtask!r}; known: {', '.join(self.subtasks)}"
        )

    def _question(self, subtask: str, index: int) -> tuple[str, str]:
        """(prompt, answer) of the index-th question of the full zero-shot space."""
        kind, n = subtask[:-1], int(subtask[-1])
        if kind == "comp":
            index, digits = divmod(index, 1000)
            op1, op2 = COMPOSITE_OPS[index // 3], COMPOSITE_OPS[index % 3]
            a, b, c = digits // 100, digits // 10 % 10, digits % 10
            expression = f"{a} {op1} ({b} {op2} {c})"
            answer = OPS[op1](a, OPS[op2](b, c))
        else:
            low = 10 ** (n - 1)
            if kind == "sub":
                # index -> (i, j) with 0 <= j <= i: row i starts at i (i + 1) / 2
                i = (math.isqrt(8 * index + 1) - 1) // 2
                j = index - i * (i + 1) // 2
                x, y = low + i, low + j
            else:
                i, j = divmod(index, _n_values(n))
                x, y = low + i, low + j
            op = {"add": "plus", "sub": "minus", "mul": "times"}[kind]
            expression = f"{x} {op} {y}"
            answer = OPS[op](x, y)
        return PROMPT.format(expression=expression), str(answer)

    def is_correct(self, item: Item, output: str) -> bool:
        return parse_signed_int(output) == item.answer
