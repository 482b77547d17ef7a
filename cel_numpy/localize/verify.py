"""`cel-numpy summarize --verify`: every number of the summary table recomputed from the run's
per-item records, compared with what report.json says.

From the records alone (`<stage>.jsonl`, or `<stage>.jsonl.gz` when only the compressed copy was
kept; each checked against the sha256 its done-file states) and the panels (checked against the
manifest's hashes), per run:

    selection    the screen ranking, the nominees and the joint ranking with the manifest's
                 tie-break: the primary set, its discovery gain, the finalists
    held-out     the primary set against the held-out intact pass: counts, the cluster sign-flip
                 p, the cluster bootstrap interval (same seed), McNemar and Newcombe on items,
                 the intact accuracy, the mean change of log p(reference) with its interval
    nulls        the unselected null sets' gains and the primary's percentile among them
    matched      the pool's ranking, the replicates' picks (same seed), the picks' held-out gains
                 and the primary's percentile among them
    cross-task   each task's gain rate and cluster p
    Holm         recomputed across the table from the recomputed p-values

The wall time comes from the done-files, not from records, and is not checked. A mismatch is
one line naming the run, the number, both values; a run directory that kept no records (written
before cel-numpy kept them, or with its records deleted) is refused with a line saying so.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from cel_numpy.errors import RunDirError
from cel_numpy.localize import rundir as rd
from cel_numpy.localize.conditions import ExampleResult, condition_name, normalize_condition
from cel_numpy.localize.metrics import logprob_change, logprob_summary, null_percentile
from cel_numpy.localize.ranking import (
    Scored,
    best_of_subsamples,
    joint_enumeration,
    joint_key,
    nominees,
    rank_joint,
    rank_singletons,
)
from cel_numpy.localize.stats import clustered_summary, holm, paired_summary

TOLERANCE = 1e-9  # relative: JSON keeps floats exactly; sums in another order differ by ulps

Block = tuple[str, str, tuple, list[ExampleResult]]  # (name, panel, condition, results)


class NoRecordsError(RunDirError):
    """A run directory without the per-item records --verify recomputes from."""


def stage_blocks(run_dir: Path, stage: str, manifest: dict) -> dict[str, Block]:
    """A finished stage's records grouped by block name (records checked against its done-file)."""
    records, done = rd.stage_paths(run_dir, stage)
    if not (records.exists() or rd.gz_path(run_dir, stage).exists()):
        raise NoRecordsError(
            f"{run_dir} keeps no per-item records of its {stage} stage ({records.name} or "
            f"{records.name}.gz), which --verify recomputes the table from: rerun the command in "
            "its manifest.json into a fresh --out to get them, or summarize without --verify"
        )
    if not done.exists():
        raise RunDirError(f"{run_dir}: the {stage} stage is not finished ({done.name} missing)")
    info = rd.read_json_object(done, "rerun the run's command")
    if info.get("manifest_key") not in (rd.manifest_key(manifest), rd.manifest_key(manifest, True)):
        raise RunDirError(f"{done} belongs to a different manifest (summarize --verify)")
    path, data = rd.finished_records(run_dir, stage, info)
    blocks: dict[str, Block] = {}
    for n, raw in enumerate(data.decode("utf-8").splitlines(), 1):
        try:
            d = json.loads(raw)
            result = ExampleResult(d["item"], d["correct"], d["answer"], d["ref_logprob"])
            name, panel, heads = d["block"], d["panel"], normalize_condition(d["heads"])
        except (ValueError, KeyError, TypeError, RecursionError):
            raise RunDirError(f"{path}:{n}: malformed record (summarize --verify)") from None
        if name not in blocks:
            blocks[name] = (name, panel, heads, [])
        blocks[name][3].append(result)
    return blocks


def read_panels(run_dir: Path, manifest: dict) -> dict:
    panels = {}
    for name, want in manifest["panel_hashes"].items():
        items = rd.read_panel(Path(run_dir) / "panels" / f"{name}.jsonl")
        if rd.items_hash(items) != want:
            raise RunDirError(f"{run_dir}/panels/{name}.jsonl does not match manifest.json")
        panels[name] = items
    return panels


def _results(blocks: dict[str, Block], name: str, stage: str, items) -> list[ExampleResult]:
    if name not in blocks:
        raise RunDirError(f"the {stage} records hold no block {name!r} (summarize --verify)")
    results = blocks[name][3]
    if [r.item_id for r in results] != [it.id for it in items]:
        raise RunDirError(
            f"the {stage} records of block {name!r} are not its panel's items in order "
            "(summarize --verify)"
        )
    return results


def _scored(cond, intact: list[ExampleResult], results: list[ExampleResult]) -> Scored:
    s = paired_summary([r.correct for r in intact], [r.correct for r in results])
    return Scored(cond, s.correct, s.rescued, s.damaged, logprob_change(intact, results))


