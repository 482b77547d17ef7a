"""`cel-numpy theory`: train the two-task theory model, ablate heads, write DIR/summary.json."""

from __future__ import annotations

import argparse
import json
import math
import sys

from cel_numpy import limits
from cel_numpy.errors import OptionError
from cel_numpy.heads import head_name, heads_name
from cel_numpy.theory.train import TrainConfig

DEFAULT_SWEEP_SCALES = "1e-4,1e-3,1e-2,1e-1,3e-1,1"


def register(subparsers) -> None:
    d = TrainConfig()
    p = subparsers.add_parser(
        "theory",
        help="train the two-task theory model, ablate heads, write a summary",
        description="Train the two-task theory model (docs/design.md#theory-world), compare with "
        "the closed forms, measure the concentration of the c-feature, and ablate every head and "
        "head set up to size 3.",
    )
    p.add_argument(
        "--heads", type=int, default=d.n_heads, help=f"number of heads H (default {d.n_heads})"
    )
    p.add_argument(
        "--p-a", type=float, default=d.p_a, help=f"probability of task A (default {d.p_a})"
    )
    p.add_argument(
        "--init",
        type=float,
        default=d.init_scale,
        help=f"init scale sigma0 (default {d.init_scale})",
    )
    p.add_argument("--steps", type=int, default=d.steps, help=f"gradient steps (default {d.steps})")
    p.add_argument("--lr", type=float, default=d.lr, help=f"learning rate (default {d.lr})")
    p.add_argument(
        "--batch", type=int, default=d.batch_size, help=f"batch size (default {d.batch_size})"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--eval-samples",
        type=int,
        default=50_000,
        help="fresh held-out samples per task (default 50000)",
    )
    p.add_argument("--out", default="runs/theory", help="output directory (default runs/theory)")
    p.add_argument(
        "--sweep-init",
        action="store_true",
        help="sweep init scales x seeds; plot concentration vs init",
    )
    p.add_argument(
        "--sweep-scales",
        default=DEFAULT_SWEEP_SCALES,
        help="comma-separated init scales for --sweep-init",
    )
    p.add_argument(
        "--sweep-seeds",
        type=int,
        default=3,
        help="seeds per init scale for --sweep-init (default 3)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=main)


MAX_HEADS = 64  # the analysis ablates every set of up to 3 heads: C(64, 3) = 41664 sets


def sample_bytes(n_heads: int, n_tokens: int = 8, n_types: int = 8, d_content: int = 8) -> int:
    """A generous bound on the memory one sample takes in a training step or an evaluation
    (measured: about 2.8 kB at the default sizes; inputs, per-head scores and gradients)."""
    return 8 * n_tokens * (n_types + d_content + 2 * n_heads) * 3


def check_memory(args) -> None:
    """--batch and --eval-samples must fit in this machine's memory (not a MemoryError later)."""
    for flag, n in (("--batch", args.batch), ("--eval-samples", args.eval_samples)):
        limits.check_memory(
            n * sample_bytes(args.heads),
            f"{flag} {n}",
            f"use a smaller {flag}",
            context=f" with --heads {args.heads}",
        )


def _config(args) -> TrainConfig:
    if not 0.0 <= args.p_a <= 1.0:
        raise OptionError(f"--p-a must lie in [0, 1], got {args.p_a}")
    if args.seed < 0:
        raise OptionError(f"--seed must be 0 or more (a NumPy seed), got {args.seed}")
    if args.eval_samples < 100:
        raise OptionError(f"--eval-samples must be >= 100, got {args.eval_samples}")
    if not 1 <= args.heads <= MAX_HEADS:
        raise OptionError(
            f"--heads must lie in [1, {MAX_HEADS}] (the analysis ablates every set of up to 3 "
            f"heads), got {args.heads}"
        )
    for flag, value in (("--lr", args.lr), ("--init", args.init)):
        if not 0 < value < math.inf:
            raise OptionError(f"{flag} must be a finite number > 0, got {value}")
    if args.batch >= 1 and args.eval_samples >= 100:
        check_memory(args)
    try:
        return TrainConfig(
            n_heads=args.heads,
            p_a=args.p_a,
            init_scale=args.init,
            steps=args.steps,
            lr=args.lr,
            batch_size=args.batch,
            log_every=max(1, args.steps // 60),
        )
    except ValueError as err:
        raise OptionError(str(err)) from None


def _parse_scales(text: str) -> list[float]:
    try:
        scales = [float(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise OptionError(f"--sweep-scales must be comma-separated numbers, got {text!r}") from None
    if not scales or not all(0 < s < math.inf for s in scales):  # nan fails both
        raise OptionError(f"--sweep-scales must be finite numbers > 0, got {text!r}")
    return scales


def format_table(summary: dict) -> str:
    """The short report printed by `cel-numpy theory`."""
    cf, tl = summary["closed_form"], summary["task_losses"]
    lines = [
        f"{'loss':8s} {'trained':>9s} {'closed form':>12s}",
        f"{'joint':8s} {summary['joint_loss']:9.4f} {cf['joint']:12.4f}",
        f"{'task A':8s} {tl['a']:9.4f} {cf['a']:12.4f}",
        f"{'task B':8s} {tl['b']:9.4f} {cf['b']:12.4f}",
        f"joint loss with z integrated exactly: {summary['joint_loss_integrated']:.4f}"
        f" ({summary['joint_loss_integrated'] / cf['joint'] - 1:+.2%} vs closed form)"
        if cf["joint"] > 0
        else "",
        f"concentration index: {summary['concentration']:.3f} "
        f"(c-feature head: {head_name((0, summary['c_head']))})",
        "",
        f"{'head':>4s} {'c-loading':>10s} {'s-loading':>10s} {'ablate dA':>10s} {'ablate dB':>10s}",
    ]
    for h in summary["heads"]:
        lines.append(
            f"{head_name((0, h['head'])):>4s} {h['c_loading']:10.4f} {h['s_loading']:10.4f}"
            f" {h['ablate_delta_a']:+10.4f} {h['ablate_delta_b']:+10.4f}"
        )
    best = summary["best_joint_ablation"]
    lines.append(
        f"best ablation (sets up to size 3): {heads_name([(0, h) for h in best['heads']])}  "
        f"dA {best['delta_a']:+.4f}  dB {best['delta_b']:+.4f}"
    )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from cel_numpy.outdir import prepare_out, run_directory_holding
    from cel_numpy.theory.run import run_theory, sweep_init

    config = _config(args)
    run_dir = run_directory_holding(args.out)
    if run_dir is not None:
        raise OptionError(
            f"--out {args.out} is inside the run directory {run_dir}: give the theory's output "
            "a folder of its own, e.g. --out results/theory"
        )
    out = prepare_out(args.out)  # before any training
    progress = not args.quiet
    if args.sweep_init:
        from cel_numpy import plots

        scales = _parse_scales(args.sweep_scales)
        if args.sweep_seeds < 1:
            raise OptionError(f"--sweep-seeds must be >= 1, got {args.sweep_seeds}")
        seeds = list(range(args.seed, args.seed + args.sweep_seeds))
        records = sweep_init(
            config, scales, seeds, eval_samples=args.eval_samples, progress=progress
        )
        (out / "sweep.json").write_text(
            json.dumps({"config": config.to_dict(), "runs": records}, indent=2) + "\n"
        )
        plots.plot_concentration_vs_init(records, out / "concentration_vs_init.png")
        print(
            f"{'init':>8s} {'seed':>4s} {'conc.':>6s} {'joint':>7s} "
            f"{'c-head dA':>10s} {'c-head dB':>10s}"
        )
        for r in records:
            print(
                f"{r['init_scale']:8.0e} {r['seed']:4d} {r['concentration']:6.3f} "
                f"{r['joint_loss']:7.4f} {r['c_head_delta_a']:+10.4f} {r['c_head_delta_b']:+10.4f}"
            )
        print(f"wrote {out / 'sweep.json'} and {out / 'concentration_vs_init.png'}")
        return 0
    if progress:
        print(
            f"training H={config.n_heads} p_A={config.p_a} init={config.init_scale} "
            f"for {config.steps} steps",
            file=sys.stderr,
        )
    try:
        summary = run_theory(
            config, args.seed, out, eval_samples=args.eval_samples, progress=progress
        )
    except MemoryError:
        raise OptionError(
            f"out of memory with --heads {args.heads} --batch {args.batch} --eval-samples "
            f"{args.eval_samples}: use smaller values"
        ) from None
    print(format_table(summary))
    print(f"wrote {out / 'summary.json'}, params.npz and figures in {out}")
    return 0
