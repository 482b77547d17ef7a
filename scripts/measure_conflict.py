"""The theory's conflict on a real model: are the heads that copy the heads whose removal helps?

    python scripts/measure_conflict.py --model smollm2 --screen exact \\
        --reuse docs/results/gradient_screen --runs runs/conflict --out docs/results/conflict

1. Every head's OV copying score (`cel_numpy.explain.ov_copying_scores`).
2. Every head's single-removal effect on each task: the change of the smooth metric M (mean
   log-probability of the reference; for choice tasks the correct candidate's log share) on the
   20-item discovery panel of seed 0 (heldout 300), exact (`exact_metric_screen`) or first-order
   (`gradient_screen`, for Qwen: one forward + backward). `--reuse DIR` takes the exact screens
   that scripts/measure_gradient_screen.py wrote there (DIR/TASK.json) instead of recomputing.
   Positive = removing the head raises M.
3. Spearman correlation over all heads between copying score and effect, per task, and the
   copying scores of the heads of the lookup primary sets (percentile among all heads).
4. The held-out tests of the primary sets on the copying tasks (`scripts/run_conflict.sh`
   run directories under --runs), as a table.

Writes OUT/MODEL-screens.json (reused by a rerun: delete it to measure again) and
a markdown page OUT/MODEL-conflict; prints the markdown.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

import cel_numpy
from cel_numpy.explain import attended_lifts, ov_copying_scores
from cel_numpy.heads import head_name, parse_heads
from cel_numpy.localize import LMEvaluator
from cel_numpy.localize.gradient import exact_metric_screen, gradient_screen
from cel_numpy.tasks import get_task, make_panels

PRIMARY_SETS = {  # lookup primary sets of docs/results (v3 and v4 rounds)
    "smollm2": {
        "antonyms": ["L2H1+L13H2", "L8H1+L13H7+L14H3", "L10H8+L13H2+L14H3", "L8H1+L10H8+L13H2",
                     "L15H5+L21H1+L23H0", "L8H1+L11H6+L13H2", "L8H1+L13H2+L14H3"],
        "capitals": ["L10H3+L11H5+L23H0", "L1H2+L19H5+L23H0", "L10H6+L19H2+L19H5",
                     "L17H8+L19H5+L29H2", "L8H0+L17H0+L23H0", "L3H5+L10H3+L10H6",
                     "L7H2+L17H0+L24H6"],
    },
    "qwen2.5-coder-0.5b": {
        "arithmetic_chat": ["L2H12+L7H8+L8H1", "L6H2+L8H1+L9H3"],
        "antonyms": ["L8H1+L10H3"],
    },
}  # fmt: skip


def screen(
    model, name: str, kind: str, reuse: Path | None, seed: int, saved: dict
) -> tuple[np.ndarray, str]:
    if name in saved.get("effects", {}):  # this script's own earlier output (OUT/MODEL-screens)
        return np.array(saved["effects"][name]), saved["sources"][name]
    if reuse is not None and (reuse / f"{name}.json").exists():
        row = json.loads((reuse / f"{name}.json").read_text())["rows"][0]
        return np.array(row[kind]), f"{kind} (from {reuse / (name + '.json')})"
    task = get_task(name)
    items, _ = make_panels(task, 20, 300, seed)
    ev = LMEvaluator(model, task, batch_size=8)
    start = time.perf_counter()
    fn = exact_metric_screen if kind == "exact" else gradient_screen
    _, effect = fn(ev, items, batch_size=8)
    print(f"  {name}: {kind} screen of 20 items in {time.perf_counter() - start:.0f} s", flush=True)
    return effect, kind


def panel_lift(model, name: str, seed: int) -> np.ndarray:
    """(L, H) mean attended lift at the answer position over the 20-item discovery panel."""
    task = get_task(name)
    items, _ = make_panels(task, 20, 300, seed)
    ev = LMEvaluator(model, task)
    total = np.zeros((model.config.n_layers, model.config.n_heads))
    for start in range(0, len(items), 8):
        rows = [ev.prompt_ids(it.prompt) for it in items[start : start + 8]]
        ids, mask = model.pad(rows)
        _, cache = model.run_with_cache(ids, mask)
        for b, row in enumerate(rows):
            total += attended_lifts(model, cache, b, row)
    return total / len(items)


def percentile(scores: np.ndarray, value: float) -> float:
    return float((scores < value).mean() * 100)


def heldout_table(runs: Path, model: str) -> list[str]:
    rows = [
        "| set (found on) | task | intact | removed | rescued | damaged | gain [cluster 95% CI] "
        "| cluster p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    found = {s: t for t, sets in PRIMARY_SETS[model].items() for s in sets}
    for task in ("ioi", "induction"):
        for heads, origin in found.items():
            path = runs / f"{model}-{task}-{heads}" / "report.json"
            if not path.exists():
                rows.append(f"| {heads} ({origin}) | {task} | not run | | | | | |")
                continue
            ho = json.loads(path.read_text())["primary"]["heldout"]
            rows.append(
                f"| {heads} ({origin}) | {task} | {ho['intact_correct']}/{ho['n']} | "
                f"{ho['correct']}/{ho['n']} | {ho['rescued']} | {ho['damaged']} | "
                f"{ho['gain']:+d} [{ho['ci_low']:+.3f}, {ho['ci_high']:+.3f}] | "
                f"{ho['p_value']:.2g} |"
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tasks", default="antonyms,capitals,ioi,induction")
    ap.add_argument("--screen", choices=("exact", "gradient"), default="exact")
    ap.add_argument("--reuse", type=Path, help="folder of measure_gradient_screen.py outputs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--lift-tasks", default="antonyms,capitals", help="tasks whose attended lift is measured"
    )
    ap.add_argument("--runs", type=Path, default=Path("runs/conflict"))
    ap.add_argument("--out", type=Path, default=Path("docs/results/conflict"))
    args = ap.parse_args()

    model = cel_numpy.load_model(args.model)
    copying = ov_copying_scores(model)  # (L, H)
    saved_path = args.out / f"{args.model}-screens.json"
    saved = json.loads(saved_path.read_text()) if saved_path.exists() else {}
    effects, sources = {}, {}
    for name in [n for n in args.tasks.split(",") if n]:  # --tasks "": copying scores only
        effects[name], sources[name] = screen(
            model, name, args.screen, args.reuse, args.seed, saved
        )
    lifts = {}
    for name in [n for n in args.lift_tasks.split(",") if n]:
        if name in saved.get("lift", {}):
            lifts[name] = np.array(saved["lift"][name])
        else:
            start = time.perf_counter()
            lifts[name] = panel_lift(model, name, args.seed)
            print(f"  {name}: attended lifts in {time.perf_counter() - start:.0f} s", flush=True)
    lines = [
        f"## {args.model}",
        "",
        "Spearman over all heads, a copying measure vs the change "
        "of M when the head alone is removed (positive: removal helps):",
        "",
    ]
    corr = {}
    measures = {"OV copying": copying} | {f"attended lift on {k}": v for k, v in lifts.items()}
    for label, measure in measures.items():
        for name, eff in effects.items():
            rho, p = spearmanr(measure.ravel(), eff.ravel())
            corr[f"{label} vs {name}"] = {"rho": float(rho), "p": float(p)}
            lines.append(f"- {label} vs {name} ({sources[name]}): rho = {rho:+.3f} (p = {p:.2g})")
    top = np.argsort(-copying.ravel(), kind="stable")[:10]
    L, H = copying.shape
    lines += [
        "",
        "The ten strongest copiers and what removing each alone does to M:",
        "",
        "| head | OV copying | " + " | ".join(effects) + " |",
        "|---|---|" + "---|" * len(effects),
    ]
    for flat in top:
        l, h = divmod(int(flat), H)
        lines.append(
            f"| {head_name((l, h))} | {copying[l, h]:+.2f} | "
            + " | ".join(f"{eff[l, h]:+.3f}" for eff in effects.values())
            + " |"
        )
    lines += [
        "",
        "Heads of the lookup primary sets: copying score (percentile among all "
        f"{L * H} heads) and single-removal effects:",
        "",
        "| head | in sets of | OV copying (pct) | "
        + "".join(f"lift {k} (pct) | " for k in lifts)
        + " | ".join(effects)
        + " |",
        "|---|---|---|" + "---|" * (len(effects) + len(lifts)),
    ]
    members: dict[tuple[int, int], set[str]] = {}
    for task, sets in PRIMARY_SETS[args.model].items():
        for s in sets:
            for head in parse_heads(s):
                members.setdefault(head, set()).add(task)
    for (l, h), tasks in sorted(members.items()):
        lines.append(
            f"| {head_name((l, h))} | {', '.join(sorted(tasks))} | {copying[l, h]:+.2f} "
            f"({percentile(copying, copying[l, h]):.0f}) | "
            + "".join(f"{v[l, h]:+.2f} ({percentile(v, v[l, h]):.0f}) | " for v in lifts.values())
            + " | ".join(f"{eff[l, h]:+.3f}" for eff in effects.values())
            + " |"
        )
    lines += [
        "",
        "Held-out tests of the primary sets on the copying tasks (test-heads, seed 0):",
        "",
    ] + heldout_table(args.runs, args.model)
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / (f"{args.model}-conflict" + ".md")).write_text(text)
    (args.out / f"{args.model}-screens.json").write_text(
        json.dumps(
            {
                "model": args.model,
                "copying": copying.tolist(),
                "effects": {k: v.tolist() for k, v in effects.items()},
                "sources": sources,
                "lift": {k: v.tolist() for k, v in lifts.items()},
                "spearman": corr,
            }
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
