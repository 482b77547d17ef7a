"""`cel-numpy explain`: the per-head analysis of `cel_numpy.explain` on a task's held-out panel."""

from __future__ import annotations

from cel_numpy.explain import explain, render_markdown, write_explanation
from cel_numpy.heads import parse_heads
from cel_numpy.outdir import out_arg

DESCRIPTION = """Why removing a head set helps (or hurts) a task, head by head, on the held-out
panel `cel-numpy test-heads` draws with the same --discovery, --heldout and --seed: where each
head attends from the answer position, its OV copying score, its direct logit attribution to the
reference and to the competing answer on rescued and damaged items, and what restoring only that
head (activation patching of z) does on the rescued items. Writes report.json, report.md and
explain.png to --out. See docs/mechanism.md.

  cel-numpy explain --model smollm2 --task antonyms --heads L2H1+L13H2 --heldout 100 --out runs/x
"""


def register(subparsers) -> None:
    import argparse

    p = subparsers.add_parser(
        "explain",
        help="why removing given heads changes a task: attention roles, OV copying, direct "
        "logit attribution, activation patching",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="smollm2, qwen2.5-coder-0.5b, a folder/file")
    p.add_argument("--task", required=True, help="a task name (cel_numpy.tasks)")
    p.add_argument("--heads", required=True, metavar="L3H1+L5H0", help="the head set removed")
    p.add_argument("--heldout", type=int, default=100, metavar="K", help="panel items (100)")
    p.add_argument(
        "--discovery",
        type=int,
        default=100,
        metavar="N",
        help="discovery size the panels are drawn with (100, as test-heads); never evaluated",
    )
    p.add_argument("--seed", type=int, default=0, help="panel seed (0)")
    p.add_argument(
        "--out",
        required=True,
        type=out_arg,
        metavar="DIR",
        help="output directory (never a run directory: its report.json is the run's)",
    )
    p.add_argument("--batch-size", type=int, default=8, help="prompts per forward (8)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run)


def run(args) -> int:
    from cel_numpy.errors import OptionError
    from cel_numpy.heads import check_heads
    from cel_numpy.localize.cli import check_model_name, check_panel_sizes, check_prompt_lengths
    from cel_numpy.localize.routine import build_panels
    from cel_numpy.models.loaders import load_model
    from cel_numpy.outdir import prepare_out, run_directory_holding
    from cel_numpy.tasks import get_task

    if args.model == "theory" or args.model.startswith("theory:"):
        raise OptionError(
            "explain reads a language model's attention and unembedding: give --model smollm2, "
            "qwen2.5-coder-0.5b or a model file (the theory world: cel-numpy theory)"
        )
    check_model_name(args.model)
    task = get_task(args.task)
    heads = parse_heads(args.heads, what="--heads")
    if not heads:
        raise OptionError("--heads: name at least one head, e.g. L13H2 or L8H1+L13H2")
    for flag, value, least in (
        ("--batch-size", args.batch_size, 1),
        ("--discovery", args.discovery, 1),
        ("--heldout", args.heldout, 1),
        ("--seed", args.seed, 0),
    ):
        if value < least:
            raise OptionError(f"{flag} must be at least {least}, got {value}")
    check_panel_sizes(task, [], args.discovery, args.heldout)
    run_dir = run_directory_holding(args.out)
    if run_dir is not None:
        raise OptionError(
            f"--out {args.out} is inside the run directory {run_dir}, whose report.json explain "
            "would overwrite: give a folder of its own, e.g. --out explain/my-heads"
        )
    out = prepare_out(args.out)
    model = load_model(args.model)
    if model.tokenizer is None:
        raise OptionError(
            f"--model {args.model}: the model has no tokenizer files: explain needs text prompts"
        )
    check_heads(heads, model.config.n_layers, model.config.n_heads, what="--heads")
    _, items = build_panels(task, args.discovery, args.heldout, args.seed)
    check_prompt_lengths(
        model, {"heldout": items}, {"heldout": task.max_new_tokens}, {"heldout": task}
    )
    say = None if args.quiet else (lambda line: print(line, flush=True))
    report = explain(
        model, task, heads, items, batch_size=args.batch_size, spec=args.model, progress=say
    )
    write_explanation(report, out)
    print(render_markdown(report.to_dict()), end="")
    print(f"report: {out / 'report.md'}, figure: {out / 'explain.png'}")
    return 0
