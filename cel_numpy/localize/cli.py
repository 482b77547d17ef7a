"""`cel-numpy localize`: the two-stage head-ablation search on a (model, task),
into a run directory."""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from cel_numpy.errors import OptionError, PromptError
from cel_numpy.limits import as_path, check_memory
from cel_numpy.localize.evaluate import BATCH_SIZE
from cel_numpy.localize.fast import MAX_BATCH_TOKENS
from cel_numpy.localize.ranking import (
    MAX_NULL_SETS,
    TIE_BREAKS,
    check_null_set_count,
    check_null_sets,
)
from cel_numpy.localize.routine import MATCHED_POOL, SCREENS
from cel_numpy.models.loaders import KNOWN_NAMES
from cel_numpy.outdir import out_arg
from cel_numpy.tasks import CODE_TASKS, TASKS, FileTask

DEFAULT_CANDIDATES = 30  # --screen gradient: heads screened exactly
DEFAULT_TAU = 1.0  # --tau: a theory prediction is correct iff |y_hat - y| < tau

MAX_SAMPLED_PANEL = (
    100_000  # items per panel of a sampled (theory) task: beyond this, memory, not insight
)
THEORY_TASKS = {"A": "A", "B": "B", "THEORY-A": "A", "THEORY-B": "B"}

DESCRIPTION = """\
Find sparse sets of attention heads whose removal improves a task (docs/design.md#protocol):
baseline (intact twice, must agree), screen (every head alone), joint (pairs and triples of the
top-10 nominees: 175 candidates), confirm (top-10 finalists, fresh intact comparator),
heldout (a panel sharing no cluster -- country, antonym pair, subject noun... -- with discovery:
cluster sign-flip test and cluster bootstrap interval, item-level McNemar as secondary), nulls
(with --null-sets N: random head sets of the rank-1 size on held-out), matched-pool and
matched-null (with --matched-null R: the selection-matched null, R replicates of "the best of
175 random sets by the search's own ranking", each pick tested on held-out; priced before it
runs), crosstask (the finalists on every other task, exploratory), report (report.json,
report.md, figures; every held-out gain also as the mean change of the reference answer's
log-probability with its cluster interval). Every stage is resumable: rerun the same command to
continue; finished stages are validated, never silently redone. Finished stages keep their
per-item records gzip-compressed (<stage>.jsonl.gz: the copy to keep; `cel-numpy summarize
--verify` recomputes a table from them); docs/results-format.md.

--model theory trains the theory model (docs/design.md#theory-world, default config, --theory-seed)
and runs the routine on task A (or B); an example is correct iff |y_hat - y| < --tau.
theory:PATH loads params.npz written by `cel-numpy theory`.

Options are checked before any work: task and model names (the known ones are listed), panel
sizes against what the task can produce, --out writable. Ctrl-C stops cleanly ("interrupted;
rerun the same command to resume", exit status 130); finished conditions are kept on disk.
A lock file DIR/lock stops two writers; a lock left by a killed run (its pid no longer running
on this host) is taken over with a note.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "localize",
        help="two-stage head-ablation search on a (model, task)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        required=True,
        help=" | ".join(KNOWN_NAMES)
        + " | theory | theory:PATH/params.npz | a HF folder, .gguf or .npz file",
    )
    p.add_argument(
        "--task",
        required=True,
        help=f"a task name ({', '.join([*TASKS, *CODE_TASKS])}, hellaswag, boolq), a .jsonl "
        "task file (docs/tasks.md); A or B for theory",
    )
    p.add_argument(
        "--discovery", type=int, default=100, metavar="N", help="discovery panel size (default 100)"
    )
    p.add_argument(
        "--heldout",
        type=int,
        default=200,
        metavar="M",
        help="held-out panel size, also the size of each cross-task panel (default 200)",
    )
    p.add_argument(
        "--out",
        required=True,
        type=out_arg,
        metavar="DIR",
        help="run directory (created; reused to resume)",
    )
    p.add_argument(
        "--stage",
        default="report",
        metavar="NAME",
        help="run up to and including this stage: baseline, screen, joint, confirm, heldout, "
        "nulls, matched-pool, matched-null, crosstask, report (default: report)",
    )
    p.add_argument("--seed", type=int, default=0, help="panel seed (default 0)")
    p.add_argument(
        "--ablation",
        choices=("zero", "mean"),
        default="zero",
        help="zero: head output z set to 0; mean: z replaced by its mean over the discovery "
        "prompts (default zero)",
    )
    p.add_argument(
        "--cross-tasks",
        default="all",
        metavar="a,b,c|all|none",
        help="other tasks to evaluate the finalists on (default all)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=BATCH_SIZE,
        help=f"prompts per forward (default {BATCH_SIZE}; fewer when they would pass "
        f"{MAX_BATCH_TOKENS:,} padded tokens; no effect on results)",
    )
    p.add_argument(
        "--tau",
        type=float,
        default=DEFAULT_TAU,
        help=f"theory only: correct iff |y_hat - y| < tau (default {DEFAULT_TAU})",
    )
    p.add_argument(
        "--theory-seed", type=int, default=0, help="theory only: training seed (default 0)"
    )
    p.add_argument(
        "--workers",
        type=workers_option,
        default="auto",
        metavar="N|auto",
        help="evaluate condition chunks in N processes, one BLAS thread each (default auto: one "
        "per core, as many as the available memory holds; 1: sequential, BLAS on every core); "
        "results are identical",
    )
    p.add_argument(
        "--screen",
        choices=SCREENS,
        default="exact",
        help="exact: every head ablated alone (default); gradient: rank heads by the first-order "
        "estimate of removing each (one forward + backward) and screen only the top --candidates "
        "exactly (language models only)",
    )
    p.add_argument(
        "--candidates",
        type=int,
        default=DEFAULT_CANDIDATES,
        metavar="K",
        help="with --screen gradient: heads screened exactly (default 30, at least 10)",
    )
    p.add_argument(
        "--gradient-agreement",
        action="store_true",
        help="with --screen exact on a language model: also compute the first-order estimate "
        "of every head (gradient.json, one forward + backward per batch) and report its "
        "agreement with the exact screen (Spearman, top-10 overlap); --screen gradient runs "
        "report it over their candidates anyway",
    )
    p.add_argument(
        "--tie-break",
        choices=TIE_BREAKS,
        default="logprob",
        help="ties in (gain, damaged, correct, set size): logprob (default) ranks first the "
        "condition that raises the reference answer's mean log-probability most, then head "
        "coordinates; coordinates: head coordinates only (the released rule)",
    )
    p.add_argument(
        "--null-sets",
        type=int,
        default=0,
        metavar="N",
        help="evaluate N random head sets of the rank-1 set's size on the held-out panel and "
        "report the rank-1 set's percentile among them (default 0: none; the README's runs use 20)",
    )
    p.add_argument(
        "--null-seed",
        type=int,
        default=None,
        metavar="S",
        help="seed of the null sets (default: the panel --seed); recorded in the manifest",
    )
    add_fold_arguments(p)
    add_intact_memory_argument(p)
    p.add_argument(
        "--matched-null",
        type=int,
        default=0,
        metavar="R",
        help="the selection-matched null: R replicates of 'the best of the search's budget (175 "
        "sets) of random sets of the rank-1 size, by the search's ranking on discovery', each "
        "pick tested on held-out (default 0: none). Its cost is printed before it runs",
    )
    p.add_argument(
        "--matched-pool",
        type=int,
        default=MATCHED_POOL,
        metavar="P",
        help=f"random sets evaluated once on discovery, from which the replicates draw "
        f"(default {MATCHED_POOL}; at least the budget, 175)",
    )
    p.add_argument(
        "--matched-seed",
        type=int,
        default=None,
        metavar="S",
        help="seed of the matched null's pool and replicates (default: the panel --seed)",
    )
    p.add_argument(
        "--matched-gate",
        type=gate_option,
        default=None,
        metavar="P",
        help="run the matched null only when the rank-1 set's held-out gain is positive with "
        "cluster p < P (e.g. 0.05); else its stages are skipped and the report says why "
        "(default: always run it). A resumed run may add it until its held-out stage "
        "finishes (it is recorded in matched-gate.json) and drop it at any time",
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="print the (condition x item) evaluations of every stage and exit, writing nothing "
        "(the model's configuration and tokenizer are read, not its weights; what the run refuses "
        "before its first evaluation, the plan refuses); stages already finished in --out "
        "are marked, and the rest timed at the pace of its finished screen or joint stage",
    )
    p.add_argument(
        "--pace-from",
        type=Path,
        default=None,
        metavar="DIR",
        help="with --plan: time the stages at the pace (wall seconds per evaluation, with its "
        "workers) of the screen or joint stage finished in this other run directory",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument(
        "--allow-code-execution",
        action="store_true",
        help="consent to running model-written code in the sandbox (needed by mbpp; also "
        "CEL_NUMPY_ALLOW_CODE_EXECUTION=1)",
    )
    p.set_defaults(func=run)
    register_test_heads(subparsers)
    register_summarize(subparsers)


def add_fold_arguments(p) -> None:
    """--fold k --folds K: panels from one of K cluster-disjoint folds (independent
    replications)."""
    p.add_argument(
        "--folds",
        type=int,
        default=None,
        metavar="K",
        help="split the task's clusters into K disjoint folds (a split fixed per task and K) and "
        "draw both panels from one of them, so runs on different folds share no cluster "
        "(independent replications; docs/design.md#panels)",
    )
    p.add_argument(
        "--fold", type=int, default=None, metavar="k", help="with --folds K: the fold, 0..K-1"
    )


def intact_memory_option(text: str) -> float:
    """--intact-memory: gigabytes (1e9 bytes), a number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1e6:  # refuses nan and inf too; a petabyte is no budget
        raise argparse.ArgumentTypeError(
            f"expected gigabytes above 0 and at most 1e6, such as 4, got {text!r}"
        )
    return value


