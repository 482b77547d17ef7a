"""What a task is: items with a prompt and an expected answer, and how an answer is scored.

The contract between the task suite (`cel_numpy.tasks`) and the localization routine
(`cel_numpy.localize`): the routine never looks inside a prompt; it asks the model for an answer
the way the task says (`scoring`), then asks the task whether that answer is correct.

Scoring modes
    "generate"  greedy continuation of the prompt, stopped at the first newline or after
                `max_new_tokens`; `Task.is_correct(item, text)` decides (e.g. strict signed-integer
                exact match for arithmetic).
    "choice"    the candidate in `item.choices` with the highest total log-probability as a
                continuation of the prompt; correct iff it is `item.answer`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

Scoring = Literal["generate", "choice"]


@dataclass(frozen=True)
class Item:
    task: str
    subtask: str
    prompt: str  # text fed to the model, without the answer
    answer: str  # the expected answer (for "choice": one of `choices`)
    choices: tuple[
        str, ...
    ] = ()  # candidate continuations for "choice" scoring (leading space if any)
    # The item's independent unit (the country asked, the antonym pair, the subject noun...): items
    # of one cluster are not independent evidence, so panels keep a cluster whole and the held-out
    # test treats the cluster as its unit. Empty: the item is a cluster of its own (its id).
    cluster: str = ""

    def __post_init__(self):
        if not self.cluster:
            object.__setattr__(self, "cluster", self.id)

    @property
    def id(self) -> str:
        """Content hash: two items with the same id are the same question (the cluster, a label
        derived from the question, is not part of it)."""
        blob = "\x1f".join([self.task, self.subtask, self.prompt, self.answer, *self.choices])
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class AnswerContext:
    """What an item's answers are compared with when a change of verdict is classified
    (`cel_numpy.tasks.changes`). A task may provide `answer_context(item)`; otherwise the query
    and shots are unknown and the reference is the only accepted answer."""

    query: str  # the looked-up key as the prompt shows it ("wet", "Cuba"); "" if none
    shot_answers: tuple[str, ...]  # the answers of the prompt's solved examples, in order
    accepted: tuple[str, ...]  # every answer the scorer accepts, the reference first


def answer_context(task, item: Item) -> AnswerContext:
    """The task's `answer_context(item)` if it has one, else (no query, no shots, the answer)."""
    own = getattr(task, "answer_context", None)
    return own(item) if own is not None else AnswerContext("", (), (item.answer,))


class Task(Protocol):
    name: str
    scoring: Scoring
    max_new_tokens: int  # cap for "generate" scoring
    # Optional: `answer_separator` (str, default " "), the text between prompt and answer in a
    # natural continuation; the gradient screen teacher-forces prompt + separator + answer.
    # Optional: `chat` (bool, default False): the prompt is one user message, which the
    # evaluator writes in the model's chat template with the generation prompt.
    # Optional: `stop` ("newline" default, or "end_of_turn"): where a generated answer ends
    # (`cel_numpy.localize.scoring.stop_rule`).
    # Optional: `answer_context(item) -> AnswerContext` (query, shot answers, every accepted
    # answer), used to classify rescued and damaged items (`cel_numpy.tasks.changes`).

    def sample(self, rng: np.random.Generator, n: int) -> list[Item]:
        """n items (may repeat; panels de-duplicate by `Item.id`)."""
        ...

    def is_correct(self, item: Item, output: str) -> bool:
        """Score one model output (generated text, or the chosen candidate)."""
        ...
