"""Benchmark: the screen on one core and on every core, ours vs torch, and the workers' memory.

    PYTHONPATH=. /work/venv-ref/bin/python bench/bench_cores.py
    ... --task capitals --size 50 --heads 16 --repeats 3 --cores 1,2
    ... --no-torch                                  # ours alone (the cel-numpy venv is enough)
    ... --task hellaswag --size 20 --heads 16       # the choice workload (fetch hellaswag first)

Not a test: one invocation prints one table of medians and ratios. The workload is a singleton
screen sample: --heads heads spread over the layers (low and high layers interleaved, so that
chunks cost about the same), each ablated alone on --size items of the task's discovery panel
(seed 0), in chunks of --chunk conditions (8, as the routine submits them). At each core count n:

  ours   n worker processes of `cel_numpy.localize.workers.WorkerPool` (what `cel-numpy
         localize --workers n` starts: forked, one BLAS thread each, the model mapped from the
         weight cache), fed the chunks through `evaluate_chunk`, as the routine does; one pool
         per n, kept for every round. Each worker's evaluator is warm: before the first round,
         every worker computes the evaluator's one-off work (the intact answers and passes of
         the panel) -- timed apart as "one-off", which a whole screen pays once per worker,
         concurrently.
  torch  transformers + torch with n threads (`torch.set_num_threads`) in a spawned process of
         its own: a forward pre-hook on o_proj zeroing the head, batched greedy `generate` with
         the same stop rule, on the same token ids and the same float32 weights
         (`bench_screen.screen_torch`; its logits checked against ours before timing). On a
         choice task (HellaSwag, BoolQ) the hook + likelihood sweep instead, as lm-eval scores:
         every (context + candidate) its own sequence, log_softmax over the vocabulary, the
         candidate's tokens summed (`bench_screen.screen_torch_choice`).

Both sides run the same heads and items; answers and verdicts are compared head by head. The
machine is shared, so the sides run interleaved (ours on 1 core, torch on 1 core, ours on n, torch
on n, then again) and medians are compared. "Whole screen" rows scale the sample to every head
(one-off once, plus the sample's time x heads / sampled heads), as bench_screen.py does.

Memory: the proportional set size (Pss, /proc/PID/smaps_rollup: shared pages divided among the
processes that map them) of the parent and its workers, summed, read right after the timed
sample while every worker still holds its activations, with 1 worker and with n, each pool
alone (after the timed rounds; Pss splits shared pages among every process that maps them). With
--no-cache-memory, also n workers that each dequantize their own copy (CEL_NUMPY_WEIGHT_CACHE=0
in the workers: what every version before the weight cache did).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_forward import cpu_summary

import cel_numpy as cn
from cel_numpy.localize.evaluate import BATCH_SIZE, LMEvaluator
from cel_numpy.localize.fast import INTACT_DRAFTS_MIN_CONDITIONS
from cel_numpy.localize.routine import evaluate_chunk
from cel_numpy.localize.workers import WorkerPool, available_cores, blas_threads
from cel_numpy.tasks import get_task, make_panels

CHUNK = 8  # conditions per chunk, the routine's default
TARGETS = {1: 3.0}  # ours / torch at one core; at every core: ALL_CORES_TARGET
ALL_CORES_TARGET = 2.5


def spread(heads, k):
    if k <= 0 or k >= len(heads):
        return list(heads)
    picked = [heads[i] for i in np.linspace(0, len(heads) - 1, k).round().astype(int)]
    return picked[0::2] + picked[1::2]  # chunks mixing low and high layers


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def pss_mib(pid: int) -> float:
    """Proportional set size of a process, MiB (Linux)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no Pss line for process {pid}")


# --------------------------------------------------------------------------- ours


def _warm(ev, items, n_layers: int, n_heads: int, pause: float):
    """In a worker: the evaluator's one-off work (as a real chunk triggers it: a call with
    enough conditions for the intact answers), timed; then a pause, so that the other workers
    take the other warm-up jobs."""
    t0 = time.perf_counter()
    k = min(n_heads, INTACT_DRAFTS_MIN_CONDITIONS)
    evaluate_chunk(ev, items, [((n_layers - 1, h),) for h in range(k)])
    once = time.perf_counter() - t0
    time.sleep(pause)
    return os.getpid(), once, intact_cache_mib()


def intact_cache_mib() -> float:
    """In a worker: MiB of intact passes its evaluator keeps (`IntactCache`), summed over arrays."""
    from cel_numpy.localize.evaluate import _WORKER_EVALUATOR

    caches = [ev.__dict__.get("_intact_cache") for ev in _WORKER_EVALUATOR.values()]
    return sum(c.nbytes for c in caches if c is not None) / 2**20


