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

Memory: the first lines compare the bytes the kept passes hold (their arrays' bases) with the
bytes the cache counts against its budget, for the engine as it is and, in the same invocation,
with K/V kept as views of the fused QKV projection (`fast._own_memory` made the identity: what
the engine did before 2026-12-04). `--memory-only` prints only those lines (one call each).
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from bench_forward import interleaved_medians, pin_threads

import cel_numpy as cn
import cel_numpy.models.fast as mfast
from cel_numpy.localize.evaluate import LMEvaluator
from cel_numpy.tasks import get_task, make_panels


def spread_heads(n_layers: int, n_heads: int, k: int) -> list[tuple]:
    """k single-head conditions, layers spread evenly from the first to the last."""
    layers = np.linspace(0, n_layers - 1, k).round().astype(int)
    return [((int(l), i % n_heads),) for i, l in enumerate(layers)]


def held_bytes(cache) -> int:
    """Bytes the kept intact passes hold alive: each kept array's base, counted once."""
    bases = {}
    for tree, _, _ in cache._trees.values():
        kept = [a for layer in tree.resid_pre + tree.z for a in layer]
        kept += [a for layer in tree.kv for kv in layer for a in kv]
        for a in kept:
            while isinstance(a.base, np.ndarray):
                a = a.base
            bases[id(a)] = a.nbytes
    return sum(bases.values())


def memory_lines(model, task, items, conds) -> list[str]:
    """Held / counted bytes of a whole panel's kept passes, as the engine is and with views."""
    lines = []
    own = mfast._own_memory
    for name, keep in (("copied (now)", own), ("views (before)", lambda a: a)):
        mfast._own_memory = keep
        try:
            ev = LMEvaluator(model, task, intact_cache_bytes=1 << 40)
            ev.evaluate_many(items, conds)
        finally:
            mfast._own_memory = own
        counted, held = ev._intact_cache.nbytes, held_bytes(ev._intact_cache)
        lines.append(
            f"# kept K/V {name}: counted {counted / 2**20:.0f} MiB, held {held / 2**20:.0f} MiB,"
            f" held / counted {held / counted:.2f}x"
        )
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--task", default="hellaswag")
    ap.add_argument("--size", type=int, default=20)
    ap.add_argument("--chunk", type=int, default=8)
    ap.add_argument("--part", type=float, default=0.18)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--memory-only", action="store_true", help="only held / counted bytes")
    args = ap.parse_args(argv)

    threads = pin_threads(1)
    model = cn.load_model(args.model)
    task = get_task(args.task)
    items, _ = make_panels(task, args.size, 1, 0)
    conds = spread_heads(model.config.n_layers, model.config.n_heads, args.chunk)
    memory = memory_lines(model, task, items, conds)
    if args.memory_only:
        print(f"# {args.model}, {args.task}: {args.size} items, {len(conds)} conditions")
        print("\n".join(memory))
        return 0

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
    print("\n".join(memory))
    print("| budget | median s per call | none / this |")
    print("|---|---|---|")
    for name, t in medians.items():
        print(f"| {name} | {t:.1f} | {medians['none'] / t:.2f}x |")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
