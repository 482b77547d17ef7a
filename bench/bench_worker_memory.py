"""Benchmark: the memory one evaluator computes with, measured, beside the price the planner uses.

    .venv/bin/python bench/bench_worker_memory.py                      # Gemma 3, HellaSwag
    ... --model smollm2 --task boolq --items 50 --conditions 11
    CEL_NUMPY_ALLOW_CODE_EXECUTION=1 .venv/bin/python bench/bench_worker_memory.py \
        --model qwen2.5-coder-0.5b --task mbpp --items 10 --conditions 11   # generation

Not a test: one invocation prints one table. `cel-numpy localize --workers auto` decides how
many workers fit, and how many intact passes each may keep, from a price per worker
(`cel_numpy.localize.workers.activation_bytes`, from the model's shapes). This measures what
the price stands for. The workload is one piece of held-out work as the routine submits it:
--items items of the task's held-out panel (seed 0; 50 is the routine's slice) under
--conditions random head triples (seeded; 11 is the held-out stage's finalists plus the intact
model), one `evaluate_many` call, one BLAS thread, no kept intact passes (intact_cache=False:
their budget is counted apart).

Each variant runs in a fresh Python process of its own (`--child`), so that one's freed heap
cannot serve the other. A thread samples the process's anonymous resident memory (RssAnon in
/proc/self/status; the weights are mapped from the weight cache and do not count) every 10 ms;
the "working set" is its peak during the call minus its value just before (the interpreter,
the tokenizer, the task and the panel).

  now     the engine as it is: unembedding GEMMs of at most 512 rows across continuations
          and conditions, each continuation scored as its logits exist
  before  one condition's continuation rows unembedded at once (several conditions per GEMM
          only when they fit in 512 rows), what the choice engine did before 2026-12-06 and
          generation's drafts before 2026-12-07 (a generate task's "before" is that one): a
          batch of 16 HellaSwag items is about 1,600 rows, 1.7 GB of logits on Gemma 3's
          vocabulary
  one-cache  (generate tasks) the engine as it is, but every row that leaves its draft in one
          decode cache, what generation did before 2026-12-07; now the rows decode in groups
          whose caches fit DECODE_CACHE_BYTES (512 MiB)

The variants must give the same results (checked); the table prints each one's peak and the
price less its interpreter term over the measured working set (above 1: the planner
overestimates; the interpreter is in "RssAnon before the call").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
VARIANTS = ("now", "before", "one-cache")


def rss_anon() -> int:
    """This process's anonymous resident bytes (RssAnon, /proc/self/status)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status: this benchmark needs Linux")


class PeakSampler:
    """Samples rss_anon() every `period` seconds on a thread between start() and stop()."""

    def __init__(self, period: float = 0.01):
        self.period, self.peak, self._stop = period, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_anon())
            time.sleep(self.period)

    def start(self) -> PeakSampler:
        self.peak = rss_anon()
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_anon())
        return self.peak


