"""report.json (machine-readable), report.md (for people) and three figures, from a finished run.

Figures (matplotlib, imported here only, Agg backend):
    singletons.png  layer x head heatmap of singleton gains (rate) on discovery; nominees boxed
    finalists.png   each finalist's gain on discovery (vs the baseline) and on held-out, 95% intervals
    crosstask.png   each finalist's held-out gain on the target task and its gain on every other task

Gains in the report are rates, (rescued - damaged) / n, with Newcombe's paired 95% interval and
the exact McNemar p-value (`cel_numpy.localize.stats`); raw counts sit beside them.
"""

from __future__ import annotations

from pathlib import Path

from cel_numpy.localize.rundir import json_dump, text_dump

FIGURES = {
    "singletons": "singletons.png",
    "finalists": "finalists.png",
    "crosstask": "crosstask.png",
}


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
        notes.append("the fresh intact comparator of the confirmation differs from the baseline")
    primary = finalists[0]
    return {
        "format": "cel-numpy.localize.report/1",
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
        "joint_ranking": r["joint"]["ranking"],
        "n_candidates": r["joint"]["n_candidates"],
        "finalists": finalists,
        "primary": {
            "heads": primary["heads"],
            "name": primary["name"],
            "heldout": primary["heldout"],
            "crosstask": primary["crosstask"],
        },
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
        "figures": FIGURES,
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


# --------------------------------------------------------------------------- markdown


def render_markdown(report: dict) -> str:
    m, t = report["model"], report["task"]
    p = report["primary"]
    ho = p["heldout"]
    lines = [
        f"# Localization report: {t['name']} on {m.get('spec') or m.get('name') or m.get('kind')}",
        "",
        f"- model: `{m.get('spec', '')}` ({m.get('kind', '')}, {report['n_layers']} layers x {report['n_heads']} heads, "
        f"{m.get('ablation', '')} ablation)",
        f"- task: `{t['name']}` (scoring: {t['scoring']}); seed {report['seed']}",
        "- panels: " + ", ".join(f"{k} {v}" for k, v in report["panel_sizes"].items()),
        f"- intact: discovery {report['intact']['discovery']['correct']}/{report['intact']['discovery']['n']}, "
        f"held-out {report['intact']['heldout']['correct']}/{report['intact']['heldout']['n']} "
        "(the two baseline passes agree exactly)",
        "",
        "## Primary result (discovery rank 1)",
        "",
        f"Ablating **{p['name']}** on the held-out panel: rescued {ho['rescued']}, damaged {ho['damaged']}, "
        f"gain {ho['gain']:+d} of {ho['n']} = {_fmt_gain(ho)} (95% Newcombe interval), "
        f"exact McNemar p = {_fmt_p(ho['p_value'])}.",
        "",
    ]
    if p["crosstask"]:
        lines.append(
            "Other tasks: "
            + "; ".join(
                f"{name} {_fmt_gain(v)}, p = {_fmt_p(v['p_value'])}"
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
        "| rank | heads | discovery gain | confirm gain | held-out gain [95% CI] | p | "
        + " | ".join(cross)
        + (" |" if cross else "")
    )
    lines += [
        "## Finalists (frozen before confirmation, discovery order)",
        "",
        head,
        "|" + "---|" * (6 + len(cross)),
    ]
    for f in report["finalists"]:
        row = (
            f"| {f['rank']} | {f['name']} | {f['discovery']['gain']:+d} ({f['discovery']['gain_rate']:+.3f}) | "
            f"{f['confirm']['gain']:+d} | "
            f"{_fmt_gain(f['heldout'])} | {_fmt_p(f['heldout']['p_value'])} | "
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
            f"| {s['rank']} | {s['name']} | {s['correct']} | {s['rescued']} | {s['damaged']} | {s['gain']:+d} |"
        )
    lines += [
        "",
        f"Joint search: {report['n_candidates']} candidates (pairs and triples of the nominees plus the "
        "nominee singletons).",
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
    text_dump(out / "report.md", render_markdown(report))
    return {"report": str(out / "report.json"), "primary": report["primary"]}