def add_intact_memory_argument(p) -> None:
    p.add_argument(
        "--intact-memory",
        type=intact_memory_option,
        default=None,
        metavar="GB",
        help="gigabytes of intact passes each evaluator may keep (default: 1 GiB plus half the "
        "memory left per worker at start, at most 16 GiB); lower it when another run shares "
        "the machine, since each run sizes its share from the memory free when it starts; "
        "--workers auto counts it in each worker's memory; results are identical",
    )


def resample_seed(args) -> int:
    """The donors' seed of resample ablation: --resample-seed (test-heads), else the panel seed."""
    seed = getattr(args, "resample_seed", None)
    return args.seed if seed is None else seed


def fold_option(args) -> tuple[int, int] | None:
    """(k, K) from --fold/--folds, None without them; OptionError when only one is given."""
    if args.fold is None and args.folds is None:
        return None
    if args.fold is None or args.folds is None:
        raise OptionError("--fold k and --folds K go together (e.g. --fold 0 --folds 3)")
    if args.folds < 2 or not 0 <= args.fold < args.folds:
        raise OptionError(
            f"--fold {args.fold} --folds {args.folds}: want --folds K >= 2 and 0 <= --fold < K"
        )
    return args.fold, args.folds


def gate_option(text: str) -> float:
    """--matched-gate: a p-value threshold in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:  # refuses nan too
        raise argparse.ArgumentTypeError(
            f"expected a p-value threshold in (0, 1], such as 0.05, got {text!r}"
        )
    return value


def workers_option(text: str):
    """--workers: "auto" or a whole number (checked >= 1 with the other options)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of processes or auto, got {text!r}"
        ) from None