class OursPool:
    """n workers of `WorkerPool` with warm evaluators, kept for every round (module docstring)."""

    def __init__(self, model, spec, task, items, n: int, batch_size: int):
        self.ev = LMEvaluator(model, task, batch_size=batch_size, spec=spec)
        self.items, self.n = items, n
        self.pool = WorkerPool(n)
        self.pool.plan(n)
        L, H = model.config.n_layers, model.config.n_heads
        warm = [self.pool.submit(_warm, self.ev, items, L, H, 3.0) for _ in range(n)]
        pids_once = [f.result() for f in warm]
        assert len({p for p, _, _ in pids_once}) == n, "a worker was not warmed up"
        self.once = max(o for _, o, _ in pids_once)  # the workers pay it at the same time
        self.intact_mib = max(m for _, _, m in pids_once)  # kept intact passes, per worker

    def screen(self, heads, chunk: int):
        """(sample seconds, {head: [(answer, correct)]}, Pss MiB of parent + workers)."""
        chunks = [heads[i : i + chunk] for i in range(0, len(heads), chunk)]
        t0 = time.perf_counter()
        futures = [
            self.pool.submit(evaluate_chunk, self.ev, self.items, [(h,) for h in c]) for c in chunks
        ]
        results = [f.result() for f in futures]
        seconds = time.perf_counter() - t0
        workers = list(self.pool._pool._processes)  # pids
        pss = pss_mib(os.getpid()) + sum(pss_mib(p) for p in workers)
        answers = {
            h: [(r.answer, bool(r.correct)) for r in res]
            for c, out in zip(chunks, results)
            for h, res in zip(c, out)
        }
        return seconds, answers, pss

    def close(self):
        self.pool.shutdown()


def measure_memory(model, spec, task, items, heads, n: int, args, cache: bool = True) -> float:
    """Pss MiB of this process + n fresh workers (no other pool alive: Pss divides shared pages
    among every process that maps them) right after one sample; cache=False: the workers load
    their own float32 copy (CEL_NUMPY_WEIGHT_CACHE=0, read by load_model in the forked workers)."""
    if not cache:
        os.environ["CEL_NUMPY_WEIGHT_CACHE"] = "0"
    try:
        pool = OursPool(model, spec, task, items, n, args.batch_size)
        try:
            pss = pool.screen(heads, args.chunk)[2]
        finally:
            pool.close()
    finally:
        os.environ.pop("CEL_NUMPY_WEIGHT_CACHE", None)
    print(f"memory, {n} worker(s){'' if cache else ', no weight cache'}: Pss {pss:.0f} MiB "
          f"(intact passes kept: {pool.intact_mib:.0f} MiB per worker)", flush=True)  # fmt: skip
    return pss


# --------------------------------------------------------------------------- torch


def torch_pool() -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))


