"""report.json (machine-readable), report.md (for people) and figures, from a finished run.

Figures (matplotlib, imported here only, Agg backend):
    singletons.png  layer x head heatmap of singleton gains (rate) on discovery; nominees boxed
    finalists.png   each finalist's gain on discovery (vs the baseline) and on held-out,
                    95% intervals
    crosstask.png   each finalist's held-out gain on the target task and its gain on every
                    other task
    nulls.png       held-out gains of the random null sets, the rank-1 set's gain marked
                    (--null-sets)

Gains are rates, (rescued - damaged) / n, raw counts beside them. On discovery: Newcombe's
paired 95% interval and the exact McNemar p (items). On held-out and cross-task panels the
cluster is the unit (`cel_numpy.localize.stats`): the cluster sign-flip p and the cluster
bootstrap interval are primary, the item-level McNemar p and Newcombe interval secondary.
Cross-task results are labelled exploratory (ten sets times several tasks, no correction).
"""

from __future__ import annotations

from pathlib import Path

from cel_numpy.localize.rundir import json_dump, text_dump
from cel_numpy.tasks.base import answer_context
from cel_numpy.tasks.changes import answer_balance, classify_change, classify_changes

FIGURES = {
    "singletons": "singletons.png",
    "finalists": "finalists.png",
    "crosstask": "crosstask.png",
}
NULLS_FIGURE = "nulls.png"


def intact_comparator_note(confirm: dict) -> str:
    """What differs between the confirmation's fresh intact comparator and the baseline."""
    n = confirm.get("intact_answers_differ")
    if n is None or n:  # old summaries without the count: say only that they differ
        what = f" in {n} answers" if n else ""
        return f"the fresh intact comparator of the confirmation differs from the baseline{what}"
    gap = confirm.get("intact_logprob_max_diff", 0.0)
    return (
        "the fresh intact comparator of the confirmation agrees with the baseline on every answer "
        f"and verdict; its reference log-probabilities differ by up to {gap:.1g} nats (float "
        "rounding of another batch composition, e.g. a resumed run with another --batch-size)"
    )


def _fmt_gain(d: dict) -> str:
    return f"{d['gain_rate']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"


def _fmt_p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def finalist_logprobs(loc, stage: str, panel: str) -> list[dict | None]:
    """The continuous metric (`routine.logprob_summary`) of every finalist on `panel`, from the
    records of the finalist stage that evaluated it ([intact, finalists...] per panel)."""
    from cel_numpy.localize.metrics import logprob_summary

    blocks = loc.blocks.get(stage)
    if not blocks:
        return []
    panels = [panel] if stage == "heldout" else [f"cross-{t.name}" for t in loc.cross_tasks]
    group = 1 + len(loc.finalists)
    start = panels.index(panel) * group
    intact, results = blocks[start], blocks[start + 1 : start + group]
    items = loc.panels[panel]
    return [logprob_summary(items, intact, r, loc.seed) for r in results]


def logprob_percentile(primary: dict | None, sets: list[dict]) -> dict | None:
    """Where the primary set's mean log-probability change falls among null sets' changes."""
    from cel_numpy.localize.metrics import null_percentile

    values = [s.get("logprob_change") for s in sets for _ in range(s.get("times", 1))]
    if primary is None or not values or any(v is None for v in values):
        return None
    return null_percentile(round(primary["mean"], 9), values)


