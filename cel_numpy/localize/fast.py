"""The fast, exact `LMEvaluator.evaluate_many`: many conditions per pass over a panel.

Same results as the naive reference (`evaluate_naive`: one independent evaluation per
condition) -- same answers, same correctness, the same reference log-probability to float
rounding -- at a fraction of the cost, through `cel_numpy.models.fast`:

  generate  items are sorted by prompt length, then by prompt ids (a batch pads little and
            shares its longest prefix: a chat template, fixed shots) and batched; per batch one
            forward over a prefix tree (common prefix -> each prompt -> [last prompt token] +
            each draft answer) under every condition, each
            condition restarting from the intact residual stream at its lowest ablated layer.
            The intact pass of a batch is kept across calls (`IntactCache`, 1 GiB by default;
            `cel-numpy localize` sizes it from the free memory).
            The drafts are the reference answer and the intact model's greedy answer (computed
            once per evaluator and item): the argmax along a draft settles every row whose greedy
            output follows it to a stop; the other rows decode on from where they leave it
            (`generate_conditions`). The reference draft's logits give `ref_logprob`.
  choice    when every candidate is one token appended to the prompt's own encoding (IOI names,
            " is"/" are", BoolQ's " no"/" yes"), each item runs once -- not once per candidate --
            with full logits at its last position only. Otherwise (HellaSwag's endings) items are
            sorted by context length and batched, and each batch runs as one prefix tree: the
            contexts' common prefix -> each context -> each candidate, so a context runs once
            for all its candidates, with logits only at the candidates' positions.
A batch holds at most `batch_size` items and at most MAX_BATCH_TOKENS padded tokens (a long
prompt runs in a smaller batch, or alone), which bounds the intact pass it keeps in memory.
Log-probabilities come from the shared scorer (`cel_numpy.localize.scoring`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cel_numpy.localize.conditions import Condition, ExampleResult, check_heads, normalize_condition
from cel_numpy.localize.resample import rows_of
from cel_numpy.localize.scoring import (
    choice_results,
    continuation_logprob,
    next_token_log_softmax,
    reference_ids,
    stop_rule,
)
from cel_numpy.models.fast import (
    IntactCache,
    Stop,
    ablated_readout,
    generate_conditions,
    prepare,
    score_continuations,
)
from cel_numpy.tasks.base import Item


def evaluate_many_fast(
    ev, items: Sequence[Item], conditions: Sequence[Condition]
) -> list[list[ExampleResult]]:
    """`LMEvaluator.evaluate_many` through the shared-prefix engine (see the module docstring)."""
    conds = [normalize_condition(c) for c in conditions]
    for c in conds:
        check_heads(c, ev.n_layers, ev.n_heads)
    if not conds:
        return []
    cache = _cache(ev)
    if cache is not None:
        cache.begin_call()
    if ev.task.scoring == "generate":
        return _generate(ev, items, conds)
    if ev.task.scoring == "choice":
        return _choice(ev, items, conds)
    raise ValueError(f"task {ev.task.name!r} has unknown scoring {ev.task.scoring!r}")


def _stop(ev) -> Stop:
    tok = ev.model.tokenizer
    rule = stop_rule(ev.task, tok)
    return Stop(ids=rule.ids, max_new_tokens=rule.max_new_tokens, is_done=rule.is_done(tok))


def _cache(ev) -> IntactCache | None:
    """The evaluator's intact passes, kept across `evaluate_many` calls (None: switched off)."""
    if not ev.intact_cache:
        return None
    return ev.__dict__.setdefault("_intact_cache", IntactCache(ev.intact_cache_bytes))


# Padded prompt tokens one batch may hold (rows x the longest row). The engine keeps a batch's
# intact pass per layer (about 280 KB per token on Qwen2.5-0.5B), so without this bound four
# MBPP problems padded to one 4,300-token prompt took 14 GB; a longer prompt runs alone.
MAX_BATCH_TOKENS = 4096


def token_budget_chunks(
    lengths: Sequence[int], batch_size: int, max_tokens: int | None = None
) -> list[range]:
    """Consecutive chunks (ranges) of the rows, each at most `batch_size` rows whose padded size
    (rows x the longest row's length) stays within `max_tokens` (default MAX_BATCH_TOKENS); a
    row longer than that runs alone. Rows in ascending length order chunk best (little
    padding)."""
    max_tokens = MAX_BATCH_TOKENS if max_tokens is None else max_tokens
    chunks, start, longest = [], 0, 0
    for i, n in enumerate(lengths):
        size = i - start
        if size and (size >= batch_size or (size + 1) * max(longest, n) > max_tokens):
            chunks.append(range(start, i))
            start, longest = i, 0
        longest = max(longest, n)
    if start < len(lengths):
        chunks.append(range(start, len(lengths)))
    return chunks


