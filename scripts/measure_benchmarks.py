"""Intact accuracy of a model on a benchmark's validation split, and the cost of one (condition x
item), for docs/benchmarks.md.

    # accuracy on the whole split (resumable: rerun the same command to continue)
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python scripts/measure_benchmarks.py accuracy \\
        --model smollm2 --task hellaswag --out runs/bench-acc/smollm2-hellaswag.jsonl
    # seconds per (condition x item): the intact pass, then single heads at several depths
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python scripts/measure_benchmarks.py cost \\
        --model smollm2 --task hellaswag --items 32
    # the same heads stacked in one call, as a screen runs them (MBPP needs consent to run code)
    CEL_NUMPY_ALLOW_CODE_EXECUTION=1 ... cost --model qwen2.5-coder-0.5b --task mbpp --items 8 \\
        --stacked
    # where a stacked call's time goes (its costliest functions by their own time)
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python scripts/measure_benchmarks.py cost \\
        --model gemma-3-270m --task hellaswag --items 16 --conditions 4 --stacked --profile 8

accuracy: items in a seeded random order (`--seed`; the items done at any moment are a uniform
random sample of the split), `--chunk` at a time through the fast engine (one condition, the
intact model); each finished chunk's results are appended to --out (one JSON object per item),
so an interrupted run continues where it stopped. Beside --out, `<out>.settings.json` records
the model, task, --seed and --limit; a file written for other items or with other settings is
refused, as is a --merge file whose settings differ, and a results file with no settings file.
To use two cores with one BLAS thread each, run a second process with `--from-end` (the same
order from its far end) and its own --out, each naming the other's file with `--merge`: an item
with a result in the merged file counts as done (re-read before every chunk, so the two stop
where they meet), and its rows are appended to --out when the call ends (rerun the first
command once both have stopped to take in the other's last chunk). A prefix and a suffix of one
uniformly random order are together a uniform random sample, so a run stopped early still is.
Prints progress with the rate and the time left, then the accuracy with its Wilson interval.
cost: one warm-up call, then the intact model alone, then `--conditions` single-head conditions
spread over the layers (head 0), each call on the same items; prints seconds per (condition x
item) for each.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time
from pathlib import Path

import numpy as np

import cel_numpy as cn
from cel_numpy.localize.evaluate import LMEvaluator
from cel_numpy.localize.stats import wilson_interval
from cel_numpy.tasks import get_task, make_panels


def settings_path(results: Path) -> Path:
    """The file beside a results file that records what wrote it: model, task, seed, limit."""
    return results.with_name(results.name + ".settings.json")


def read_settings(results: Path) -> dict | None:
    """The settings recorded beside `results`; None when there are none (or not yet all)."""
    try:
        return json.loads(settings_path(results).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def check_settings(results: Path, settings: dict, flag: str) -> None:
    """Refuse to continue (--out) or take in (--merge) a results file written with other
    settings (model, task, order --seed, --limit), or one with results and no settings file."""
    found, has_rows = read_settings(results), results.exists() and results.stat().st_size > 0
    if found is not None and found != settings and (has_rows or flag == "--merge"):
        diff = ", ".join(f"{k} {found.get(k)!r} there, {v!r} here"
                         for k, v in settings.items() if found.get(k) != v)  # fmt: skip
        sys.exit(f"{results} was written with other settings ({diff}): check {flag}")
    if found is None and has_rows:
        sys.exit(
            f"{results} has results but no {settings_path(results).name}, so what wrote them "
            f"is unknown: use another {flag}, or if they were written with these settings, "
            f"write {json.dumps(settings)} to that file"
        )


def write_settings(results: Path, settings: dict) -> None:
    """Record `settings` beside `results` in one step (a process reading it sees all or none)."""
    path = settings_path(results)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(settings) + "\n")
    os.replace(tmp, path)


def accuracy(args) -> None:
    settings = {"model": args.model, "task": args.task, "seed": args.seed, "limit": args.limit}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    check_settings(out, settings, "--out")
    if args.merge:
        check_settings(Path(args.merge), settings, "--merge")
    model, task = cn.load_model(args.model), get_task(args.task)
    # a seeded random order: the items done at any moment are a uniform random sample
    order = np.random.default_rng(args.seed).permutation(len(task.items))
    items = [task.items[i] for i in order][: args.limit or None]
    done = {}
    if out.exists():
        for line in out.read_text().splitlines():
            row = json.loads(line)
            done[row["id"]] = row
    known = {it.id for it in task.items}
    if set(done) - known:
        sys.exit(f"{out} holds results of other items; use another --out")

    def merged() -> dict:
        """Rows of --merge's file (another process's --out), a half-written last line skipped."""
        rows = {}
        if args.merge and Path(args.merge).exists():
            check_settings(Path(args.merge), settings, "--merge")
            for line in Path(args.merge).read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if row.get("id") not in known:
                    sys.exit(f"{args.merge} holds results of other items; check --merge")
                rows[row["id"]] = row
        return rows

    # one condition per call: keeping intact passes across calls would only hold memory
    ev = LMEvaluator(model, task, batch_size=args.batch_size, intact_cache=False)
    other = merged()
    todo = [it for it in items if it.id not in done and it.id not in other]
    if args.from_end:
        todo.reverse()
    start, ran = time.perf_counter(), 0
    print(f"{args.model} {task.name}: {len(items)} items, {len(done)} done", flush=True)
    write_settings(out, settings)  # after every check and the loading: a refused run leaves none
    with open(out, "a") as f:
        for c0 in range(0, len(todo), args.chunk):
            other = merged()
            chunk = [it for it in todo[c0 : c0 + args.chunk] if it.id not in other]
            if not chunk:
                break  # the other process has done the rest
            (results,) = ev.evaluate_many(chunk, [()])
            for it, r in zip(chunk, results):
                row = {"id": it.id, "file_id": task.file_ids[it.id], "correct": r.correct,
                       "answer": r.answer}  # fmt: skip
                done[it.id] = row
                f.write(json.dumps(row) + "\n")
            f.flush()
            ran += len(chunk)
            rate = (time.perf_counter() - start) / ran
            correct = sum(done[it.id]["correct"] for it in items if it.id in done)
            left = sum(it.id not in done and it.id not in other for it in todo)
            print(
                f"  {len(done)}/{len(items)} items, {rate:.3f} s/item, "
                f"{rate * left / 60:.1f} min left at this rate alone, accuracy so far "
                f"{correct / len(done):.4f}",
                flush=True,
            )
        for row in merged().values():
            if row["id"] not in done:
                done[row["id"]] = row
                f.write(json.dumps(row) + "\n")
    missing = sum(it.id not in done for it in items)
    if missing:
        sys.exit(f"{missing} items have no result yet: rerun once the --merge process has stopped")
    k = sum(done[it.id]["correct"] for it in items)
    lo, hi = wilson_interval(k, len(items))
    wall = time.perf_counter() - start
    print(f"{args.model} {task.name}: {k}/{len(items)} = {k / len(items):.4f} "
          f"(Wilson 95% {lo:.4f}-{hi:.4f}); this call {wall / 60:.1f} min for {ran} items, "
          f"{time.process_time() / 60:.1f} min of CPU")  # fmt: skip


def cost(args) -> None:
    model, task = cn.load_model(args.model), get_task(args.task)
    # a data task's first items; a template task's (MBPP's) discovery panel of seed 0
    items = (
        task.items[: args.items]
        if hasattr(task, "items")
        else make_panels(task, args.items, 1, 0)[0]
    )
    L = model.config.n_layers
    layers = [round(k * (L - 1) / max(1, args.conditions - 1)) for k in range(args.conditions)]
    if args.stacked:
        return stacked_cost(model, task, items, layers, args.batch_size, args.profile)
    ev = LMEvaluator(model, task, batch_size=args.batch_size, intact_cache=False)
    ev.evaluate_many(items[: args.batch_size], [()])  # warm-up: prepared weights, allocator
    for label, conds in [("intact", [()])] + [(f"L{l}H0", [((l, 0),)]) for l in layers]:
        t0, c0 = time.perf_counter(), time.process_time()
        ev.evaluate_many(items, conds)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        print(f"{label:>7}: {dt:7.2f} s wall, {dc:7.2f} s CPU for {len(items)} items = "
              f"{dt / len(items):.3f} s wall, {dc / len(items):.3f} s CPU per (condition x item)",
              flush=True)  # fmt: skip


def stacked_cost(model, task, items, layers, batch_size, profile_top: int = 0) -> None:
    """The heads at `layers` (head 0) in one call, as a screen chunk runs them: the intact pass
    and the intact answers (a generate task's drafts) computed first and kept, then every
    condition; prints both parts per item and per (condition x item), and how many ablated
    answers equal the intact one."""
    ev = LMEvaluator(model, task, batch_size=batch_size)
    t0, c0 = time.perf_counter(), time.process_time()
    (intact,) = ev.evaluate_many(items, [()])
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    print(f" intact: {dt / len(items):.3f} s wall, {dc / len(items):.3f} s CPU per item "
          f"({sum(r.correct for r in intact)}/{len(items)} correct)", flush=True)  # fmt: skip
    conds = [((l, 0),) for l in layers]
    profile = cProfile.Profile() if profile_top else None
    t0, c0 = time.perf_counter(), time.process_time()
    out = (
        ev.evaluate_many(items, conds)
        if profile is None
        else profile.runcall(ev.evaluate_many, items, conds)
    )
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    n = len(items) * len(conds)
    same = sum(a.answer == b.answer for res in out for a, b in zip(res, intact))
    print(f"stacked: {len(conds)} heads ({', '.join(f'L{l}H0' for l in layers)}) x {len(items)} "
          f"items: {dt / n:.3f} s wall, {dc / n:.3f} s CPU per (condition x item); "
          f"{same} of {n} answers equal the intact model's", flush=True)  # fmt: skip
    if profile is not None:
        print_profile(profile, profile_top)


def print_profile(profile: cProfile.Profile, top: int) -> None:
    """The `top` functions by their own time (a BLAS call's time counts to the Python function
    that made it), each as a share of the profiled call's time."""
    stats = pstats.Stats(profile).stats  # {(file, line, name): (cc, nc, tottime, cumtime, callers)}
    total = sum(row[2] for row in stats.values())
    print(f"profile of the stacked call ({total:.1f} s), top {top} by own time:")
    for (file, line, name), row in sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]:
        where = f"{Path(file).name}:{line}({name})" if line else name
        print(f"  {row[2] / total:6.1%} {row[2]:8.2f} s  {where}", flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=("accuracy", "cost"))
    p.add_argument("--model", default="smollm2")
    p.add_argument("--task", required=True)
    p.add_argument("--out", help="accuracy: the per-item results file (JSONL)")
    p.add_argument("--limit", type=int, default=0, help="accuracy: only the first N items")
    p.add_argument("--seed", type=int, default=0, help="accuracy: the order items run in")
    p.add_argument("--from-end", action="store_true", help="accuracy: run the order backwards")
    p.add_argument("--merge", help="accuracy: another process's --out (see above)")
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--items", type=int, default=32, help="cost: items per call")
    p.add_argument("--conditions", type=int, default=4, help="cost: single-head conditions")
    p.add_argument(
        "--stacked", action="store_true",
        help="cost: every condition in one call with the intact pass kept, as a screen runs them",
    )  # fmt: skip
    p.add_argument(
        "--profile", type=int, default=0, metavar="N",
        help="cost --stacked: profile the stacked call; print its N costliest functions",
    )  # fmt: skip
    args = p.parse_args(argv)
    accuracy(args) if args.mode == "accuracy" else cost(args)


if __name__ == "__main__":
    main()
