"""The two-stage localization routine (docs/design.md#protocol) over a resumable run directory.

    baseline   intact model twice on the discovery panel; the two passes must agree exactly
    screen     every head ablated alone, against the baseline; ranked; top 10 nominees.
               screen="gradient": the heads are first ordered by the signed first-order estimate
               of removing each (one forward + backward, `cel_numpy.localize.gradient`, kept in
               gradient.json) and only the top `n_candidates` are evaluated exactly, then ranked
    joint      all pairs and triples of the nominees (165 new + 10 singletons reused = 175),
               ranked with fewer heads first on ties; top 10 finalists frozen in finalists.json
               (ties in the counts broken by the reference answer's log-probability change,
               `tie_break="logprob"`, or by head coordinates as released, "coordinates")
    confirm    finalists re-run on discovery against a fresh intact comparator (no reselection)
    heldout    finalists on the held-out panel (no cluster shared with discovery): the cluster
               sign-flip test and cluster bootstrap interval (primary), exact McNemar and
               Newcombe's interval on items (secondary); `cel_numpy.localize.stats`
    nulls      with null_sets = N > 0: N random head sets of the rank-1 set's size (seeded,
               never the rank-1 set) on the held-out panel: is the found set special?
    matched-pool  with matched_null = R > 0, the selection-matched null: a pool of P random head
               sets of the rank-1 set's size evaluated on discovery against the baseline
    matched-null  R replicates each draw the search's budget (its joint candidates, 175) from the
               pool and keep the best by the joint ranking key; the distinct picks are evaluated
               on held-out once: would a search of the same size over random heads do as well?
               With matched_gate = g, both matched stages run only when the rank-1 set's
               held-out gain is positive with cluster p < g (a fixed-sequence gate: a set not
               shown to beat the intact model needs no comparison with random searches); else
               they are skipped, nothing is written and the report says why (matched records
               already on disk are always run or validated and reported)
    crosstask  finalists on a panel of every other task: does the gain cost elsewhere?
               (exploratory: many sets times many tasks, no correction)
    report     report.json, report.md and figures

`localize(...)` runs up to and including `until`, reusing (after validation) what is on disk;
see `cel_numpy.localize.rundir` for the files and the resume rules.

Models enter only through `make_evaluator(task, reference_items) -> Evaluator`
(`cel_numpy.localize.evaluate`); `reference_items` is the discovery panel (used by mean ablation,
so every task sees the same intervention).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from pathlib import Path

from cel_numpy.errors import UserError
from cel_numpy.limits import check_whole_numbers
from cel_numpy.localize import rundir as rd
from cel_numpy.localize.conditions import (
    INTACT,
    Condition,
    ExampleResult,
    condition_name,
    normalize_condition,
)
from cel_numpy.localize.evaluate import takes_rows
from cel_numpy.localize.metrics import logprob_change, null_percentile
from cel_numpy.localize.progress import Progress
from cel_numpy.localize.ranking import (
    N_FINALISTS,
    N_NOMINEES,
    TIE_BREAKS,
    Scored,
    all_heads,
    best_of_subsamples,
    check_null_sets,
    decided_by,
    draw_null_sets,
    expected_distinct_picks,
    joint_enumeration,
    joint_key,
    nominees,
    rank_joint,
    rank_singletons,
)
from cel_numpy.localize.stats import clustered_summary, paired_summary
from cel_numpy.outdir import prepare_out
from cel_numpy.tasks.base import Item

STAGES = (
    "baseline", "screen", "joint", "confirm", "heldout", "nulls", "matched-pool", "matched-null",
    "crosstask", "report",
)  # fmt: skip
TEST_STAGES = ("heldout", "nulls", "report")  # `test_heads`: a given head set, no search
SCREENS = ("exact", "gradient")
MATCHED_POOL = 700  # default pool of the selection-matched null: 4x the search's 175 candidates
# A chunk (one evaluate_many call, and the unit that is written and resumed) holds at most
# `chunk_size` conditions and at most CHUNK_ITEMS (condition x item) evaluations: 8 conditions on
# a 100-item panel (conditions share each batch's intact pass), 3 on a 500-item one, so that a
# large panel's chunk is written within minutes instead of one 8 x 500 chunk in 40.
CHUNK_ITEMS = 1600
# A chunk on a panel of more than SLICE_ABOVE items (a held-out panel of 300 or 500; discovery
# panels of 100 stay whole) is computed in slices of at most SLICE_ITEMS items (one
# evaluate_many call each, `panel_slices`; the boundaries depend on the panel size alone, so the
# records do not depend on --workers) and written when its last slice is in: a held-out chunk
# keeps every worker busy even when it is the stage's only chunk (a test-heads held-out stage:
# the set and the intact model), and its progress moves per slice.
SLICE_ABOVE = 100
SLICE_ITEMS = 50


def nominee_count(
    n_heads: int, screen: str = "exact", n_candidates: int = 30, n_nominees: int = N_NOMINEES
) -> int:
    """Heads the joint search combines: n_nominees, or fewer when the model (n_heads, every
    head) or the gradient screen's candidates have fewer."""
    screened = n_heads if screen == "exact" else min(n_heads, n_candidates)
    return min(n_nominees, screened)


def search_budget(
    n_heads: int, screen: str = "exact", n_candidates: int = 30, n_nominees: int = N_NOMINEES
) -> int:
    """Candidates the joint search ranks (175 with 10 nominees): the nominees alone, in pairs
    and in triples; the matched null's budget. n_heads counts every head of the model."""
    n = nominee_count(n_heads, screen, n_candidates, n_nominees)
    return n + math.comb(n, 2) + math.comb(n, 3)


def check_matched_pool(pool: int, budget: int, n_heads: int) -> None:
    """--matched-pool smaller than the budget, on a model with enough sets of every size to
    fill the budget: refused before any work (a replicate could not draw its budget)."""
    if pool < budget and n_heads >= budget:
        raise UserError(
            f"--matched-pool {pool} is smaller than the search budget ({budget} candidate "
            f"sets): each replicate draws {budget} sets from the pool; use --matched-pool "
            f">= {budget} (4x the budget or more keeps the replicates apart)"
        )