def file_identity(path: Path) -> dict:
    """What identifies a model on disk: sha256 and size of exactly the files the loader reads
    (`loaders.model_files`; in a folder each is preceded by its name), and, not part of the
    identity, where they were (`resolved_path`: a run resumed through another spelling of the
    path, or after moving the folder, is the same run)."""
    from cel_numpy.models.loaders import model_files

    path = Path(path)
    digest, size = hashlib.sha256(), 0
    for f in model_files(path):
        if path.is_dir():
            digest.update(str(f.relative_to(path)).encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
                size += len(chunk)
    return {
        "file_sha256": digest.hexdigest(),
        "file_bytes": size,
        "resolved_path": str(path.resolve()),
    }


def _split(names: str) -> list[str]:
    """--cross-tasks 'a,b' -> ['a', 'b']; empty, a name given twice, or all / none beside
    other names is an OptionError."""
    out = [n.strip() for n in names.split(",") if n.strip()]
    out = [n.lower() if n.lower() in ("all", "none") else n for n in out]
    if not out:
        raise OptionError(
            f"--cross-tasks {names!r} names no task: give task names (a,b), all or none"
        )
    for i, name in enumerate(out):
        if name.lower() in (n.lower() for n in out[:i]):
            raise OptionError(f"--cross-tasks: {name!r} is given twice")
        if name in ("all", "none") and len(out) > 1:  # lowercased above
            raise OptionError(
                f"--cross-tasks: {name!r} stands alone; give it by itself, or list task names"
            )
    return out


def _say_if_the_task_is_crossed(task_name: str, cross_names: list[str], given: list[str]) -> None:
    """A cross task that is the --task itself is left out (its own held-out panel is the run's
    primary test), with a note on stderr rather than silently: one --cross-tasks list may serve
    a loop over its own tasks, as round 1's command did."""
    for name, spelled in zip(cross_names, given, strict=True):
        if name == task_name:
            print(
                f"cel-numpy: note: --cross-tasks {spelled} is the --task itself: its held-out "
                "panel is the primary test, so it is not tested again as a cross task",
                file=sys.stderr,
                flush=True,
            )


def is_theory(spec: str) -> bool:
    """--model theory or theory:PATH."""
    return spec == "theory" or spec.startswith("theory:")


def theory_setup(args, which: str, cross_names: list[str]):
    """(task, cross tasks, make_evaluator) for --model theory[:PATH]; names from
    `theory_task_names`."""
    import numpy as np

    from cel_numpy.errors import ModelFileError
    from cel_numpy.localize.evaluate import TheoryEvaluator, TheoryTask
    from cel_numpy.theory import TrainConfig, load_params, train

    config = TrainConfig()
    if args.model == "theory":
        if not args.quiet:
            print(
                f"training the theory model (default config, seed {args.theory_seed}) ...",
                file=sys.stderr,
            )
        # as `cel-numpy theory` does
        train_rng, _ = np.random.default_rng(args.theory_seed).spawn(2)
        params = train(TrainConfig(log_every=config.steps), train_rng).params
        label = f"theory(seed={args.theory_seed})"
    else:
        path = args.model.split(":", 1)[1]
        try:
            params = load_params(path)
        except Exception as err:  # np.load and zipfile raise many types for a wrong or damaged file
            raise ModelFileError(
                f"{path}: not a theory params.npz with arrays K and V "
                f"({type(err).__name__}: {err}); write one with `cel-numpy theory --out DIR`"
            ) from None
        if (
            params["K"].ndim != 2
            or params["V"].ndim != 2
            or params["K"].shape[0] != params["V"].shape[0]
        ):
            raise ModelFileError(
                f"{path}: K {params['K'].shape} and V {params['V'].shape} are not (H, T) and (H, m)"
            )
        label = args.model
    world = config.world
    task = TheoryTask(which, world, tau=args.tau)
    cross = [TheoryTask(w, world, tau=args.tau) for w in cross_names]

    def make_evaluator(t, reference_items):
        return TheoryEvaluator(
            params,
            t,
            ablation=args.ablation,
            reference_items=reference_items,
            label=label,
            resample_seed=resample_seed(args),
        )

    return task, cross, make_evaluator


def theory_task_names(args) -> tuple[str, list[str]]:
    """("A" or "B", cross task letters) for --model theory; OptionError for other names."""
    which = THEORY_TASKS.get(args.task.upper())
    if which is None:
        raise OptionError(
            f"--model theory has tasks A and B (theory-A, theory-B), not {args.task!r}"
        )
    given = _split(args.cross_tasks)
    if given == ["all"]:
        return which, ["B" if which == "A" else "A"]
    if given == ["none"]:
        return which, []
    cross = []
    for n in given:
        w = THEORY_TASKS.get(n.upper())
        if w is None:
            raise OptionError(f"--cross-tasks: theory tasks are A and B, not {n!r}")
        cross.append(w)
    _say_if_the_task_is_crossed(which, cross, given)
    return which, cross


def lm_tasks(args):
    """(task, cross tasks) for a language model; OptionError listing the known tasks otherwise."""
    from cel_numpy.tasks import TASKS, get_task

    task = get_task(args.task)
    given = _split(args.cross_tasks)
    if given == ["all"]:
        return task, [t for name, t in TASKS.items() if name != task.name]
    if given == ["none"]:
        return task, []
    cross = [get_task(n) for n in given]
    _say_if_the_task_is_crossed(task.name, [t.name for t in cross], given)
    return task, cross


def check_panel_sizes(task, cross, n_discovery: int, n_heldout: int) -> None:
    """Every panel the run will build can be built (the routine builds them after
    loading the model).

    Template tasks have a finite item space (`max_panel_items`); sampled tasks are capped at
    MAX_SAMPLED_PANEL items per panel.
    """
    from cel_numpy.tasks import TemplateTask, max_panel_items

    wanted = [(task, n_discovery + n_heldout, f"--discovery {n_discovery} + --heldout {n_heldout}")]
    wanted += [
        (t, n_heldout + 1, f"--heldout {n_heldout} (the cross-task panel size) + 1")
        for t in cross
        if t is not task
    ]
    for t, n, what in wanted:
        if isinstance(t, TemplateTask):
            limit = max_panel_items(t)
            if n > limit:
                raise OptionError(
                    f"task {t.name!r} can produce at most {limit} distinct items; {what} = {n}: "
                    "ask for fewer"
                )
        elif isinstance(getattr(t, "items", None), list):  # a task file: its items
            if n > len(t.items):
                raise OptionError(
                    f"task {t.name!r} has {len(t.items)} items; {what} = {n}: ask for fewer"
                )
        elif max(n_discovery, n_heldout) > MAX_SAMPLED_PANEL:
            raise OptionError(
                f"--discovery and --heldout are limited to {MAX_SAMPLED_PANEL} items "
                f"for task {t.name!r}"
            )


def check_model_name(spec: str) -> None:
    """A known name, theory[:PATH] or an existing path; OptionError listing the
    choices otherwise."""
    from cel_numpy.models.loaders import KNOWN_NAMES

    if spec == "theory" or spec in KNOWN_NAMES:
        return
    if spec.startswith("theory:"):
        if not Path(spec.split(":", 1)[1]).is_file():
            raise OptionError(
                f"--model {spec}: no such file (theory:PATH wants the params.npz written by "
                "`cel-numpy theory --out DIR`)"
            )
        return
    if not as_path(spec, "--model").exists():
        raise OptionError(
            f"--model {spec!r} not found: give a known name ({', '.join(KNOWN_NAMES)}, theory, "
            "theory:PATH/params.npz), a Hugging Face folder, a .gguf or a .npz file"
        )


def check_batch_memory(
    batch_size: int, n_tokens: int, config, itemsize: int, *, full_logits: bool
) -> None:
    """--batch-size must fit in memory: a forward of B sequences of T tokens holds about
    B T (2 H T + 3 F + 8 D) numbers (attention scores and probabilities, the MLP and residual
    activations), and B T V more where logits are computed at every position (`full_logits`:
    the first-order estimate's forward and backward, for --screen gradient or
    --gradient-agreement). The exact engine reads logits only at answer positions, in GEMMs of
    at most a few hundred rows, so its full-vocabulary logits are not priced per token (on
    Gemma 3's 262,144-token vocabulary they would be 90% of the count).
    Refused past half of this machine's memory."""
    c = config
    per_token = 2 * c.n_heads * n_tokens + 3 * c.d_mlp + 8 * c.d_model
    if full_logits:
        per_token += c.vocab_size
    check_memory(
        batch_size * n_tokens * per_token * itemsize,
        f"--batch-size {batch_size}",
        "use a smaller --batch-size",
        context=f" with prompts of up to {n_tokens} tokens on this model"
        + (" (the first-order estimate keeps logits at every position)" if full_logits else ""),
    )


def check_prompt_lengths(
    model, panels: dict, max_new_tokens: dict, tasks: dict | None = None
) -> int:
    """Every prompt (with its longest choice, or its generated answer) fits the model's context;
    returns the longest such length in tokens. `tasks` (panel name -> task): an item of a task
    file is named by its file, line and id."""
    n_ctx = model.config.n_ctx
    fix = "use a model with a longer context or another task (a task file: shorten the item)"
    longest = 1
    for name, items in panels.items():
        task = (tasks or {}).get(name)
        new = max_new_tokens.get(name, 0)
        for it in items:
            if isinstance(task, FileTask):
                where = f"{task.where_item(it)} ({name} panel)"
                what = f"{where}: its prompt"
            else:
                where = f"task {it.task!r} ({name} panel)"
                what = f"a prompt of {where}"
            text = it.prompt + max(it.choices, key=len, default="")
            model.check_text_length(text, what, fix)
            n = len(model.encode(text)) + new
            longest = max(longest, n)
            if n > n_ctx:
                parts = f" ({n - new} for the prompt, max_new_tokens {new} for the answer)"
                raise PromptError(
                    f"{where}: a prompt needs {n} tokens with its answer{parts if new else ''}, "
                    f"more than the model's context of {n_ctx} tokens: "
                    + (
                        f"lower max_new_tokens in the file's options line, or {fix}"
                        if new and isinstance(task, FileTask)
                        else fix
                    )
                )
    return longest


def check_answers_reachable(model, tasks: dict, panels: dict) -> None:
    """A generate item of a task file none of whose accepted answers fits in the file's
    max_new_tokens can never be scored correct: refused, naming the item.

    Generation continues the prompt's own tokens and the output is compared stripped, so an
    answer may come with no lead, a space or the file's separator; its cost is the fewest
    tokens any of these takes after the prompt's ids, as `scoring.reference_ids` counts them
    (the prompt and answer encoded together where the prompt's ids are a prefix of that, else
    the answer alone). Chat prompts (rendered by the template) are not checked."""
    tok = model.tokenizer
    bos = [tok.bos_id] if getattr(tok, "add_bos", False) else []

    def cost(prompt_ids: list[int], prompt: str, continuation: str) -> int:
        full = model.encode(prompt + continuation)
        if full[: len(prompt_ids)] == prompt_ids and len(full) > len(prompt_ids):
            return len(full) - len(prompt_ids)
        alone = model.encode(continuation)
        return len(alone) - (1 if bos and alone[:1] == bos else 0)

    for name, items in panels.items():
        task = tasks[name]
        if not isinstance(task, FileTask) or task.scoring != "generate" or task.chat:
            continue
        leads = {"", " ", task.separator}
        for it in items:
            prompt_ids = model.encode(it.prompt)
            need = min(
                cost(prompt_ids, it.prompt, lead + a)
                for a in task.accepted[it.id]
                for lead in leads
            )
            if need > task.max_new_tokens:
                raise OptionError(
                    f"{task.where_item(it)} ({name} panel) of task {task.name!r} needs "
                    f"{need} tokens for its shortest answer, more than max_new_tokens "
                    f"{task.max_new_tokens}: it could never be scored correct; raise "
                    "max_new_tokens in the file's options line, or drop the item"
                )


def check_prompts(args, model, task, cross, itemsize: int) -> None:
    """What the run checks of its prompts before any evaluation: the model has a tokenizer,
    every panel's prompts fit its context, every generate item's answer fits max_new_tokens, a
    chat task's prompt renders in the model's chat template, and --batch-size fits in memory at
    the longest prompt. `model` needs only its config and tokenizer
    (`loaders.read_weightless_model` for --plan); `itemsize`: bytes per activation."""
    from cel_numpy.localize.routine import build_panels, cross_panel

    if model.tokenizer is None:
        raise OptionError(
            f"--model {args.model}: the model has no tokenizer files (tokenizer.json, or "
            "vocab.json + merges.txt): localization needs text prompts"
        )
    discovery, heldout = build_panels(
        task, args.discovery, args.heldout, args.seed, fold_option(args)
    )
    panels = {"discovery": discovery, "heldout": heldout}
    panels.update(
        {
            f"cross-{t.name}": cross_panel(t, args.heldout, args.seed)
            for t in cross
            if t.name != task.name
        }
    )
    tasks = {"discovery": task, "heldout": task, **{f"cross-{t.name}": t for t in cross}}
    longest = check_prompt_lengths(
        model,
        panels,
        {
            name: getattr(t, "max_new_tokens", 0) if t.scoring == "generate" else 0
            for name, t in tasks.items()
        },
        tasks,
    )
    check_answers_reachable(model, tasks, panels)
    for name, t in tasks.items():  # a chat task needs the model's chat template (one render)
        if getattr(t, "chat", False) and panels.get(name):
            model.chat([{"role": "user", "content": panels[name][0].prompt}])
    full_logits = args.screen == "gradient" or args.gradient_agreement  # test-heads: both off
    check_batch_memory(args.batch_size, longest, model.config, itemsize, full_logits=full_logits)


def lm_setup(args, task, cross, evaluator_options: dict | None = None):
    """(task, cross tasks, make_evaluator, model) for a real language model. `evaluator_options`
    (extra LMEvaluator keywords) is read when each evaluator is made, so a caller may fill it
    after this returns (the intact-pass budget, once the worker plan is known)."""
    evaluator_options = {} if evaluator_options is None else evaluator_options
    from cel_numpy.heads import check_heads
    from cel_numpy.localize.evaluate import LMEvaluator
    from cel_numpy.models.loaders import load_model, resolve_source

    path = resolve_source(args.model)
    size = len(args.heads_parsed) if getattr(args, "heads_parsed", None) else None

    def check_config(config) -> None:  # before any weight is read
        if size:  # test-heads: its heads exist in this model
            check_heads(args.heads_parsed, config.n_layers, config.n_heads, what="--heads")
        check_null_sets(args.null_sets, config.n_layers, config.n_heads, size)

    # a folder that is no model fails here, before any hashing
    model = load_model(args.model, check_config=check_config)
    ident = file_identity(path)
    check_prompts(args, model, task, cross, model.dtype.itemsize)
    cache = {}

    def make_evaluator(t, reference_items):
        if t.name not in cache:
            cache[t.name] = LMEvaluator(
                model,
                t,
                ablation=args.ablation,
                reference_items=reference_items,
                batch_size=args.batch_size,
                spec=args.model,
                file_identity=ident,
                resample_seed=resample_seed(args),
                **evaluator_options,
            )
        return cache[t.name]

    return task, cross, make_evaluator, model


def check_companions(args) -> None:
    """An option that only qualifies another one is refused without it, not silently ignored
    (a --null-seed without --null-sets would run no null at all)."""
    needs = [
        (args.null_seed is not None and not args.null_sets, "--null-seed", "--null-sets N"),
        (
            args.matched_seed is not None and not args.matched_null,
            "--matched-seed",
            "--matched-null R",
        ),
        (
            args.matched_pool != MATCHED_POOL and not args.matched_null,
            "--matched-pool",
            "--matched-null R",
        ),
        (
            args.candidates != DEFAULT_CANDIDATES and args.screen != "gradient",
            "--candidates",
            "--screen gradient",
        ),
        (
            getattr(args, "resample_seed", None) is not None and args.ablation != "resample",
            "--resample-seed",
            "--ablation resample",
        ),
        (args.tau != DEFAULT_TAU and not is_theory(args.model), "--tau", "--model theory"),
        (
            args.theory_seed != 0 and not is_theory(args.model),
            "--theory-seed",
            "--model theory",
        ),
    ]
    for given_alone, option, companion in needs:
        if given_alone:
            raise OptionError(
                f"{option} has no effect without {companion}: add it, or drop {option}"
            )
    if args.theory_seed != 0 and args.model.startswith("theory:"):
        raise OptionError(
            f"--theory-seed trains a new theory model; {args.model} is trained already: drop "
            "--theory-seed, or give --model theory"
        )


def check_options(args) -> None:
    """Everything that needs no model, before any work (OptionError, one line)."""
    from cel_numpy.localize.routine import STAGES

    if args.stage not in STAGES:
        raise OptionError(f"--stage must be one of {', '.join(STAGES)}, got {args.stage!r}")
    if args.discovery < 1 or args.heldout < 1:
        raise OptionError(
            f"--discovery and --heldout must be >= 1 (got {args.discovery}, {args.heldout})"
        )
    workers = 1 if args.workers == "auto" else args.workers
    for flag, value in (("--batch-size", args.batch_size), ("--workers", workers)):
        if value < 1:
            raise OptionError(f"{flag} must be >= 1, got {value}")
    if args.seed < 0 or args.theory_seed < 0:
        raise OptionError(
            f"--seed and --theory-seed must be >= 0 (got {args.seed}, {args.theory_seed})"
        )
    if not args.tau > 0:
        raise OptionError(f"--tau must be > 0, got {args.tau}")
    check_model_name(args.model)
    if args.screen == "gradient" and is_theory(args.model):
        raise OptionError(
            "--screen gradient needs a language model (its backward pass); use --screen exact "
            "with theory"
        )
    if args.gradient_agreement and is_theory(args.model):
        raise OptionError(
            "--gradient-agreement needs a language model (the first-order estimate's backward "
            "pass); the theory model has no gradient screen"
        )
    if args.null_sets < 0 or (args.null_seed is not None and args.null_seed < 0):
        raise OptionError(
            f"--null-sets and --null-seed must be >= 0 (got {args.null_sets}, {args.null_seed})"
        )
    check_null_set_count(args.null_sets)  # against the model's size once its config is read
    matched = (args.matched_null, args.matched_pool, args.matched_seed)
    if (
        args.matched_null < 0
        or args.matched_pool < 1
        or (matched[2] is not None and matched[2] < 0)
    ):
        raise OptionError(
            "--matched-null and --matched-seed must be >= 0 and --matched-pool >= 1 (got "
            f"{args.matched_null}, {args.matched_seed}, {args.matched_pool})"
        )
    if args.matched_null > MAX_NULL_SETS:
        raise OptionError(
            f"--matched-null {args.matched_null}: each replicate is one more best-of-pool pick, "
            f"tested on held-out; at most {MAX_NULL_SETS:,} are run"
        )
    resample = getattr(args, "resample_seed", None)
    if resample is not None and resample < 0:
        raise OptionError(f"--resample-seed must be >= 0, got {resample}")
    if getattr(args, "matched_gate", None) is not None and not args.matched_null:
        raise OptionError("--matched-gate gates the matched null: it needs --matched-null R")
    if args.candidates < 10:
        raise OptionError(
            f"--candidates must be >= 10 (the number of nominees), got {args.candidates}"
        )
    check_companions(args)  # after the range checks: a bad value is named first
    if fold_option(args) is not None and is_theory(args.model):
        raise OptionError(
            "--fold: the theory tasks draw fresh samples (no finite cluster space to split into "
            "folds); run theory without --fold"
        )
    if is_theory(args.model) and max(args.discovery, args.heldout) > MAX_SAMPLED_PANEL:
        raise OptionError(
            f"--discovery and --heldout are limited to {MAX_SAMPLED_PANEL} items "
            "for the theory tasks"
        )


def make_worker_pool(
    workers,
    weights: int = 0,
    shared: bool = True,
    quiet: bool = False,
    intact_gigabytes: float | None = None,
    activations: int | None = None,
):
    """The process pool for --workers N|auto (None for one process); says the plan on stderr.

    auto: one worker per core, capped by the available memory (`workers.auto_workers`): the
    model's `weights` bytes count once when they are `shared` (mapped from the weight cache),
    else once per worker, and each worker counts its `activations` (`workers.activation_bytes`
    of the model) and the intact passes it may keep (`intact_gigabytes`, --intact-memory, in
    place of the 1 GiB default); one process for the
    theory model (no `weights`: its evaluations take milliseconds, workers would only add their
    start-up). N larger than the cores: a warning.
    """
    from cel_numpy.limits import available_memory
    from cel_numpy.localize.workers import WorkerPool, auto_workers, available_cores, memory_split

    cores = available_cores()
    say = (lambda text: None) if quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    if workers == "auto" and not weights:  # the theory model: milliseconds per evaluation
        workers = 1
    if workers == "auto":
        intact = None if intact_gigabytes is None else int(intact_gigabytes * 1e9)
        split = memory_split(weights, shared, intact, activations)
        plan = auto_workers(cores, available_memory(), *split)
        say(f"cel-numpy: --workers auto: {plan.describe()}")
        workers = plan.workers
    if workers <= 1:
        return None
    if workers > cores:
        print(
            f"cel-numpy localize: warning: --workers {workers} is more than the {cores} CPU "
            "cores here: the extra workers only compete for them (each stage starts at most one "
            "worker per piece of work: a chunk of conditions or a slice of a large panel)",
            file=sys.stderr,
            flush=True,
        )
    return WorkerPool(workers)


def check_code_consent(args, tasks) -> None:
    """Tasks that run model-written code need the user's consent, asked before any work; the
    run then says once if the sandbox lacks OS isolation here."""
    from cel_numpy.sandbox import grant_consent, isolation_notice, require_consent

    runs_code = [t.name for t in tasks if getattr(t, "executes_code", False)]
    if not runs_code:
        return
    if getattr(args, "allow_code_execution", False):
        grant_consent()  # also for worker processes
    first = runs_code[0]
    require_consent(f"--task {first}" if first == tasks[0].name else f"--cross-tasks {first}")
    notice = isolation_notice()
    if notice:
        print(notice, file=sys.stderr, flush=True)


def check_lm_run(args):
    """(task, cross tasks) of a language-model run after the checks it makes before loading
    anything, in its order; the run (`_prepare`) and --plan (`run_plan`) share them, so both
    refuse the same input with the same line. Creates nothing."""
    from cel_numpy.outdir import check_out, refuse_inside_run, refuse_other_output

    refuse_inside_run(args.out)
    refuse_other_output(args.out)
    task, cross = lm_tasks(args)
    check_code_consent(args, [task, *cross])
    check_panel_sizes(task, cross, args.discovery, args.heldout)
    if fold_option(args) is not None or args.ablation == "resample":
        from cel_numpy.localize.resample import resample_donors
        from cel_numpy.localize.routine import build_panels

        # a fold holds about 1/K of the clusters, and resample donors need other clusters:
        # both are settled by the panels, which cost milliseconds, so try them now
        _, heldout = build_panels(task, args.discovery, args.heldout, args.seed, fold_option(args))
        if args.ablation == "resample":
            resample_donors([it.cluster for it in heldout], resample_seed(args))
    check_out(args.out)
    return task, cross


def _prepare(args):
    """Check everything that needs no model, then (task, cross tasks, make_evaluator, executor)."""
    from cel_numpy.outdir import prepare_out, refuse_inside_run, refuse_other_output

    check_options(args)
    theory = is_theory(args.model)
    if theory:
        refuse_inside_run(args.out)
        refuse_other_output(args.out)
        which, cross_names = theory_task_names(args)  # before any work: a wrong name costs nothing
    else:
        task, cross = check_lm_run(args)
    prepare_out(args.out)  # an unwritable --out fails before any model is loaded
    weights, shared, activations, evaluator_options = 0, True, None, {}
    if theory:
        task, cross, make_evaluator = theory_setup(args, which, cross_names)
    else:
        from cel_numpy.localize.workers import activation_bytes

        task, cross, make_evaluator, model = lm_setup(args, task, cross, evaluator_options)
        weights, shared = model.weight_bytes(), model.weight_cache is not None
        generation = any(t.scoring == "generate" for t in [task, *cross])
        activations = activation_bytes(model.config, generation=generation)
    executor = make_worker_pool(
        args.workers,
        weights,
        shared,
        quiet=args.quiet,
        intact_gigabytes=args.intact_memory,
        activations=activations,
    )
    if not theory:
        evaluator_options["intact_cache_bytes"] = intact_cache_plan(
            executor,
            weights,
            shared,
            quiet=args.quiet,
            gigabytes=args.intact_memory,
            activations=activations,
        )
    return task, cross, make_evaluator, executor


def intact_cache_plan(
    executor,
    weights: int,
    shared: bool,
    quiet: bool = False,
    gigabytes: float | None = None,
    activations: int | None = None,
) -> int:
    """The intact passes each evaluator may keep: `gigabytes` (--intact-memory) when given,
    else `workers.intact_cache_budget` (the weights count once when `shared`, else once per
    worker; each worker's `activations` as in `make_worker_pool`); said on stderr when given or
    above the default."""
    from cel_numpy.limits import available_memory
    from cel_numpy.localize.workers import intact_cache_budget, memory_split
    from cel_numpy.models.fast import INTACT_CACHE_BYTES

    workers = getattr(executor, "n_workers", 1) if executor is not None else 1
    if gigabytes is not None:
        budget, why = int(gigabytes * 1e9), "(--intact-memory)"
        warn_if_memory_short(workers, *memory_split(weights, shared, budget, activations))
    else:
        once, per_worker = memory_split(weights, shared, None, activations)
        budget = intact_cache_budget(available_memory(), once, workers, per_worker)
        why = (
            f"(half the memory left for {workers} worker{'s' if workers != 1 else ''}), so "
            "large panels are not recomputed in every chunk"
        )
    if (gigabytes is not None or budget > INTACT_CACHE_BYTES) and not quiet:
        print(
            f"cel-numpy: each evaluator keeps up to {budget / 1e9:.1f} GB of intact passes {why}",
            file=sys.stderr,
            flush=True,
        )
    return budget


def warn_if_memory_short(workers: int, once: int, per_worker: int) -> None:
    """A hand-set --intact-memory that, times the workers, may not fit the available memory:
    one warning line, also under --quiet (the run goes on: intact passes are kept only as
    panels fill them)."""
    from cel_numpy.limits import available_memory

    available = available_memory()
    need = once + workers * per_worker
    if available is None or need <= available:
        return
    print(
        f"cel-numpy: warning: {workers} worker{'s' if workers != 1 else ''} with this "
        f"--intact-memory may need {need / 1e9:.1f} GB, more than the {available / 1e9:.1f} GB "
        "available: lower --intact-memory or --workers if a worker is killed",
        file=sys.stderr,
        flush=True,
    )


def _run_with(loc, executor, stage: str, out) -> dict:
    """loc.run(stage), stopping the worker pool on any way out (a dead worker is one line)."""
    from concurrent.futures.process import BrokenProcessPool

    from cel_numpy.errors import WorkerError

    try:
        return loc.run(stage)
    except BrokenProcessPool:
        executor.terminate()
        executor = None
        raise WorkerError(
            f"a worker process died (killed from outside, often by the out-of-memory killer); "
            f"the finished conditions are kept in {out}: rerun the same command to resume "
            "(with fewer --workers if memory is short)"
        ) from None
    except BaseException:
        if executor is not None:  # Ctrl-C, SIGTERM or an error: stop the workers now
            executor.terminate()
            executor = None
        raise
    finally:
        if executor is not None:
            executor.shutdown()


def format_plan(rows, on_disk: dict[str, tuple[bool, int]], pace) -> str:
    """The table `--plan` prints. rows: (stage, conditions, items) from `evaluation_plan`;
    on_disk: {stage: (finished, records written)} of the stages found in --out; pace: (wall
    seconds per evaluation, the stage it was measured on, its run directory) or None."""
    lines = [f"{'stage':<13} {'conditions x items':>22} {'evaluations':>12}  status"]
    total = left = 0.0
    for stage, conditions, items in rows:
        n = conditions * items
        total += n
        finished, written = on_disk.get(stage, (False, 0))
        to_do = 0.0 if finished else max(0.0, n - written)
        left += to_do
        if finished:
            status = "done"
        else:
            status = f"{written:,} on disk; " if written else ""
            status += f"about {to_do * pace[0] / 3600:.1f} h" if pace else "to run"
        about = "about " if isinstance(conditions, float) else ""
        shown = f"{about}{conditions:.0f} x {items}"
        lines.append(f"{stage:<13} {shown:>22} {n:>12,.0f}  {status}")
    lines.append(f"{'total':<13} {'':>22} {total:>12,.0f}")
    if on_disk:
        lines.append(f"{'left':<13} {'':>22} {left:>12,.0f}")
    if pace:
        lines.append(
            f"time left: about {left * pace[0] / 3600:.1f} h at {pace[0]:.3f} s of wall time per "
            f"evaluation (the {pace[1]} stage of {pace[2]}, with the workers it ran with; intact "
            "baseline passes cost more per evaluation)"
        )
    else:
        lines.append(
            "time: no pace known (--pace-from DIR takes it from a finished run of the same "
            "model and task); every stage prints its own estimate after its first chunk"
        )
    return "\n".join(lines)


def check_plan_against_manifest(args, out: Path, task, cross, config) -> None:
    """--plan on an --out written by a run with other settings: the error the run would give,
    instead of a plan that counts that run's stages as this one's.

    Compares the manifest the run would write (`routine.options_manifest`, with the panels
    built) field by field, as the run does, except what needs the weights: the model is
    compared by family, shape and ablation (the run also compares its file's sha256), and the
    rendered prompts are not compared."""
    from cel_numpy.localize import rundir as rd
    from cel_numpy.localize.ranking import N_FINALISTS, N_NOMINEES
    from cel_numpy.localize.routine import Localizer, options_manifest, run_panels

    if not (out / "manifest.json").exists():
        return
    there = rd.read_manifest(out)
    cross = [t for t in cross if t.name != task.name]  # as the routine drops the task itself
    fold = fold_option(args)
    null_seed = args.seed if args.null_seed is None else args.null_seed
    matched_seed = args.seed if args.matched_seed is None else args.matched_seed
    model = {
        "family": config.family,
        "n_layers": config.n_layers,
        "n_heads": config.n_heads,
        "ablation": args.ablation,
    }
    matched = {"replicates": args.matched_null, "pool": args.matched_pool, "seed": matched_seed}
    now = {
        "format": rd.FORMAT,
        "kind": Localizer.kind,
        "model": model,
        **options_manifest(
            task,
            cross,
            run_panels(task, cross, args.discovery, args.heldout, args.seed, fold),
            seed=args.seed,
            n_nominees=N_NOMINEES,
            n_finalists=N_FINALISTS,
            tie_break=args.tie_break,
            null_sets=(args.null_sets, null_seed),
            screen=(args.screen, args.candidates),
            fold=fold,
            matched=matched if args.matched_null else None,
        ),
    }
    there_model = there.get("model") if isinstance(there.get("model"), dict) else {}
    there = {**there, "model": {k: there_model.get(k) for k in model}}
    difference = rd.manifest_difference(there, now)
    if difference is not None:
        raise OptionError(
            f"{out / 'manifest.json'} describes a different run ({difference}); give its own "
            "options, or a fresh --out"
        )


def run_plan(args) -> int:
    """--plan: the evaluations of every stage, from the model's configuration and the options,
    after the checks the run makes before its first evaluation (the model's tokenizer is read,
    not its weights); nothing is written."""
    from cel_numpy.localize import rundir as rd
    from cel_numpy.localize.routine import (
        STAGES,
        check_matched_pool,
        evaluation_plan,
        search_budget,
        stage_pace,
    )
    from cel_numpy.models.loaders import read_weightless_model

    check_options(args)
    if is_theory(args.model):
        raise OptionError("--plan is for language models: a theory localization takes seconds")
    if args.pace_from is not None and not args.pace_from.is_dir():
        raise OptionError(f"--pace-from {args.pace_from}: not a directory; give a run directory")
    task, cross = check_lm_run(args)  # as the run, creating nothing

    def check_config(config) -> None:  # as the run checks it, before the tokenizer is read
        check_null_sets(args.null_sets, config.n_layers, config.n_heads, None)

    weightless = read_weightless_model(args.model, check_config=check_config)
    config = weightless.config
    n_heads = config.n_layers * config.n_heads
    # the prompts' checks, as the run makes them once the model is loaded (float32 activations)
    check_prompts(args, weightless, task, cross, itemsize=4)
    if args.matched_null:  # as the run refuses it before any work
        budget = search_budget(n_heads, args.screen, args.candidates)
        check_matched_pool(args.matched_pool, budget, n_heads)
    check_plan_against_manifest(args, Path(args.out), task, cross, config)
    rows = evaluation_plan(
        n_heads,
        args.discovery,
        args.heldout,
        screen=args.screen,
        n_candidates=args.candidates,
        null_sets=args.null_sets,
        matched_null=args.matched_null,
        matched_pool=args.matched_pool,
        n_cross_tasks=len([t for t in cross if t.name != task.name]),
    )
    rows = [r for r in rows if STAGES.index(r[0]) <= STAGES.index(args.stage)]  # --stage NAME
    out = Path(args.out)
    on_disk = {}
    for stage in STAGES if out.is_dir() else ():
        records, done = rd.stage_paths(out, stage)
        if done.exists():
            on_disk[stage] = (True, 0)
        elif records.exists():  # a stage stopped part way: its finished chunks
            with open(records, "rb") as f:
                on_disk[stage] = (
                    False,
                    sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b"")),
                )
    source = args.pace_from if args.pace_from is not None else out
    found = stage_pace(source) if source.is_dir() else None
    if args.pace_from is not None and found is None:
        raise OptionError(
            f"--pace-from {args.pace_from}: no finished screen or joint stage there "
            "(screen.done.json or joint.done.json); give a run directory that has one"
        )
    print(
        f"plan: {args.model} ({config.n_layers} x {config.n_heads} = {n_heads} heads), "
        f"{task.name}, {args.discovery} discovery / {args.heldout} held-out items"
        + (
            " (the matched null's pool at its largest over rank-1 sizes 1-3"
            + (
                f"; its two stages run only if the held-out gain passes --matched-gate "
                f"{args.matched_gate:g})"
                if args.matched_gate is not None
                else ")"
            )
            if args.matched_null
            else ""
        )
    )
    print(format_plan(rows, on_disk, None if found is None else (*found, source)))
    return 0


