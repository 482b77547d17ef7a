"""One table across finished runs (`cel-numpy summarize RUN_DIR...`): what the README's results
section is written from.

Per run (a `localize` or `test-heads` directory of the current format; older directories are
refused, so old and new panels never mix): task, panel seed, panel sizes in items and clusters,
intact accuracy, the primary (rank-1 or tested) head set, its held-out gain with the cluster
bootstrap interval, the cluster sign-flip p, that p Holm-adjusted across every primary test of
the table, the item-level McNemar p (secondary), the mean change of the reference answer's
log-probability with its cluster interval, the percentiles against the unselected and the
selection-matched nulls, the cross-task gains (exploratory) and the wall time.

report.json and manifest.json are data, not trusted: every field the table reads is checked for
type and range (a p-value in [0, 1], rates in [-1, 1], counts) and a file that fails is one
line naming the field. A directory given twice (under any spelling) counts once; table cells
have newlines and pipes escaped. `--verify` (`cel_numpy.localize.verify`) recomputes every
number of the table from the run's per-item records.

Then, per task (per model and task when the runs hold several models: a head belongs to one
model), how often each head recurs in the primary sets and among the finalists across the runs
(seeds).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from pathlib import Path

from cel_numpy.errors import OptionError, RunDirError
from cel_numpy.limits import read_json
from cel_numpy.localize.report import fmt_logprob
from cel_numpy.localize.rundir import read_manifest
from cel_numpy.localize.stats import holm

REPORT_FORMATS = ("cel-numpy.localize.report/2",)


def _fmt_p(p: float | None) -> str:
    if p is None:
        return "-"
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def cell(text) -> str:
    """A table cell that cannot break the table: newlines and other control characters become
    spaces, a pipe is escaped."""
    out = "".join(" " if (ord(c) < 32 or 127 <= ord(c) < 160) else c for c in str(text))
    return out.replace("|", "\\|")


# what repairs a damaged file of a run: the report stage rewrites report.json from the kept
# records; a damaged manifest is the run itself
REPAIR = (
    "not a report cel-numpy wrote (edited or damaged); rerun the run's command (in its "
    "manifest.json) "
)
REPAIR_REPORT = (
    REPAIR + "with the same --out: its report stage rewrites report.json from the kept records"
)


def _check(cond: bool, path: Path, field: str, value, want: str) -> None:
    if not cond:
        shown = "missing (or null)" if value is None else repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        advice = (
            REPAIR_REPORT if Path(path).name == "report.json" else REPAIR + "with a fresh --out"
        )
        raise RunDirError(f"{path}: {field} is {shown}, not {want}: {advice}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) and math.isfinite(x)


def _check_obj(path: Path, obj, field: str) -> dict:
    _check(isinstance(obj, dict), path, field, obj, "an object")
    return obj


def _check_prob(path: Path, d: dict, field: str, key: str) -> None:
    v = d.get(key)
    _check(_is_num(v) and 0 <= v <= 1, path, f"{field}.{key}", v, "a p-value in [0, 1]")


def _check_heldout(path: Path, ho, field: str) -> None:
    """The held-out numbers the table shows: counts, rates in [-1, 1], p-values in [0, 1]."""
    ho = _check_obj(path, ho, field)
    for key in ("gain", "n", "n_clusters", "correct", "intact_correct"):
        v = ho.get(key)
        _check(_is_int(v) and (key == "gain" or v >= 0), path, f"{field}.{key}", v, "a count")
    _check(
        ho["n"] > 0 and abs(ho["gain"]) <= ho["n"],
        path,
        f"{field}.gain",
        ho["gain"],
        f"a gain of at most {ho['n']} items",
    )
    for key in ("gain_rate", "ci_low", "ci_high"):
        v = ho.get(key)
        _check(_is_num(v) and -1 <= v <= 1, path, f"{field}.{key}", v, "a rate in [-1, 1]")
    for key in ("p_value", "item_p_value"):
        _check_prob(path, ho, field, key)


def _check_percentile(path: Path, d, field: str) -> None:
    if d is None:
        return
    d = _check_obj(path, d, field)
    v = d.get("percentile")
    _check(_is_num(v) and 0 <= v <= 100, path, f"{field}.percentile", v, "a number in [0, 100]")
    _check(_is_int(d.get("n")) and d["n"] > 0, path, f"{field}.n", d.get("n"), "a count")


def check_report(report, path: Path) -> dict:
    """Every field `summarize` reads, of the right type and range (RunDirError naming the first
    that is not): a report.json is data, never trusted to be well-formed."""
    report = _check_obj(path, report, "the file")
    fmt = report.get("format")
    _check(fmt in REPORT_FORMATS, path, "format", fmt, " or ".join(REPORT_FORMATS))
    p = _check_obj(path, report.get("primary"), "primary")
    _check(
        isinstance(p.get("name"), str) and bool(p["name"]),
        path,
        "primary.name",
        p.get("name"),
        "a head set name",
    )
    _check_heldout(path, p.get("heldout"), "primary.heldout")
    _check_percentile(path, p.get("nulls"), "primary.nulls")
    _check_percentile(path, p.get("matched_null"), "primary.matched_null")
    skipped = p.get("matched_null_skipped")
    if skipped is not None:
        skipped = _check_obj(path, skipped, "primary.matched_null_skipped")
        _check(
            p.get("matched_null") is None,
            path,
            "primary.matched_null",
            "a result",
            "absent beside primary.matched_null_skipped",
        )
        for key, ok, want in (
            ("gate", lambda v: _is_num(v) and 0 < v <= 1, "a number in (0, 1]"),
            ("gain", _is_int, "a count"),
            ("p_value", lambda v: _is_num(v) and 0 <= v <= 1, "a number in [0, 1]"),
        ):
            v = skipped.get(key)
            _check(ok(v), path, f"primary.matched_null_skipped.{key}", v, want)
    lp = p.get("heldout_logprob")
    if lp is not None:
        lp = _check_obj(path, lp, "primary.heldout_logprob")
        for key in ("mean", "ci_low", "ci_high"):
            v = lp.get(key)
            _check(_is_num(v), path, f"primary.heldout_logprob.{key}", v, "a finite number")
    cross = _check_obj(path, p.get("crosstask", {}), "primary.crosstask")
    for name, v in cross.items():
        v = _check_obj(path, v, f"primary.crosstask.{name}")
        g = v.get("gain_rate")
        _check(
            _is_num(g) and -1 <= g <= 1,
            path,
            f"primary.crosstask.{name}.gain_rate",
            g,
            "a rate in [-1, 1]",
        )
        _check_prob(path, v, f"primary.crosstask.{name}", "p_value")
    intact = _check_obj(path, report.get("intact"), "intact")
    held = _check_obj(path, intact.get("heldout"), "intact.heldout")
    for key in ("n", "correct"):
        _check(
            _is_int(held.get(key)) and held[key] >= 0,
            path,
            f"intact.heldout.{key}",
            held.get(key),
            "a count",
        )
    finalists = report.get("finalists", [])
    _check(isinstance(finalists, list), path, "finalists", finalists, "a list")
    for k, f in enumerate(finalists):
        f = _check_obj(path, f, f"finalists[{k}]")
        _check(
            isinstance(f.get("name"), str),
            path,
            f"finalists[{k}].name",
            f.get("name"),
            "a head set name",
        )
    if finalists:
        disc = _check_obj(path, finalists[0].get("discovery"), "finalists[0].discovery")
        _check(
            _is_int(disc.get("gain")),
            path,
            "finalists[0].discovery.gain",
            disc.get("gain"),
            "a count",
        )
    seconds = _check_obj(path, report.get("stage_seconds", {}), "stage_seconds")
    for stage, v in seconds.items():
        _check(
            v is None or (_is_num(v) and v >= 0),
            path,
            f"stage_seconds.{stage}",
            v,
            "a number of seconds",
        )
    return report


def load_run(run_dir) -> dict:
    """The manifest and report of one finished run (one-line RunDirError otherwise)."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    path = run_dir / "report.json"
    if not path.exists():
        raise RunDirError(
            f"{run_dir} has no report.json: finish the run first (rerun its command, in "
            "manifest.json)"
        )
    # a regular file (a FIFO would hang, a device never end), size-capped, one line otherwise
    report = read_json(path, "report", error=RunDirError, hint=REPAIR_REPORT)
    return {
        "dir": str(run_dir),
        "manifest": check_manifest(manifest, run_dir / "manifest.json"),
        "report": check_report(report, path),
    }


