"""Intact accuracy of a real model on every task, to pick tasks it half-solves.

    .venv/bin/python scripts/measure_tasks.py                       # SmolLM2, 100 items per task
    .venv/bin/python scripts/measure_tasks.py --tasks arithmetic --n 200 --show 5

The simplest correct evaluation, independent of `cel_numpy.localize`:
    "generate"  greedy continuation (model.generate, task.max_new_tokens), scored by task.is_correct
    "choice"    total log-probability of each candidate's tokens after the prompt's tokens
                (encode(prompt) + encode(choice)), argmax scored by task.is_correct
Items are the discovery panel of make_panels(task, n, 1, seed).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np

import cel_numpy
from cel_numpy.tasks import TASKS, get_task, make_panels


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def choose(model, items, batch_size: int) -> list[str]:
    """For each item, the candidate with the highest total log-probability after the prompt."""
    rows = []  # (item index, choice, prompt ids + choice ids, n choice tokens)
    for i, item in enumerate(items):
        prompt_ids = model.encode(item.prompt)
        for choice in item.choices:
            choice_ids = model.encode(choice)
            rows.append((i, choice, prompt_ids + choice_ids, len(choice_ids)))
    scores = np.empty(len(rows))
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        logits = model.logits([ids for _, _, ids, _ in chunk])  # (B, T, V), left-padded
        for b, (_, _, ids, k) in enumerate(chunk):
            logp = log_softmax(
                logits[b, -k - 1 : -1]
            )  # (k, V): positions predicting the choice tokens
            scores[start + b] = logp[np.arange(k), ids[-k:]].sum()
    best: dict[int, tuple[float, str]] = {}
    for (i, choice, _, _), score in zip(rows, scores):
        if i not in best or score > best[i][0]:
            best[i] = (score, choice)
    return [best[i][1] for i in range(len(items))]


def generate(model, items, max_new_tokens: int, batch_size: int) -> list[str]:
    outputs = []
    for start in range(0, len(items), batch_size):
        prompts = [it.prompt for it in items[start : start + batch_size]]
        outputs.extend(model.generate(prompts, max_new_tokens=max_new_tokens))
    return outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tasks", nargs="*", default=sorted(TASKS))
    parser.add_argument("--n", type=int, default=100, help="items per task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--show", type=int, default=0, help="print this many outputs per task")
    args = parser.parse_args()

    model = cel_numpy.load_model(args.model)
    print(model)
    for name in args.tasks:
        task = get_task(name)
        items, _ = make_panels(task, args.n, 1, args.seed)
        t0 = time.perf_counter()
        if task.scoring == "choice":
            outputs = choose(model, items, args.batch_size)
        else:
            outputs = generate(model, items, task.max_new_tokens, args.batch_size)
        correct = [task.is_correct(it, out) for it, out in zip(items, outputs)]
        by_subtask = defaultdict(list)
        for it, ok in zip(items, correct):
            by_subtask[it.subtask].append(ok)
        print(
            f"{name:14s} {task.scoring:8s} acc {np.mean(correct):.2f}  "
            f"(n={len(items)}, {time.perf_counter() - t0:.0f}s)"
        )
        if len(by_subtask) > 1:
            print("    " + "  ".join(f"{s} {np.mean(v):.2f}" for s, v in by_subtask.items()))
        for it, out, ok in list(zip(items, outputs, correct))[: args.show]:
            print(
                f"    {'ok ' if ok else 'BAD'} {it.prompt[-60:]!r} -> {out!r} "
                f"(answer {it.answer!r})"
            )


if __name__ == "__main__":
    main()
