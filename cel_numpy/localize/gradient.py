"""Signed first-order head screen: every head's ablation effect from one forward + backward.

The metric M is the mean over a panel's items of a smooth score read from the same text the
exact evaluation reads (`LMEvaluator.continuation_ids`, so tokenization matches real use):

    generate   log p(answer | prompt), teacher-forced. The answer follows the prompt after the
               task's `answer_separator` (default one space: "Answer:" + " 146"), none when either
               side already has whitespace there.
    choice     log p(correct | prompt) - logsumexp_c log p(c | prompt): the correct candidate's
               log share among the candidates, the smooth counterpart of the argmax that is scored.

Removing head h sets m_h from 1 to 0, so to first order M changes by

    estimate_h = -m_h dM/dm_h   (m_h = 1)

positive: removal helps, negative: removal hurts. `gradient_screen` returns the estimates for all
L x H heads from one forward + backward per batch; `exact_metric_screen` computes the same change
exactly (an exact forward per head, sharing the intact prefix), which is what the estimate is
judged against. The estimate is
exact only when M is linear in the mask (tests/test_backward.py); for a deep network it ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cel_numpy.localize.scoring import answer_text, continuation_log_softmax
from cel_numpy.models.backward import transformer_backward
from cel_numpy.models.transformer import transformer_forward
from cel_numpy.tasks.base import Item


@dataclass(frozen=True)
class MetricRow:
    item: int  # index into the panel
    ids: list[int]  # prompt + continuation tokens
    start: int  # ids[start:] is the scored continuation
    correct: bool  # the continuation is the item's answer (always True for "generate")


def metric_rows(evaluator, items: Sequence[Item]) -> list[MetricRow]:
    """One row per generate item; one per candidate for a choice item."""
    rows = []
    for i, it in enumerate(items):
        if evaluator.task.scoring == "generate":
            texts = [(answer_text(it, getattr(evaluator.task, "answer_separator", " ")), True)]
        else:
            texts = [(choice, choice == it.answer) for choice in it.choices]
        for text, correct in texts:
            ids, start = evaluator.continuation_ids(it.prompt, text)
            rows.append(MetricRow(item=i, ids=ids, start=start, correct=correct))
    return rows


def _chunks(rows: list[MetricRow], max_rows: int) -> list[list[MetricRow]]:
    """Consecutive rows in groups of at most max_rows that never split an item's rows."""
    chunks, current = [], []
    for r in rows:
        if current and len(current) >= max_rows and r.item != current[-1].item:
            chunks.append(current)
            current = []
        current.append(r)
    return chunks + ([current] if current else [])


def _score(logits: np.ndarray, rows: list[MetricRow], T: int, t0: int, scoring: str):
    """Sum of the item metrics from logits (R, T - t0, V) at positions t0..T-1 of a
    left-padded batch.

    Returns total, weight (R,) = d total / d row log-prob, spans (positions predicting each row's
    continuation, relative to t0) and their log-softmaxes, for the backward. Every row ends at
    column T - 1, so its logits are right-aligned as the shared scorer expects.
    """
    spans, logps, row_logp = [], [], np.zeros(len(rows))
    N = T - t0
    for k, r in enumerate(rows):
        targets = r.ids[r.start :]
        logp, row_logp[k] = continuation_log_softmax(logits[k], targets)  # (n, V)
        spans.append(np.arange(N - 1 - len(targets), N - 1))  # (n,)
        logps.append(logp)
    item_of = np.array([r.item for r in rows])
    weight = np.ones(len(rows))
    total = 0.0
    for item in np.unique(item_of):
        members = np.flatnonzero(item_of == item)
        if scoring == "generate":
            total += row_logp[members].sum()
            continue
        lse = np.logaddexp.reduce(row_logp[members])
        correct = [k for k in members if rows[k].correct]
        total += row_logp[correct].sum() - lse
        weight[members] = [float(rows[k].correct) - np.exp(row_logp[k] - lse) for k in members]
    return total, weight, spans, logps