def evaluation_plan(
    n_heads: int,
    n_discovery: int,
    n_heldout: int,
    *,
    screen: str = "exact",
    n_candidates: int = 30,
    n_nominees: int = N_NOMINEES,
    n_finalists: int = N_FINALISTS,
    null_sets: int = 0,
    matched_null: int = 0,
    matched_pool: int = MATCHED_POOL,
    n_cross_tasks: int = 0,
    set_size: int | None = None,
) -> list[tuple[str, float, int]]:
    """(stage, conditions, items) of every stage that evaluates, in run order: a localization
    makes sum(conditions x items) (condition x item) evaluations. n_heads counts every head of
    the model (layers x heads). The rank-1 set's size is known only after the joint search;
    set_size sizes the matched null's pool (default: the size among 1-3 heads with the most
    sets, so the pool is an upper bound). The matched null's
    held-out picks are an expectation (`expected_distinct_picks`), hence a float. The gradient
    screen's forward + backward passes are not (condition x item) evaluations and are not
    counted."""
    if set_size is None:  # the largest pool any rank-1 size (1 to 3 heads) could draw
        set_size = max(range(1, 4), key=lambda k: math.comb(n_heads, k))
    screened = n_heads if screen == "exact" else min(n_heads, n_candidates)
    nominees = nominee_count(n_heads, screen, n_candidates, n_nominees)
    budget = search_budget(n_heads, screen, n_candidates, n_nominees)
    finalists = min(n_finalists, budget)
    rows = [
        ("baseline", 2, n_discovery),  # the intact model twice: the passes must agree
        ("screen", screened, n_discovery),
        ("joint", budget - nominees, n_discovery),  # the singletons come from the screen
        ("confirm", finalists + 1, n_discovery),
        ("heldout", finalists + 1, n_heldout),
    ]
    if null_sets:
        rows.append(("nulls", null_sets, n_heldout))
    if matched_null:
        pool = min(matched_pool, math.comb(n_heads, set_size))
        picks = expected_distinct_picks(pool, min(budget, pool), matched_null) if pool else 0.0
        rows += [("matched-pool", pool, n_discovery), ("matched-null", picks, n_heldout)]
    if n_cross_tasks:
        rows.append(("crosstask", n_cross_tasks * (finalists + 1), n_heldout))
    return rows


def stage_pace(run_dir) -> tuple[float, str] | None:
    """(wall seconds per (condition x item), "joint" or "screen") of the joint search or the
    screen finished in run_dir (ablated evaluations, as most stages make; the intact baseline
    passes cost far more each); None when neither is finished or readable. A resumed stage's
    done-file holds its last process's time and the records that process found written
    (records_resumed), so the pace is that process's time over the records it evaluated; a
    done-file from before records_resumed was kept counts all records, and reads too fast."""
    for stage in ("joint", "screen"):
        try:
            info = json.loads(rd.stage_paths(run_dir, stage)[1].read_text())
            evaluated = int(info["n_records"]) - int(info.get("records_resumed", 0))
            return float(info["seconds"]) / evaluated, stage
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
            continue
    return None


def cel_numpy_version() -> str:
    try:
        from importlib.metadata import version

        return version("cel-numpy")
    except Exception:  # not installed (running from a checkout)
        return "unknown"


def build_panels(
    task, n_discovery: int, n_heldout: int, seed: int, fold: tuple[int, int] | None = None
) -> tuple[list[Item], list[Item]]:
    """Disjoint discovery and held-out panels of distinct items (`cel_numpy.tasks.make_panels`);
    with fold=(k, K) from fold k of the task's K cluster folds only."""
    from cel_numpy.tasks.panels import make_panels

    try:
        return make_panels(task, n_discovery, n_heldout, seed, fold)
    except ValueError as err:
        raise UserError(str(err)) from None


def cross_seed(seed: int, task_name: str) -> int:
    """The panel seed of a cross task: distinct per task, a pure function of (seed, name)."""
    return (int(seed) << 32) ^ zlib.crc32(task_name.encode())


def cross_panel(task, n: int, seed: int) -> list[Item]:
    """The panel a cross task is evaluated on: the first panel of
    make_panels(task, n, 1, cross_seed)."""
    return build_panels(task, n, 1, cross_seed(seed, task.name))[0]


def run_panels(
    task, cross_tasks, n_discovery: int, n_heldout: int, seed: int, fold=None
) -> dict[str, list[Item]]:
    """Every panel a run evaluates, by name: "discovery", "heldout" (`build_panels`) and
    "cross-NAME" per cross task (`cross_panel`)."""
    discovery, heldout = build_panels(task, n_discovery, n_heldout, seed, fold)
    panels = {"discovery": discovery, "heldout": heldout}
    for t in cross_tasks:
        panels[f"cross-{t.name}"] = cross_panel(t, n_heldout, seed)
    return panels


def options_manifest(
    task,
    cross_tasks,
    panels: dict[str, list[Item]],
    *,
    seed: int,
    n_nominees: int,
    n_finalists: int,
    tie_break: str,
    null_sets: tuple[int, int],
    screen: tuple[str, int],
    fold: tuple[int, int] | None,
    matched: dict | None,
) -> dict:
    """The fields of a run's manifest.json that its task, panels and options decide (not the
    model, which the evaluator describes): written by the routine, and compared by
    `localize --plan` with an existing run directory before any weights are read.

    null_sets = (n, seed); screen = (method, n_candidates), recorded only when not "exact";
    fold = (k, K) or None, recorded only when given, so that runs written before these options
    existed still resume; matched = {"replicates", "pool", "seed"} or None."""
    fields = {
        "task": {
            "name": task.name,
            "scoring": task.scoring,
            "max_new_tokens": getattr(task, "max_new_tokens", None),
            # a task file's sha256 and options: a changed file is a different run
            **(task.identity() if hasattr(task, "identity") else {}),
        },
        "seed": seed,
        "panel_sizes": {name: len(items) for name, items in panels.items()},
        "panel_hashes": {name: rd.items_hash(items) for name, items in panels.items()},
        "n_clusters": {name: len({it.cluster for it in items}) for name, items in panels.items()},
        "cross_tasks": [t.name for t in cross_tasks],
        "n_nominees": n_nominees,
        "n_finalists": n_finalists,
        "tie_break": tie_break,
        "null_sets": {"n": null_sets[0], "seed": null_sets[1]},
    }
    if screen[0] != "exact":
        fields["screen"] = {"method": screen[0], "n_candidates": screen[1]}
    if fold is not None:
        fields["fold"] = {"k": fold[0], "folds": fold[1]}
    if matched is not None:
        fields["matched_null"] = dict(matched)
    return fields


def _roundtrip(obj):
    return json.loads(json.dumps(obj))


def _scored(cond: Condition, comparator: list[ExampleResult], results: list[ExampleResult]) -> dict:
    s = paired_summary([r.correct for r in comparator], [r.correct for r in results])
    return {
        "name": condition_name(cond),
        "heads": [list(h) for h in cond],
        **s.to_dict(),
        "logprob_change": logprob_change(comparator, results),
    }