def run(args) -> int:
    from cel_numpy.localize.routine import Localizer

    if args.plan:
        return run_plan(args)
    if args.pace_from is not None:
        raise OptionError("--pace-from goes with --plan (it times a plan); add --plan")
    task, cross, make_evaluator, executor = _prepare(args)
    loc = Localizer(
        args.out,
        make_evaluator,
        task,
        n_discovery=args.discovery,
        n_heldout=args.heldout,
        seed=args.seed,
        cross_tasks=cross,
        progress=not args.quiet,
        executor=executor,
        command="cel-numpy " + " ".join(sys.argv[1:]),
        screen=args.screen,
        n_candidates=args.candidates,
        tie_break=args.tie_break,
        null_sets=args.null_sets,
        null_seed=args.null_seed,
        fold=fold_option(args),
        matched_null=args.matched_null,
        matched_pool=args.matched_pool,
        matched_seed=args.matched_seed,
        matched_gate=args.matched_gate,
        gradient_agreement=args.gradient_agreement,
    )
    results = _run_with(loc, executor, args.stage, args.out)
    if "report" in results:
        from cel_numpy.localize.report import (
            fmt_heldout,
            fmt_logprob,
            fmt_matched,
            fmt_matched_skipped,
            fmt_nulls,
        )

        p = results["report"]["primary"]
        print(f"rank 1: {p['name']}  held-out: {fmt_heldout(p['heldout'])}")
        if p.get("heldout_logprob"):
            print(f"mean change of log p(reference): {fmt_logprob(p['heldout_logprob'])} nats")
        if p.get("nulls"):
            print(f"null sets: {fmt_nulls(p['nulls'], p['heldout']['gain'])}")
        if p.get("matched_null"):
            print(f"matched null: {fmt_matched(p['matched_null'], p['heldout']['gain'])}")
        if p.get("matched_null_skipped"):
            print(f"matched null: {fmt_matched_skipped(p['matched_null_skipped'])}")
        print(f"report: {Path(args.out) / 'report.md'}")
    else:
        if "heldout" in results:  # the primary test is settled once the held-out stage is done
            from cel_numpy.localize.report import fmt_heldout

            rank1 = results["heldout"]["heldout"]["finalists"][0]
            print(f"rank 1: {rank1['name']}  held-out: {fmt_heldout(rank1)}")
        print(f"stages up to {args.stage} done in {args.out}")
    return 0