def _batches(ev, items, refs):
    """Item indices in batches, sorted by prompt length (little padding), then by prompt ids
    (shared prefixes become neighbours); at most ev.batch_size items and MAX_BATCH_TOKENS padded
    prompt tokens each. Sorting by ids alone padded 17% more tokens on a 50-item capitals panel
    (random shots) and 9% more on arithmetic_chat."""
    order = sorted(range(len(items)), key=lambda i: (len(refs[i][0]), refs[i][0]))
    chunks = token_budget_chunks([len(refs[i][0]) for i in order], ev.batch_size)
    return [[order[i] for i in c] for c in chunks]


def _run(ev, items, refs, batch, conds, drafts_of, keep_intact=True, fill=None):
    """generate_conditions on one batch: per condition, [(new ids, ref_logprob)] in batch order.
    fill: what removed heads become for the batch's items (None: zero)."""
    prompts = [refs[i][0] for i in batch]
    drafts = [drafts_of(i) for i in batch]  # the reference answer first
    first = np.cumsum([0] + [len(d) for d in drafts])[:-1]  # row of each prompt's reference
    ref_of_row = {int(c): refs[i][1] for c, i in zip(first, batch)}

    def score(c, logits):  # draft row c's (A + 1, V): its last prompt token and its draft
        return continuation_logprob(logits, ref_of_row[c]) if c in ref_of_row else None

    new, scores = generate_conditions(
        prepare(ev.model),
        prompts,
        conds,
        fill,
        _stop(ev),
        drafts=drafts,
        score=score,
        share_prefix=ev.share_prefix,
        verify=ev.forced,
        cache=_cache(ev) if keep_intact else None,
    )
    return [list(zip(n, [s[c] for c in first])) for n, s in zip(new, scores)]


def _intact(ev, items, refs) -> dict[str, tuple[list[int], float]]:
    """The intact model's (greedy ids, ref_logprob) per item id, computed once per evaluator."""
    memo = ev.__dict__.setdefault("_intact_memo", {})
    todo = [i for i, it in enumerate(items) if it.id not in memo]
    for batch in _batches(ev, [items[i] for i in todo], [refs[i] for i in todo]):
        batch = [todo[i] for i in batch]
        (out,) = _run(ev, items, refs, batch, [()], lambda i: [refs[i][1]], keep_intact=False)
        for i, res in zip(batch, out):
            memo[items[i].id] = res
    return memo


def _guess_draft(answer: list[int], stop: Stop) -> list[int]:
    """The intact model's greedy answer as a draft: without its last token when that token
    ended the generation (the stop text, the token cap), since the argmax after the draft
    gives it. A correct answer then equals the reference draft and adds no row; an answer
    that ended at a stop token is kept whole (the argmax after it gives the stop)."""
    return answer[:-1] if answer and stop.ended_by_last(answer) else answer


# Intact-answer drafts cost one extra intact pass (with decoding) per item, once per evaluator;
# a call with fewer ablated conditions than this does not pay it back (a test-heads held-out
# stage, 1 ablated condition: 29 s against 18 s on 100 capitals items), unless it is paid already.
INTACT_DRAFTS_MIN_CONDITIONS = 4


def _use_intact_drafts(ev, items, conds) -> bool:
    if not ev.intact_drafts:
        return False
    memo = ev.__dict__.get("_intact_memo", {})
    n_ablated = len({c for c in conds if c})
    return n_ablated >= INTACT_DRAFTS_MIN_CONDITIONS or all(it.id in memo for it in items)


def _generate(ev, items, conds):
    tok = ev.model.tokenizer
    rule = stop_rule(ev.task, tok)
    refs = [reference_ids(ev, it) for it in items]  # (prompt ids, reference answer ids)
    use_drafts = _use_intact_drafts(ev, items, conds)
    intact = _intact(ev, items, refs) if use_drafts else {}

    stop = _stop(ev)

    def drafts_of(i):
        ref = refs[i][1]
        guess = _guess_draft(intact[items[i].id][0], stop) if items[i].id in intact else ref
        return [ref] if guess == ref else [ref, guess]

    found: dict[Condition, list] = {c: [None] * len(items) for c in conds}
    ablated = [c for c in dict.fromkeys(conds) if c or not use_drafts]
    fill = ev.fill_for(items) if ablated else None
    for batch in _batches(ev, items, refs) if ablated else []:
        runs = _run(ev, items, refs, batch, ablated, drafts_of, fill=rows_of(fill, batch))
        for c, out in zip(ablated, runs):
            for i, res in zip(batch, out):
                found[c][i] = res
    if () in found and use_drafts:
        found[()] = [intact[it.id] for it in items]
    out = []
    for c in conds:
        res = []
        for it, (ids, logprob) in zip(items, found[c]):
            text = rule.text_of(tok, ids)
            res.append(ExampleResult(it.id, bool(ev.task.is_correct(it, text)), text, logprob))
        out.append(res)
    return out