def _torch_sweep(spec, threads, task_name, D, heads, batch_size):
    """In a spawned process (torch imported there only): bench_screen's hook + generate sweep."""
    from bench_screen import torch_job

    dlogits, seconds, results, _ = torch_job(spec, threads, task_name, D, heads, batch_size)
    import torch

    return dlogits, seconds, results, torch.get_num_threads()


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--task", default="capitals")
    ap.add_argument("--size", type=int, default=50, help="items (D), default 50")
    ap.add_argument("--heads", type=int, default=16, help="sampled heads (default 16)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds (0: the memory rows only)")
    ap.add_argument("--cores", default=f"1,{available_cores()}", help="core counts (1,all)")
    ap.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    ap.add_argument(
        "--chunk", type=int, default=CHUNK,
        help=f"conditions per chunk (default {CHUNK}, the routine's; a smaller one gives a small "
        "sample enough chunks for every worker)",
    )  # fmt: skip
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-cache-memory", action="store_true", help="also Pss without the cache")
    args = ap.parse_args(argv)
    cores = sorted({int(c) for c in args.cores.split(",")})
    print(f"machine: {cpu_summary()}; {available_cores()} cores available to this process; "
          f"numpy {np.__version__}, {blas_threads()} BLAS threads in the parent; "
          f"load {load()}", flush=True)  # fmt: skip

    t0 = time.perf_counter()
    model = cn.load_model(args.model)
    print(f"model {args.model} loaded in {time.perf_counter() - t0:.2f} s "
          f"(weight cache: {model.weight_cache})", flush=True)  # fmt: skip
    task = get_task(args.task)
    items, _ = make_panels(task, args.size, 1, 0)
    L, H = model.config.n_layers, model.config.n_heads
    all_heads = [(l, h) for l in range(L) for h in range(H)]
    heads = spread(all_heads, args.heads)
    scale = len(all_heads) / len(heads)
    torch_pools = {} if args.no_torch else {n: torch_pool() for n in cores}

    ours: dict[int, list] = {n: [] for n in cores}
    theirs: dict[int, list] = {n: [] for n in cores}
    answers_ours, answers_torch, torch_threads, pools = {}, {}, {}, {}
    try:
        for n in cores if args.repeats else []:  # --repeats 0: the memory rows only
            pools[n] = OursPool(model, args.model, task, items, n, args.batch_size)
            print(f"ours, {n} worker(s) warm: one-off {pools[n].once:.1f} s, intact passes "
                  f"kept {pools[n].intact_mib:.0f} MiB per worker (load {load()})",
                  flush=True)  # fmt: skip
        for rnd in range(args.repeats):
            for n in cores:
                t, ans, _ = pools[n].screen(heads, args.chunk)
                ours[n].append((pools[n].once, t))
                answers_ours[n] = ans
                print(f"[{rnd}] ours, {n} worker(s): sample {t:.1f} s (load {load()})",
                      flush=True)  # fmt: skip
                if n in torch_pools:
                    job = (args.model, n, args.task, args.size, heads, args.batch_size)
                    dl, tt, res, nt = torch_pools[n].submit(_torch_sweep, *job).result()
                    assert dl < 1e-3, f"torch is not our model: max |dlogits| {dl}"
                    theirs[n].append(tt)
                    answers_torch[n], torch_threads[n] = res, nt
                    print(f"[{rnd}] torch, {nt} thread(s): sample {tt:.1f} s, "
                          f"max |dlogits| {dl:.1e} (load {load()})", flush=True)  # fmt: skip
        for pool in pools.values():
            pool.close()
        pools.clear()
        for p in torch_pools.values():  # they map the weight cache too: Pss would split with them
            p.shutdown()
        torch_pools.clear()
        memory = {n: measure_memory(model, args.model, task, items, heads, n, args) for n in cores}
        no_cache = None
        if args.no_cache_memory:
            n = max(cores)
            no_cache = measure_memory(model, args.model, task, items, heads, n, args, False)
    finally:
        for p in [*torch_pools.values(), *pools.values()]:
            p.close() if isinstance(p, OursPool) else p.shutdown()

    med = lambda xs: float(np.median(xs))
    tag = f"{args.task} D={args.size}"
    rows = []
    for n in cores if args.repeats else []:
        once, t = (med([r[i] for r in ours[n]]) for i in range(2))
        whole = once + scale * t
        rows.append((tag, f"{n} core(s): ours, {n} worker(s) x 1 BLAS thread, {len(heads)} heads",
                     f"{t:.1f} s", f"one-off {once:.1f} s; whole screen (est.) {whole:.0f} s; "
                     f"median of {len(ours[n])}"))  # fmt: skip
        if theirs[n]:
            tt = med(theirs[n])
            pairs = [(a, b) for h in heads for a, b in zip(answers_ours[n][h], answers_torch[n][h])]
            same = f"{sum(a == b for a, b in pairs)} of {len(pairs)}"
            target = TARGETS.get(n, ALL_CORES_TARGET)
            rows.append((tag, f"{n} core(s): torch, {torch_threads[n]} thread(s)", f"{tt:.1f} s",
                         f"ours **{tt / t:.2f}x** faster on the sample (warm), "
                         f"{scale * tt / whole:.2f}x on the whole screen (est.; target >= "
                         f"{target}); answers equal on {same} (head, item)"))  # fmt: skip
    one, many = cores[0], cores[-1]
    if args.repeats:
        t1, tn = med([r[1] for r in ours[one]]), med([r[1] for r in ours[many]])
        rows.append(
            (tag, f"ours, {many} workers vs {one}", f"{t1 / tn:.2f}x", "scaling of the sample")
        )
    if theirs[one] and theirs[many]:
        s = med(theirs[one]) / med(theirs[many])
        rows.append((tag, f"torch, {many} threads vs {one}", f"{s:.2f}x", "scaling of the sample"))
    p1, pn = memory[one], memory[many]
    rows.append((tag, f"Pss, parent + {one} worker", f"{p1:.0f} MiB", "after one sample"))
    rows.append((tag, f"Pss, parent + {many} workers", f"{pn:.0f} MiB",
                 f"{pn / p1:.2f}x one worker's (target <= 1.3)"))  # fmt: skip
    if no_cache is not None:
        rows.append((tag, f"Pss, parent + {many} workers, no weight cache", f"{no_cache:.0f} MiB",
                     f"{no_cache / p1:.2f}x one worker's with the cache"))  # fmt: skip
    print(f"\nload average after: {load()}")
    w = max(len(r[1]) for r in rows)
    print(f"\n| workload | {'measure':<{w}} | value | note |\n|---|---|---|---|")
    for tag, what, val, note in rows:
        print(f"| {tag} | {what:<{w}} | {val} | {note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