# --------------------------------------------------------------------------- test-heads

TEST_DESCRIPTION = """\
Test a given head set on a held-out panel, with the statistics of the routine's held-out stage:
the heads removed together vs the intact model on the same items, gain with the cluster
sign-flip p and cluster bootstrap interval (primary), exact McNemar and Newcombe's interval on
items (secondary); with --null-sets N, N random sets of as many heads on the same panel.

The panel is the held-out panel `cel-numpy localize` builds with the same --seed, --discovery,
--heldout and --fold (give them all: the default --heldout is 300 here and 200 in localize): a
run's options re-test its set on that run's held-out panel, a new seed tests it on items no run
with that seed has seen. Resumable like localize (rerun the same command); writes report.md,
report.json and the per-example records into --out.

Example: cel-numpy test-heads --model smollm2 --task capitals --heads L10H3+L11H5+L23H0 \\
             --heldout 300 --seed 7 --out results/capitals-heads
"""


def register_test_heads(subparsers) -> None:
    p = subparsers.add_parser(
        "test-heads",
        help="held-out test of a given head set (the routine's statistics), on any model and task",
        description=TEST_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="as for localize (smollm2, theory, a file...)")
    p.add_argument(
        "--task",
        required=True,
        help="a task name, a .jsonl task file (docs/tasks.md); A or B for --model theory",
    )
    p.add_argument(
        "--heads", required=True, metavar="L3H1+L5H0", help="the heads to remove together"
    )
    p.add_argument("--heldout", type=int, default=300, metavar="K", help="held-out items (300)")
    p.add_argument(
        "--discovery",
        type=int,
        default=100,
        metavar="N",
        help="the discovery size the panels are drawn with (default 100, as localize); "
        "never evaluated",
    )
    p.add_argument("--seed", type=int, default=0, help="panel seed (default 0)")
    p.add_argument("--out", required=True, type=out_arg, metavar="DIR", help="run directory")
    p.add_argument(
        "--stage",
        default="report",
        metavar="NAME",
        help="run up to and including this stage: heldout, nulls, report (default: report)",
    )
    p.add_argument("--null-sets", type=int, default=0, metavar="N", help="random sets (0)")
    p.add_argument("--null-seed", type=int, default=None, metavar="S", help="default: --seed")
    p.add_argument(
        "--ablation",
        choices=("zero", "mean", "resample"),
        default="zero",
        help="what a removed head's z becomes: zero (default); mean: its mean over the discovery "
        "prompts; resample: per held-out item, the mean z of a donor item of the same panel from "
        "another cluster (a derangement seeded by --resample-seed; docs/design.md#ablations)",
    )
    p.add_argument(
        "--resample-seed",
        type=int,
        default=None,
        metavar="S",
        help="with --ablation resample: the seed of the donors (default: --seed)",
    )
    p.add_argument(
        "--batch-size", type=int, default=BATCH_SIZE, help=f"prompts per forward ({BATCH_SIZE})"
    )
    p.add_argument(
        "--workers",
        type=workers_option,
        default="auto",
        metavar="N|auto",
        help="processes (default auto: one per core, as memory allows)",
    )
    p.add_argument(
        "--tau", type=float, default=DEFAULT_TAU, help=f"theory only (default {DEFAULT_TAU})"
    )
    p.add_argument("--theory-seed", type=int, default=0, help="theory only (default 0)")
    add_fold_arguments(p)
    add_intact_memory_argument(p)
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument(
        "--allow-code-execution",
        action="store_true",
        help="consent to running model-written code in the sandbox (needed by mbpp; also "
        "CEL_NUMPY_ALLOW_CODE_EXECUTION=1)",
    )
    p.set_defaults(
        func=run_test_heads,
        cross_tasks="none",
        screen="exact",
        candidates=DEFAULT_CANDIDATES,
        tie_break=None,
        matched_null=0,
        matched_pool=MATCHED_POOL,
        matched_seed=None,
        gradient_agreement=False,
    )


