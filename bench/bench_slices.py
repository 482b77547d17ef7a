"""Benchmark: a held-out stage with few conditions, as one chunk and in slices of the panel.

    .venv/bin/python bench/bench_slices.py                       # SmolLM2, BoolQ, 200 items
    ... --task hellaswag --size 100 --heads L3H2+L6H7+L9H8 --repeats 3

Not a test: one invocation prints one table of medians and their ratio. The workload is a
test-heads held-out stage: the intact model and one head set (two conditions) on --size items
of the task (a panel drawn with seed 0). Before slicing, the routine sent such a stage to the
workers as one chunk (2 x 500 is below CHUNK_ITEMS), so one worker computed it while the others
waited; now a panel of more than SLICE_ABOVE items goes out in slices of at most SLICE_ITEMS
(`routine.panel_slices`). Both ways run through the routine's `evaluate_chunk` on a fresh
`WorkerPool` of --workers workers per round (a test-heads stage is one-off work: its workers
start cold), interleaved (whole, sliced, whole, sliced, ...), and the medians are compared. The
two ways' verdicts must agree item for item, and their reference log-probabilities to 1e-4
(batches hold other items in a slice, so float32 sums differ in the last digits).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_forward import cpu_summary

import cel_numpy as cn
from cel_numpy.heads import parse_heads
from cel_numpy.localize.evaluate import BATCH_SIZE, LMEvaluator
from cel_numpy.localize.routine import SLICE_ITEMS, evaluate_chunk, join_slices, panel_slices
from cel_numpy.localize.workers import WorkerPool, available_cores
from cel_numpy.tasks import get_task, make_panels


def run_once(ev, items, conditions, n_workers: int, sliced: bool):
    """(seconds, results per condition) of one stage on a fresh pool."""
    pool = WorkerPool(n_workers)
    try:
        pieces = panel_slices(len(items), SLICE_ITEMS) if sliced else [None]
        pool.plan(len(pieces))
        t0 = time.perf_counter()
        futures = [pool.submit(evaluate_chunk, ev, items, conditions, rows) for rows in pieces]
        parts = [f.result() for f in futures]
        seconds = time.perf_counter() - t0
    finally:
        pool.shutdown()
    return seconds, join_slices(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--task", default="boolq")
    ap.add_argument("--size", type=int, default=200, help="held-out items (default 200)")
    ap.add_argument(
        "--heads", default="L2H4+L5H3+L12H0", help="the set (default: SmolLM2 BoolQ's rank 1)"
    )
    ap.add_argument("--workers", type=int, default=available_cores())
    ap.add_argument("--repeats", type=int, default=3, help="rounds (default 3)")
    args = ap.parse_args(argv)

    print(f"machine: {cpu_summary()}; {available_cores()} cores; load "
          + " ".join(f"{x:.1f}" for x in os.getloadavg()), flush=True)  # fmt: skip
    model = cn.load_model(args.model)
    task = get_task(args.task)
    _, items = make_panels(task, 1, args.size, 0)
    conditions = [(), tuple(parse_heads(args.heads))]
    ev = LMEvaluator(model, task, batch_size=BATCH_SIZE, spec=args.model)
    n_slices = len(panel_slices(len(items), SLICE_ITEMS))
    print(f"{args.model} on {args.task}: intact + {args.heads} on {len(items)} items "
          f"({2 * len(items)} evaluations); {args.workers} workers; whole = one chunk, sliced = "
          f"{n_slices} slices of at most {SLICE_ITEMS} items", flush=True)  # fmt: skip

    times: dict[str, list[float]] = {"whole": [], "sliced": []}
    results = {}
    for r in range(args.repeats):
        for way in ("whole", "sliced"):
            seconds, results[way] = run_once(ev, items, conditions, args.workers, way == "sliced")
            times[way].append(seconds)
            print(f"round {r + 1}: {way:<6} {seconds:7.1f} s", flush=True)

    for whole_c, sliced_c in zip(results["whole"], results["sliced"]):
        verdicts = [(r.item_id, r.correct, r.answer) for r in whole_c]
        assert verdicts == [(r.item_id, r.correct, r.answer) for r in sliced_c], "verdicts differ"
        a = np.array([r.ref_logprob for r in whole_c])
        b = np.array([r.ref_logprob for r in sliced_c])
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)
    whole, sliced = (statistics.median(times[w]) for w in ("whole", "sliced"))
    ratio = whole / sliced
    print(f"median of {args.repeats}: whole {whole:.1f} s, sliced {sliced:.1f} s: "
          f"{ratio:.2f}x with {args.workers} workers; results agree", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
