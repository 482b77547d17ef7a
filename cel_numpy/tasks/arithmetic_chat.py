"""Arithmetic as the paper's released code asks it of a chat model.

Each item is ONE user message, rendered through the model's own chat template with the
generation prompt (the evaluator does the rendering: the task declares `chat = True`):

    Solve the arithmetic problem. Return only the final integer, with no words or explanation.

    Question: What is 48 plus 76?
    Answer:

Greedy decoding, at most 32 new tokens, stopping at the model's end-of-turn or end-of-text
token (`stop = "end_of_turn"`: the tokenizer's `stop_ids`, e.g. `<|im_end|>` and
`<|endoftext|>` for Qwen2 -- not at a newline). Correct iff the stripped completion fully
matches `[+-]?\\d+` and equals the answer as an integer ("+124" and "0124" count, "124." and
"124 apples" do not).

The ten subtasks and their question wording are the EleutherAI arithmetic set's (GPT-3's):
    add2..add5   "What is X plus Y?"    both operands uniform n-digit numbers
    sub2..sub5   "What is X minus Y?"   both operands uniform n-digit numbers, in either order,
                                        so about half the answers are negative (as in the data)
    mul2         "What is X times Y?"   both operands uniform in [10, 99]
    comp1        one-digit composites written with symbols, "What is (2 * 3) + 4?" or
                 "What is 6 + (4 * 8)?": digits uniform in [0, 9], operations uniform in
                 {+, -, *}, the parentheses around the first or the last two digits

What follows the released code: the instruction, the question and answer wording, one user
message through the chat template with the generation prompt, greedy decoding of at most 32
tokens stopping at end-of-sequence, the answer check. What differs: the items are synthetic,
drawn from the full template space of each subtask (so panels can be as large as needed and
cluster-disjoint), not the 2,000 rows per subtask of the EleutherAI files (which cannot be
downloaded here); the composite wording is our reading of that set.

Template space: add_n and sub_n = (9 * 10^(n-1))^2 (8,100 for n=2), mul2 = 8,100, comp1 =
10^3 * 3^2 * 2 = 18,000. Every item's `cluster` is its problem (the expression): one problem, one
cluster, so no problem is both in a discovery and a held-out panel.
"""

from __future__ import annotations

import re

from cel_numpy.tasks.base import Item
from cel_numpy.tasks.template import TemplateTask

INSTRUCTION = (
    "Solve the arithmetic problem. Return only the final integer, with no words or explanation."
)
QUESTION = "Question: What is {expression}?\nAnswer:"
WORDS = {"add": "plus", "sub": "minus", "mul": "times"}
SYMBOLS = ("+", "-", "*")
_APPLY = {
    "plus": int.__add__, "minus": int.__sub__, "times": int.__mul__,
    "+": int.__add__, "-": int.__sub__, "*": int.__mul__,
}  # fmt: skip
_ANSWER = re.compile(r"[+-]?\d+")


def _n_values(n_digits: int) -> int:
    return 9 * 10 ** (n_digits - 1)


class ArithmeticChat(TemplateTask):
    """The released arithmetic protocol: instruction + question as one chat user message."""

    name = "arithmetic_chat"
    scoring = "generate"
    max_new_tokens = 32
    chat = True  # the prompt is one user message: the evaluator renders the model's template
    stop = "end_of_turn"  # decoding ends at the tokenizer's stop_ids, not at a newline
    answer_separator = ""  # the assistant turn starts right after the generation prompt
    subtasks = ("add2", "add3", "add4", "add5", "sub2", "sub3", "sub4", "sub5", "mul2", "comp1")

    def space_size(self, subtask: str) -> int:
        kind, n = subtask[:-1], int(subtask[-1])
        if kind in ("add", "sub", "mul"):
            return _n_values(n) ** 2
        if kind == "comp":
            return 10**3 * len(SYMBOLS) ** 2 * 2
        raise ValueError(
            f"{self.name} has no subtask {subtask!r}; known: {', '.join(self.subtasks)}"
        )

    def item_at(self, subtask: str, index: int) -> Item:
        self._check_index(subtask, index)
        expression, answer = self.problem(subtask, index)
        prompt = INSTRUCTION + "\n\n" + QUESTION.format(expression=expression)
        item = Item(task=self.name, subtask=subtask, prompt=prompt, answer=str(answer))
        return _with_cluster(item, expression)

    def problem(self, subtask: str, index: int) -> tuple[str, int]:
        """(expression, integer answer) of the index-th problem of a subtask."""
        kind, n = subtask[:-1], int(subtask[-1])
        if kind == "comp":
            index, digits = divmod(index, 1000)
            index, grouping = divmod(index, 2)
            op1, op2 = SYMBOLS[index // 3], SYMBOLS[index % 3]
            a, b, c = digits // 100, digits // 10 % 10, digits % 10
            if grouping == 0:
                return f"({a} {op1} {b}) {op2} {c}", _APPLY[op2](_APPLY[op1](a, b), c)
            return f"{a} {op1} ({b} {op2} {c})", _APPLY[op1](a, _APPLY[op2](b, c))
        low = 10 ** (n - 1)
        i, j = divmod(index, _n_values(n))
        x, y, word = low + i, low + j, WORDS[kind]
        return f"{x} {word} {y}", _APPLY[word](x, y)

    def is_correct(self, item: Item, output: str) -> bool:
        """The stripped completion is one integer ([+-]?digits) equal to the answer."""
        text = output.strip()
        return bool(_ANSWER.fullmatch(text)) and int(text) == int(item.answer)


def _with_cluster(item: Item, cluster: str) -> Item:
    """The item with `cluster` set, where Item has that field (cluster-disjoint panels)."""
    if "cluster" in getattr(Item, "__dataclass_fields__", {}):
        from dataclasses import replace

        return replace(item, cluster=cluster)
    return item