def _selection(run_dir: Path, manifest: dict, panels: dict) -> dict:
    """The search replayed from its records: intact comparator, ranked candidates, primary."""
    disc = panels["discovery"]
    tie_break = manifest.get("tie_break") or "coordinates"
    baseline = stage_blocks(run_dir, "baseline", manifest)
    intact = _results(baseline, "intact#1", "baseline", disc)
    screen = stage_blocks(run_dir, "screen", manifest)
    singles = {
        name: _scored(cond, intact, _results(screen, name, "screen", disc))
        for name, (_, _, cond, _) in screen.items()
    }
    ranked = rank_singletons(list(singles.values()), tie_break)
    nominated = nominees(ranked, min(manifest["n_nominees"], len(ranked)))
    reused, _ = joint_enumeration(nominated)
    joint = stage_blocks(run_dir, "joint", manifest)
    candidates = [singles[condition_name(c)] for c in reused] + [
        _scored(cond, intact, _results(joint, name, "joint", disc))
        for name, (_, _, cond, _) in joint.items()
    ]
    ranking = rank_joint(candidates, tie_break)
    return {"intact": intact, "ranking": ranking, "tie_break": tie_break}


def _matched(run_dir, manifest, panels, selection, held_intact, primary_gain) -> dict:
    """The selection-matched null replayed: pool ranking, picks, the picks' held-out gains."""
    disc, held = panels["discovery"], panels["heldout"]
    settings = manifest["matched_null"]
    pool_blocks = stage_blocks(run_dir, "matched-pool", manifest)
    pool = [
        _scored(cond, selection["intact"], _results(pool_blocks, name, "matched-pool", disc))
        for name, (_, _, cond, _) in pool_blocks.items()
    ]
    order = sorted(range(len(pool)), key=lambda i: joint_key(pool[i], selection["tie_break"]))
    position = [0] * len(pool)
    for rank, i in enumerate(order):
        position[i] = rank
    budget = min(len(selection["ranking"]), len(pool))
    picks = best_of_subsamples(
        position, len(pool), budget, settings["replicates"], settings["seed"]
    )
    null_blocks = stage_blocks(run_dir, "matched-null", manifest)
    gains = {}
    for i in set(picks):
        name = f"matched:{condition_name(pool[i].heads)}"
        res = _results(null_blocks, name, "matched-null", held)
        gains[i] = sum(int(b.correct) - int(a.correct) for a, b in zip(held_intact, res))
    return {
        "budget": budget,
        "distinct": len(set(picks)),
        **null_percentile(primary_gain, [gains[i] for i in picks]),
    }


def recompute(run_dir: Path, manifest: dict, row: dict) -> dict:
    """The row's numbers from the records (the same keys as the row where they exist)."""
    run_dir = Path(run_dir)
    panels = read_panels(run_dir, manifest)
    held, seed = panels["heldout"], manifest["seed"]
    fresh: dict = {}
    if manifest["kind"] == "localize":
        selection = _selection(run_dir, manifest, panels)
        top = selection["ranking"][0]
        fresh["primary"] = condition_name(top.heads)
        fresh["discovery_gain"] = top.gain
        fresh["finalists"] = [
            condition_name(s.heads) for s in selection["ranking"][: manifest["n_finalists"]]
        ]
    else:
        fresh["primary"] = manifest["heads"]
    heldout = stage_blocks(run_dir, "heldout", manifest)
    intact = _results(heldout, "intact", "heldout", held)
    ablated = _results(heldout, fresh["primary"], "heldout", held)
    clusters = [it.cluster for it in held]
    fresh["heldout"] = clustered_summary(
        clusters, [r.correct for r in intact], [r.correct for r in ablated], seed=seed
    ).to_dict()
    fresh["intact_heldout"] = {"n": len(intact), "correct": sum(r.correct for r in intact)}
    fresh["heldout_logprob"] = logprob_summary(held, intact, ablated, seed)
    gain = fresh["heldout"]["gain"]
    if row.get("nulls"):
        blocks = stage_blocks(run_dir, "nulls", manifest)
        sets = [
            {
                "gain": sum(int(b.correct) - int(a.correct) for a, b in zip(intact, res)),
                "logprob_change": logprob_change(intact, res),
            }
            for res in (_results(blocks, n, "nulls", held) for n in blocks)
        ]
        fresh["nulls"] = null_percentile(gain, [s["gain"] for s in sets])
        lp = fresh["heldout_logprob"]
        values = [s["logprob_change"] for s in sets]
        if lp is not None and None not in values:
            fresh["nulls"]["logprob"] = null_percentile(round(lp["mean"], 9), values)
    if row.get("matched_null"):
        fresh["matched_null"] = _matched(run_dir, manifest, panels, selection, intact, gain)
    if row.get("matched_null_skipped"):
        gate = rd.gate_path(run_dir)
        fresh["gate"] = (
            rd.read_json_object(gate, "it is written by localize --matched-gate").get("gate")
            if gate.exists()
            else None
        )
        fresh["matched_started"] = any(
            rd.stage_started(run_dir, s) for s in ("matched-pool", "matched-null")
        )
    if row.get("crosstask"):
        blocks = stage_blocks(run_dir, "crosstask", manifest)
        fresh["crosstask"] = {}
        for task in row["crosstask"]:
            items = panels[f"cross-{task}"]
            a = _results(blocks, f"{task}:intact", "crosstask", items)
            b = _results(blocks, f"{task}:{fresh['primary']}", "crosstask", items)
            fresh["crosstask"][task] = clustered_summary(
                [it.cluster for it in items],
                [r.correct for r in a],
                [r.correct for r in b],
                seed=seed,
            ).to_dict()
    return fresh


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None or isinstance(a, bool) or isinstance(b, bool):
            return False
        return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE)
    return a == b


