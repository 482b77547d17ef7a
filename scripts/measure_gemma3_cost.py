"""Cost per (condition x item) of a capitals screen on Gemma 3 270M, beside SmolLM2-135M.

    PYTHONPATH=. OPENBLAS_NUM_THREADS=1 python scripts/measure_gemma3_cost.py [--items 20]

For each model: the held-out capitals panel of seed 0 (first --items items), one warm-up
evaluation (weights laid out for the fast engine), then the intact model and two single-head
ablations evaluated together (the fast evaluator, as a screen runs them). Prints CPU and wall
seconds per (condition x item) and Gemma's ratio to SmolLM2 measured in the same invocation.
One BLAS thread: on a machine shared with other jobs the CPU seconds are the steadier number.
"""

from __future__ import annotations

import argparse
import time

import cel_numpy as cn
from cel_numpy.localize.evaluate import LMEvaluator
from cel_numpy.tasks import TASKS, make_panels

HEADS = {"smollm2": [(10, 3), (23, 0)], "gemma-3-270m": [(5, 1), (11, 2)]}


def measure(name: str, n_items: int) -> tuple[float, float, int]:
    model = cn.load_model(name)
    task = TASKS["capitals"]
    _, heldout = make_panels(task, 100, 100, 0)
    items = heldout[:n_items]
    evaluator = LMEvaluator(model, task)
    evaluator.evaluate_many(items[:2], [(), (HEADS[name][0],)])  # warm-up: fast-engine layout
    conditions = [()] + [(h,) for h in HEADS[name]]
    cpu, wall = time.process_time(), time.perf_counter()
    results = evaluator.evaluate_many(items, conditions)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    n = len(conditions) * len(items)
    intact = sum(r.correct for r in results[0])
    print(
        f"{name}: {n} (condition x item): {cpu / n:.3f} CPU s and {wall / n:.3f} wall s each; "
        f"intact {intact}/{len(items)}",
        flush=True,
    )
    return cpu / n, wall / n, intact


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=20)
    args = parser.parse_args()
    smollm2 = measure("smollm2", args.items)
    gemma = measure("gemma-3-270m", args.items)
    print(f"gemma / smollm2: {gemma[0] / smollm2[0]:.2f}x CPU, {gemma[1] / smollm2[1]:.2f}x wall")


if __name__ == "__main__":
    main()