def check_manifest(manifest: dict, path: Path) -> dict:
    """The manifest fields the table shows, of the right types (RunDirError otherwise)."""
    _check(
        manifest.get("kind") in ("localize", "test-heads"),
        path,
        "kind",
        manifest.get("kind"),
        "localize or test-heads",
    )
    _check_obj(path, manifest.get("model"), "model")
    task = _check_obj(path, manifest.get("task"), "task")
    _check(isinstance(task.get("name"), str), path, "task.name", task.get("name"), "a name")
    _check(_is_int(manifest.get("seed")), path, "seed", manifest.get("seed"), "an integer")
    for key in ("panel_sizes", "n_clusters"):
        d = _check_obj(path, manifest.get(key), key)
        for panel in ("discovery", "heldout"):
            _check(_is_int(d.get(panel)), path, f"{key}.{panel}", d.get(panel), "a count")
    if manifest.get("fold") is not None:  # absent in runs without --folds
        fold = _check_obj(path, manifest["fold"], "fold")
        folds, k = fold.get("folds"), fold.get("k")
        _check(_is_int(folds) and folds >= 2, path, "fold.folds", folds, "a count of at least 2")
        _check(_is_int(k) and 0 <= k < folds, path, "fold.k", k, f"a fold in 0..{folds - 1}")
    return manifest


