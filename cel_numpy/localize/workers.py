"""Worker processes for `cel-numpy localize --workers N`: they end with their parent.

    pool = WorkerPool(n)          an Executor; the routine submits chunks of conditions to it
    pool.plan(n_chunks)           before a stage: at most one worker per chunk (never more than n)
    pool.terminate()              on Ctrl-C / SIGTERM / an error: kill the workers now
    auto_workers(...)             `--workers auto`: the cores here, capped by available memory

Each worker runs its BLAS with one thread (threadpoolctl, set when it starts): N workers on N
cores, not N x N threads competing for them.

Workers are forked from the parent (they inherit the loaded model without pickling it) and

  * die with their parent, however it dies: on Linux the kernel sends them SIGKILL when the
    parent exits (prctl PR_SET_PDEATHSIG); everywhere a watchdog thread in each worker polls
    os.getppid() once a second and exits when the parent is gone. A worker never writes to the
    run directory (the parent writes every record), so killing one loses at most the chunk it
    was computing, which the rerun computes again;
  * never hold the run directory's lock: the lock's descriptor is closed in every forked child
    (`cel_numpy.localize.rundir`, os.register_at_fork), so a killed parent's lock is free and
    the rerun takes it over;
  * leave Ctrl-C to the parent (SIGINT ignored) and die on SIGTERM (the default action; the
    parent's SIGTERM handler, which raises in the parent, is not theirs).

A worker killed from outside (the out-of-memory killer) breaks the pool: the futures raise
BrokenProcessPool, which the command line reports in one line (rerunning resumes).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass

from cel_numpy.models.fast import (
    ATTENTION_BLOCK_BYTES,
    DECODE_CACHE_BYTES,
    INTACT_CACHE_BYTES,
    UNEMBED_ROWS,
    WAVE_ROWS,
)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_SECONDS = 1.0
# Memory a screening worker needs besides the weights when nothing says which model runs: its
# activations (1 GiB; `activation_bytes` prices them from the model's shapes) and the intact
# passes it keeps (INTACT_CACHE_BYTES, 1 GiB; `intact_cache_budget` gives more when memory
# allows). A SmolLM2 capitals screen at D=50 peaked at 2.6 GiB resident in one process, 0.8 GiB
# of it weights (docs/results/bench/bench-capitals50-final.txt).
DEFAULT_ACTIVATION_BYTES = 1 << 30
WORKER_BYTES = INTACT_CACHE_BYTES + DEFAULT_ACTIVATION_BYTES
INTERPRETER_BYTES = 300 << 20  # Python, NumPy, the tokenizer and the task's items


def activation_bytes(
    config, batch_tokens: int | None = None, itemsize: int = 4, generation: bool = False
) -> int:
    """Bytes one evaluator of a model with `config` (a ModelConfig) computes with at its peak,
    besides the weights (mapped, counted once) and the intact passes it keeps (its budget):

      the batch's intact pass   batch_tokens x L x (D + H E + 2 G E): each layer's residual,
                                head outputs and K/V, kept while the batch's conditions run
                                (batch_tokens: `localize.fast.MAX_BATCH_TOKENS`, 4096)
      one wave's layer          WAVE_ROWS x (3 D + (H + 2 G) E + 3 F): residual, its norm,
                                Q/K/V and the gated MLP's hidden rows of every stacked condition
      attention scores          2 x ATTENTION_BLOCK_BYTES (scores and their softmax)
      the unembedding           3 x UNEMBED_ROWS x V: two GEMMs' logits and the scorer's
                                float64 log-softmax (LOGPROB_ROWS = 32 rows, 4 arrays: half
                                a slab)
      the interpreter           INTERPRETER_BYTES

    and with `generation` (a task scored by generating its answer):

      the wave's K/V            WAVE_ROWS x L x 2 G E: every layer's keys and values of the
                                stacked conditions, kept for the rows that decode on
      the decode cache          DECODE_CACHE_BYTES: the K/V of a group of rows that leave
                                their drafts, lineage plus the answer's slots (one row larger
                                than that decodes alone)

    float32 (`itemsize` 4). These are the largest arrays each step holds, summed as if they were
    alive at once; generation unembeds its draft rows in the same slabs (a draft longer than
    UNEMBED_ROWS alone). A batch whose prompts and drafts together exceed WAVE_ROWS tokens
    (long drafts) runs one condition per wave and can exceed the wave's terms, as one decoding
    row larger than DECODE_CACHE_BYTES exceeds that one. `bench/bench_worker_memory.py` prints
    the price beside a measured peak."""
    from cel_numpy.localize.fast import MAX_BATCH_TOKENS

    c = config
    tokens = MAX_BATCH_TOKENS if batch_tokens is None else batch_tokens
    kv = 2 * c.n_kv_heads * c.d_head
    intact = tokens * c.n_layers * (c.d_model + c.n_heads * c.d_head + kv)
    wave = WAVE_ROWS * (3 * c.d_model + c.n_heads * c.d_head + kv + 3 * c.d_mlp)
    unembed = 3 * UNEMBED_ROWS * c.vocab_size
    wave_kv = WAVE_ROWS * c.n_layers * kv if generation else 0
    decode = DECODE_CACHE_BYTES if generation else 0
    fixed = 2 * ATTENTION_BLOCK_BYTES + INTERPRETER_BYTES + decode
    return (intact + wave + wave_kv + unembed) * itemsize + fixed


def available_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class WorkerPlan:
    """How many workers `--workers auto` starts, and why (printed before the run)."""

    workers: int
    cores: int
    memory_cap: int | None  # workers the available memory allows (None: unknown)
    available: int | None  # bytes (MemAvailable)
    shared: int  # bytes every worker maps once (weights from the cache), counted once
    per_worker: int  # bytes each worker needs of its own

    def describe(self) -> str:
        threads = "1 BLAS thread each" if self.workers > 1 else f"{blas_threads()} BLAS threads"
        head = f"{self.workers} worker{'s' * (self.workers != 1)}, {threads}"
        if self.available is None:
            return f"{head} ({self.cores} cores; available memory unknown)"
        gb = lambda n: f"{n / 1e9:.1f} GB"
        return (
            f"{head} ({self.cores} cores; memory for {self.memory_cap}: {gb(self.available)} "
            f"available, {gb(self.shared)} of weights mapped once, about {gb(self.per_worker)} "
            "per worker)"
        )


def memory_split(
    weights: int, shared: bool, intact_bytes: int | None = None, activations: int | None = None
) -> tuple[int, int]:
    """(bytes counted once, bytes per worker) for a model of `weights` bytes: the weights count
    once when `shared` (mapped from the weight cache), else once per worker; each worker counts
    its `activations` (`activation_bytes` of the model; None: DEFAULT_ACTIVATION_BYTES) and the
    intact passes it keeps: `intact_bytes` when the user sets the budget (--intact-memory),
    else INTACT_CACHE_BYTES (None)."""
    intact = INTACT_CACHE_BYTES if intact_bytes is None else intact_bytes
    working = DEFAULT_ACTIVATION_BYTES if activations is None else activations
    return (weights if shared else 0), working + intact + (0 if shared else weights)


def auto_workers(
    cores: int, available: int | None, shared: int, per_worker: int = WORKER_BYTES
) -> WorkerPlan:
    """One worker per core, as many as `available` bytes hold: `shared` bytes once (weights
    mapped from the weight cache, one copy for all) plus `per_worker` each; at least one."""
    cap = None if available is None else max(1, (available - shared) // max(per_worker, 1))
    n = max(1, min(cores, cap if cap is not None else cores))
    return WorkerPlan(n, cores, cap, available, shared, per_worker)


# What one evaluator keeps of intact passes when nothing says how much memory there is
# (INTACT_CACHE_BYTES, the IntactCache default), and at most when there is plenty.
MAX_INTACT_CACHE_BYTES = 16 << 30


def intact_cache_budget(
    available: int | None, shared: int, workers: int, per_worker: int = WORKER_BYTES
) -> int:
    """Bytes of intact passes each of `workers` evaluators may keep: the 1 GiB that
    `WORKER_BYTES` already counts, plus half of what `available` bytes leave per worker after
    the `shared` weights and `per_worker` bytes (as in `auto_workers`; the other half is left
    free), at most 16 GiB. A HellaSwag panel of 100 items keeps about 5.6 GB of intact passes on
    SmolLM2; when they fit, a screen stops recomputing them in every chunk (docs/speed.md)."""
    if available is None:
        return INTACT_CACHE_BYTES
    spare = (available - shared) // max(workers, 1) - per_worker
    return int(min(MAX_INTACT_CACHE_BYTES, INTACT_CACHE_BYTES + max(spare, 0) // 2))


def blas_threads() -> int:
    """Threads NumPy's BLAS uses in this process (the largest pool threadpoolctl reports)."""
    from threadpoolctl import threadpool_info

    return max((int(d.get("num_threads", 1)) for d in threadpool_info()), default=1)


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(WATCH_SECONDS)
        if os.getppid() != parent_pid:  # reparented: the parent is gone
            os._exit(1)


