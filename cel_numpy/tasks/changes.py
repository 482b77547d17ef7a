"""What a rescued or damaged item is made of: one pure function over an item and its two answers.

A rescue (intact wrong, ablated right) or a damage (intact right, ablated wrong) is a change of
verdict; what it means depends on the WRONG answer of the two, compared with the item's
`AnswerContext` (the query, the shots' answers, every accepted answer; `tasks.base`):

    valid    the wrong answer is one of the accepted answers after all: the verdicts came from a
             stricter scorer than the list (records written before a task accepted every
             listed answer, e.g. "narrow -> broad" scored against "wide" alone)
    format   the wrong answer is an accepted answer written another way: case, surrounding
             punctuation or quotes, accents, spacing ("rome", "Rome.", "Bogota" for "Bogotá")
    echo     the wrong answer repeats the query ("pass -> pass", "Cuba: Cuba")
    shot     the wrong answer is the answer of one of the prompt's solved examples (the model
             copied another shot)
    genuine  anything else: a wrong answer of its own replaced by a right one, or the reverse

The categories are checked in this order and the first that fits is taken. Only "genuine"
changes say the ablation changed what the model knows or retrieves; the others are an artefact
of the scorer (valid, format) or of the few-shot format (echo, shot). `classify_changes`
counts them for a condition against the intact model; the reports show the counts.

A choice task whose items all offer the same choices (BoolQ's " no" / " yes", a JSONL file of
labels) has another way to gain without answering better: moving the bias between labels. A
model that answers " no" on 95% of BoolQ items gains on every "yes" item by saying " yes" more
often. `answer_balance` shows it: per label, the items whose reference it is, how many of them
each model gets right, and how often each model picks it. A bias shift gains on one label's
items and loses on the others'; a better reader gains on both.
"""

from __future__ import annotations

import string
import unicodedata
from collections import Counter
from collections.abc import Sequence

from cel_numpy.tasks.base import AnswerContext, Item

CATEGORIES = ("valid", "format", "echo", "shot", "genuine")

_EDGE = string.punctuation + string.whitespace + "\u201c\u201d\u2018\u2019"


def normalize(text: str) -> str:
    """Lower case, accents folded, one space between words, punctuation and quotes at either
    end dropped: "  Rome." -> "rome", "Bogotá" -> "bogota", '"Cape  Town"' -> "cape town"."""
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return " ".join(folded.lower().split()).strip(_EDGE)


def _first_line(text: str) -> str:
    return text.split("\n", 1)[0].strip()


def classify_change(context: AnswerContext, wrong: str) -> str:
    """The category (one of CATEGORIES) of a change of verdict whose wrong answer is `wrong`
    (the intact answer of a rescued item, the ablated answer of a damaged one)."""
    answer = _first_line(wrong)
    if answer in context.accepted:
        return "valid"
    norm = normalize(answer)
    if norm and norm in {normalize(a) for a in context.accepted}:
        return "format"
    if norm and context.query and norm == normalize(context.query):
        return "echo"
    if norm and norm in {normalize(s) for s in context.shot_answers}:
        return "shot"
    return "genuine"


def classify_changes(
    contexts: Sequence[AnswerContext],
    intact: Sequence[tuple[bool, str]],
    ablated: Sequence[tuple[bool, str]],
) -> dict[str, dict[str, int]]:
    """Per item (context, (intact correct, intact answer), (ablated correct, ablated answer)):
    {"rescued": {category: n}, "damaged": {category: n}}, every category listed (0 if none)."""
    counts = {"rescued": Counter(), "damaged": Counter()}
    for ctx, (ok_i, text_i), (ok_a, text_a) in zip(contexts, intact, ablated, strict=True):
        if ok_a and not ok_i:
            counts["rescued"][classify_change(ctx, text_i)] += 1
        elif ok_i and not ok_a:
            counts["damaged"][classify_change(ctx, text_a)] += 1
    return {kind: {c: int(n[c]) for c in CATEGORIES} for kind, n in counts.items()}


def answer_balance(
    items: Sequence[Item], intact: Sequence[tuple[bool, str]], ablated: Sequence[tuple[bool, str]]
) -> list[dict] | None:
    """Per label of a fixed choice set, in the items' choice order: {"label", "items" (whose
    reference it is), "intact_correct", "ablated_correct", "intact_picked", "ablated_picked"};
    (correct, picked answer) per item for each model. None unless there are at least two items,
    all offering the same choices (HellaSwag's endings differ per item: no labels to balance),
    and every reference and every pick is one of them (a task scoring by its own rule may
    accept an answer outside the choices: then there is no balance to show)."""
    choices = items[0].choices if items else ()
    if len(items) < 2 or not choices or any(it.choices != choices for it in items):
        return None
    answers = [it.answer for it in items] + [a for _, a in intact] + [a for _, a in ablated]
    if not set(choices).issuperset(answers):
        return None
    counts = ("items", "intact_correct", "ablated_correct", "intact_picked", "ablated_picked")
    rows = {label: dict.fromkeys(counts, 0) for label in choices}
    for it, (ok_i, pick_i), (ok_a, pick_a) in zip(items, intact, ablated, strict=True):
        ref = rows[it.answer]
        ref["items"] += 1
        ref["intact_correct"] += int(ok_i)
        ref["ablated_correct"] += int(ok_a)
        rows[pick_i]["intact_picked"] += 1
        rows[pick_a]["ablated_picked"] += 1
    return [{"label": label, **row} for label, row in rows.items()]