def distinct_dirs(run_dirs) -> tuple[list[Path], list[Path]]:
    """(the run directories, each once, in the order given; the later spellings of one already
    given: `run`, `./run` and a symlink to it are one run and count once)."""
    seen, keep, dropped = set(), [], []
    for d in map(Path, run_dirs):
        key = d.resolve()
        if key in seen:
            dropped.append(d)
        else:
            seen.add(key)
            keep.append(d)
    return keep, dropped


def check_output_path(out: Path, run_dirs) -> None:
    """An output file inside a run directory (given or not) would overwrite, or pose as, that
    run's files; a folder is not a file: both refused, before anything is read."""
    from cel_numpy.outdir import run_directory_holding

    target = Path(out).resolve()
    holder = run_directory_holding(target)
    for d in [*map(Path, run_dirs), *([holder] if holder else [])]:
        root = d.resolve()
        if target == root or root in target.parents:
            raise OptionError(
                f"--json {out} is inside the run directory {d}: write the summary elsewhere "
                "(a run directory holds only what its run wrote)"
            )
    if target.is_dir():
        raise OptionError(f"--json {out} is a folder: give a file name, e.g. summary.json")


def summarize(run_dirs) -> dict:
    """Rows (one per run), Holm-adjusted primary p-values and per-task head recurrence."""
    run_dirs, repeated = distinct_dirs(run_dirs)
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
                "heldout_logprob": p.get("heldout_logprob"),
                "nulls": p.get("nulls"),
                "matched_null": p.get("matched_null"),
                "matched_null_skipped": p.get("matched_null_skipped"),
                "crosstask": {k: v for k, v in p.get("crosstask", {}).items()},
                "finalists": finalists,
                "fold": m.get("fold"),
                "ablation": _ablation_text(m["model"]),
                "wall_seconds": sum(seconds) if seconds else None,
            }
        )
    adjusted = holm([row["heldout"]["p_value"] for row in rows])
    for row, q in zip(rows, adjusted):
        row["p_holm"] = q
    models = {(row["model"], row["model_sha256"]) for row in rows}
    return {
        "rows": rows,
        "recurrence": head_recurrence(rows),
        "n_models": len(models),
        "repeated": [str(d) for d in repeated],
    }


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
        return {
            it.cluster
            for name in ("discovery", "heldout")
            for it in read_panel(panels / f"{name}.jsonl")
        }

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


