"""The fast, exact `LMEvaluator.evaluate_many`: many conditions per pass over a panel.

Same results as the naive reference (`evaluate_naive`: one independent evaluation per
condition) -- same answers, same correctness -- at a fraction of the cost, through
`cel_numpy.models.fast`:

  generate  one intact prompt pass per chunk of items; each condition restarts from the intact
            residual stream at its lowest ablated layer (layers below reuse the intact KV
            cache); conditions are decoded together, a row leaves the batch at eos or once its
            text has a newline (the answer is the text before it), and decoding stops when
            every row is done.
  choice    when every candidate is one token appended to the prompt's own encoding (IOI names,
            " is"/" are"), each item runs once -- not once per candidate -- and only the
            candidates' unembedding columns are computed (the log-softmax normaliser is common
            to all candidates at one position, so the logits order them as the log-probs do).
            Otherwise the prompt+candidate rows run as in the reference, logits only at the
            scored positions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cel_numpy.localize.conditions import Condition, ExampleResult, check_heads, normalize_condition
from cel_numpy.models.fast import ablated_readout, generate_conditions, prepare
from cel_numpy.ops import check_finite_scores
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
    if ev.task.scoring == "generate":
        return _generate(ev, items, conds)
    if ev.task.scoring == "choice":
        return _choice(ev, items, conds)
    raise ValueError(f"task {ev.task.name!r} has unknown scoring {ev.task.scoring!r}")


def _generate(ev, items, conds):
    model, tok = ev.model, ev.model.tokenizer
    prep = prepare(model)
    eos = getattr(tok, "eos_id", None)
    is_done = lambda ids: "\n" in tok.decode(list(ids))
    out: list[list[ExampleResult]] = [[] for _ in conds]
    for start in range(0, len(items), ev.batch_size):
        chunk = items[start : start + ev.batch_size]
        prompts = [ev._encode(it.prompt) for it in chunk]
        new = generate_conditions(
            prep,
            prompts,
            model.pad_id,
            conds,
            ev.mean_z,
            ev.task.max_new_tokens,
            eos=eos,
            is_done=is_done,
        )
        for k in range(len(conds)):
            for it, ids in zip(chunk, new[k]):
                text = tok.decode(list(ids)).split("\n", 1)[0]
                out[k].append(ExampleResult(it.id, bool(ev.task.is_correct(it, text)), text))
    return out


def _single_token_choices(ev, items):
    """Per item (prompt ids, [candidate token per choice]) if every candidate is one appended token, else None."""
    out = []
    for it in items:
        if not it.choices:
            raise ValueError(f"choice task item {it.id} has no choices")
        alone = ev._encode(it.prompt)
        toks = []
        for ch in it.choices:
            full, start = ev.continuation_ids(it.prompt, ch)
            if start != len(full) - 1 or full[:start] != alone:
                return None
            toks.append(full[-1])
        out.append((alone, toks))
    return out


def _choice(ev, items, conds):
    model = ev.model
    prep = prepare(model)
    scores = np.full((len(conds), len(items), max(len(it.choices) for it in items)), -np.inf)
    single = _single_token_choices(ev, items)
    if single is not None:
        for start in range(0, len(items), ev.batch_size):
            chunk = single[start : start + ev.batch_size]
            ids, mask = model.pad([p for p, _ in chunk])
            columns = np.array(sorted({t for _, toks in chunk for t in toks}))
            col = {t: i for i, t in enumerate(columns)}
            logits = ablated_readout(
                prep, ids, mask, conds, ev.mean_z, readout=slice(-1, None), columns=columns
            )
            for k, lg in enumerate(logits):  # (b, 1, C)
                for b, (_, toks) in enumerate(chunk):
                    scores[k, start + b, : len(toks)] = [lg[b, 0, col[t]] for t in toks]
    else:
        rows = []  # (item index, choice index, ids, start)
        for i, it in enumerate(items):
            for j, ch in enumerate(it.choices):
                ids, start = ev.continuation_ids(it.prompt, ch)
                rows.append((i, j, ids, start))
        for b0 in range(0, len(rows), ev.batch_size):
            chunk = rows[b0 : b0 + ev.batch_size]
            ids, mask = model.pad([r[2] for r in chunk])
            T = ids.shape[1]
            n = (
                max(len(seq) - start for _, _, seq, start in chunk) + 1
            )  # scored positions, at the end
            logits = ablated_readout(prep, ids, mask, conds, ev.mean_z, readout=slice(T - n, None))
            for k, lg_all in enumerate(logits):  # (b, n, V)
                lg_all = np.asarray(lg_all, dtype=np.float64)
                for r, (i, j, seq, start) in enumerate(chunk):
                    offset = T - len(seq) - (T - n)  # left padding, in read-out coordinates
                    lg = lg_all[r, offset + start - 1 : offset + len(seq) - 1]  # (n_cont, V)
                    m = lg.max(axis=-1, keepdims=True)
                    logp = lg - m - np.log(np.exp(lg - m).sum(axis=-1, keepdims=True))
                    scores[k, i, j] = float(logp[np.arange(len(seq) - start), seq[start:]].sum())
    for k in range(len(conds)):
        check_finite_scores(scores[k], items)
    out = []
    for k in range(len(conds)):
        res = []
        for i, it in enumerate(items):
            chosen = it.choices[int(np.argmax(scores[k, i, : len(it.choices)]))]
            res.append(ExampleResult(it.id, bool(ev.task.is_correct(it, chosen)), chosen))
        out.append(res)
    return out
