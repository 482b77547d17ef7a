"""How well the first-order pre-filter (`--screen gradient`) agrees with the exact screen on the
same discovery panel.

Inputs: the estimates of `gradient.json` (L, H): the first-order change of the smooth metric M
when each head is removed (`cel_numpy.localize.gradient`), and the exact screen's conditions
(`screen.done.json`'s summary: one per head screened, with its accuracy gain and its exact mean
change of the reference answer's log-probability, `logprob_change`). Over the heads screened
exactly:

    spearman_logprob   rank correlation of the estimate with the exact log-probability change
                       (the same kind of quantity: how far the first-order estimate ranks right)
    spearman_gain      rank correlation with the exact accuracy gain (what the routine ranks by;
                       coarse integers on small panels, so lower)
    overlap_nominees   heads shared by the estimate's top k and the exact screen's nominees
    overlap_logprob    heads shared by the estimate's top k and the exact top k by logprob change
    nominees_in_top    for a few candidate counts N: how many exact nominees the estimate's
                       top N holds (what `--screen gradient --candidates N` would have kept)

With the exact screen of every head (`--screen exact --gradient-agreement`, or
`scripts/screen_agreement.py EXACT_RUN GRADIENT_RUN`) these are over all heads; inside a
`--screen gradient` run only the candidates were screened exactly, so the numbers are over them
(`complete` false) and the overlaps cannot see a head the pre-filter dropped.
"""

from __future__ import annotations

import math

import numpy as np

CANDIDATE_COUNTS = (10, 20, 30, 50, 100)


def _spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None if either side is constant
    or has a missing value."""
    from scipy.stats import spearmanr

    if len(x) < 3 or any(v is None for v in y) or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    rho = float(spearmanr(x, y).statistic)
    return None if math.isnan(rho) else rho


def _top(values: dict, k: int) -> list:
    """Keys of the k largest values (ties broken by the key: head coordinates)."""
    return sorted(values, key=lambda h: (-values[h], h))[:k]


def screen_agreement(estimate, conditions: list[dict], nominees, k: int = 10) -> dict:
    """The agreement numbers of the module docstring. `estimate`: (L, H) nested lists or array;
    `conditions`: the exact screen's singleton summaries; `nominees`: the exact nominees."""
    est = np.asarray(estimate, dtype=np.float64)  # (L, H)
    n_layers, n_heads = est.shape
    all_est = {(l, h): float(est[l, h]) for l in range(n_layers) for h in range(n_heads)}
    heads = [tuple(c["heads"][0]) for c in conditions]
    screened_est = [all_est[h] for h in heads]
    logprob = [c.get("logprob_change") for c in conditions]
    nominated = {tuple(h) for h in nominees}
    grad_top = set(_top({h: all_est[h] for h in heads}, k))
    exact_lp_top = set(_top(dict(zip(heads, logprob)), k)) if None not in logprob else None
    ranked_all = _top(all_est, len(all_est))
    return {
        "n_heads": len(heads),
        "n_heads_total": len(all_est),
        "complete": len(heads) == len(all_est),
        "k": k,
        "spearman_logprob": _spearman(screened_est, logprob),
        "spearman_gain": _spearman(screened_est, [c["gain"] for c in conditions]),
        "overlap_nominees": len(grad_top & nominated),
        "overlap_logprob": None if exact_lp_top is None else len(grad_top & exact_lp_top),
        "nominees_in_top": {
            str(n): len(set(ranked_all[:n]) & nominated)
            for n in CANDIDATE_COUNTS
            if n <= len(all_est)
        },
    }


def fmt_agreement(a: dict) -> str:
    """One sentence for report.md."""
    rho = lambda v: "undefined" if v is None else f"{v:+.2f}"
    scope = (
        f"all {a['n_heads']} heads"
        if a["complete"]
        else f"the {a['n_heads']} candidates screened exactly (of {a['n_heads_total']})"
    )
    tops = ", ".join(f"top {n}: {m}" for n, m in a["nominees_in_top"].items())
    overlap_lp = "-" if a["overlap_logprob"] is None else f"{a['overlap_logprob']}/{a['k']}"
    return (
        f"gradient pre-filter vs exact screen over {scope}: Spearman {rho(a['spearman_logprob'])} "
        f"with the exact log-probability change, {rho(a['spearman_gain'])} with the exact "
        f"accuracy gain; top-{a['k']} overlap {overlap_lp} (log-probability), "
        f"{a['overlap_nominees']}/{a['k']} with the nominees; exact nominees in the estimate's "
        f"{tops}"
    )
