"""How well does the one-pass gradient screen predict the exact singleton screen? (issue #6)

    .venv/bin/python scripts/measure_gradient_screen.py \
        --tasks ioi,agreement,antonyms,capitals,arithmetic \
        --discovery 20 --heldout 300 [--runs /work/results2] [--out gradient_screen.json]

For each task, on the discovery panel the routine would build (make_panels(task, discovery,
heldout, seed)), in this one process:
  gradient  estimate_h = -dM/dm_h for every head, one forward + backward per batch
            (cel_numpy.localize.gradient.gradient_screen)
  exact     M with head h removed minus M intact, an exact forward per head sharing the intact
            prefix below it (exact_metric_screen)
and reports the Spearman rank correlation of the two over all heads, the overlap of their top 10,
and the wall-time ratio. M is the smooth task metric of gradient.py (log-probability of the answer,
or the correct choice's log share).

With --runs DIR, DIR/<task>/ is a finished `cel-numpy localize` run on the same panels (the
panel hash is checked): the estimate is also compared with that run's exact singleton screen on
ACCURACY (gain = rescued - damaged, what the routine ranks by), and with its 10 nominees. Its wall
time is read from the run's stage timestamps (another process: quoted, not a same-run ratio).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

import cel_numpy
from cel_numpy.localize import LMEvaluator
from cel_numpy.localize.gradient import exact_metric_screen, gradient_screen
from cel_numpy.localize.rundir import items_hash
from cel_numpy.tasks import get_task, make_panels


def top(a: np.ndarray, k: int = 10) -> set[int]:
    """Flat indices of the k largest entries (ties: lower index first)."""
    return set(np.argsort(-a.ravel(), kind="stable")[:k].tolist())


def from_run(run: Path, items, n_layers: int, n_heads: int) -> dict:
    manifest = json.loads((run / "manifest.json").read_text())
    if manifest["panel_hashes"]["discovery"] != items_hash(items):
        raise SystemExit(
            f"{run}: its discovery panel is not this one (hash differs): "
            "pass matching --discovery/--heldout/--seed"
        )
    screen = json.loads((run / "screen.done.json").read_text())
    gain = np.zeros((n_layers, n_heads))
    for cond in screen["summary"]["conditions"]:
        ((layer, head),) = cond["heads"]
        gain[layer, head] = cond["gain"]
    nominees = {layer * n_heads + head for layer, head in screen["summary"]["nominees"]}
    started = dt.datetime.fromisoformat(
        json.loads((run / "baseline.done.json").read_text())["finished"]
    )
    finished = dt.datetime.fromisoformat(screen["finished"])
    return {"gain": gain, "nominees": nominees, "seconds": (finished - started).total_seconds()}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tasks", default="ioi,agreement,antonyms,capitals,arithmetic")
    ap.add_argument("--discovery", type=int, default=20)
    ap.add_argument("--heldout", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument(
        "--runs", type=Path, help="folder with finished localize runs, one per task name"
    )
    ap.add_argument("--out", type=Path, help="write the measurements as JSON here")
    args = ap.parse_args()

    model = cel_numpy.load_model(args.model)
    L, H = model.config.n_layers, model.config.n_heads
    rows = []
    print(
        "| task | items | M intact | gradient s | exact s | ratio | Spearman vs exact M "
        "| top-10 overlap | Spearman vs accuracy screen | nominees in gradient top 10 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.tasks.split(","):
        task = get_task(name)
        items, _ = make_panels(task, args.discovery, args.heldout, args.seed)
        evaluator = LMEvaluator(model, task, batch_size=args.batch_size)
        t0 = time.perf_counter()
        m_intact, estimate = gradient_screen(evaluator, items, batch_size=args.batch_size)
        t1 = time.perf_counter()
        m_check, exact = exact_metric_screen(evaluator, items, batch_size=args.batch_size)
        t2 = time.perf_counter()
        assert abs(m_intact - m_check) < 1e-4 * max(1.0, abs(m_intact)), (
            "intact metric differs between the paths"
        )
        row = {
            "task": name,
            "items": len(items),
            "metric_intact": m_intact,
            "gradient_seconds": t1 - t0,
            "exact_seconds": t2 - t1,
            "ratio": (t2 - t1) / (t1 - t0),
            "spearman_exact_metric": float(spearmanr(estimate.ravel(), exact.ravel())[0]),
            "top10_overlap_exact_metric": len(top(estimate) & top(exact)),
            "estimate": estimate.tolist(),
            "exact": exact.tolist(),
        }
        acc = ""
        if args.runs is not None and (args.runs / name / "screen.done.json").is_file():
            run = from_run(args.runs / name, items, L, H)
            row["spearman_accuracy_screen"] = float(
                spearmanr(estimate.ravel(), run["gain"].ravel())[0]
            )
            row["nominees_in_gradient_top10"] = len(top(estimate) & run["nominees"])
            row["accuracy_screen_seconds_from_run"] = run["seconds"]
            acc = f"{row['spearman_accuracy_screen']:+.2f} | {row['nominees_in_gradient_top10']}/10"
        else:
            acc = "- | -"
        print(
            f"| {name} | {len(items)} | {m_intact:+.3f} | {t1 - t0:.1f} | {t2 - t1:.0f} "
            f"| {row['ratio']:.0f}x | {row['spearman_exact_metric']:+.2f} "
            f"| {row['top10_overlap_exact_metric']}/10 | {acc} |",
            flush=True,
        )
        rows.append(row)
        if args.out is not None:
            args.out.write_text(
                json.dumps(
                    {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1
                )
            )


if __name__ == "__main__":
    main()
