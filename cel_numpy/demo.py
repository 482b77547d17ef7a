"""`cel-numpy demo` (what `make demo` runs): the whole story in a few minutes on a laptop CPU.

It is a sequence of ordinary `cel-numpy` commands, each printed before it runs, so a newcomer
can re-run any step alone:

1. theory    train the two-task model; the conflicting feature ends up in one head, and
             removing that head helps task A and hurts task B (closed forms alongside).
2. localize  the same two-stage search on SmolLM2-135M-Instruct (fetched once into the cache)
             for a small panel of one task; the report says which heads, removed, help.
3. generate  SmolLM2 intact, then with the rank-1 head set from step 2 removed.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from cel_numpy.heads import heads_name

# A small, few-minute localization: a choice-scored task (no generation), small panels, both cores.
# These panels only show the routine working; the README's results use larger ones.
DEMO_TASK = "agreement"
DEMO_DISCOVERY = 20
DEMO_HELDOUT = 80
DEMO_WORKERS = 2
DEMO_PROMPT = "The capital of France is"


def register(subparsers, run_command) -> None:
    """Add `demo`; run_command(argv) -> exit status runs one `cel-numpy` command (the CLI's main)."""
    p = subparsers.add_parser(
        "demo", help="what `make demo` runs: theory, a small SmolLM2 localization, generation"
    )
    p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    p.add_argument(
        "--task", default=DEMO_TASK, help=f"task for the SmolLM2 localization (default {DEMO_TASK})"
    )
    p.add_argument(
        "--discovery",
        type=int,
        default=DEMO_DISCOVERY,
        help=f"discovery panel size (default {DEMO_DISCOVERY})",
    )
    p.add_argument(
        "--heldout",
        type=int,
        default=DEMO_HELDOUT,
        help=f"held-out panel size (default {DEMO_HELDOUT})",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=DEMO_WORKERS,
        help=f"worker processes (default {DEMO_WORKERS})",
    )
    p.add_argument(
        "--theory-only", action="store_true", help="skip the SmolLM2 steps (no download)"
    )
    p.set_defaults(func=run, run_command=run_command)


def _step(run_command, title: str, argv: list[str]) -> None:
    print(f"\n=== {title}\n$ cel-numpy {shlex.join(argv)}", flush=True)
    status = run_command(argv)
    if status:
        raise SystemExit(status)


def check_localize_step(argv: list[str]) -> None:
    """The localize step's options checked as `cel-numpy localize` checks them, before step 1
    (a wrong --task or panel size fails in one line, not after the theory training)."""
    import argparse

    from cel_numpy.localize import cli as localize_cli

    parser = argparse.ArgumentParser(prog="cel-numpy")
    localize_cli.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    localize_cli.check_options(args)
    task, cross = localize_cli.lm_tasks(args)
    localize_cli.check_panel_sizes(task, cross, args.discovery, args.heldout)


def run(args) -> int:
    from cel_numpy.outdir import prepare_out

    out = Path(args.out)
    if not args.theory_only:
        check_localize_step(
            ["localize", "--model", "smollm2", "--task", args.task, "--discovery",
             str(args.discovery), "--heldout", str(args.heldout), "--cross-tasks", "none",
             "--workers", str(args.workers), "--out", str(out / f"localize-{args.task}")]
        )  # fmt: skip
    prepare_out(out)  # fails in one line, before any work, if the directory cannot be written
    _step(
        args.run_command,
        "1/3 theory: two tasks, one conflicting feature, one head",
        ["theory", "--out", str(out / "theory"), "--quiet"],
    )
    if args.theory_only:
        print(f"\ndone (theory only). Summary: {out / 'theory' / 'summary.json'}")
        return 0
    loc = out / f"localize-{args.task}"
    _step(
        args.run_command,
        f"2/3 localize on SmolLM2-135M-Instruct, task {args.task}",
        [
            "localize",
            "--model",
            "smollm2",
            "--task",
            args.task,
            "--discovery",
            str(args.discovery),
            "--heldout",
            str(args.heldout),
            "--cross-tasks",
            "none",
            "--workers",
            str(args.workers),
            "--out",
            str(loc),
        ],
    )
    report = json.loads((loc / "report.json").read_text())
    heads = report["primary"]["heads"]
    spec = heads_name(heads)
    _step(
        args.run_command,
        "3/3 generate: intact",
        ["generate", "--model", "smollm2", DEMO_PROMPT, "--max-new-tokens", "8"],
    )
    _step(
        args.run_command,
        f"3/3 generate: rank-1 head set {spec} removed",
        ["generate", "--model", "smollm2", DEMO_PROMPT, "--max-new-tokens", "8", "--ablate", spec],
    )
    print(
        f"\nWhere to look:\n  theory summary and figures: {out / 'theory'}\n"
        f"  localization report:        {loc / 'report.md'} (figures beside it)\n",
        file=sys.stdout,
    )
    return 0