def build_report(loc) -> dict:
    r = loc.results
    manifest = loc.manifest
    discovery_stats = {c["name"]: c for c in r["screen"]["conditions"] + r["joint"]["conditions"]}
    finalists = []
    for k, name in enumerate(r["joint"]["ranking"][: loc.n_finalists]):
        entry = {
            "rank": k + 1,
            "name": name,
            "heads": discovery_stats[name]["heads"],
            "discovery": discovery_stats[name],
            "confirm": r["confirm"]["discovery"]["finalists"][k],
            "heldout": r["heldout"]["heldout"]["finalists"][k],
            "crosstask": {
                panel.removeprefix("cross-"): v["finalists"][k]
                for panel, v in r["crosstask"].items()
            },
        }
        assert entry["confirm"]["name"] == name and entry["heldout"]["name"] == name, (
            "finalist order mismatch"
        )
        finalists.append(entry)
    for entry, lp in zip(finalists, finalist_logprobs(loc, "heldout", "heldout")):
        entry["heldout_logprob"] = lp
    cross_lp = {
        t.name: finalist_logprobs(loc, "crosstask", f"cross-{t.name}")[0]
        for t in loc.cross_tasks
        if finalists
    }
    notes = []
    if r["screen"]["note"]:
        notes.append(r["screen"]["note"])
    if r["joint"]["n_candidates"] < loc.n_finalists:
        notes.append(f"only {r['joint']['n_candidates']} joint candidates: all are finalists")
    if not r["confirm"]["discovery"]["intact_matches_baseline"]:
        notes.append(intact_comparator_note(r["confirm"]["discovery"]))
    primary = finalists[0]
    intact_heldout, primary_heldout = loc.heldout_blocks[0], loc.heldout_blocks[1]
    changes = heldout_changes(loc.task, loc.panels["heldout"], intact_heldout, primary_heldout)
    figures = dict(FIGURES)
    nulls = r.get("nulls") or {}
    matched = r.get("matched-null") or {}
    skipped = matched.get("skipped")  # --matched-gate: {gate, gain, p_value}
    if skipped is not None:
        matched = {}
    if nulls.get("n") or matched.get("n"):
        figures["nulls"] = NULLS_FIGURE
    primary_lp = primary.get("heldout_logprob")
    return {
        "format": "cel-numpy.localize.report/2",
        "kind": "localize",
        "model": manifest["model"],
        "task": manifest["task"],
        "seed": manifest["seed"],
        "panel_sizes": manifest["panel_sizes"],
        "panel_hashes": manifest["panel_hashes"],
        "baseline": r["baseline"],
        "n_layers": loc.n_layers,
        "n_heads": loc.n_heads,
        "singletons": [
            {"rank": r["screen"]["ranking"].index(c["name"]) + 1, **c}
            for c in r["screen"]["conditions"]
        ],
        "nominees": r["screen"]["nominees"],
        "n_clusters": manifest["n_clusters"],
        "tie_break": manifest["tie_break"],
        "decided_by": {
            "nominees": r["screen"]["decided_by"],
            "finalists": r["joint"]["decided_by"],
        },
        "joint_ranking": r["joint"]["ranking"],
        "n_candidates": r["joint"]["n_candidates"],
        "finalists": finalists,
        "primary": {
            "heads": primary["heads"],
            "name": primary["name"],
            "heldout": primary["heldout"],
            "crosstask": primary["crosstask"],
            "changes": changes,
            "answer_balance": heldout_balance(
                loc.panels["heldout"], intact_heldout, primary_heldout
            ),
            "heldout_logprob": primary_lp,
            "crosstask_logprob": cross_lp,
            "nulls": _null_digest(nulls, primary_lp),
            "matched_null": _matched_digest(matched, primary_lp),
            "matched_null_skipped": skipped,
        },
        "nulls": nulls,
        "matched_null": matched,
        "screen_agreement": loc.screen_agreement(),
        "stage_seconds": loc.stage_seconds(),
        "intact": {
            "discovery": {"n": r["baseline"]["n"], "correct": r["baseline"]["correct"]},
            "heldout": {
                "n": r["heldout"]["heldout"]["n"],
                "correct": r["heldout"]["heldout"]["intact_correct"],
            },
            **{
                p.removeprefix("cross-"): {"n": v["n"], "correct": v["intact_correct"]}
                for p, v in r["crosstask"].items()
            },
        },
        "notes": notes,
        "figures": figures,
    }


def _null_digest(nulls: dict, primary_lp: dict | None = None) -> dict | None:
    if not nulls.get("n"):
        return None
    keys = ("n", "seed", "size", "below", "ties", "percentile", "p_value")
    return {**{k: nulls[k] for k in keys}, "logprob": logprob_percentile(primary_lp, nulls["sets"])}


def _matched_digest(matched: dict, primary_lp: dict | None) -> dict | None:
    """The selection-matched null in a few numbers (report.json's "matched_null" has them all)."""
    if not matched.get("n"):
        return None
    keys = (
        "n",
        "replicates",
        "budget",
        "pool",
        "distinct",
        "seed",
        "size",
        "below",
        "ties",
        "percentile",
        "p_value",
    )
    return {
        **{k: matched[k] for k in keys},
        "logprob": logprob_percentile(primary_lp, matched["sets"]),
    }