HELDOUT_KEYS = ("n", "n_clusters", "intact_correct", "correct", "rescued", "damaged", "gain",
                "gain_rate", "p_value", "ci_low", "ci_high", "item_p_value", "item_ci_low",
                "item_ci_high")  # fmt: skip
PERCENTILE_KEYS = ("n", "below", "ties", "percentile", "p_value")


def comparisons(row: dict, fresh: dict):
    """(what, in report.json, from the records) for every number of the row."""
    yield "primary set", row["primary"], fresh["primary"]
    if "discovery_gain" in fresh:
        yield "discovery gain", row["discovery_gain"], fresh["discovery_gain"]
        yield "finalists", row["finalists"], fresh["finalists"]
    for key in HELDOUT_KEYS:
        yield f"held-out {key}", row["heldout"].get(key), fresh["heldout"][key]
    for key in ("n", "correct"):
        yield f"intact held-out {key}", row["intact"]["heldout"][key], fresh["intact_heldout"][key]
    # a report written before the continuous metric existed shows "-" there: nothing to check
    lp, flp = row.get("heldout_logprob"), fresh["heldout_logprob"]
    if lp is not None:
        for key in ("mean", "ci_low", "ci_high"):
            yield f"held-out log p change {key}", lp.get(key), (flp or {}).get(key)
    for name in ("nulls", "matched_null"):
        if not row.get(name):
            continue
        keys = PERCENTILE_KEYS + (("budget", "distinct") if name == "matched_null" else ())
        for key in keys:
            yield f"{name} {key}", row[name].get(key), fresh[name].get(key)
        if name == "nulls" and row[name].get("logprob"):
            for key in PERCENTILE_KEYS:
                yield (
                    f"nulls log p {key}",
                    (row[name].get("logprob") or {}).get(key),
                    (fresh[name].get("logprob") or {}).get(key),
                )
    skipped = row.get("matched_null_skipped")
    if skipped:  # --matched-gate: the records' held-out result must fail the recorded gate
        held = fresh["heldout"]
        yield "matched null skip's gain", skipped["gain"], held["gain"]
        yield "matched null skip's p", skipped["p_value"], held["p_value"]
        yield "matched null skip's gate (matched-gate.json)", skipped["gate"], fresh["gate"]
        fails = not (held["gain"] > 0 and held["p_value"] < skipped["gate"])
        yield "matched null skipped by its gate", True, fails
        yield "matched null skipped with no matched records", True, not fresh["matched_started"]
    for task, v in (row.get("crosstask") or {}).items():
        for key in ("gain_rate", "p_value"):
            yield f"cross-task {task} {key}", v.get(key), fresh["crosstask"][task][key]


def verify(summary: dict) -> None:
    """Recompute every row of `summary` (from `summary.summarize`) from its run's records;
    RunDirError naming the first number that differs."""
    from cel_numpy.localize.summary import load_run

    fresh_p = []
    for row in summary["rows"]:
        run_dir = Path(row["dir"])
        manifest = load_run(run_dir)["manifest"]
        fresh = recompute(run_dir, manifest, row)
        for what, reported, recomputed in comparisons(row, fresh):
            if not _same(reported, recomputed):
                raise RunDirError(
                    f"{run_dir}: {what} is {reported!r} in report.json but {recomputed!r} from "
                    "the records (summarize --verify)"
                )
        fresh_p.append(fresh["heldout"]["p_value"])
    for row, q in zip(summary["rows"], holm(fresh_p)):
        if not _same(row["p_holm"], q):
            raise RunDirError(
                f"{row['dir']}: Holm p is {row['p_holm']!r} in the table but {q!r} from the "
                "records (summarize --verify)"
            )