def _seed_text(row: dict) -> str:
    """The panel seed, with the fold when the run took one ("0 (fold 1 of 3)"): two folds of one
    seed are independent replications and must not read as the same run twice."""
    fold = row.get("fold")
    return f"{row['seed']} (fold {fold['k']} of {fold['folds']})" if fold else str(row["seed"])


def _ablation_text(model: dict) -> str | None:
    """None for zero ablation (the search's default); else "mean ablation" or "resample
    ablation, donor seed S", so a robustness test never reads as the same set's zero row."""
    kind = model.get("ablation", "zero")
    if kind == "zero":
        return None
    seed = model.get("resample_seed")
    return f"{kind} ablation" + (
        f", donor seed {seed}" if kind == "resample" and seed is not None else ""
    )


def render(summary: dict) -> str:
    rows = summary["rows"]
    show_model = summary["n_models"] > 1
    lines = [
        "| "
        + ("model | " if show_model else "")
        + "task | seed (fold) | discovery (items/clusters) | held-out (items/clusters) "
        "| intact held-out | primary heads | discovery gain | held-out gain [cluster 95% CI] "
        "| cluster p | Holm p "
        "| item McNemar p | held-out mean change of log p(reference) [cluster 95% CI] "
        "| null percentile (unselected) | matched-null percentile | cross-task (exploratory) "
        "| wall |",
        "|" + "---|" * (16 + show_model),
    ]
    for row in rows:
        ho, sizes, clusters = row["heldout"], row["panel_sizes"], row["n_clusters"]
        nulls, matched = row["nulls"], row.get("matched_null")
        null_text = f"{nulls['percentile']:g} (of {nulls['n']})" if nulls else "-"
        skipped = row.get("matched_null_skipped")
        matched_text = (
            f"{matched['percentile']:g} (of {matched['n']}, best of {matched['budget']})"
            if matched
            else f"not run (gate: gain > 0 with p < {skipped['gate']:g})"
            if skipped
            else "-"
        )
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
            _seed_text(row),
            "-" if row["kind"] == "test-heads" else f"{sizes['discovery']}/{clusters['discovery']}",
            f"{sizes['heldout']}/{clusters['heldout']}",
            f"{intact['correct']}/{intact['n']}",
            row["primary"] + (f" ({row['ablation']})" if row.get("ablation") else ""),
            disc_text,
            f"{ho['gain']:+d}/{ho['n']} = {ho['gain_rate']:+.3f} "
            f"[{ho['ci_low']:+.3f}, {ho['ci_high']:+.3f}]",
            _fmt_p(ho["p_value"]),
            _fmt_p(row["p_holm"]),
            _fmt_p(ho["item_p_value"]),
            fmt_logprob(row.get("heldout_logprob")),
            null_text,
            matched_text,
            cross or "-",
            wall,
        ]
        lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
    lines += [
        "",
        f"Holm: adjusted across the {len(rows)} primary tests of this table (one per run: the "
        "primary set on its held-out panel, cluster sign-flip test). Cross-task gains are "
        "exploratory (no correction). Wall: the stages' recorded times summed; a stage resumed "
        "over several processes recorded only its last process's time, so a resumed run's "
        "wall reads short.",
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
        lines.append(
            f"- {cell(task)} ({n} search{'es' if n != 1 else ''}): " + cell(", ".join(recurring))
        )
    return "\n".join(lines) + "\n"
