"""Benchmark: what the kept intact passes save a screen whose panel is larger than the budget.

    .venv/bin/python bench/bench_intact_cache.py                  # HellaSwag, 20 items, SmolLM2
    ... --task boolq --size 40 --repeats 3 --model smollm2

Not a test: one invocation prints one table of medians and ratios. The workload is one chunk of
a singleton screen as the routine submits it (8 heads spread over the layers, one
`evaluate_many` call on --size items of the task's discovery panel, seed 0, one BLAS thread),
repeated by one evaluator per budget, timed in turns after one untimed call each
(`bench_forward.interleaved_medians`):

  none     intact_cache=False: every call recomputes every batch's intact pass (what a full
           least-recently-used cache did when the panel did not fit: each batch evicted the one
           the next call needed first, so nothing was ever reused)
  part     a budget for --part of the panel's intact passes (default 0.18: a 1 GiB budget
           against the 5.6 GB that 100 HellaSwag items keep on SmolLM2): the scan-resistant
           cache keeps the first batches and reuses them every call
  all      a budget that holds the whole panel (what `cel-numpy localize` now sizes from the
           free memory, `workers.intact_cache_budget`)

The ratio none/all is the share of a chunk's time that is intact passes; a screen pays it once
per chunk of 8 conditions.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from bench_forward import interleaved_medians, pin_threads

import cel_numpy as cn
from cel_numpy.localize.evaluate import LMEvaluator
from cel_numpy.tasks import get_task, make_panels


def spread_heads(n_layers: int, n_heads: int, k: int) -> list[tuple]:
    """k single-head conditions, layers spread evenly from the first to the last."""
    layers = np.linspace(0, n_layers - 1, k).round().astype(int)
    return [((int(l), i % n_heads),) for i, l in enumerate(layers)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--task", default="hellaswag")
    ap.add_argument("--size", type=int, default=20)
    ap.add_argument("--chunk", type=int, default=8)
    ap.add_argument("--part", type=float, default=0.18)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    threads = pin_threads(1)
    model = cn.load_model(args.model)
    task = get_task(args.task)
    items, _ = make_panels(task, args.size, 1, 0)
    conds = spread_heads(model.config.n_layers, model.config.n_heads, args.chunk)

    whole = LMEvaluator(model, task, intact_cache_bytes=1 << 40)
    whole.evaluate_many(items, conds)
    panel_bytes = whole._intact_cache.nbytes
    evaluators = {
        "none": LMEvaluator(model, task, intact_cache=False),
        "part": LMEvaluator(model, task, intact_cache_bytes=int(args.part * panel_bytes)),
        "all": whole,
    }
    results = {name: ev.evaluate_many(items, conds) for name, ev in evaluators.items()}
    same = all(results[name] == results["none"] for name in results)
    medians = interleaved_medians(
        {name: (lambda ev=ev: ev.evaluate_many(items, conds)) for name, ev in evaluators.items()},
        args.repeats,
    )
    kept = evaluators["part"]._intact_cache.nbytes

    print(f"# {args.model}, {args.task}: {args.size} items, {len(conds)} conditions per call")
    print(f"# {threads}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"# the panel's intact passes: {panel_bytes / 2**20:.0f} MiB; part keeps ", end="")
    print(f"{kept / 2**20:.0f} MiB ({kept / panel_bytes:.0%}); results equal: {same}")
    print("| budget | median s per call | none / this |")
    print("|---|---|---|")
    for name, t in medians.items():
        print(f"| {name} | {t:.1f} | {medians['none'] / t:.2f}x |")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
