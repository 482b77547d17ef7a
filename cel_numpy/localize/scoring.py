"""The one continuation scorer, and the stop rule of a generation, shared by every evaluator.

The reference evaluator (`localize/evaluate.py`), the fast engine (`localize/fast.py`) and the
gradient metric (`localize/gradient.py`) read log-probabilities of continuations from logits in
one way, here, so "fast equals naive" has one less place to disagree:

    logits (N, V) of one row, RIGHT-aligned: logits[-1] predicts the token after the row's last
    token (every row of a left-padded batch ends at the last column), so the A tokens of a
    continuation that ends the row are predicted by logits[N-1-A : N-1].

    continuation_log_softmax(logits, targets) -> (log-softmax (A, V) float64, total log-prob)
    continuation_logprob(logits, targets)     -> the total alone
    next_token_log_softmax(logits (V,))       -> log p of every one-token continuation

Greedy generation stops by a `StopRule` taken from the task and the tokenizer (never hard-coded):
a stop token ends it (excluded from the text), a stop text (a newline, for tasks that declare
`stop = "newline"`, the default) cuts the text at its first occurrence, and `max_new_tokens`
caps it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cel_numpy.ops import check_finite_scores, log_softmax
from cel_numpy.tasks.base import Item


def continuation_log_softmax(
    logits: np.ndarray, targets: Sequence[int]
) -> tuple[np.ndarray, float]:
    """logits (N, V) right-aligned (see the module docstring) -> log-softmax (A, V), sum of log p.

    float64, max-subtracted (`ops.log_softmax`). A = len(targets) <= N - 1.
    """
    A = len(targets)
    logp = log_softmax(np.asarray(_target_rows(logits, A), dtype=np.float64))  # (A, V)
    return logp, float(logp[np.arange(A), list(targets)].sum())


def _target_rows(logits: np.ndarray, A: int) -> np.ndarray:
    """The rows of right-aligned logits (N, V) that predict an A-token continuation: (A, V)."""
    N = logits.shape[0]
    if A > N - 1:
        raise ValueError(f"{A} continuation tokens need {A + 1} logit rows, got {N}")
    return logits[N - 1 - A : N - 1]


# Rows of float64 log-softmax `continuation_logprob` holds at once: its temporaries stay near
# 4 x 32 x V x 8 bytes (270 MB at Gemma 3's V = 262,144) however long the continuation.
LOGPROB_ROWS = 32


def continuation_logprob(logits: np.ndarray, targets: Sequence[int]) -> float:
    """Total log-probability of `targets` from right-aligned logits (N, V): the total of
    `continuation_log_softmax`, bit for bit (each row's log-softmax is its own reduction and the
    picked values are summed in the same order), computed LOGPROB_ROWS rows at a time."""
    A = len(targets)
    rows, targets = _target_rows(logits, A), np.asarray(targets, dtype=np.int64)  # (A, V), (A,)
    picked = np.empty(A)  # log p of each target, float64
    for start in range(0, A, LOGPROB_ROWS):
        part = log_softmax(np.asarray(rows[start : start + LOGPROB_ROWS], dtype=np.float64))
        picked[start : start + len(part)] = part[
            np.arange(len(part)), targets[start : start + len(part)]
        ]
    return float(picked.sum())


def next_token_log_softmax(logits: np.ndarray) -> np.ndarray:
    """logits (V,) at one position -> log p of every next token (V,) float64
    (one-token candidates)."""
    return log_softmax(np.asarray(logits, dtype=np.float64))


def answer_text(item: Item, separator: str = " ") -> str:
    """The reference continuation of a generate item: separator + answer, unless either side
    already has whitespace there ("Answer:" + " 146"; a chat prompt ending in a newline + "146")."""
    if item.prompt[-1:].isspace() or item.answer[:1].isspace():
        return item.answer
    return separator + item.answer


def reference_ids(ev, item: Item) -> tuple[list[int], list[int]]:
    """(prompt ids, reference answer ids) of a generate item, as greedy decoding would see them.

    The prompt is encoded alone (what generation continues); the answer's tokens are those of
    prompt + answer encoded whole after the prompt's ids when the prompt's ids are a prefix of it
    (the usual case), else the answer encoded alone (a merge across the boundary).
    """
    tok = ev.model.tokenizer
    text = answer_text(item, getattr(ev.task, "answer_separator", " "))
    prompt = ev.prompt_ids(item.prompt)
    full, _ = ev.continuation_ids(item.prompt, text)
    if full[: len(prompt)] == prompt and len(full) > len(prompt):
        return prompt, full[len(prompt) :]
    alone = ev._encode(text)
    if getattr(tok, "add_bos", False) and alone[:1] == [getattr(tok, "bos_id", None)]:
        alone = alone[1:]
    return prompt, alone


def choice_scores(task, item: Item, logprobs: np.ndarray) -> np.ndarray:
    """What a choice task compares: the total log-probability of each candidate (n_choices,),
    or with `task.normalize == "chars"` that divided by the candidate's length in characters
    (`task.choice_lengths(item)`: lm-eval's acc_norm). The first maximum is chosen."""
    if getattr(task, "normalize", "none") == "chars":
        return logprobs / np.asarray(task.choice_lengths(item), dtype=np.float64)
    return logprobs


def choice_results(task, items: Sequence[Item], scores: np.ndarray) -> list:
    """Per item the best-scoring candidate, its verdict and the correct candidate's log-prob.

    scores (n_items, max choices): total log-probability of each candidate (-inf past the end).
    """
    from cel_numpy.localize.conditions import ExampleResult

    check_finite_scores(scores, items)  # a NaN or Inf log-probability is never a score
    out = []
    for i, it in enumerate(items):
        chosen = it.choices[int(np.argmax(choice_scores(task, it, scores[i, : len(it.choices)])))]
        ref = float(scores[i, it.choices.index(it.answer)]) if it.answer in it.choices else None
        out.append(ExampleResult(it.id, bool(task.is_correct(it, chosen)), chosen, ref))
    return out


@dataclass(frozen=True)
class StopRule:
    """When a greedy generation ends, and what text it leaves."""

    ids: frozenset[int]  # tokens that end it (excluded): end-of-sequence, end-of-turn
    text: str | None  # the text is cut at its first occurrence; generation may stop once seen
    max_new_tokens: int

    def cut_ids(self, ids: Sequence[int]) -> list[int]:
        """Generated ids up to (excluding) the first stop token, at most max_new_tokens."""
        out = []
        for t in ids[: self.max_new_tokens]:
            if int(t) in self.ids:
                break
            out.append(int(t))
        return out

    def text_of(self, tokenizer, ids: Sequence[int]) -> str:
        """The recorded answer: the decoded ids, cut at the stop text."""
        text = tokenizer.decode(list(ids))
        return text if self.text is None else text.split(self.text, 1)[0]

    def is_done(self, tokenizer):
        """A test on the ids so far (None when there is no stop text): the text has the
        stop text."""
        if self.text is None:
            return None
        return lambda ids: self.text in tokenizer.decode(list(ids))


STOPS = ("newline", "end_of_turn", "text")


def stop_rule(task, tokenizer) -> StopRule:
    """The task's declared stop (`task.stop`, default "newline") with the tokenizer's stop ids.

    "newline": at eos, and the text is cut at (generation may stop once it has) a newline.
    "end_of_turn": at one of the tokenizer's `stop_ids` (a chat model's end-of-turn and
    end-of-text tokens); newlines are part of the answer. A task's `stop_text` (e.g. MBPP's
    "[DONE]") also ends it there: the text is cut at its first occurrence.
    "text": as "newline", with the task's `stop_text` in place of the newline.
    """
    stop = getattr(task, "stop", "newline")
    if stop not in STOPS:
        raise ValueError(f"task {task.name!r} declares stop={stop!r}; known: {', '.join(STOPS)}")
    if stop == "end_of_turn":
        ids = frozenset(int(i) for i in getattr(tokenizer, "stop_ids", ()))
        if not ids:
            raise ValueError(
                f"task {task.name!r} stops at the end of the model's turn, but the tokenizer "
                "declares no end-of-turn or end-of-text token"
            )
        text = getattr(task, "stop_text", None)
        return StopRule(ids=ids, text=text, max_new_tokens=int(task.max_new_tokens))
    eos = getattr(tokenizer, "eos_id", None)
    return StopRule(
        ids=frozenset() if eos is None else frozenset({int(eos)}),
        text=task.stop_text if stop == "text" else "\n",
        max_new_tokens=int(task.max_new_tokens),
    )
