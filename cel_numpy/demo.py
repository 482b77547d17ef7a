"""`cel-numpy demo` (what `make demo` runs): the phenomenon in a few minutes on a laptop CPU.

It is a sequence of ordinary `cel-numpy` commands, each printed before it runs, so a newcomer
can re-run any step alone:

1. theory      train the two-task model; the conflicting feature ends up in one head, and
               removing that head helps task A and hurts task B (closed forms alongside).
2. test-heads  the README's capitals heads on SmolLM2-135M-Instruct (fetched once into the
               cache), tested on a fresh held-out panel: intact vs removed, the routine's
               statistics, and items the removal rescued and damaged.
3. localize    the whole two-stage search (screen, joint sets, held-out test, report), run on
               the theory model so that it takes seconds; its rank-1 set holds step 1's head.
4. generate    SmolLM2 with and without the capitals heads on a prompt whose answer changes.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

# The README's capitals head set: rank 1 of `cel-numpy localize --model smollm2 --task capitals
# --discovery 20 --heldout 300` (panel seed 0), docs/results/archive/round1-old-format/capitals/.
CAPITALS_HEADS = "L10H3+L11H5+L23H0"
# The 19 countries asked by the 20-item discovery panel that chose these heads (seed 0, the
# 70-country table of that run; panel hash ad1275ae in its manifest.json under
# docs/results/archive/round1-old-format/capitals/).
SELECTION_COUNTRIES = (
    "Afghanistan", "Armenia", "Austria", "Bangladesh", "Belgium", "Canada", "Estonia", "Ethiopia",
    "Finland", "Germany", "Iran", "Iraq", "Lebanon", "Malaysia", "North Korea", "Pakistan",
    "Senegal", "Uganda", "Venezuela",
)  # fmt: skip
# A panel seed that no documented run used (README runs: seeds 0-2, see "What you will see"), so
# the held-out items are drawn afresh; 200 items keep the step well under a minute on two cores.
DEMO_SEED = 2026
DEMO_HELDOUT = 200
DEMO_WORKERS = 2
# A prompt whose greedy answer changes, found by generating 24 countries x 3 shot sets with and
# without the heads (README, "What you will see"): intact SmolLM2 answers Lahore, one of
# Pakistan's largest cities; without the three heads, Islamabad, its capital.
DEMO_PROMPT = "Germany: Berlin\nSpain: Madrid\nPeru: Lima\nPakistan:"
# Wall times of each step on an idle 2-core VM, rounded up (test-heads measured 30-42 s, the
# whole demo 47 s; README, "What you will see"), printed at the start as the estimate.
STEP_SECONDS = {"theory": 10, "test-heads": 45, "localize": 15, "generate": 15}


def register(subparsers, run_command) -> None:
    """Add `demo`; run_command(argv) -> exit status runs one `cel-numpy` command
    (the CLI's main)."""
    p = subparsers.add_parser(
        "demo",
        help="what `make demo` runs: theory, the capitals heads tested on SmolLM2, a "
        "localization, generation with and without the heads",
    )
    p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    p.add_argument(
        "--heldout",
        type=int,
        default=DEMO_HELDOUT,
        help=f"held-out items for the capitals test (default {DEMO_HELDOUT})",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=DEMO_SEED,
        help=f"panel seed of the capitals test (default {DEMO_SEED}: no documented run used it)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=DEMO_WORKERS,
        help=f"worker processes (default {DEMO_WORKERS})",
    )
    p.add_argument(
        "--theory-only",
        action="store_true",
        help="only the theory steps (1 and 3): no SmolLM2 download",
    )
    p.set_defaults(func=run, run_command=run_command)


def _step(run_command, title: str, argv: list[str]) -> None:
    print(f"\n=== {title}\n$ cel-numpy {shlex.join(argv)}", flush=True)
    status = run_command(argv)
    if status:
        raise SystemExit(status)


def plan(args) -> list[tuple[str, str, list[str]]]:
    """The demo's steps: (key, title, argv) in order."""
    out = Path(args.out)
    steps = [
        (
            "theory",
            "1/4 theory: two tasks, one conflicting feature, one head",
            ["theory", "--out", str(out / "theory"), "--quiet"],
        )
    ]
    if not args.theory_only:
        steps.append(
            (
                "test-heads",
                f"2/4 the capitals heads {CAPITALS_HEADS} on SmolLM2-135M-Instruct, tested on a "
                f"fresh held-out panel (seed {args.seed}, {args.heldout} items)",
                [
                    "test-heads",
                    "--model",
                    "smollm2",
                    "--task",
                    "capitals",
                    "--heads",
                    CAPITALS_HEADS,
                    "--heldout",
                    str(args.heldout),
                    "--seed",
                    str(args.seed),
                    "--workers",
                    str(args.workers),
                    "--out",
                    str(out / "capitals-heads"),
                ],
            )
        )
    steps.append(
        (
            "localize",
            "3/4 localize: the two-stage search and its report, on the theory model",
            [
                "localize",
                "--model",
                "theory",
                "--task",
                "A",
                "--discovery",
                "200",
                "--heldout",
                "200",
                "--out",
                str(out / "localize-theory"),
            ],
        )
    )
    if not args.theory_only:
        steps.append(
            (
                "generate",
                f"4/4 generate: SmolLM2 intact, then without {CAPITALS_HEADS}",
                [
                    "generate",
                    "--model",
                    "smollm2",
                    DEMO_PROMPT,
                    "--max-new-tokens",
                    "4",
                    "--ablate",
                    CAPITALS_HEADS,
                ],
            )
        )
    for i, (key, title, argv) in enumerate(steps):  # renumber when steps are skipped
        steps[i] = (key, f"{i + 1}/{len(steps)}{title[3:]}", argv)
    return steps


def split_by_selection(run_dir: Path) -> str:
    """A test-heads run's held-out result on the items whose country chose the heads, and on the
    rest (countries the selection never saw): one line each."""
    import json

    from cel_numpy.localize.stats import mcnemar_exact

    items = [json.loads(line) for line in (run_dir / "panels" / "heldout.jsonl").open()]
    verdict: dict[tuple[bool, str], bool] = {}
    for line in (run_dir / "heldout.jsonl").open():
        r = json.loads(line)
        if r.get("panel", "heldout") == "heldout":
            verdict[(r["block"] == "intact", r["item"])] = bool(r["correct"])
    lines = []
    for label, inside in (
        ("asking a country that chose the heads", True),
        ("asking any other", False),
    ):
        ids = [it["id"] for it in items if (it["cluster"] in SELECTION_COUNTRIES) == inside]
        rescued = sum(verdict[(False, i)] and not verdict[(True, i)] for i in ids)
        damaged = sum(verdict[(True, i)] and not verdict[(False, i)] for i in ids)
        countries = len({it["cluster"] for it in items if it["id"] in set(ids)})
        lines.append(
            f"  {len(ids)} items ({countries} countries) {label}: rescued {rescued}, damaged "
            f"{damaged}, exact McNemar p = {mcnemar_exact(rescued, damaged):.2g}"
        )
    return "\n".join(lines)


def check_options(args) -> None:
    """The demo's own options, checked before step 1 (one line, not after the theory training)."""
    from cel_numpy.errors import OptionError

    if args.heldout < 1 or args.seed < 0 or args.workers < 1:
        raise OptionError(
            f"--heldout and --workers must be >= 1 and --seed >= 0 "
            f"(got {args.heldout}, {args.workers}, {args.seed})"
        )


def run(args) -> int:
    from cel_numpy.outdir import prepare_out

    out = Path(args.out)
    check_options(args)
    prepare_out(out)  # fails in one line, before any work, if the directory cannot be written
    steps = plan(args)
    total = sum(STEP_SECONDS[key] for key, _, _ in steps)
    print(
        f"cel-numpy demo: {len(steps)} steps, about {max(1, round(total / 60))} minutes on a "
        f"2-core machine"
        + ("" if args.theory_only else " (plus a 98 MB download the first time)")
        + ": "
        + ", ".join(f"{key} ~{STEP_SECONDS[key]} s" for key, _, _ in steps),
        flush=True,
    )
    start = time.perf_counter()
    for key, title, argv in steps:
        _step(args.run_command, title, argv)
        if key == "test-heads":
            print(split_by_selection(out / "capitals-heads"), flush=True)
    where = [f"  theory summary and figures: {out / 'theory'}"]
    if not args.theory_only:
        where.append(f"  capitals heads report:      {out / 'capitals-heads' / 'report.md'}")
    where.append(f"  localization report:        {out / 'localize-theory' / 'report.md'}")
    print(f"\ndone in {time.perf_counter() - start:.0f} s. Where to look:\n" + "\n".join(where))
    return 0