def _single_token_choices(ev, items):
    """Per item (prompt ids, [candidate token per choice]) if every candidate is one appended
    token, else None."""
    out = []
    for it in items:
        if not it.choices:
            raise ValueError(f"choice task item {it.id} has no choices")
        alone = ev.prompt_ids(it.prompt)
        toks = []
        for ch in it.choices:
            full, start = ev.continuation_ids(it.prompt, ch)
            if start != len(full) - 1 or full[:start] != alone:
                return None
            toks.append(full[-1])
        out.append((alone, toks))
    return out


def _choice_rows(ev, items):
    """Per item, per choice: (context ids, continuation ids), split where the reference
    evaluator starts scoring (`LMEvaluator.continuation_ids`)."""
    out = []
    for it in items:
        rows = []
        for ch in it.choices:
            ids, start = ev.continuation_ids(it.prompt, ch)
            rows.append((ids[:start], ids[start:]))
        out.append(rows)
    return out


def _choice_tree(ev, prep, items, conds, scores, fill) -> None:
    """Multi-token choices: per batch of items one forward over the prefix tree context ->
    choices (`score_continuations`), so a context shared by its choices runs once. Fills
    scores (n_conds, n_items, n_choices) in place.

    fill: None (zero), (L, H, E) for every row (mean ablation), or (L, n_items, H, E) one per
    item (resample ablation): then each item's context is its own root row, carrying its fill,
    and the batch shares no prefix (one prefix row would serve every item)."""
    per_item = fill is not None and fill.ndim == 4
    rows = _choice_rows(ev, items)
    longest = [max(len(c) + len(x) for c, x in rows[i]) for i in range(len(items))]
    order = sorted(range(len(items)), key=lambda i: (max(len(c) for c, _ in rows[i]), rows[i]))
    for chunk in token_budget_chunks([longest[i] for i in order], ev.batch_size):
        batch = [order[i] for i in chunk]
        contexts: dict[tuple, int] = {}  # distinct contexts of the batch, in order
        context_ids, context_item = [], []  # per context: its tokens, the item it was first for
        parent, conts, slots = [], [], []  # per continuation row: its context, ids, (i, j)
        for i in batch:
            for j, (context, cont) in enumerate(rows[i]):
                key = (i, tuple(context)) if per_item else tuple(context)  # per item: not merged
                if key not in contexts:
                    contexts[key] = len(contexts)
                    context_ids.append(list(context))
                    context_item.append(i)
                parent.append(contexts[key])
                conts.append(cont)
                slots.append((i, j))

        def score(k, logits, conts=conts):  # row k's (A + 1, V) -> its total log-probability
            return continuation_logprob(logits, conts[k])

        per_cond = score_continuations(
            prep,
            context_ids,
            conts,
            parent,
            conds,
            rows_of(fill, context_item) if per_item else fill,
            score,
            share_prefix=ev.share_prefix and not per_item,
            cache=_cache(ev),
        )
        for k, logps in enumerate(per_cond):
            for (i, j), lp in zip(slots, logps):
                scores[k, i, j] = lp


def _choice(ev, items, conds):
    scores = _choice_scores(ev, items, conds)
    return [choice_results(ev.task, items, scores[k]) for k in range(len(conds))]


def choice_logprobs_fast(ev, items: Sequence[Item], conds: Sequence[Condition]) -> np.ndarray:
    """`LMEvaluator.choice_logprobs` through the shared-prefix engine: the total log-probability
    of every candidate of every item under every (checked) condition, (n_conds, n_items, max
    choices), -inf past an item's last choice."""
    cache = _cache(ev)
    if cache is not None:
        cache.begin_call()
    return _choice_scores(ev, items, conds)


def _choice_scores(ev, items, conds) -> np.ndarray:
    model = ev.model
    prep = prepare(model)
    scores = np.full((len(conds), len(items), max(len(it.choices) for it in items)), -np.inf)
    fill = ev.fill_for(items)
    single = _single_token_choices(ev, items)
    if single is not None:
        for span in token_budget_chunks([len(p) for p, _ in single], ev.batch_size):
            start, chunk = span.start, single[span.start : span.stop]
            ids, mask = model.pad([p for p, _ in chunk])

            def reduce(lg, chunk=chunk):  # (b, 1, V) -> (b, n_choices) log-probs
                return [next_token_log_softmax(lg[b, 0])[toks] for b, (_, toks) in enumerate(chunk)]

            logits = ablated_readout(
                prep,
                ids,
                mask,
                conds,
                rows_of(fill, slice(start, start + len(chunk))),
                readout=slice(-1, None),
                reduce=reduce,
                share_prefix=ev.share_prefix,
                cache=_cache(ev),
            )
            for k, per_item in enumerate(logits):
                for b, logp in enumerate(per_item):
                    scores[k, start + b, : len(logp)] = logp
    else:
        _choice_tree(ev, prep, items, conds, scores, fill)
    return scores