def _first_read(rows: list[MetricRow], T: int) -> int:
    """The earliest position whose logits any row's metric reads."""
    return min(T - len(r.ids) + r.start - 1 for r in rows)


def _chunk_metric(
    model, rows: list[MetricRow], scoring: str, head_mask, head_fill, *, backward: bool
):
    """Sum over the chunk's items of the item metric (plain forward), and dM/dm (L, H)
    if backward."""
    ids, mask = model.pad([r.ids for r in rows])  # (R, T) left-padded
    # (R, T, V)
    logits, cache = transformer_forward(
        model.params,
        model.config,
        ids,
        mask,
        head_mask=head_mask,
        head_fill=head_fill,
        keep_activations=backward,
    )
    total, weight, spans, logps = _score(logits, rows, ids.shape[1], 0, scoring)
    if not backward:
        return total, None
    dlogits = np.zeros_like(logits)  # (R, T, V): d total / d logits
    for k, r in enumerate(rows):
        onehot = np.zeros_like(logps[k])
        onehot[np.arange(len(spans[k])), r.ids[r.start :]] = 1.0
        dlogits[k, spans[k]] = weight[k] * (onehot - np.exp(logps[k]))  # d log p / d logits
    _, dhead_mask = transformer_backward(
        dlogits, model.params, model.config, cache, ids, head_fill=head_fill
    )
    return total, dhead_mask


def panel_metric(evaluator, items: Sequence[Item], *, ablate=None, batch_size: int = 16) -> float:
    """M on a panel (mean over items), with the heads in `ablate` removed."""
    model = evaluator.model
    head_mask = model.head_mask(ablate)
    fill = evaluator.mean_z if head_mask is not None else None
    rows = metric_rows(evaluator, items)
    total = sum(
        _chunk_metric(model, chunk, evaluator.task.scoring, head_mask, fill, backward=False)[0]
        for chunk in _chunks(rows, batch_size)
    )
    return total / len(items)


def gradient_screen(
    evaluator, items: Sequence[Item], *, batch_size: int = 16
) -> tuple[float, np.ndarray]:
    """(M intact, estimate (L, H)): the first-order change of M when each head alone is removed."""
    if not items:
        raise ValueError("gradient screen on an empty panel: give at least one item")
    model = evaluator.model
    c = model.config
    dM_dm = np.zeros((c.n_layers, c.n_heads))
    total = 0.0
    for chunk in _chunks(metric_rows(evaluator, items), batch_size):
        part, dmask = _chunk_metric(
            model, chunk, evaluator.task.scoring, None, evaluator.mean_z, backward=True
        )
        total += part
        dM_dm += dmask
    return total / len(items), -dM_dm / len(items)  # m = 1 everywhere: estimate = -1 * dM/dm


def exact_metric_screen(
    evaluator, items: Sequence[Item], *, batch_size: int = 16
) -> tuple[float, np.ndarray]:
    """(M intact, exact (L, H)): M with each head alone removed, minus M intact.

    Every condition is an exact forward; they share the intact prefix below the removed head and
    run only the positions the metric reads in the last layer (`cel_numpy.models.fast`).
    """
    from cel_numpy.models.fast import ablated_readout, prepare

    model = evaluator.model
    c = model.config
    prep = prepare(model)
    conds = [()] + [((layer, head),) for layer in range(c.n_layers) for head in range(c.n_heads)]
    totals = np.zeros(len(conds))
    for chunk in _chunks(metric_rows(evaluator, items), batch_size):
        ids, mask = model.pad([r.ids for r in chunk])  # (R, T)
        T = ids.shape[1]
        t0 = _first_read(chunk, T)
        per_cond = ablated_readout(
            prep,
            ids,
            mask,
            conds,
            evaluator.mean_z,
            readout=slice(t0, None),
            reduce=lambda lg: np.array(_score(lg, chunk, T, t0, evaluator.task.scoring)[0]),  # noqa: B023 - called within this iteration
        )
        totals += np.array([float(v) for v in per_cond])
    metric = totals / len(items)
    return float(metric[0]), (metric[1:] - metric[0]).reshape(c.n_layers, c.n_heads)