def run_test_heads(args) -> int:
    from cel_numpy.heads import parse_heads
    from cel_numpy.localize.conditions import condition_name
    from cel_numpy.localize.report import fmt_heldout, fmt_nulls
    from cel_numpy.localize.routine import TEST_STAGES, HeadSetTest

    if args.stage not in TEST_STAGES:
        raise OptionError(
            f"--stage must be one of {', '.join(TEST_STAGES)} for test-heads, got {args.stage!r}"
        )
    heads = parse_heads(args.heads, what="--heads")
    if not heads:
        raise OptionError("--heads: name at least one head to remove, e.g. L3H1+L5H0")
    args.heads_parsed = heads  # the null sets' size, checked with the model's configuration
    args.stage, stage = "report", args.stage  # check_options knows the localize stages
    task, _, make_evaluator, executor = _prepare(args)
    loc = HeadSetTest(
        args.out,
        make_evaluator,
        task,
        heads,
        n_discovery=args.discovery,
        n_heldout=args.heldout,
        seed=args.seed,
        progress=not args.quiet,
        executor=executor,
        command="cel-numpy " + " ".join(sys.argv[1:]),
        null_sets=args.null_sets,
        null_seed=args.null_seed,
        fold=fold_option(args),
    )
    results = _run_with(loc, executor, stage, args.out)
    if "report" not in results:
        if "heldout" in results:  # the primary test is settled once the held-out stage is done
            print(f"held-out: {fmt_heldout(results['heldout']['heldout']['finalists'][0])}")
        print(f"stages up to {stage} done in {args.out}")
        return 0
    rep = results["report"]
    ho = rep["primary"]["heldout"]
    print(
        f"{condition_name(heads)} on {ho['n']} held-out {task.name} items "
        f"({ho['n_clusters']} clusters): intact {ho['intact_correct']}/{ho['n']}, "
        f"removed {ho['correct']}/{ho['n']}"
    )
    print(f"held-out: {fmt_heldout(ho)}")
    if rep["primary"].get("nulls"):
        print(f"null sets: {fmt_nulls(rep['primary']['nulls'], ho['gain'], 'the set')}")
    for kind in ("rescued", "damaged"):
        for e in rep["examples"][kind][:2]:
            if e["prompt"].startswith("{"):
                continue  # a theory sample: numbers, not text (report.json has them)
            last = e["prompt"].rsplit("\n", 1)[-1][-60:]
            print(
                f"  {kind}: {last!r} -> intact {e['intact'].strip()!r}, removed "
                f"{e['ablated'].strip()!r} (answer {e['answer'].strip()!r})"
            )
    print(f"report: {Path(args.out) / 'report.md'}")
    return 0


