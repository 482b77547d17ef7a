"""One table across finished runs (`cel-numpy summarize RUN_DIR...`): what the README's results
section is written from.

Per run (a `localize` or `test-heads` directory of the current format; older directories are
refused, so old and new panels never mix): task, panel seed, panel sizes in items and clusters,
intact accuracy, the primary (rank-1 or tested) head set, its held-out gain with the cluster
bootstrap interval, the cluster sign-flip p, that p Holm-adjusted across every primary test of
the table, the item-level McNemar p (secondary), the null-set percentile, the cross-task gains
(exploratory) and the wall time. Then, per task (per model and task when the runs hold several
models: a head belongs to one model), how often each head recurs in the primary sets
and among the finalists across the runs (seeds).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from cel_numpy.errors import RunDirError
from cel_numpy.localize.rundir import read_manifest
from cel_numpy.localize.stats import holm


def _fmt_p(p: float | None) -> str:
    if p is None:
        return "-"
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def load_run(run_dir) -> dict:
    """The manifest and report of one finished run (one-line RunDirError otherwise)."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    path = run_dir / "report.json"
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        raise RunDirError(
            f"{run_dir} has no report.json: finish the run first (rerun its command, in "
            "manifest.json)"
        ) from None
    except (OSError, json.JSONDecodeError) as err:
        raise RunDirError(f"{path} is unreadable ({err})") from None
    return {"dir": str(run_dir), "manifest": manifest, "report": report}


def summarize(run_dirs) -> dict:
    """Rows (one per run), Holm-adjusted primary p-values and per-task head recurrence."""
    runs = [load_run(d) for d in run_dirs]
    if not runs:
        raise RunDirError("summarize needs at least one run directory")
    rows = []
    for run in runs:
        m, r = run["manifest"], run["report"]
        p = r["primary"]
        ho = p["heldout"]
        finalists = [f["name"] for f in r.get("finalists", [])]
        seconds = [s for s in r.get("stage_seconds", {}).values() if s is not None]
        rows.append(
            {
                "dir": run["dir"],
                "kind": m["kind"],
                "model": m["model"].get("spec") or m["model"].get("kind"),
                "model_sha256": m["model"].get("file_sha256") or m["model"].get("params_sha256"),
                "task": m["task"]["name"],
                "seed": m["seed"],
                "panel_sizes": m["panel_sizes"],
                "n_clusters": m["n_clusters"],
                "tie_break": m.get("tie_break"),
                "intact": r["intact"],
                "primary": p["name"],
                "discovery_gain": r["finalists"][0]["discovery"]["gain"] if finalists else None,
                "heldout": ho,
                "nulls": p.get("nulls"),
                "crosstask": {k: v for k, v in p.get("crosstask", {}).items()},
                "finalists": finalists,
                "fold": m.get("fold"),
                "wall_seconds": sum(seconds) if seconds else None,
            }
        )
    adjusted = holm([row["heldout"]["p_value"] for row in rows])
    for row, q in zip(rows, adjusted):
        row["p_holm"] = q
    models = {(row["model"], row["model_sha256"]) for row in rows}
    return {"rows": rows, "recurrence": head_recurrence(rows), "n_models": len(models)}