def before_unembedding(prep, wave, final, real, unembed_rows: int):
    """The engine's unembedding before 2026-12-06 (`_unembed_continuations`' contract): every
    continuation row of one condition in one GEMM, max(1, unembed_rows // rows) conditions per
    GEMM, scored after the whole GEMM."""
    import cel_numpy.models.fast as mfast

    N = int(real.sum())
    ends = np.cumsum(real.sum(axis=1))[:-1]
    per_gemm = max(1, unembed_rows // max(1, N))
    for i0 in range(0, len(wave), per_gemm):
        group = wave[i0 : i0 + per_gemm]
        logits = mfast._unembed(prep, np.concatenate([final[c][real] for c in group]), None)
        for g, c in enumerate(group):
            for k, lg in enumerate(np.split(logits[g * N : (g + 1) * N], ends)):
                yield c, k, lg


def random_triples(n_layers: int, n_heads: int, n: int, seed: int) -> list[tuple]:
    """n distinct conditions of three distinct heads each, drawn uniformly (seeded)."""
    rng = np.random.default_rng(seed)
    heads = [(layer, h) for layer in range(n_layers) for h in range(n_heads)]
    out: set[tuple] = set()
    while len(out) < n:
        pick = rng.choice(len(heads), 3, replace=False)
        out.add(tuple(sorted(heads[i] for i in pick)))
    return sorted(out)


def child(args) -> None:
    """One variant in this process: print one JSON line."""
    from bench_forward import pin_threads

    import cel_numpy as cn
    import cel_numpy.models.fast as mfast
    from cel_numpy.localize.evaluate import LMEvaluator
    from cel_numpy.tasks import get_task, make_panels

    pin_threads(1)
    if args.child == "before":
        mfast._unembed_continuations = before_unembedding
    if args.child == "one-cache":
        mfast._decode_groups = lambda prep, segments, resumes, max_new, budget: [resumes]
    model = cn.load_model(args.model)
    task = get_task(args.task)
    _, items = make_panels(task, 1, args.items, 0)
    conds = random_triples(model.config.n_layers, model.config.n_heads, args.conditions, 1)
    ev = LMEvaluator(model, task, intact_cache=False)
    base = rss_anon()
    sampler = PeakSampler().start()
    t0 = time.perf_counter()
    results = ev.evaluate_many(items, conds)
    seconds = time.perf_counter() - t0
    peak = sampler.stop()
    digest = hashlib.sha256(repr(results).encode()).hexdigest()[:16]
    print(json.dumps({"base": base, "peak": peak, "seconds": seconds, "results": digest}))


def run_child(variant: str, args) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", variant]
    cmd += ["--model", args.model, "--task", args.task]
    cmd += ["--items", str(args.items), "--conditions", str(args.conditions)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)])}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"variant {variant} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--task", default="hellaswag")
    ap.add_argument("--items", type=int, default=50)
    ap.add_argument("--conditions", type=int, default=11)
    ap.add_argument("--repeats", type=int, default=1, help="fresh processes per variant")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0

    from cel_numpy.localize.workers import INTERPRETER_BYTES, activation_bytes
    from cel_numpy.models.loaders import read_model_config
    from cel_numpy.tasks import get_task

    config = read_model_config(args.model)
    generation = get_task(args.task).scoring == "generate"
    price = activation_bytes(config, generation=generation)
    variants = VARIANTS if generation else VARIANTS[:2]
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for _ in range(args.repeats):
        for v in variants:  # interleaved: a change of load hits all alike
            runs[v].append(run_child(v, args))
    same = len({r["results"] for rs in runs.values() for r in rs}) == 1
    mib = lambda n: f"{n / 2**20:,.0f} MiB"

    print(f"$ python bench/bench_worker_memory.py {' '.join(argv or sys.argv[1:])}")
    print(
        f"# {args.model} ({config.vocab_size:,} tokens, d_mlp {config.d_mlp}), {args.task}: "
        f"{args.items} held-out items x {args.conditions} random triples, one evaluate_many "
        f"call, 1 BLAS thread, no kept intact passes; {args.repeats} fresh process(es) per "
        f"variant; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    print(f"# results equal across variants: {same}")
    print(
        f"# price (workers.activation_bytes, generation={generation}): {mib(price)}, of which "
        "the interpreter "
        f"{mib(INTERPRETER_BYTES)}"
    )
    print(
        "| variant | RssAnon before the call | peak during it | working set "
        "| price less interpreter / working set | median s |"
    )
    print("|---|---|---|---|---|---|")
    for v, rs in runs.items():
        base = int(np.median([r["base"] for r in rs]))
        peak = int(np.median([r["peak"] for r in rs]))
        work = peak - base
        seconds = float(np.median([r["seconds"] for r in rs]))
        ratio = (price - INTERPRETER_BYTES) / max(work, 1)
        print(f"| {v} | {mib(base)} | {mib(peak)} | {mib(work)} | {ratio:.2f}x | {seconds:.1f} |")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