def _clustered(
    cond: Condition, items: list[Item], comparator: list[ExampleResult], results, seed: int
) -> dict:
    """Held-out statistics of one condition, the cluster as the unit (stats.clustered_summary)."""
    s = clustered_summary(
        [it.cluster for it in items],
        [r.correct for r in comparator],
        [r.correct for r in results],
        seed=seed,
    )
    return {
        "name": condition_name(cond),
        "heads": [list(h) for h in cond],
        **s.to_dict(),
        "logprob_change": logprob_change(comparator, results),
    }


def _as_scored(d: dict) -> Scored:
    return Scored(
        normalize_condition(d["heads"]),
        d["correct"],
        d["rescued"],
        d["damaged"],
        d.get("logprob_change"),
    )


SLOW_HINTS = {  # what to try when a stage's first block predicts a long wait
    "screen-exact": "faster: --screen gradient (first-order pre-filter, then exact on the top "
    "--candidates), or more cores (--workers auto, the default, starts one process per core)",
    "screen-gradient": "faster: fewer --candidates, or more cores (--workers auto, the default, "
    "starts one process per core)",
}


def describe_single_process() -> str:
    """The plan of a run without workers, for the time estimate."""
    from cel_numpy.localize.workers import blas_threads

    n = blas_threads()
    return f"1 process, {n} BLAS thread{'s' * (n != 1)}"