def worker_init(parent_pid: int) -> None:
    """Runs first in every worker: die with the parent, leave Ctrl-C to it, die on SIGTERM."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # no prctl here: the watchdog alone
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    threading.Thread(
        target=_watch_parent, args=(parent_pid,), daemon=True, name="cel-numpy-watch-parent"
    ).start()
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1)  # stays in force for the worker's life: one core each


def _context():
    # fork: workers share the parent's loaded model and any patched code (the tests rely on it)
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else None)


class WorkerPool(Executor):
    """A process pool of at most `n_workers` whose workers end with the parent
    (module docstring)."""

    def __init__(self, n_workers: int):
        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1, got {n_workers}")
        self.n_workers = int(n_workers)
        self.size = 0  # workers of the current pool (0: not started)
        self._pool: ProcessPoolExecutor | None = None

    def plan(self, n_tasks: int) -> None:
        """Make sure min(n_workers, n_tasks) workers exist (a larger earlier pool is kept)."""
        want = max(1, min(self.n_workers, int(n_tasks)))
        if want <= self.size:
            return
        if self._pool is not None:  # idle between stages: its workers exit at once
            self._pool.shutdown(wait=True)
        self._pool = ProcessPoolExecutor(
            max_workers=want,
            mp_context=_context(),
            initializer=worker_init,
            initargs=(os.getpid(),),
        )
        self.size = want

    def describe(self) -> str:
        """The plan in a few words, for the time estimate."""
        return f"{self.n_workers} workers x 1 BLAS thread"

    def submit(self, fn, /, *args, **kwargs):
        if self._pool is None:
            self.plan(self.n_workers)
        return self._pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)
            self._pool = None

    def terminate(self) -> None:
        """Stop at once: cancel queued chunks and kill the running workers (their chunks are lost
        and recomputed on resume; nothing of theirs is on disk)."""
        if self._pool is None:
            return
        pool, self._pool = self._pool, None
        processes = list((getattr(pool, "_processes", None) or {}).values())
        for p in processes:
            try:
                p.kill()
            except (OSError, ValueError):  # already gone
                pass
        pool.shutdown(wait=True, cancel_futures=True)
