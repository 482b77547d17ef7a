"""Intact MBPP pass@1 of a model, problem by problem, resumable, with the cost per problem.

    CEL_NUMPY_ALLOW_CODE_EXECUTION=1 python scripts/measure_mbpp.py \\
        --model qwen2.5-coder-0.5b --first 20 --out runs/mbpp-intact.jsonl

Problems are taken in task_id order (the first --first of the 500). Each finished batch appends
one line per problem to --out (task_id, outcome, the program's first 200 characters, generated
tokens, the batch's wall and CPU seconds per problem: CPU time is this process's, all threads,
so it means the same on a busy machine); a rerun skips the task_ids already there. Prints
progress and the CPU time left at the measured rate; at the end, pass@1 over every problem in
--out and the median CPU seconds per problem of this invocation's batches.

--data DIR reads mbpp.json and mbpp-prompt.json (lists of rows) from DIR instead of
`cel_numpy.datasets.load_rows` (for a checkout without the data loader).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from cel_numpy.localize.evaluate import LMEvaluator
from cel_numpy.models.loaders import load_model
from cel_numpy.sandbox import isolation_notice, require_consent
from cel_numpy.tasks.mbpp import Mbpp, extract_program


def load_task(data: Path | None) -> Mbpp:
    if data is None:
        return Mbpp()
    rows = json.loads((data / "mbpp.json").read_text())
    prompt_rows = json.loads((data / "mbpp-prompt.json").read_text())
    return Mbpp(rows, prompt_rows)


def done_ids(out: Path) -> set[int]:
    if not out.exists():
        return set()
    return {json.loads(line)["task_id"] for line in out.read_text().splitlines() if line.strip()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--first", type=int, default=500, help="problems, in task_id order")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--data", type=Path, default=None)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    require_consent("measure_mbpp.py")
    notice = isolation_notice()
    if notice:
        print(notice, file=sys.stderr)
    task = load_task(args.data)
    rows = task.rows()[: args.first]
    todo = [i for i, row in enumerate(rows) if row["task_id"] not in done_ids(args.out)]
    print(f"{len(rows) - len(todo)} of {len(rows)} problems already in {args.out}", flush=True)
    if todo:
        start = time.perf_counter()
        model = load_model(args.model)
        print(f"model loaded in {time.perf_counter() - start:.1f} s", flush=True)
        # one condition: nothing to reuse across calls, so no intact cache (memory)
        ev = LMEvaluator(
            model, task, batch_size=args.batch_size, spec=args.model, intact_cache=False
        )
        tok = model.tokenizer
        per_problem = []
        args.out.parent.mkdir(parents=True, exist_ok=True)
        for b in range(0, len(todo), args.batch_size):
            batch = todo[b : b + args.batch_size]
            items = [task.item_at("mbpp", i) for i in batch]
            t0, c0 = time.perf_counter(), time.process_time()
            (results,) = ev.evaluate_many(items, [()])
            seconds = (time.perf_counter() - t0) / len(batch)
            cpu = (time.process_time() - c0) / len(batch)
            per_problem.append(cpu)
            lines = []
            for i, it, res in zip(batch, items, results):
                run = task.run(it, res.answer)
                lines.append(
                    {
                        "task_id": rows[i]["task_id"],
                        "passed": run.passed,
                        "outcome": run.outcome,
                        "tokens": len(tok.encode(res.answer)),
                        "program": extract_program(res.answer)[:200],
                        "seconds_per_problem": round(seconds, 3),
                        "cpu_seconds_per_problem": round(cpu, 3),
                    }
                )
            with args.out.open("a") as f:
                f.writelines(json.dumps(line) + "\n" for line in lines)
            finished = b + len(batch)
            left = statistics.median(per_problem) * (len(todo) - finished)
            print(
                f"{finished}/{len(todo)} problems, {seconds:.1f} s wall and {cpu:.1f} s CPU per "
                f"problem in this batch, about {left / 60:.1f} CPU-min left",
                flush=True,
            )
        print(f"median CPU seconds per problem: {statistics.median(per_problem):.2f}")
    records = [json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]
    records = [r for r in records if r["task_id"] in {row["task_id"] for row in rows}]
    passed = sum(r["passed"] for r in records)
    print(f"pass@1: {passed}/{len(records)} = {passed / len(records):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