# --------------------------------------------------------------------------- summarize


def register_summarize(subparsers) -> None:
    p = subparsers.add_parser(
        "summarize",
        help="one table across finished localize / test-heads runs (Holm across primary tests)",
        description="One markdown table across finished runs: per run the primary head set, its "
        "held-out gain with the cluster bootstrap interval and cluster sign-flip p (Holm-adjusted "
        "across the table), the item-level McNemar p, the null-set percentile, cross-task gains "
        "(exploratory) and the wall time; then how often each head recurs across runs. Run "
        "directories of the old format are refused.",
    )
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    p.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help="also write the numbers as JSON (never inside a run directory)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="recompute every number of the table from each run's per-item records "
        "(<stage>.jsonl or .jsonl.gz) and fail on the first mismatch",
    )
    p.set_defaults(func=run_summarize)


def run_summarize(args) -> int:
    import json

    from cel_numpy.localize.rundir import text_dump
    from cel_numpy.localize.summary import check_output_path, render, summarize

    if args.json:
        check_output_path(args.json, args.runs)
    summary = summarize(args.runs)
    for d in summary["repeated"]:
        print(
            f"cel-numpy summarize: note: {d} names a run directory already given: counted once",
            file=sys.stderr,
        )
    if args.verify:
        from cel_numpy.localize.verify import verify

        verify(summary)
    print(render(summary), end="")
    if args.verify:
        print(
            f"\nverified: every number above recomputed from the records of the "
            f"{len(summary['rows'])} runs (wall times excepted)."
        )
    if args.json:
        text_dump(args.json, json.dumps(summary, indent=1) + "\n")
    return 0
