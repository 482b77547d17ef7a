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
from cel_numpy.tasks.changes import classify_change, classify_changes

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
    if nulls.get("n"):
        figures["nulls"] = NULLS_FIGURE
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
            "nulls": _null_digest(nulls),
            "changes": changes,
        },
        "nulls": nulls,
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


def _null_digest(nulls: dict) -> dict | None:
    if not nulls.get("n"):
        return None
    keys = ("n", "seed", "size", "below", "ties", "percentile", "p_value")
    return {k: nulls[k] for k in keys}


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
    plt = _plt()
    nulls = report["nulls"]
    gains = [s["gain_rate"] for s in nulls["sets"]]
    primary = report["primary"]["heldout"]["gain_rate"]
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.hist(gains, bins=min(30, max(5, len(gains) // 2)), color="0.6", label="random sets")
    ax.axvline(primary, color="C3", linewidth=2, label=f"rank 1: {report['primary']['name']}")
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_xlabel("held-out gain rate")
    ax.set_ylabel("null sets")
    ax.set_title(
        f"{nulls['n']} random sets of {nulls['size']} heads (seed {nulls['seed']}): "
        f"percentile {nulls['percentile']:.0f}",
        fontsize=9,
    )
    ax.legend(fontsize=8)
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


def heldout_changes(task, items, intact, ablated) -> dict:
    """The primary set's rescued and damaged held-out items by category
    (`cel_numpy.tasks.changes`: valid, format, echo, shot, genuine)."""
    return classify_changes(
        [answer_context(task, it) for it in items],
        [(r.correct, r.answer) for r in intact],
        [(r.correct, r.answer) for r in ablated],
    )


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
    if p["nulls"]:
        lines += [f"Null sets: {fmt_nulls(p['nulls'], ho['gain'])}.", ""]
    if p.get("changes"):
        lines += [f"What the changes are (held-out): {fmt_changes(p['changes'])}.", ""]
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
    cross = list(report["finalists"][0]["crosstask"]) if report["finalists"] else []
    head = (
        "| rank | heads | discovery gain | confirm gain | held-out gain [cluster 95% CI] | "
        "cluster p | item p | "
        + " | ".join(f"{c} (exploratory)" for c in cross)
        + (" |" if cross else "")
    )
    lines += [
        "## Finalists (frozen before confirmation, discovery order)",
        "",
        head,
        "|" + "---|" * (7 + len(cross)),
    ]
    for f in report["finalists"]:
        row = (
            f"| {f['rank']} | {f['name']} | {f['discovery']['gain']:+d} "
            f"({f['discovery']['gain_rate']:+.3f}) | "
            f"{f['confirm']['gain']:+d} | "
            f"{_fmt_gain(f['heldout'])} | {_fmt_p(f['heldout']['p_value'])} | "
            f"{_fmt_p(f['heldout']['item_p_value'])} | "
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
    lines += ["Per-example records: `<stage>.jsonl`; machine-readable numbers: `report.json`.", ""]
    return "\n".join(lines)


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
            out.append({"item": it.id, "cluster": it.cluster, "prompt": prompt,
                        "answer": it.answer, "intact": a.answer, "ablated": b.answer,
                        "category": category})  # fmt: skip
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
            "nulls": _null_digest(nulls),
            "changes": heldout_changes(loc.task, items, intact, ablated),
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
    ]
    if p["nulls"]:
        lines += [f"Null sets: {fmt_nulls(p['nulls'], ho['gain'], 'the set')}.", "",
                  "![nulls](nulls.png)", ""]  # fmt: skip
    lines += [f"What the changes are: {fmt_changes(p['changes'])} (docs/design.md#scoring).", ""]
    for kind in ("rescued", "damaged"):
        examples = report["examples"][kind]
        if not examples:
            continue
        lines += [f"## Examples {kind}", "",
                  "| prompt (end) | answer | intact | removed | category |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for e in examples:
            cells = [e["prompt"].replace("\n", " / "), e["answer"], e["intact"], e["ablated"]]
            lines.append("| " + " | ".join(f"`{c.strip()}`" for c in cells)
                         + f" | {e['category']} |")  # fmt: skip
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
    return {"report": str(out / "report.json"), "primary": report["primary"],
            "examples": report["examples"], "intact": report["intact"]}  # fmt: skip
