"""`cel-numpy localize`: the two-stage head-ablation search on a (model, task), into a run directory."""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from cel_numpy.cli import UserError

DESCRIPTION = """\
Find sparse sets of attention heads whose removal improves a task (DESIGN.md section 5):
baseline (intact twice, must agree), screen (every head alone), joint (pairs and triples of the
top-10 nominees: 175 candidates), confirm (top-10 finalists, fresh intact comparator),
heldout (disjoint panel: exact McNemar test, 95%% interval), crosstask (the finalists on every
other task), report (report.json, report.md, figures). Every stage is resumable: rerun the
same command to continue; finished stages are validated, never silently redone.

--model theory trains the theory model (DESIGN.md section 3, default config, --theory-seed) and
runs the routine on task A (or B); an example is correct iff |y_hat - y| < --tau.
theory:PATH loads params.npz written by `cel-numpy theory`.

A lock file DIR/lock stops two writers; if a run was killed hard and the lock is stale, delete it.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "localize", help="two-stage head-ablation search on a (model, task)", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True,
                   help="smollm2 | theory | theory:PATH/params.npz | a HF folder, .gguf or .npz file")
    p.add_argument("--task", required=True,
                   help="a task name (arithmetic, ioi, greater_than, capitals, antonyms, agreement); A or B for theory")
    p.add_argument("--discovery", type=int, default=100, metavar="N", help="discovery panel size (default 100)")
    p.add_argument("--heldout", type=int, default=200, metavar="M",
                   help="held-out panel size, also the size of each cross-task panel (default 200)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="run directory (created; reused to resume)")
    p.add_argument("--stage", default="report", metavar="NAME",
                   help="run up to and including this stage: baseline, screen, joint, confirm, heldout, crosstask, "
                        "report (default: report)")
    p.add_argument("--seed", type=int, default=0, help="panel seed (default 0)")
    p.add_argument("--ablation", choices=("zero", "mean"), default="zero",
                   help="zero: head output z set to 0; mean: z replaced by its mean over the discovery prompts "
                        "(default zero)")
    p.add_argument("--cross-tasks", default="all", metavar="a,b,c|all|none",
                   help="other tasks to evaluate the finalists on (default all)")
    p.add_argument("--batch-size", type=int, default=16, help="prompts per forward (default 16; no effect on results)")
    p.add_argument("--tau", type=float, default=1.0, help="theory only: correct iff |y_hat - y| < tau (default 1.0)")
    p.add_argument("--theory-seed", type=int, default=0, help="theory only: training seed (default 0)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="evaluate condition chunks in N processes (default 1: sequential; results are identical)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run)


def file_identity(path: Path) -> dict:
    """sha256 and size of a model file (or of every file of a folder, in name order)."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    digest, size = hashlib.sha256(), 0
    for f in files:
        if path.is_dir():
            digest.update(str(f.relative_to(path)).encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
                size += len(chunk)
    return {"file_sha256": digest.hexdigest(), "file_bytes": size}


def _split(names: str) -> list[str]:
    return [n.strip() for n in names.split(",") if n.strip()]


def theory_setup(args):
    """(task, cross tasks, make_evaluator) for --model theory[:PATH]."""
    import numpy as np

    from cel_numpy.localize.evaluate import TheoryEvaluator, TheoryTask
    from cel_numpy.theory import TrainConfig, load_params, train

    config = TrainConfig()
    if args.model == "theory":
        if not args.quiet:
            print(f"training the theory model (default config, seed {args.theory_seed}) ...", file=sys.stderr)
        train_rng, _ = np.random.default_rng(args.theory_seed).spawn(2)  # as `cel-numpy theory` does
        params = train(TrainConfig(log_every=config.steps), train_rng).params
        label = f"theory(seed={args.theory_seed})"
    else:
        params = load_params(args.model.split(":", 1)[1])
        label = args.model
    world = config.world
    names = {"A": "A", "B": "B", "THEORY-A": "A", "THEORY-B": "B"}
    which = names.get(args.task.upper())
    if which is None:
        raise UserError(f"--model theory has tasks A and B (theory-A, theory-B), not {args.task!r}")
    task = TheoryTask(which, world, tau=args.tau)
    other = TheoryTask("B" if which == "A" else "A", world, tau=args.tau)
    if args.cross_tasks in ("all", ""):
        cross = [other]
    elif args.cross_tasks == "none":
        cross = []
    else:
        cross = []
        for n in _split(args.cross_tasks):
            w = names.get(n.upper())
            if w is None:
                raise UserError(f"--cross-tasks: theory tasks are A and B, not {n!r}")
            cross.append(TheoryTask(w, world, tau=args.tau))

    def make_evaluator(t, reference_items):
        return TheoryEvaluator(params, t, ablation=args.ablation, reference_items=reference_items, label=label)

    return task, cross, make_evaluator


def lm_setup(args):
    """(task, cross tasks, make_evaluator) for a real language model."""
    from cel_numpy.localize.evaluate import LMEvaluator
    from cel_numpy.models.loaders import load_model, resolve_source
    from cel_numpy.tasks import TASKS, get_task

    task = get_task(args.task)
    if args.cross_tasks in ("all", ""):
        cross = [t for name, t in TASKS.items() if name != task.name]
    elif args.cross_tasks == "none":
        cross = []
    else:
        cross = [get_task(n) for n in _split(args.cross_tasks)]
    path = resolve_source(args.model)
    ident = file_identity(path)
    model = load_model(args.model)
    cache = {}

    def make_evaluator(t, reference_items):
        if t.name not in cache:
            cache[t.name] = LMEvaluator(model, t, ablation=args.ablation, reference_items=reference_items,
                                        batch_size=args.batch_size, spec=args.model, file_identity=ident)
        return cache[t.name]

    return task, cross, make_evaluator


def run(args) -> int:
    from cel_numpy.localize.routine import STAGES, Localizer

    if args.stage not in STAGES:
        raise UserError(f"--stage must be one of {', '.join(STAGES)}, got {args.stage!r}")
    if args.discovery < 1 or args.heldout < 1:
        raise UserError(f"--discovery and --heldout must be >= 1 (got {args.discovery}, {args.heldout})")
    from cel_numpy.localize.rundir import prepare_out

    prepare_out(args.out)  # an unwritable --out fails before any model is loaded
    if args.model == "theory" or args.model.startswith("theory:"):
        task, cross, make_evaluator = theory_setup(args)
    else:
        task, cross, make_evaluator = lm_setup(args)
    if args.workers < 1:
        raise UserError(f"--workers must be >= 1, got {args.workers}")
    executor = None
    if args.workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        executor = ProcessPoolExecutor(max_workers=args.workers)
    loc = Localizer(args.out, make_evaluator, task, n_discovery=args.discovery, n_heldout=args.heldout,
                    seed=args.seed, cross_tasks=cross, progress=not args.quiet, executor=executor,
                    command="cel-numpy " + " ".join(sys.argv[1:]))
    try:
        results = loc.run(args.stage)
    finally:
        if executor is not None:
            executor.shutdown()
    if "report" in results:
        p = results["report"]["primary"]
        ho = p["heldout"]
        print(f"rank 1: {p['name']}  held-out gain {ho['gain']:+d}/{ho['n']} = {ho['gain_rate']:+.3f} "
              f"[{ho['ci_low']:+.3f}, {ho['ci_high']:+.3f}], exact McNemar p = {ho['p_value']:.3g}")
        print(f"report: {Path(args.out) / 'report.md'}")
    else:
        print(f"stages up to {args.stage} done in {args.out}")
    return 0