def chunk_blocks(
    blocks: Sequence[rd.Block], panel_sizes: dict[str, int], chunk_size: int, chunk_items: int
) -> list[list[rd.Block]]:
    """Split `blocks` (in order) into runs on one panel of at most `chunk_size` conditions and
    at most `chunk_items` (condition x item) evaluations, and never less than one condition.

    A run of consecutive blocks on one panel is cut into as few chunks as those limits allow,
    of nearly equal size: a confirm stage's 11 conditions on 100 items give 5 + 6, not 8 + 3,
    so that two workers finish together (the 8 + 3 split kept one idle for 5/8 of the stage)."""
    chunks: list[list[rd.Block]] = []
    for panel, run in itertools.groupby(blocks, key=lambda block: block.panel):
        run = list(run)
        per_chunk = max(1, min(chunk_size, chunk_items // max(1, panel_sizes[panel])))
        chunks += [run[rows.start : rows.stop] for rows in panel_slices(len(run), per_chunk)]
    return chunks


def item_text_length(item) -> int:
    """Characters an evaluation of `item` reads (prompt, and its choices or answer): what a
    stage's time estimate weighs its pieces by. A HellaSwag held-out panel's first 150 items hold
    half the text per item of its last 350, so an estimate from its first piece, counting
    evaluations alone, said 1 h 50 min for a Gemma 3 nulls stage whose ETA after its first 10%
    was 4 h 20 min."""
    return len(item.prompt) + (sum(map(len, item.choices)) if item.choices else len(item.answer))


def panel_slices(n_items: int, slice_items: int) -> list[range]:
    """The rows of an n-item panel in consecutive slices of nearly equal size, none larger than
    slice_items: 500 items at 50 -> ten of 50; 250 at 100 -> 83, 83, 84."""
    n_slices = max(1, -(-n_items // max(1, slice_items)))
    bounds = [n_items * k // n_slices for k in range(n_slices + 1)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def join_slices(pieces: Sequence[list[list[ExampleResult]]]) -> list[list[ExampleResult]]:
    """A chunk's results from its slices' results (each: per condition, the slice's items in
    order): per condition, every slice's items in order."""
    return [[r for part in per_condition for r in part] for per_condition in zip(*pieces)]


def evaluate_chunk(evaluator, items, conditions, rows=None):
    """What an executor runs: `evaluator.evaluate_many(items, conditions)`, or for the slice
    `rows` of the panel `items` (picklable by reference)."""
    if rows is None:
        return evaluator.evaluate_many(items, conditions)
    return evaluator.evaluate_many(items, conditions, rows=rows)


def _as_task(task):
    """A task object, or one named: a registered task, hellaswag/boolq, a .jsonl task file."""
    if isinstance(task, (str, Path)):
        from cel_numpy.tasks import get_task

        return get_task(str(task))
    return task


class Localizer:
    """One run of the routine in one run directory (see the module docstring).

    `task` (and each of `cross_tasks`) is a task object or a name `cel_numpy.tasks.get_task`
    knows: a registered task, "hellaswag", "boolq", or the path of a .jsonl task file."""

    def __init__(
        self,
        out,
        make_evaluator: Callable,
        task,
        *,
        n_discovery: int,
        n_heldout: int,
        seed: int = 0,
        cross_tasks: Sequence = (),
        executor: Executor | None = None,
        chunk_size: int = 8,
        chunk_items: int = CHUNK_ITEMS,
        slice_items: int = SLICE_ITEMS,
        progress: bool = True,
        command: str | None = None,
        n_nominees: int = N_NOMINEES,
        n_finalists: int = N_FINALISTS,
        stream=None,
        screen: str = "exact",
        n_candidates: int = 30,
        tie_break: str = "logprob",
        null_sets: int = 0,
        null_seed: int | None = None,
        fold: tuple[int, int] | None = None,
        matched_null: int = 0,
        matched_pool: int = MATCHED_POOL,
        matched_seed: int | None = None,
        matched_gate: float | None = None,
        gradient_agreement: bool = False,
    ):
        optional_seeds = {"null_seed": null_seed, "matched_seed": matched_seed}
        check_whole_numbers(  # a 2.5 or a "1" would be truncated or fail deep inside
            n_discovery=(n_discovery, 1),
            n_heldout=(n_heldout, 1),
            seed=(seed, 0),
            null_sets=(null_sets, 0),
            **{name: (v, 0) for name, v in optional_seeds.items() if v is not None},
            matched_null=(matched_null, 0),
            matched_pool=(matched_pool, 1),
            n_nominees=(n_nominees, 1),
            n_finalists=(n_finalists, 1),
            n_candidates=(n_candidates, 1),
            chunk_size=(chunk_size, 1),
            chunk_items=(chunk_items, 1),
            slice_items=(slice_items, 1),
        )
        if screen not in SCREENS:
            raise UserError(f"screen must be one of {', '.join(SCREENS)}, got {screen!r}")
        if n_candidates < n_nominees:
            raise UserError(
                f"--candidates must be >= the {n_nominees} nominees, got {n_candidates}"
            )
        if tie_break not in TIE_BREAKS:
            raise UserError(
                f"--tie-break must be one of {', '.join(TIE_BREAKS)}, got {tie_break!r}"
            )
        if matched_gate is not None and not 0 < matched_gate <= 1:
            raise UserError(f"--matched-gate must be in (0, 1], got {matched_gate}")
        self.matched = {
            "replicates": int(matched_null),
            "pool": int(matched_pool),
            "seed": int(seed if matched_seed is None else matched_seed),
        }
        # not in the manifest: the gate changes which stages run, never a record, so a run
        # may adopt it when resumed (and dropping it later runs the matched stages)
        self.matched_gate = None if matched_gate is None else float(matched_gate)
        self.gradient_agreement = bool(gradient_agreement)
        self.tie_break = tie_break
        self.fold = None if fold is None else (int(fold[0]), int(fold[1]))
        self.null_sets = int(null_sets)
        self.null_seed = int(seed if null_seed is None else null_seed)
        self.screen_method, self.n_candidates = screen, int(n_candidates)
        self.out = prepare_out(out)
        self.make_evaluator = make_evaluator
        task, cross_tasks = _as_task(task), [_as_task(t) for t in cross_tasks]
        self.task = task
        self.cross_tasks = [t for t in cross_tasks if t.name != task.name]
        self.n_discovery, self.n_heldout, self.seed = int(n_discovery), int(n_heldout), int(seed)
        self.executor = executor
        self.chunk_size = int(chunk_size)
        self.chunk_items = int(chunk_items)
        self.slice_items = int(slice_items)
        self.progress = progress
        self.stream = stream if stream is not None else sys.stderr
        self.command = command if command is not None else " ".join(sys.argv)
        self.n_nominees, self.n_finalists = int(n_nominees), int(n_finalists)
        self.results: dict[str, dict] = {}  # stage -> summary
        self.blocks: dict[str, list[list[ExampleResult]]] = {}  # stage -> results per block

    # ------------------------------------------------------------------ setup

    def _say(self, msg: str) -> None:
        if self.progress:
            print(msg, file=self.stream, flush=True)

    def _setup(self) -> None:
        self.panels = run_panels(
            self.task, self.cross_tasks, self.n_discovery, self.n_heldout, self.seed, self.fold
        )
        discovery, heldout = self.panels["discovery"], self.panels["heldout"]
        if {it.cluster for it in discovery} & {it.cluster for it in heldout}:
            raise RuntimeError(  # build_panels guarantees not
                "discovery and held-out panels share a cluster"
            )
        self.evaluators = {"discovery": self.make_evaluator(self.task, discovery)}
        self.evaluators["heldout"] = self.evaluators["discovery"]
        ev = self.evaluators["discovery"]
        self.n_layers, self.n_heads = int(ev.n_layers), int(ev.n_heads)
        self._check_model()  # before anything is written
        if self.gradient_agreement and not hasattr(ev, "continuation_ids"):
            raise UserError(
                "--gradient-agreement needs a language model (the first-order estimate's "
                "backward pass)"
            )
        check_null_sets(self.null_sets, self.n_layers, self.n_heads, self._null_set_size())
        with_matched = self.matched["replicates"] and "matched-null" in self.stages
        manifest = {
            "format": rd.FORMAT,
            "kind": self.kind,
            "model": ev.identity(),
            **options_manifest(
                self.task,
                self.cross_tasks,
                self.panels,
                seed=self.seed,
                n_nominees=self.n_nominees,
                n_finalists=self.n_finalists,
                tie_break=self.tie_break,
                null_sets=(self.null_sets, self.null_seed),
                screen=(self.screen_method, self.n_candidates),
                fold=self.fold,
                matched=self.matched if with_matched else None,
            ),
            **self._extra_manifest(),
            **({"task_file": str(self.task.path)} if hasattr(self.task, "path") else {}),
            "cel_numpy_version": cel_numpy_version(),
            "command": self.command,
        }
        if with_matched:
            self._check_matched_pool()
        if hasattr(ev, "prompts_sha256"):  # language models: the texts the model reads
            tasks = {"discovery": self.task, "heldout": self.task}
            tasks.update({f"cross-{t.name}": t for t in self.cross_tasks})
            manifest["prompt_hashes"] = {
                name: ev.prompts_sha256(tasks[name], items) for name, items in self.panels.items()
            }
        self.manifest = rd.check_or_write_manifest(self.out, manifest)
        for name, items in self.panels.items():
            path = self.out / "panels" / f"{name}.jsonl"
            if path.exists():
                if rd.items_hash(rd.read_panel(path)) != self.manifest["panel_hashes"][name]:
                    raise rd.RunDirError(f"{path} does not match manifest.json; use a fresh --out")
            else:
                rd.write_panel(path, items)

        if "matched_null" in manifest:
            gate = self.matched_gate
            when = "" if gate is None else f"; run only if the held-out gain passes {gate:g}"
            self._say(self._matched_price() + when)
            self._record_gate()

    kind = "localize"

    def _search_budget(self) -> int:
        return search_budget(
            self.n_layers * self.n_heads, self.screen_method, self.n_candidates, self.n_nominees
        )

    def _check_matched_pool(self) -> None:
        check_matched_pool(
            self.matched["pool"], self._search_budget(), self.n_layers * self.n_heads
        )

    def _matched_price(self, size: int | None = None) -> str:
        """The matched null's cost in (condition x item) evaluations, said before it runs."""
        search_budget, reps = self._search_budget(), self.matched["replicates"]
        n_heads = self.n_layers * self.n_heads
        sizes = [size] if size is not None else [1, 2, 3]  # the rank-1 set's size, once known
        pool = max(min(self.matched["pool"], math.comb(n_heads, k)) for k in sizes)
        budget = min(search_budget, pool)
        picks = expected_distinct_picks(pool, budget, reps)
        at_most = min(reps, pool - budget + 1)
        disc, held = self.n_discovery, self.n_heldout
        plan = evaluation_plan(
            n_heads, disc, held, screen=self.screen_method, n_candidates=self.n_candidates,
            n_nominees=self.n_nominees,
        )  # fmt: skip
        search = sum(c * n for stage, c, n in plan if stage in ("screen", "joint"))
        cost = pool * disc + picks * held
        text = (
            f"matched null: {pool} pool sets x {disc} discovery items + about {picks:.0f} "
            f"picked sets (at most {at_most}) x {held} held-out items = about {cost:,.0f} "
            f"evaluations (condition x item); the search's screen and joint stages: {search:,}"
        )
        rate = self._seconds_per_evaluation()
        if rate:
            text += f"; about {cost * rate[0] / 60:.0f} min at the {rate[1]}'s pace"
        return text

    def _seconds_per_evaluation(self) -> tuple[float, str] | None:
        return stage_pace(self.out)

    def _extra_manifest(self) -> dict:
        return {}

    def _check_model(self) -> None:
        pass

    def _null_set_size(self) -> int | None:
        """Heads per null set, when known before the search (None: the rank-1 set's size)."""
        return None

    def _evaluator_for(self, panel: str):
        if panel not in self.evaluators:
            task = next(t for t in self.cross_tasks if f"cross-{t.name}" == panel)
            self.evaluators[panel] = self.make_evaluator(task, self.panels["discovery"])
        return self.evaluators[panel]

    # ------------------------------------------------------------------ one resumable stage

    def _slices(self, chunk: list[rd.Block]) -> list[range | None]:
        """How a chunk is computed: whole ([None]), or in slices of at most `slice_items` of its
        panel's rows when the panel holds more than SLICE_ABOVE items and the evaluator can
        take a slice."""
        n_items = len(self.panels[chunk[0].panel])
        if n_items <= SLICE_ABOVE or not takes_rows(self._evaluator_for(chunk[0].panel)):
            return [None]
        return panel_slices(n_items, self.slice_items)

    def _run_stage(
        self,
        stage: str,
        plan: list[rd.Block],
        depends: dict[str, str],
        summarize: Callable,
        label: str | None = None,
    ):
        """Evaluate `plan` (or validate what is on disk), write the done-file, return
        (blocks, summary)."""
        records, done = rd.stage_paths(self.out, stage)
        if done.exists():
            blocks, info = rd.validate_done(
                self.out, stage, plan, self.panels, self.manifest, depends
            )
            summary = summarize(blocks)
            if info.get("summary") != _roundtrip(summary):
                raise rd.RunDirError(
                    f"{done}: summary does not match its records; {rd._fresh_hint(stage)}"
                )
            if records.exists():  # finished by a cel-numpy that kept no compressed copy
                rd.compress_records(self.out, stage)
            self._say(
                f"{stage:<10} done earlier: validated {stage}.jsonl ({info['n_records']} records)"
            )
            self.blocks[stage] = blocks
            return blocks, summary
        blocks: list[list[ExampleResult]] = []
        if records.exists():
            blocks, good_bytes, dropped = rd.read_blocks(
                records, plan, self.panels, stage, complete=False
            )
            blocks, good_bytes, dropped = rd.check_sums(
                self.out, stage, plan, blocks, good_bytes, dropped
            )
            with open(records, "r+b") as fh:
                fh.truncate(good_bytes)
            self._say(
                f"{stage:<10} resuming after {len(blocks)} of {len(plan)} conditions"
                + (f" (dropped {dropped} lines of an incomplete block)" if dropped else "")
            )
        else:
            rd.sums_path(self.out, stage).unlink(missing_ok=True)  # of records deleted to redo
        started = time.monotonic()
        records_resumed = sum(len(b) for b in blocks)
        remaining = plan[len(blocks) :]
        chunks = chunk_blocks(
            remaining,
            {name: len(items) for name, items in self.panels.items()},
            self.chunk_size,
            self.chunk_items,
        )
        # what is computed: each chunk whole, or slice by slice (a large panel; `SLICE_ITEMS`)
        tasks = [(k, rows) for k, chunk in enumerate(chunks) for rows in self._slices(chunk)]

        def work(k, rows) -> int:
            """Task (k, rows)'s cost for the estimates: its items' text x its conditions."""
            items = self.panels[chunks[k][0].panel]
            items = items if rows is None else items[rows.start : rows.stop]
            return len(chunks[k]) * sum(map(item_text_length, items))

        bar = Progress(
            label or stage,
            sum(len(self.panels[b.panel]) for b in remaining),
            stream=self.stream,
            enabled=self.progress and label is not None,
            slow_hint=SLOW_HINTS.get(
                stage if stage != "screen" else f"screen-{self.screen_method}"
            ),
            plan=self._plan(),
            parallel=min(getattr(self.executor, "n_workers", 1), max(len(tasks), 1)),
            unit="evaluations",
            total_work=sum(work(k, rows) for k, rows in tasks),
        )

        def chunk_args(k, rows):
            """evaluate_chunk's arguments for slice `rows` (None: all) of chunk k."""
            panel = chunks[k][0].panel
            return (
                self._evaluator_for(panel),
                self.panels[panel],
                [b.condition for b in chunks[k]],
                rows,
            )

        if self.executor is not None:
            for chunk in chunks:  # evaluators are created here, before any worker needs them
                self._evaluator_for(chunk[0].panel)
            # a WorkerPool: no more workers than pieces of work
            if tasks and hasattr(self.executor, "plan"):
                self.executor.plan(len(tasks))
            # a module-level function and picklable arguments: works with thread, process and
            # cluster executors (Dask's Client.get_executor()) alike
            futures = [
                self.executor.submit(evaluate_chunk, *chunk_args(k, rows)) for k, rows in tasks
            ]
            results_iter = (f.result() for f in futures)
        else:
            results_iter = (evaluate_chunk(*chunk_args(k, rows)) for k, rows in tasks)
        pieces: list[list[list[ExampleResult]]] = []  # the slices of the chunk being assembled
        with bar, open(records, "ab") as fh:  # `with bar`: a silent stage still says it works
            for (k, rows), results in zip(tasks, results_iter):
                chunk = chunks[k]
                if len(results) != len(chunk):
                    raise RuntimeError(
                        f"evaluator returned {len(results)} result lists "
                        f"for {len(chunk)} conditions"
                    )
                pieces.append(results)
                n_items = len(self.panels[chunk[0].panel])
                bar.update(len(chunk) * (n_items if rows is None else len(rows)), work(k, rows))
                if rows is not None and rows.stop < n_items:
                    continue  # the chunk's later slices are still to come
                results, pieces = join_slices(pieces), []
                text, sums = [], []
                for block, res in zip(chunk, results):
                    ids = [it.id for it in self.panels[block.panel]]
                    if [r.item_id for r in res] != ids:
                        raise RuntimeError(
                            f"evaluator results for {block.name} are not in panel order"
                        )
                    lines = "".join(rd.record_line(block, r) for r in res)
                    text.append(lines)
                    sums.append(rd.sum_line(block, lines))
                    blocks.append(res)
                with rd.writing(records):  # a full disk names the file
                    fh.write("".join(text).encode())
                    fh.flush()
                    os.fsync(fh.fileno())
                # after the records: a block with a checksum is whole
                rd.append_sums(self.out, stage, sums)
        summary = summarize(blocks)
        rd.write_done(
            self.out,
            stage,
            sum(len(b) for b in blocks),
            len(plan),
            self.manifest,
            depends,
            summary,
            seconds=time.monotonic() - started,
            records_resumed=records_resumed,
        )
        rd.compress_records(self.out, stage)
        self.blocks[stage] = blocks
        return blocks, summary

    # ------------------------------------------------------------------ the stages

    def baseline(self):
        plan = [
            rd.Block("intact#1", "discovery", INTACT),
            rd.Block("intact#2", "discovery", INTACT),
        ]
        items = self.panels["discovery"]

        def summarize(blocks):
            first, second = blocks
            diffs = [(it.id, a, b) for it, a, b in zip(items, first, second) if a != b]
            if diffs:
                item, a, b = diffs[0]
                raise UserError(
                    f"baseline: the two intact passes disagree on {len(diffs)} of {len(items)} "
                    f"discovery examples (first: item {item}: {a.answer!r}/{a.correct} vs "
                    f"{b.answer!r}/{b.correct}); evaluation must be deterministic"
                )
            return {"n": len(items), "correct": sum(r.correct for r in first), "agree": True}

        old_chunk, self.chunk_size = self.chunk_size, 1  # two separate evaluations, never shared
        try:
            blocks, summary = self._run_stage("baseline", plan, {}, summarize)
        finally:
            self.chunk_size = old_chunk
        self.intact = blocks[0]
        self._say(
            f"baseline   intact {summary['correct']}/{summary['n']} correct on discovery "
            "(two passes agree)"
        )
        return summary

    def _plan(self) -> str:
        """How the stages run (workers and BLAS threads), printed with the time estimate."""
        if self.executor is None:
            return describe_single_process()
        return getattr(self.executor, "describe", lambda: "")()

    def _gradient_estimates(self) -> tuple[list[list[float]], str]:
        """Estimated gain of removing each head (L, H), computed once and kept in gradient.json."""
        from cel_numpy.models.fetch import sha256_file

        path = self.out / "gradient.json"
        if not path.exists():
            ev = self.evaluators["discovery"]
            if not hasattr(ev, "continuation_ids"):
                raise UserError(
                    "--screen gradient needs a language model (its backward pass); "
                    "use --screen exact"
                )
            if getattr(ev, "ablation", "zero") == "resample":
                raise UserError(
                    "--screen gradient estimates zero or mean ablation, not resample ablation "
                    "(a fill per item); use --screen exact"
                )
            from cel_numpy.localize.gradient import gradient_screen

            self._say("screen     gradient pre-filter: one forward + backward per batch")
            metric, estimate = gradient_screen(
                ev, self.panels["discovery"], batch_size=getattr(ev, "batch_size", 16)
            )
            rd.json_dump(
                path,
                {
                    "manifest_key": rd.manifest_key(self.manifest),
                    "metric_intact": metric,
                    "estimate": estimate.tolist(),
                },
            )
        try:
            saved = rd.read_json_object(path, rd._fresh_hint("screen"))
            estimate = saved["estimate"]
            ok = (
                saved["manifest_key"]
                in (rd.manifest_key(self.manifest), rd.manifest_key(self.manifest, True))
                and len(estimate) == self.n_layers
                and all(len(row) == self.n_heads for row in estimate)
            )
        except (OSError, ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise rd.RunDirError(
                f"{path} is unreadable or belongs to another run; use a fresh --out"
            )
        return estimate, sha256_file(path)

    def screen(self):
        heads = all_heads(self.n_layers, self.n_heads)
        depends = {"baseline": rd.records_sha(self.out, "baseline")}
        note = ""
        if self.screen_method == "gradient" and self.n_candidates < len(heads):
            estimate, depends["gradient"] = self._gradient_estimates()
            # stable on ties
            order = sorted(range(len(heads)), key=lambda i: -estimate[heads[i][0]][heads[i][1]])
            heads = sorted(heads[i] for i in order[: self.n_candidates])
            note = (
                f"gradient pre-filter: the {len(heads)} heads with the largest first-order "
                f"estimated gain (of {self.n_layers * self.n_heads}) were screened exactly; "
                "estimates in gradient.json"
            )
        plan = [rd.Block(condition_name(((l, h),)), "discovery", ((l, h),)) for l, h in heads]
        n_nom = min(self.n_nominees, len(heads))

        def summarize(blocks):
            conds = [_scored(b.condition, self.intact, res) for b, res in zip(plan, blocks)]
            ranked = rank_singletons([_as_scored(c) for c in conds], self.tie_break)
            return {
                "conditions": conds,
                "ranking": [condition_name(s.heads) for s in ranked],
                "nominees": [list(h) for h in nominees(ranked, n_nom)],
                "tie_break": self.tie_break,
                "decided_by": decided_by(ranked, n_nom, joint=False, tie_break=self.tie_break),
                "n_heads_total": self.n_layers * self.n_heads,
                "note": note
                or (
                    ""
                    if len(heads) >= self.n_nominees
                    else f"the model has only {len(heads)} heads (< {self.n_nominees}): "
                    "all of them are nominees"
                ),
            }

        _, summary = self._run_stage("screen", plan, depends, summarize, label="screen")
        self.nominees = [tuple(h) for h in summary["nominees"]]
        if self.gradient_agreement:  # the estimate beside the exact screen, for the report
            self._gradient_estimates()
        return summary

    def screen_agreement(self) -> dict | None:
        """The gradient pre-filter against the exact screen (`cel_numpy.localize.agreement`),
        when gradient.json exists (--screen gradient, or --gradient-agreement)."""
        from cel_numpy.localize.agreement import screen_agreement

        if not (self.out / "gradient.json").exists():
            return None
        estimate, _ = self._gradient_estimates()
        screen = self.results["screen"]
        return screen_agreement(estimate, screen["conditions"], screen["nominees"])

    def joint(self):
        screen = self.results["screen"]
        singles, new = joint_enumeration(self.nominees)
        plan = [rd.Block(condition_name(c), "discovery", c) for c in new]
        by_name = {c["name"]: c for c in screen["conditions"]}
        reused = [by_name[condition_name(c)] for c in singles]

        def summarize(blocks):
            conds = [_scored(b.condition, self.intact, res) for b, res in zip(plan, blocks)]
            ranked = rank_joint([_as_scored(c) for c in reused + conds], self.tie_break)
            finalists = ranked[: self.n_finalists]
            return {
                "conditions": conds,
                "n_candidates": len(reused) + len(conds),
                "ranking": [condition_name(s.heads) for s in ranked],
                "finalists": [[list(h) for h in s.heads] for s in finalists],
                "tie_break": self.tie_break,
                "decided_by": decided_by(
                    ranked, self.n_finalists, joint=True, tie_break=self.tie_break
                ),
            }

        depends = {
            "baseline": rd.records_sha(self.out, "baseline"),
            "screen": rd.records_sha(self.out, "screen"),
        }
        _, summary = self._run_stage("joint", plan, depends, summarize, label="joint")
        frozen = {
            "finalists": summary["finalists"],
            "names": summary["ranking"][: self.n_finalists],
            "joint_sha256": rd.records_sha(self.out, "joint"),
        }
        path = self.out / "finalists.json"
        if path.exists():
            on_disk = rd.read_json_object(path, rd._fresh_hint("joint"))
            if on_disk != frozen:
                raise rd.RunDirError(
                    f"{path} does not match the joint search records; {rd._fresh_hint('joint')}"
                )
        else:
            rd.json_dump(path, frozen)
        self.finalists = [normalize_condition(f) for f in summary["finalists"]]
        return summary

    def _finalist_stage(self, stage: str, panels: list[tuple[str, str]], depends_on: Sequence[str]):
        """Intact + every finalist on each (block-name prefix, panel); paired summaries against that
        intact: item-level on discovery, the cluster as the unit on held-out and
        cross-task panels."""
        plan, groups = [], []
        for prefix, panel in panels:
            names = [f"{prefix}intact"] + [f"{prefix}{condition_name(f)}" for f in self.finalists]
            conds = [INTACT] + list(self.finalists)
            group = [rd.Block(n, panel, c) for n, c in zip(names, conds)]
            groups.append((panel, group))
            plan.extend(group)

        def summarize(blocks):
            out, i = {}, 0
            for panel, group in groups:
                res = blocks[i : i + len(group)]
                i += len(group)
                intact = res[0]
                items = self.panels[panel]

                def score(cond, r, intact=intact, items=items, panel=panel):
                    if panel == "discovery":
                        return _scored(cond, intact, r)
                    return _clustered(cond, items, intact, r, self.seed)

                out[panel] = {
                    "n": len(intact),
                    "n_clusters": len({it.cluster for it in items}),
                    "intact_correct": sum(r.correct for r in intact),
                    "finalists": [
                        {"rank": k + 1, **score(b.condition, r)}
                        for k, (b, r) in enumerate(zip(group[1:], res[1:]))
                    ],
                }
            return out

        depends = {s: rd.records_sha(self.out, s) for s in depends_on}
        blocks, summary = self._run_stage(stage, plan, depends, summarize, label=stage)
        return blocks, summary

    def confirm(self):
        blocks, summary = self._finalist_stage(
            "confirm", [("", "discovery")], ["baseline", "joint"]
        )
        pairs = list(zip(blocks[0], self.intact)) if blocks else []
        summary["discovery"]["intact_matches_baseline"] = all(a == b for a, b in pairs)
        # Which way it differs: answers (a real difference) or only the reference answer's
        # log-probability (float rounding, e.g. another --batch-size, never a verdict).
        summary["discovery"]["intact_answers_differ"] = sum(
            (a.answer, a.correct) != (b.answer, b.correct) for a, b in pairs
        )
        gaps = [
            abs(a.ref_logprob - b.ref_logprob)
            for a, b in pairs
            if a.ref_logprob is not None and b.ref_logprob is not None
        ]
        summary["discovery"]["intact_logprob_max_diff"] = max(gaps, default=0.0)
        return summary

    def heldout(self):
        blocks, summary = self._finalist_stage("heldout", [("", "heldout")], self._heldout_depends)
        self.heldout_blocks = blocks
        self.heldout_intact = blocks[0]
        return summary

    _heldout_depends = ("joint",)

    def nulls(self):
        """N random head sets of the rank-1 set's size on the held-out panel, against the held-out
        stage's intact block (recorded seed; never the rank-1 set; distinct)."""
        primary = self.finalists[0]
        plan = []
        if self.null_sets:
            try:
                sets = draw_null_sets(
                    self.n_layers,
                    self.n_heads,
                    len(primary),
                    self.null_sets,
                    self.null_seed,
                    exclude=primary,
                )
            except ValueError as err:
                raise UserError(f"--null-sets: {err}") from None
            plan = [rd.Block(f"null:{condition_name(c)}", "heldout", c) for c in sets]
        items = self.panels["heldout"]
        primary_gain = self.results["heldout"]["heldout"]["finalists"][0]["gain"]

        def summarize(blocks):
            sets = [
                _clustered(b.condition, items, self.heldout_intact, r, self.seed)
                for b, r in zip(plan, blocks)
            ]
            return {
                "primary": condition_name(primary),
                "seed": self.null_seed,
                "size": len(primary),
                "sets": sets,
                "primary_gain": primary_gain,
                **null_percentile(primary_gain, [s["gain"] for s in sets]),
            }

        depends = {"heldout": rd.records_sha(self.out, "heldout")}
        _, summary = self._run_stage("nulls", plan, depends, summarize, label="nulls")
        return summary

    def _matched_on(self) -> bool:
        return bool(self.manifest.get("matched_null", {}).get("replicates"))

    def _record_gate(self) -> None:
        """--matched-gate is recorded in matched-gate.json when first given, and only before
        the held-out result exists (so a gate cannot be chosen after seeing it); dropping it
        is always allowed (the matched stages then run)."""
        if self.matched_gate is None or not self._matched_on():
            return
        path = rd.gate_path(self.out)
        recorded = None
        if path.exists():
            recorded = rd.read_json_object(path, "delete it to record the gate again")
        if recorded is not None and recorded.get("gate") == self.matched_gate:
            return
        if rd.stage_paths(self.out, "heldout")[1].exists():
            there = "" if recorded is None else f" (recorded: {recorded.get('gate')})"
            other = (
                "" if recorded is None else f", or with the recorded one ({recorded.get('gate')})"
            )
            raise UserError(
                f"--matched-gate {self.matched_gate:g} is given after the held-out result "
                f"exists{there}: a gate must be fixed before the result it gates; run "
                f"without it (the matched null then runs){other}"
            )
        rd.json_dump(path, {"gate": self.matched_gate, "set_before": "heldout"})

    def _matched_gate_verdict(self) -> dict | None:
        """None when the matched stages run (no gate, the rank-1 set's held-out gain positive
        with cluster p below it, or their records already on disk, which are then validated
        and reported as usual); else why they do not: {gate, gain, p_value}."""
        if self.matched_gate is None:
            return None
        if any(rd.stage_started(self.out, s) for s in ("matched-pool", "matched-null")):
            return None
        primary = self.results["heldout"]["heldout"]["finalists"][0]
        gain, p = primary["gain"], primary["p_value"]
        if gain > 0 and p < self.matched_gate:
            return None
        return {"gate": self.matched_gate, "gain": gain, "p_value": p}

    def matched_pool(self):
        """The selection-matched null's pool: random sets of the rank-1 set's size on discovery,
        against the baseline (uniform over all sets of that size, the rank-1 set included: a
        random search may find it too), seeded; none when --matched-null is 0."""
        if not self._matched_on():
            return None
        skipped = self._matched_gate_verdict()
        if skipped is not None:
            self._say(
                f"matched    not run: the rank-1 set's held-out gain {skipped['gain']:+d} "
                f"(cluster p = {skipped['p_value']:.3g}) does not pass --matched-gate "
                f"{skipped['gate']:g}"
            )
            return {"skipped": skipped}
        size = len(self.finalists[0])
        n_sets = min(self.matched["pool"], math.comb(self.n_layers * self.n_heads, size))
        if not rd.stage_paths(self.out, "matched-pool")[1].exists():
            self._say(self._matched_price(size))
        sets = draw_null_sets(
            self.n_layers, self.n_heads, size, n_sets, self.matched["seed"], exclude=()
        )
        plan = [rd.Block(f"pool:{condition_name(c)}", "discovery", c) for c in sets]

        def summarize(blocks):
            return {
                "size": size,
                "seed": self.matched["seed"],
                "budget": min(self._search_budget(), n_sets),
                "conditions": [_scored(b.condition, self.intact, r) for b, r in zip(plan, blocks)],
            }

        depends = {s: rd.records_sha(self.out, s) for s in ("baseline", "joint")}
        _, summary = self._run_stage("matched-pool", plan, depends, summarize, label="pool")
        return summary

    def matched_null(self):
        """R replicates of "the best of `budget` random sets by the search's ranking key", drawn
        from the pool; each distinct pick evaluated once on held-out against the held-out
        intact pass. The primary set's held-out gain is placed among the R picks' gains."""
        pool = self.results.get("matched-pool")
        if not pool:
            return None
        if "skipped" in pool:
            return pool
        scored = [_as_scored(c) for c in pool["conditions"]]
        order = sorted(range(len(scored)), key=lambda i: joint_key(scored[i], self.tie_break))
        position = [0] * len(scored)
        for rank, i in enumerate(order):
            position[i] = rank
        reps = self.matched["replicates"]
        picks = best_of_subsamples(
            position, len(scored), pool["budget"], reps, self.matched["seed"]
        )
        times = Counter(picks)
        distinct = sorted(times, key=lambda i: position[i])  # best pool rank first
        plan = [
            rd.Block(f"matched:{condition_name(scored[i].heads)}", "heldout", scored[i].heads)
            for i in distinct
        ]
        items = self.panels["heldout"]
        primary = self.results["heldout"]["heldout"]["finalists"][0]

        def summarize(blocks):
            sets = [
                {
                    **_clustered(b.condition, items, self.heldout_intact, r, self.seed),
                    "times": times[i],
                    "pool_rank": position[i] + 1,
                    "discovery_gain": scored[i].gain,
                }
                for i, b, r in zip(distinct, plan, blocks)
            ]
            gains = [s["gain"] for s in sets for _ in range(s["times"])]
            return {
                "primary": primary["name"],
                "size": pool["size"],
                "budget": pool["budget"],
                "pool": len(scored),
                "replicates": reps,
                "seed": self.matched["seed"],
                "distinct": len(sets),
                "sets": sets,
                "primary_gain": primary["gain"],
                **null_percentile(primary["gain"], gains),
            }

        depends = {s: rd.records_sha(self.out, s) for s in ("matched-pool", "heldout")}
        _, summary = self._run_stage("matched-null", plan, depends, summarize, label="matched")
        return summary

    def crosstask(self):
        pairs = [(f"{t.name}:", f"cross-{t.name}") for t in self.cross_tasks]
        _, summary = self._finalist_stage("crosstask", pairs, ["joint"])
        return summary

    def report(self):
        from cel_numpy.localize.report import write_report

        return write_report(self)

    def stage_seconds(self) -> dict[str, float | None]:
        """Wall time of each finished stage (its done-file), as recorded by the process
        that ran it."""
        out = {}
        for stage in self.stages:
            done = rd.stage_paths(self.out, stage)[1]
            if done.exists():
                out[stage] = rd.read_json_object(done, rd._fresh_hint(stage)).get("seconds")
        return out

    # ------------------------------------------------------------------ driver

    def run(self, until: str = "report") -> dict:
        """Run (or validate) every stage up to and including `until`; returns {stage: summary}."""
        stages = self.stages
        if until not in stages:
            raise UserError(f"unknown stage {until!r}; stages: {', '.join(stages)}")
        with rd.Lock(self.out):
            self._setup()
            for stage in stages[: stages.index(until) + 1]:
                self.results[stage] = getattr(self, stage.replace("-", "_"))()
        return self.results

    stages = STAGES


class HeadSetTest(Localizer):
    """The held-out test of a given head set, with the routine's own held-out (and null-set)
    stages and statistics: `cel-numpy test-heads`.

    The panels are the ones `localize` builds for the same (task, n_discovery, n_heldout, seed):
    with a run's seed this re-tests its set on its own held-out panel, with a fresh seed on a
    panel no run has used. The discovery panel is written too (mean ablation averages over it)
    but never evaluated. Stages: heldout, nulls, report; resumable like the routine's.
    """

    kind = "test-heads"
    stages = TEST_STAGES
    _heldout_depends = ()

    def __init__(self, out, make_evaluator, task, heads, **kwargs):
        kwargs.setdefault("n_discovery", 100)
        super().__init__(out, make_evaluator, task, cross_tasks=(), **kwargs)
        self.heads = normalize_condition(heads)
        if not self.heads:
            raise UserError("--heads: name at least one head to remove, e.g. L3H1+L5H0")
        self.finalists = [self.heads]

    def _extra_manifest(self) -> dict:
        return {
            "heads": condition_name(self.heads),
            "n_nominees": None,
            "n_finalists": None,
            "tie_break": None,
        }

    def _check_model(self) -> None:
        from cel_numpy.heads import check_heads

        check_heads(self.heads, self.n_layers, self.n_heads, what="--heads")

    def _null_set_size(self) -> int | None:
        return len(self.heads)

    def report(self):
        from cel_numpy.localize.report import write_test_report

        return write_test_report(self)


def test_heads(
    out,
    make_evaluator: Callable,
    task,
    heads,
    *,
    n_heldout: int,
    n_discovery: int = 100,
    seed: int = 0,
    until: str = "report",
    **kwargs,
) -> dict:
    """Test `heads` (any spelling of cel_numpy.heads) on the held-out panel; {stage: summary}."""
    loc = HeadSetTest(
        out,
        make_evaluator,
        task,
        heads,
        n_discovery=n_discovery,
        n_heldout=n_heldout,
        seed=seed,
        **kwargs,
    )
    return loc.run(until)


test_heads.__test__ = False  # not a pytest test, whatever imports it


def localize(
    out,
    make_evaluator: Callable,
    task,
    *,
    n_discovery: int,
    n_heldout: int,
    seed: int = 0,
    cross_tasks: Sequence = (),
    until: str = "report",
    **kwargs,
) -> dict:
    """Run the routine into `out` up to `until`; returns {stage: summary} (see `Localizer`)."""
    loc = Localizer(
        out,
        make_evaluator,
        task,
        n_discovery=n_discovery,
        n_heldout=n_heldout,
        seed=seed,
        cross_tasks=cross_tasks,
        **kwargs,
    )
    return loc.run(until)