# --------------------------------------------------------------------------- figures


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_singletons(report: dict, path: Path) -> None:
    import numpy as np

    plt = _plt()
    L, H = report["n_layers"], report["n_heads"]
    grid = np.full((L, H), np.nan)  # (L, H)
    for s in report["singletons"]:
        ((l, h),) = s["heads"]
        grid[l, h] = s["gain_rate"]
    lim = max(float(np.nanmax(np.abs(grid))), 1e-9)
    fig, ax = plt.subplots(figsize=(max(4, 0.45 * H + 2), max(2.5, 0.25 * L + 1.5)))
    im = ax.imshow(grid, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto", origin="upper")
    for l, h in report["nominees"]:
        ax.add_patch(
            plt.Rectangle((h - 0.5, l - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1.2)
        )
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(
        f"singleton ablation gain on discovery ({report['task']['name']}); boxes: nominees"
    )
    fig.colorbar(im, ax=ax, label="gain rate (rescued - damaged) / n")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _errorbars(ax, xs, entries, **kw):
    ys = [e["gain_rate"] for e in entries]
    lo = [e["gain_rate"] - e["ci_low"] for e in entries]
    hi = [e["ci_high"] - e["gain_rate"] for e in entries]
    ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=3, **kw)


def _finish_finalist_axes(
    plt, fig, ax, fin: list, title: str, path: Path, legend_size: int
) -> None:
    """Zero line, one tick per finalist, labels and legend; save and close the figure."""
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xticks(
        range(1, len(fin) + 1), [f["name"] for f in fin], rotation=45, ha="right", fontsize=8
    )
    ax.set_ylabel("gain rate, 95% interval")
    ax.set_title(title)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_finalists(report: dict, path: Path) -> None:
    plt = _plt()
    fin = report["finalists"]
    xs = list(range(1, len(fin) + 1))
    fig, ax = plt.subplots(figsize=(max(5, 0.7 * len(fin) + 2), 3.6))
    _errorbars(
        ax, [x - 0.12 for x in xs], [f["discovery"] for f in fin], label="discovery (vs baseline)"
    )
    _errorbars(ax, [x + 0.12 for x in xs], [f["heldout"] for f in fin], label="held-out")
    _finish_finalist_axes(plt, fig, ax, fin, "finalists in discovery order", path, legend_size=8)


def plot_crosstask(report: dict, path: Path) -> None:
    plt = _plt()
    fin = report["finalists"]
    tasks = [report["task"]["name"] + " (held-out)"] + list(fin[0]["crosstask"]) if fin else []
    xs = list(range(1, len(fin) + 1))
    fig, ax = plt.subplots(figsize=(max(5, 0.7 * len(fin) + 2), 3.6))
    width = 0.8 / max(1, len(tasks))
    for j, t in enumerate(tasks):
        entries = [f["heldout"] for f in fin] if j == 0 else [f["crosstask"][t] for f in fin]
        _errorbars(ax, [x - 0.4 + width * (j + 0.5) for x in xs], entries, label=t)
    _finish_finalist_axes(
        plt,
        fig,
        ax,
        fin,
        "does the gain cost elsewhere? finalists on every task",
        path,
        legend_size=7,
    )


def plot_nulls(report: dict, path: Path) -> None:
    """Held-out gains of the unselected null sets (filled) and of the selection-matched null's
    picks (outline, each counted as often as replicates picked it), the primary set marked."""
    plt = _plt()
    nulls = report.get("nulls") or {}
    matched = report.get("matched_null") or {}
    primary = report["primary"]["heldout"]["gain_rate"]
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    titles = []
    if nulls.get("n"):
        gains = [s["gain_rate"] for s in nulls["sets"]]
        ax.hist(
            gains,
            bins=min(30, max(5, len(gains) // 2)),
            color="0.6",
            density=True,
            label=f"{nulls['n']} random sets",
        )
        titles.append(f"unselected: percentile {nulls['percentile']:.0f}")
    if matched.get("n"):
        picks = [s["gain_rate"] for s in matched["sets"] for _ in range(s["times"])]
        ax.hist(
            picks,
            bins=min(30, max(5, len(set(picks)))),
            histtype="step",
            density=True,
            color="C0",
            linewidth=1.5,
            label=f"best of {matched['budget']}: {matched['n']} replicates",
        )
        titles.append(f"matched: percentile {matched['percentile']:.0f}")
    ax.axvline(primary, color="C3", linewidth=2, label=f"primary: {report['primary']['name']}")
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_xlabel("held-out gain rate")
    ax.set_ylabel("density")
    size = nulls.get("size") or matched.get("size")
    ax.set_title(f"null sets of {size} heads; " + "; ".join(titles), fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- markdown


def fmt_heldout(d: dict) -> str:
    """One held-out (cluster-level) result in words, shared by report.md and the CLI."""
    method = "exact" if d["p_method"] == "exact" else f"Monte Carlo, SE {d['p_se']:.1g}"
    return (
        f"rescued {d['rescued']}, damaged {d['damaged']}, gain {d['gain']:+d} of {d['n']} = "
        f"{d['gain_rate']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] (cluster bootstrap 95%, "
        f"{d['n_clusters']} clusters), cluster sign-flip p = {_fmt_p(d['p_value'])} ({method}); "
        f"item-level (secondary): exact McNemar p = {_fmt_p(d['item_p_value'])}, Newcombe "
        f"[{d['item_ci_low']:+.3f}, {d['item_ci_high']:+.3f}]"
    )


def _verdicts(results) -> list[tuple[bool, str]]:
    """(correct, answer) per record: what `cel_numpy.tasks.changes` reads of a result."""
    return [(r.correct, r.answer) for r in results]


def heldout_changes(task, items, intact, ablated) -> dict:
    """The primary set's rescued and damaged held-out items by category
    (`cel_numpy.tasks.changes`: valid, format, echo, shot, genuine)."""
    return classify_changes(
        [answer_context(task, it) for it in items], _verdicts(intact), _verdicts(ablated)
    )


def heldout_balance(items, intact, ablated) -> list[dict] | None:
    """Per label of a fixed choice set (BoolQ's " no" / " yes"), the held-out items whose
    reference it is, right intact and removed, and how often each picks it
    (`cel_numpy.tasks.changes.answer_balance`); None for other tasks."""
    return answer_balance(items, _verdicts(intact), _verdicts(ablated))


def fmt_balance(balance: list[dict] | None) -> list[str]:
    """The markdown lines of `heldout_balance`: a bias shift between labels gains on one label's
    items and loses on the other's; none when the task has no fixed choice set."""
    if not balance:
        return []
    n = sum(row["items"] for row in balance)
    per_label = "; ".join(
        f"`{row['label']!r}` ({row['items']} items): intact {row['intact_correct']} right, "
        f"removed {row['ablated_correct']} ({row['ablated_correct'] - row['intact_correct']:+d})"
        for row in balance
    )
    picked = ", ".join(
        f"`{row['label']!r}` {row['intact_picked']} -> {row['ablated_picked']}" for row in balance
    )
    return [
        f"By reference label (every item offers the same choices): {per_label}. Answers picked "
        f"(intact -> removed, of {n}): {picked}. A gain on some labels' items with a loss on "
        "the others' is a shift of bias between labels, not better reading.",
        "",
    ]


def fmt_changes(changes: dict) -> str:
    """ "rescued 7 (genuine 4, echo 3), damaged 2 (genuine 2)": categories with a count only."""
    parts = []
    for kind in ("rescued", "damaged"):
        counts = changes[kind]
        inner = ", ".join(f"{c} {n}" for c, n in counts.items() if n)
        parts.append(f"{kind} {sum(counts.values())}" + (f" ({inner})" if inner else ""))
    return ", ".join(parts)


def fmt_decided(counts: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "-"


def fmt_nulls(nulls: dict, primary_gain: int, label: str = "the rank-1 set") -> str:
    return (
        f"{label}'s held-out gain ({primary_gain:+d}) is above {nulls['below']} of "
        f"{nulls['n']} random sets of {nulls['size']} heads (seed {nulls['seed']}; "
        f"{nulls['ties']} ties): percentile {nulls['percentile']:.1f}; share of random sets "
        f"at least as good (counting {label}) p = {_fmt_p(nulls['p_value'])}"
    )


def fmt_logprob(d: dict | None) -> str:
    """The continuous metric in a table cell: mean change in nats [cluster bootstrap 95%]."""
    if not d:
        return "-"
    return f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"


def fmt_matched_skipped(skipped: dict) -> str:
    """Why the matched null was not run (--matched-gate)."""
    return (
        f"not run: the rank-1 set's held-out gain ({skipped['gain']:+d}, cluster p = "
        f"{_fmt_p(skipped['p_value'])}) does not pass --matched-gate {skipped['gate']:g} (a "
        "positive gain with cluster p below it); a set not shown to beat the intact model "
        "needs no comparison with random searches"
    )


def fmt_matched(matched: dict, primary_gain: int, label: str = "the rank-1 set") -> str:
    return (
        f"{label}'s held-out gain ({primary_gain:+d}) is above {matched['below']} of the "
        f"{matched['n']} replicates' picks ({matched['ties']} ties; each the best of "
        f"{matched['budget']} random sets of {matched['size']} heads by the search's ranking on "
        f"discovery, drawn from a pool of {matched['pool']}, seed {matched['seed']}; "
        f"{matched['distinct']} distinct picks): percentile {matched['percentile']:.1f}; "
        f"share at least as good p = {_fmt_p(matched['p_value'])}"
    )


def render_markdown(report: dict) -> str:
    m, t = report["model"], report["task"]
    p = report["primary"]
    ho = p["heldout"]
    lines = [
        f"# Localization report: {t['name']} on {m.get('spec') or m.get('name') or m.get('kind')}",
        "",
        f"- model: `{m.get('spec', '')}` ({m.get('kind', '')}, {report['n_layers']} layers x "
        f"{report['n_heads']} heads, {m.get('ablation', '')} ablation)",
        f"- task: `{t['name']}` (scoring: {t['scoring']}); seed {report['seed']}",
        "- panels (items, clusters; discovery and held-out share no cluster): "
        + ", ".join(
            f"{k} {v} ({report['n_clusters'][k]})" for k, v in report["panel_sizes"].items()
        ),
        f"- intact: discovery {report['intact']['discovery']['correct']}/"
        f"{report['intact']['discovery']['n']}, "
        f"held-out {report['intact']['heldout']['correct']}/{report['intact']['heldout']['n']} "
        "(the two baseline passes agree exactly)",
        "- selection: ties in (gain, damaged, correct, set size) broken by "
        + (
            "the mean change of the reference answer's log-probability, then head coordinates"
            if report["tie_break"] == "logprob"
            else "head coordinates (the released rule)"
        )
        + f"; nominee slots decided by: {fmt_decided(report['decided_by']['nominees'])}; "
        f"finalist slots decided by: {fmt_decided(report['decided_by']['finalists'])}",
        "",
        "## Primary result (discovery rank 1)",
        "",
        f"Ablating **{p['name']}** on the held-out panel: {fmt_heldout(ho)}.",
        "",
    ]
    lines += _logprob_lines(p)
    if p["nulls"]:
        lines += [f"Null sets: {fmt_nulls(p['nulls'], ho['gain'])}.", ""]
    if p.get("changes"):
        lines += [f"What the changes are (held-out): {fmt_changes(p['changes'])}.", ""]
    lines += fmt_balance(p.get("answer_balance"))
    if p.get("matched_null"):
        lines += [f"Selection-matched null: {fmt_matched(p['matched_null'], ho['gain'])}.", ""]
    if p.get("matched_null_skipped"):
        lines += [f"Selection-matched null: {fmt_matched_skipped(p['matched_null_skipped'])}.", ""]
    if p["crosstask"]:
        lines.append(
            "Other tasks (exploratory: not corrected for the many sets and tasks): "
            + "; ".join(
                f"{name} {_fmt_gain(v)}, cluster p = {_fmt_p(v['p_value'])}"
                for name, v in p["crosstask"].items()
            )
            + "."
        )
        lines.append("")
    for note in report["notes"]:
        lines.append(f"> Note: {note}")
        lines.append("")
    if report.get("screen_agreement"):
        from cel_numpy.localize.agreement import fmt_agreement

        lines += [f"Screen agreement: {fmt_agreement(report['screen_agreement'])}.", ""]
    cross = list(report["finalists"][0]["crosstask"]) if report["finalists"] else []
    head = (
        "| rank | heads | discovery gain | confirm gain | held-out gain [cluster 95% CI] | "
        "cluster p | item p | held-out mean change of log p(reference) [cluster 95% CI] | "
        + " | ".join(f"{c} (exploratory)" for c in cross)
        + (" |" if cross else "")
    )
    lines += [
        "## Finalists (frozen before confirmation, discovery order)",
        "",
        head,
        "|" + "---|" * (8 + len(cross)),
    ]
    for f in report["finalists"]:
        row = (
            f"| {f['rank']} | {f['name']} | {f['discovery']['gain']:+d} "
            f"({f['discovery']['gain_rate']:+.3f}) | "
            f"{f['confirm']['gain']:+d} | "
            f"{_fmt_gain(f['heldout'])} | {_fmt_p(f['heldout']['p_value'])} | "
            f"{_fmt_p(f['heldout']['item_p_value'])} | {fmt_logprob(f.get('heldout_logprob'))} | "
        )
        row += " | ".join(_fmt_gain(f["crosstask"][c]) for c in cross) + (" |" if cross else "")
        lines.append(row)
    lines += [
        "",
        "## Singleton screen (top 10)",
        "",
        "| rank | head | correct | rescued | damaged | gain |",
        "|---|---|---|---|---|---|",
    ]
    for s in sorted(report["singletons"], key=lambda s: s["rank"])[:10]:
        lines.append(
            f"| {s['rank']} | {s['name']} | {s['correct']} | {s['rescued']} | {s['damaged']} "
            f"| {s['gain']:+d} |"
        )
    lines += [
        "",
        f"Joint search: {report['n_candidates']} candidates (pairs and triples of the nominees "
        "plus the nominee singletons).",
        "",
        "## Figures",
        "",
    ]
    for key, fname in report["figures"].items():
        lines.append(f"![{key}]({fname})")
        lines.append("")
    lines += [
        "Per-example records: `<stage>.jsonl` (and `<stage>.jsonl.gz`, the copy to keep); "
        "machine-readable numbers: `report.json`.",
        "",
    ]
    return "\n".join(lines)


def _logprob_lines(p: dict) -> list[str]:
    """The continuous metric of the primary set, under its accuracy result."""
    lp = p.get("heldout_logprob")
    if not lp:
        return []
    text = (
        f"Mean change of the reference answer's log-probability on the held-out panel: "
        f"{fmt_logprob(lp)} nats (cluster bootstrap 95%, {lp['n_clusters']} clusters)"
    )
    cross = {k: v for k, v in (p.get("crosstask_logprob") or {}).items() if v}
    if cross:
        text += "; other tasks (exploratory): " + "; ".join(
            f"{k} {fmt_logprob(v)}" for k, v in cross.items()
        )
    for key, label in (("nulls", "unselected null sets"), ("matched_null", "matched-null picks")):
        d = (p.get(key) or {}).get("logprob")
        if d:
            text += f"; percentile {d['percentile']:.1f} among the {label}"
    return [text + ".", ""]


def write_report(loc) -> dict:
    report = build_report(loc)
    out = Path(loc.out)
    json_dump(out / "report.json", report)
    plot_singletons(report, out / FIGURES["singletons"])
    plot_finalists(report, out / FIGURES["finalists"])
    plot_crosstask(report, out / FIGURES["crosstask"])
    if "nulls" in report["figures"]:
        plot_nulls(report, out / NULLS_FIGURE)
    text_dump(out / "report.md", render_markdown(report))
    return {"report": str(out / "report.json"), "primary": report["primary"]}


# --------------------------------------------------------------------------- test-heads


def _examples(task, items, intact, ablated, want: bool, k: int = 3) -> list[dict]:
    """Up to k items that the head set rescued (want=True) or damaged, with both outputs and
    the category of the change (`cel_numpy.tasks.changes`)."""
    out = []
    for it, a, b in zip(items, intact, ablated):
        if b.correct == want and a.correct != want:
            prompt = it.prompt if len(it.prompt) <= 160 else "..." + it.prompt[-157:]
            category = classify_change(answer_context(task, it), a.answer if want else b.answer)
            out.append(
                {
                    "item": it.id,
                    "cluster": it.cluster,
                    "prompt": prompt,
                    "answer": it.answer,
                    "intact": a.answer,
                    "ablated": b.answer,
                    "category": category,
                }
            )
        if len(out) == k:
            break
    return out


def build_test_report(loc) -> dict:
    r, manifest = loc.results, loc.manifest
    held = r["heldout"]["heldout"]
    result = held["finalists"][0]
    items = loc.panels["heldout"]
    intact, ablated = loc.heldout_blocks
    nulls = r.get("nulls") or {}
    (primary_lp,) = finalist_logprobs(loc, "heldout", "heldout")
    return {
        "format": "cel-numpy.localize.report/2",
        "kind": "test-heads",
        "model": manifest["model"],
        "task": manifest["task"],
        "seed": manifest["seed"],
        "panel_sizes": manifest["panel_sizes"],
        "panel_hashes": manifest["panel_hashes"],
        "n_clusters": manifest["n_clusters"],
        "n_layers": loc.n_layers,
        "n_heads": loc.n_heads,
        "primary": {
            "heads": result["heads"],
            "name": result["name"],
            "heldout": result,
            "crosstask": {},
            "changes": heldout_changes(loc.task, items, intact, ablated),
            "answer_balance": heldout_balance(items, intact, ablated),
            "heldout_logprob": primary_lp,
            "nulls": _null_digest(nulls, primary_lp),
        },
        "intact": {"heldout": {"n": held["n"], "correct": held["intact_correct"]}},
        "examples": {
            "rescued": _examples(loc.task, items, intact, ablated, True),
            "damaged": _examples(loc.task, items, intact, ablated, False),
        },
        "nulls": nulls,
        "stage_seconds": loc.stage_seconds(),
        "figures": {"nulls": NULLS_FIGURE} if nulls.get("n") else {},
    }


def render_test_markdown(report: dict) -> str:
    m, t, p = report["model"], report["task"], report["primary"]
    ho = p["heldout"]
    lines = [
        f"# Head-set test: {p['name']} on {t['name']} ({m.get('spec') or m.get('kind')})",
        "",
        f"- model: `{m.get('spec', '')}` ({m.get('kind', '')}, {report['n_layers']} layers x "
        f"{report['n_heads']} heads, {m.get('ablation', '')} ablation)",
        f"- task: `{t['name']}` (scoring: {t['scoring']}); panel seed {report['seed']}: the "
        f"held-out panel of `cel-numpy localize` with the same --seed, --discovery "
        f"{report['panel_sizes']['discovery']} and --heldout {report['panel_sizes']['heldout']}",
        f"- held-out panel: {ho['n']} items in {report['n_clusters']['heldout']} clusters; "
        f"intact {report['intact']['heldout']['correct']}/{ho['n']}, with {p['name']} removed "
        f"{ho['correct']}/{ho['n']}",
        "",
        "## Result",
        "",
        f"Removing **{p['name']}**: {fmt_heldout(ho)}.",
        "",
        *_logprob_lines(p),
    ]
    if p["nulls"]:
        lines += [
            f"Null sets: {fmt_nulls(p['nulls'], ho['gain'], 'the set')}.",
            "",
            "![nulls](nulls.png)",
            "",
        ]
    lines += [f"What the changes are: {fmt_changes(p['changes'])} (docs/design.md#scoring).", ""]
    lines += fmt_balance(p.get("answer_balance"))
    for kind in ("rescued", "damaged"):
        examples = report["examples"][kind]
        if not examples:
            continue
        lines += [
            f"## Examples {kind}",
            "",
            "| prompt (end) | answer | intact | removed | category |",
            "|---|---|---|---|---|",
        ]
        for e in examples:
            cells = [e["prompt"].replace("\n", " / "), e["answer"], e["intact"], e["ablated"]]
            lines.append(
                "| " + " | ".join(f"`{c.strip()}`" for c in cells) + f" | {e['category']} |"
            )
        lines.append("")
    lines += ["Per-example records: `heldout.jsonl`; machine-readable numbers: `report.json`.", ""]
    return "\n".join(lines)


def write_test_report(loc) -> dict:
    report = build_test_report(loc)
    out = Path(loc.out)
    json_dump(out / "report.json", report)
    if report["figures"]:
        plot_nulls(report, out / NULLS_FIGURE)
    text_dump(out / "report.md", render_test_markdown(report))
    return {
        "report": str(out / "report.json"),
        "primary": report["primary"],
        "examples": report["examples"],
        "intact": report["intact"],
    }
