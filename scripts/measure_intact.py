"""Intact accuracy per subtask of a model on a task, through the evaluator localize uses.

    .venv/bin/python scripts/measure_intact.py --model qwen2.5-coder-0.5b \
        --task arithmetic_chat --n 20
    .venv/bin/python scripts/measure_intact.py --model qwen2.5-coder-0.5b --task capitals --n 60

For each subtask, `--n` distinct items drawn without replacement from its template space
(seeded), evaluated by `LMEvaluator` with no head removed (the same prompt rendering, chat
template, stop rule and scoring as a localization run). Prints one row per subtask and the
total, and `--show` example answers per subtask.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import cel_numpy
from cel_numpy.localize.conditions import INTACT
from cel_numpy.localize.evaluate import LMEvaluator
from cel_numpy.tasks import get_task


def items_per_subtask(task, n: int, seed: int) -> dict:
    """subtask -> n distinct items (all of them when the space is smaller)."""
    rng = np.random.default_rng(seed)
    out = {}
    for subtask in task.subtasks:
        size = task.space_size(subtask)
        picks = rng.choice(size, size=min(n, size), replace=False)
        out[subtask] = [task.item_at(subtask, int(i)) for i in picks]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--task", default="arithmetic_chat")
    parser.add_argument("--n", type=int, default=20, help="items per subtask")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--show", type=int, default=2, help="example answers per subtask")
    args = parser.parse_args()

    t0 = time.time()
    model = cel_numpy.load_model(args.model)
    task = get_task(args.task)
    evaluator = LMEvaluator(model, task, batch_size=args.batch_size)
    print(f"{args.model} ({model.config.arch}), task {task.name}, {args.n} items per subtask")
    print(f"loaded in {time.time() - t0:.0f} s")
    if getattr(task, "chat", False):
        example = task.item_at(task.subtasks[0], 0).prompt
        print("rendered prompt:", repr(evaluator.model_text(example)))
    total_right = total = 0
    print(f"{'subtask':10s} {'correct':>9s} {'accuracy':>9s} {'seconds':>8s}")
    for subtask, items in items_per_subtask(task, args.n, args.seed).items():
        t = time.time()
        (results,) = evaluator.evaluate_many(items, [INTACT])
        right = sum(r.correct for r in results)
        total_right, total = total_right + right, total + len(results)
        print(
            f"{subtask:10s} {right:4d}/{len(results):<4d} {right / len(results):9.0%} "
            f"{time.time() - t:8.0f}",
            flush=True,
        )
        for it, r in list(zip(items, results))[: args.show]:
            print(f"    want {it.answer!r:10s} got {r.answer!r}")
    print(f"{'total':10s} {total_right:4d}/{total:<4d} {total_right / total:9.0%}")
    print(f"wall time {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
