"""Is a run's gain on a two-label task (BoolQ) more than a shift of bias between its labels?

    .venv/bin/python scripts/measure_label_bias.py docs/results/round5/smollm2-boolq-fold0 \
        --json docs/results/round5-label-bias/smollm2-boolq-fold0.json

Reads a localize run directory (its manifest, its two panels, its rank-1 set: `--heads` to test
another), scores both labels of every discovery and held-out item with the intact model and
with the set removed (zero ablation, the run's own), checks every pick and reference log-prob
against the run's records where it kept them (the intact model on both panels, and the set on
both if it was a finalist; it says which it checked), and prints, beside the run's own gain
(cel_numpy.localize.label_bias):

- the set against the intact model given the constant that makes it pick the second label
  exactly as often as the set's removal does on the held-out panel (the same bias shift; the
  constant reads the held-out margins and the ablated picks, never a reference answer), with
  the routine's cluster sign-flip test. This is the comparison docs/results.md reads as
  deciding (chosen on review, after a first pass of this script on SmolLM2 BoolQ had printed
  it, before any other run was measured): a gain here is a reordering no constant gives;
- the ROC AUC of each model's margin log p(second) - log p(first) on the held-out items, which
  no constant changes, and the cluster-bootstrap interval of its change;
- each model with its best constant (chosen on the 100-item discovery panel, so noisy),
  held-out, and the set against the recalibrated intact model.

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


def recorded(run: Path) -> dict:
    """{(panel, heads): {item id: (picked answer, reference log-prob)}} from the run's finished
    baseline, confirm and held-out stages (each file checked against its done-file's sha256)."""
    out: dict = {}
    for stage in ("baseline", "confirm", "heldout"):
        done = rd.stage_paths(run, stage)[1]
        if not done.exists():
            continue
        _, data = rd.finished_records(run, stage, json.loads(done.read_text()))
        for line in data.decode().splitlines():
            r = json.loads(line)
            key = (r["panel"], tuple(tuple(h) for h in r["heads"]))
            out.setdefault(key, {})[r["item"]] = (r["answer"], r["ref_logprob"])
    return out


def check_against_records(records: dict, panel: str, heads, items, scores, labels) -> str:
    """Compare one model's scores (n, 2) on a panel with the run's records of it: the same pick
    on every item and the reference's log-prob within 1e-4 nats. A line saying what was
    checked; exits on a mismatch."""
    name = condition_name(heads) if heads else "intact"
    got = records.get((panel, tuple(tuple(h) for h in heads)))
    if not got:
        return f"{panel} {name}: not checked (the run kept no records of it)"
    missing = [it.id for it in items if it.id not in got]
    if missing:
        sys.exit(f"error: the run's {panel} records of {name} lack {len(missing)} items")
    for it, row in zip(items, scores):
        pick = labels[int(row[1] > row[0])]  # the first maximum, as the routine picks
        answer, ref = got[it.id]
        if pick != answer or abs(row[labels.index(it.answer)] - ref) > 1e-4:
            sys.exit(
                f"error: {panel} item {it.id} under {name}: picked {pick!r} with reference "
                f"log-prob {row[labels.index(it.answer)]:.6f}, the run recorded {answer!r} and "
                f"{ref:.6f}; the model or code differs from the run's"
            )
    return f"{panel} {name}: {len(items)} picks and reference log-probs match the run's records"


def summary_line(label: str, s) -> str:
    return (
        f"{label}: {s.intact_correct} -> {s.correct} of {s.n} ({s.gain:+d}, rescued {s.rescued}, "
        f"damaged {s.damaged}), 95% CI [{100 * s.ci_low:+.1f}, {100 * s.ci_high:+.1f}] pp, "
        f"cluster p = {s.p_value:.2g}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a localize run directory with a held-out stage")
    parser.add_argument("--heads", default=None, help="the set to test (default: rank 1)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--json", type=Path, default=None, help="write the numbers here")
    args = parser.parse_args(argv)

    run = args.run
    manifest = rd.read_manifest(run)
    if manifest["model"].get("ablation", "zero") != "zero":
        sys.exit(f"error: {run} used {manifest['model']['ablation']} ablation; this is for zero")
    heads = parse_heads(args.heads, what="--heads") if args.heads else rank1_heads(run)
    name = condition_name(heads)
    panels = {p: rd.read_panel(run / "panels" / f"{p}.jsonl") for p in ("discovery", "heldout")}
    try:
        labels = lb.two_label_choices(panels["heldout"])
        if lb.two_label_choices(panels["discovery"]) != labels:
            raise ValueError("the discovery and held-out panels offer different labels")
    except ValueError as err:
        sys.exit(f"error: {run}: {err}")
    task = get_task(manifest.get("task_file") or manifest["task"]["name"])
    want_sha = manifest["task"].get("file_sha256")
    if want_sha and getattr(task, "sha256", want_sha) != want_sha:
        sys.exit(f"error: task {task.name}'s file has changed since the run (sha256 differs)")
    if getattr(task, "normalize", "none") != "none":
        sys.exit(f"error: {task.name} normalizes its scores; the verdict is not the raw margin")

    t0 = time.time()
    model = cel_numpy.load_model(manifest["model"]["spec"])
    ev = LMEvaluator(model, task, batch_size=args.batch_size)
    records = recorded(run)
    margins = {}  # (panel, "intact" | "ablated") -> (n,)
    checks = []
    for panel, items in panels.items():
        scores = ev.choice_logprobs(items, [INTACT, tuple(heads)])  # (2, n, 2)
        for k, (which, hs) in enumerate((("intact", []), ("ablated", heads))):
            checks.append(check_against_records(records, panel, hs, items, scores[k], labels))
            margins[panel, which], second = lb.label_margins(items, scores[k])
        margins[panel, "second"] = second
    seconds = time.time() - t0

    held = panels["heldout"]
    pos = margins["heldout", "second"]
    d_pos = margins["discovery", "second"]
    offsets = {w: lb.best_offset(margins["discovery", w], d_pos) for w in ("intact", "ablated")}
    right = {w: lb.correct_with_offset(margins["heldout", w], pos) for w in ("intact", "ablated")}
    calibrated = {
        w: lb.correct_with_offset(margins["heldout", w], pos, offsets[w])
        for w in ("intact", "ablated")
    }
    n_picks = int(lb.picks_second(margins["heldout", "ablated"]).sum())
    try:
        matched_offset = lb.offset_for_picks(margins["heldout", "intact"], n_picks)
    except ValueError as err:
        sys.exit(f"error: no pick-matched constant: {err}")
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
    for line in checks:
        print(line)
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
                "roc_auc_bootstrap": {"resamples": 2000, "seed": 0, "level": 0.95},
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
            "checks": checks,
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
