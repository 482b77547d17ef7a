"""Is a run's gain on a two-label task (BoolQ) more than a shift of bias between its labels?

    .venv/bin/python scripts/measure_label_bias.py docs/results/round5/smollm2-boolq-fold0 \
        --json docs/results/round5-label-bias/smollm2-boolq-fold0.json

Reads a localize run directory (its manifest, its two panels, its rank-1 set: `--heads` to test
another), scores both labels of every discovery and held-out item with the intact model and
with the set removed (zero ablation, the run's own), checks that the held-out picks are the ones
the run recorded, and prints, beside the run's own gain (cel_numpy.localize.label_bias):

- the ROC AUC of each model's margin log p(second) - log p(first) on the held-out items, which
  no constant bias changes, and the cluster-bootstrap interval of its change;
- each model with its best constant added (chosen on the discovery panel), held-out;
- the set against the intact model given that constant, with the routine's cluster sign-flip
  test: does removing the heads beat simply recalibrating the intact model?
- the intact model with the constant that gives it exactly the ablated model's number of
  second-label picks on the held-out panel (a pure bias shift of the same size; it reads the
  held-out margins and the ablated model's picks, never a reference answer), against the set,
  with the same test.

The JSON also keeps every item's two margins, so the numbers can be recomputed without a
model. Cost: one pass over the discovery and held-out items for both models together (SmolLM2
on BoolQ, 600 items: 14 min on one core beside a two-worker run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import cel_numpy
from cel_numpy.heads import parse_heads
from cel_numpy.localize import label_bias as lb
from cel_numpy.localize import rundir as rd
from cel_numpy.localize.conditions import INTACT, condition_name
from cel_numpy.localize.evaluate import LMEvaluator
from cel_numpy.localize.stats import clustered_summary
from cel_numpy.tasks import get_task


def rank1_heads(run: Path) -> list:
    """The run's rank-1 set: report.json's primary set, else the held-out stage's first."""
    report = run / "report.json"
    if report.exists():
        return [tuple(h) for h in json.loads(report.read_text())["primary"]["heads"]]
    done = run / "heldout.done.json"
    if not done.exists():
        sys.exit(f"error: {run} has no held-out stage yet; finish the run or pass --heads")
    first = json.loads(done.read_text())["summary"]["heldout"]["finalists"][0]
    return [tuple(h) for h in first["heads"]]


def recorded_picks(run: Path, name: str) -> dict[str, dict[str, str]]:
    """{block name: {item id: picked answer}} of the held-out records, intact and `name`."""
    path = run / "heldout.jsonl"
    if not path.exists():
        path = rd.gz_path(run, "heldout")
        import gzip

        lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    else:
        lines = path.read_text().splitlines()
    out: dict[str, dict[str, str]] = {"intact": {}, name: {}}
    for line in lines:
        r = json.loads(line)
        if r["block"] in out:
            out[r["block"]][r["item"]] = r["answer"]
    return out