def head_recurrence(rows: list[dict]) -> dict[str, dict]:
    """Per task, how many independent searches hold each head in their primary set and among
    their finalists. A head belongs to one model: when the rows hold several models, the key is
    "model task". Only searches count (`localize` runs): a test-heads run's set was given to it,
    so counting it would count one finding twice. Only independent searches count: in table
    order, a search is kept when its discovery and held-out panels share no cluster with those
    of the searches kept before it (runs on distinct folds, `--fold k --folds K`, always do;
    nested or overlapping panels of one task do not); "not_independent" says how many were
    left out. A row's clusters are its "clusters" entry, else read from its run directory's
    panels."""
    from cel_numpy.localize.rundir import read_panel

    def clusters_of(row) -> set[str]:
        if "clusters" in row:
            return set(row["clusters"])
        panels = Path(row["dir"]) / "panels"
        return {it.cluster for name in ("discovery", "heldout")
                for it in read_panel(panels / f"{name}.jsonl")}  # fmt: skip

    several = len({row["model"] for row in rows}) > 1
    by_task = defaultdict(list)
    for row in rows:
        if row.get("kind") == "test-heads":
            continue
        by_task[f"{row['model']} {row['task']}" if several else row["task"]].append(row)
    recurrence = {}
    for task, task_rows in by_task.items():
        seen: set[str] = set()
        independent = []
        for row in task_rows:
            clusters = clusters_of(row)
            if not clusters & seen:
                independent.append(row)
                seen |= clusters
        primary, finalist = Counter(), Counter()
        for row in independent:
            primary.update(row["primary"].split("+"))
            finalist.update({h for name in row["finalists"] for h in name.split("+")})
        recurrence[task] = {
            "runs": len(independent),
            "not_independent": len(task_rows) - len(independent),
            "primary": dict(primary.most_common()),
            "finalists": dict(finalist.most_common()),
        }
    return recurrence


def render(summary: dict) -> str:
    rows = summary["rows"]
    show_model = summary["n_models"] > 1
    lines = [
        "| "
        + ("model | " if show_model else "")
        + "task | seed | discovery (items/clusters) | held-out (items/clusters) | intact held-out "
        "| primary heads | discovery gain | held-out gain [cluster 95% CI] | cluster p | Holm p "
        "| item McNemar p | null percentile | cross-task (exploratory) | wall |",
        "|" + "---|" * (14 + show_model),
    ]
    for row in rows:
        ho, sizes, clusters = row["heldout"], row["panel_sizes"], row["n_clusters"]
        nulls = row["nulls"]
        null_text = f"{nulls['percentile']:.0f} (of {nulls['n']})" if nulls else "-"
        cross = "; ".join(
            f"{name} {v['gain_rate']:+.3f} (p {_fmt_p(v['p_value'])})"
            for name, v in sorted(row["crosstask"].items())
        )
        wall = f"{row['wall_seconds'] / 60:.0f} min" if row["wall_seconds"] is not None else "-"
        disc = row["discovery_gain"]
        disc_text = "(given)" if row["kind"] == "test-heads" else f"{disc:+d}/{sizes['discovery']}"
        intact = row["intact"]["heldout"]
        cells = [
            *([row["model"]] if show_model else []),
            row["task"],
            str(row["seed"]),
            "-" if row["kind"] == "test-heads" else f"{sizes['discovery']}/{clusters['discovery']}",
            f"{sizes['heldout']}/{clusters['heldout']}",
            f"{intact['correct']}/{intact['n']}",
            row["primary"],
            disc_text,
            f"{ho['gain']:+d}/{ho['n']} = {ho['gain_rate']:+.3f} "
            f"[{ho['ci_low']:+.3f}, {ho['ci_high']:+.3f}]",
            _fmt_p(ho["p_value"]),
            _fmt_p(row["p_holm"]),
            _fmt_p(ho["item_p_value"]),
            null_text,
            cross or "-",
            wall,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Holm: adjusted across the {len(rows)} primary tests of this table (one per run: the "
        "primary set on its held-out panel, cluster sign-flip test). Cross-task gains are "
        "exploratory (no correction).",
        "",
        "How often each head of a primary set recurs across the searches of its task (in the "
        "primary set; among the ten finalists; test-heads runs, whose set was given, not "
        "counted):",
        "",
    ]
    for task, rec in summary["recurrence"].items():
        recurring = [
            f"{h} primary {n}/{rec['runs']}, finalist {rec['finalists'].get(h, 0)}/{rec['runs']}"
            for h, n in rec["primary"].items()
        ]
        n = rec["runs"]
        lines.append(f"- {task} ({n} search{'es' if n != 1 else ''}): " + ", ".join(recurring))
    return "\n".join(lines) + "\n"