def summary_line(label: str, s) -> str:
    return (
        f"{label}: {s.intact_correct} -> {s.correct} of {s.n} ({s.gain:+d}, rescued {s.rescued}, "
        f"damaged {s.damaged}), 95% CI [{100 * s.ci_low:+.1f}, {100 * s.ci_high:+.1f}] pp, "
        f"cluster p = {s.p_value:.2g}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a localize run directory with a held-out stage")
    parser.add_argument("--heads", default=None, help="the set to test (default: rank 1)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--json", type=Path, default=None, help="write the numbers here")
    args = parser.parse_args()

    run = args.run
    manifest = rd.read_manifest(run)
    if manifest["model"].get("ablation", "zero") != "zero":
        sys.exit(f"error: {run} used {manifest['model']['ablation']} ablation; this is for zero")
    heads = parse_heads(args.heads, what="--heads") if args.heads else rank1_heads(run)
    name = condition_name(heads)
    panels = {p: rd.read_panel(run / "panels" / f"{p}.jsonl") for p in ("discovery", "heldout")}
    try:
        labels = lb.two_label_choices(panels["heldout"])
    except ValueError as err:
        sys.exit(f"error: {run}: {err}")

    t0 = time.time()
    model = cel_numpy.load_model(manifest["model"]["spec"])
    task = get_task(manifest["task"]["name"])
    ev = LMEvaluator(model, task, batch_size=args.batch_size)
    margins = {}  # (panel, "intact" | "ablated") -> (n,)
    for panel, items in panels.items():
        scores = ev.choice_logprobs(items, [INTACT, tuple(heads)])  # (2, n, 2)
        for k, which in enumerate(("intact", "ablated")):
            margins[panel, which], second = lb.label_margins(items, scores[k])
        margins[panel, "second"] = second
    seconds = time.time() - t0

    held = panels["heldout"]
    pos = margins["heldout", "second"]
    recorded = recorded_picks(run, name)
    for which, block in (("intact", "intact"), ("ablated", name)):
        picks = lb.picks_second(margins["heldout", which])
        want = [recorded[block].get(it.id) == labels[1] for it in held]
        if recorded[block] and picks.tolist() != want:
            n_diff = int(np.sum(picks != np.array(want)))
            sys.exit(f"error: {which} picks differ from the run's records on {n_diff} items")

    d_pos = margins["discovery", "second"]
    offsets = {w: lb.best_offset(margins["discovery", w], d_pos) for w in ("intact", "ablated")}
    right = {w: lb.correct_with_offset(margins["heldout", w], pos) for w in ("intact", "ablated")}
    calibrated = {
        w: lb.correct_with_offset(margins["heldout", w], pos, offsets[w])
        for w in ("intact", "ablated")
    }
    n_picks = int(lb.picks_second(margins["heldout", "ablated"]).sum())
    matched_offset = lb.offset_for_picks(margins["heldout", "intact"], n_picks)
    matched = lb.correct_with_offset(margins["heldout", "intact"], pos, matched_offset)
    clusters = [it.cluster for it in held]
    auc = {w: lb.roc_auc(margins["heldout", w], pos) for w in ("intact", "ablated")}
    auc_lo, auc_hi = lb.auc_difference_interval(
        clusters, margins["heldout", "intact"], margins["heldout", "ablated"], pos
    )
    raw = clustered_summary(clusters, right["intact"], right["ablated"])
    vs_matched = clustered_summary(clusters, matched, right["ablated"])
    vs_cal = clustered_summary(clusters, calibrated["intact"], right["ablated"])
    both_cal = clustered_summary(clusters, calibrated["intact"], calibrated["ablated"])

    first, second = (repr(x) for x in labels)
    print(
        f"{run}: {manifest['model']['spec']} on {task.name}, set {name}, labels {first} / "
        f"{second}; scored in {seconds:.0f} s"
    )
    print(f"held-out: {len(held)} items ({int(pos.sum())} {second}), {raw.n_clusters} clusters")
    print(
        f"{second} picked: intact {int(lb.picks_second(margins['heldout', 'intact']).sum())}, "
        f"set removed {n_picks}"
    )
    print(summary_line("the run's gain (set removed vs intact)", raw))
    print(
        f"ROC AUC of the margin (no constant changes it): intact {auc['intact']:.3f}, set "
        f"removed {auc['ablated']:.3f}, change {auc['ablated'] - auc['intact']:+.3f} "
        f"[{auc_lo:+.3f}, {auc_hi:+.3f}] (cluster bootstrap 95%)"
    )
    print(
        f"best constant on the discovery panel: intact {offsets['intact']:+.3f}, set removed "
        f"{offsets['ablated']:+.3f} nats"
    )
    print(
        f"held-out with it: intact {int(calibrated['intact'].sum())}, set removed "
        f"{int(calibrated['ablated'].sum())} of {len(held)}"
    )
    print(summary_line("set removed vs intact with its discovery constant", vs_cal))
    print(summary_line("both with their discovery constants", both_cal))
    print(
        f"intact with the constant that picks {second} {n_picks} times, as the set removed does "
        f"(no reference answer read): {int(matched.sum())} of {len(held)}"
    )
    print(summary_line("set removed vs intact with that constant", vs_matched))

    if args.json:
        out = {
            "run": run.name,
            "panel_hashes": manifest["panel_hashes"],
            "model": manifest["model"]["spec"],
            "task": task.name,
            "heads": [list(h) for h in heads],
            "set": name,
            "labels": list(labels),
            "command": "python scripts/measure_label_bias.py " + " ".join(sys.argv[1:]),
            "heldout": {
                "n": len(held),
                "n_second": int(pos.sum()),
                "picks_second": {
                    "intact": int(lb.picks_second(margins["heldout", "intact"]).sum()),
                    "ablated": n_picks,
                },
                "roc_auc": auc,
                "roc_auc_change_ci": [auc_lo, auc_hi],
                "discovery_offsets": offsets,
                "correct": {
                    "intact": int(right["intact"].sum()),
                    "ablated": int(right["ablated"].sum()),
                    "intact_calibrated": int(calibrated["intact"].sum()),
                    "ablated_calibrated": int(calibrated["ablated"].sum()),
                    "intact_pick_matched": int(matched.sum()),
                },
                "pick_matched_offset": matched_offset,
                "gain": raw.to_dict(),
                "gain_vs_calibrated_intact": vs_cal.to_dict(),
                "gain_both_calibrated": both_cal.to_dict(),
                "gain_vs_pick_matched_intact": vs_matched.to_dict(),
            },
            "margins": {
                panel: {
                    "ids": [it.id for it in items],
                    "intact": margins[panel, "intact"].round(6).tolist(),
                    "ablated": margins[panel, "ablated"].round(6).tolist(),
                }
                for panel, items in panels.items()
            },
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(out, indent=1) + "\n")
        tmp.replace(args.json)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
