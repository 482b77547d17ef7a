"""Conditions and per-example results: the vocabulary the routine, the evaluators and the run
directory share (a module of its own so that none of them imports another for it).

    Head       (layer, head), both 0-based: L3H1 is layer 3, head 1 (names: cel_numpy.heads)
    Condition  a sorted tuple of heads removed together; INTACT = () is the intact model
    ExampleResult  one item's verdict under one condition
"""

from __future__ import annotations

from dataclasses import dataclass

from cel_numpy.heads import Head, heads_name, parse_heads
from cel_numpy.heads import check_heads as _check_heads

Condition = tuple[Head, ...]  # sorted heads to ablate together; () = intact

INTACT: Condition = ()


@dataclass(frozen=True)
class ExampleResult:
    item_id: str
    correct: bool
    answer: str  # the model's answer: generated text up to the stop, chosen candidate, or y_hat
    # log-probability of the reference answer under this condition (its tokens given the prompt;
    # choice tasks: the correct candidate's); None where an evaluator does not compute it
    ref_logprob: float | None = None


def normalize_condition(heads) -> Condition:
    """Heads in any spelling cel_numpy.heads takes ("L3H1+L5H0", pairs) -> sorted tuple of pairs.

    A head named twice or a malformed name is an OptionError (a ValueError).
    """
    return parse_heads(heads)


def condition_name(cond: Condition) -> str:
    """() -> "intact"; ((3, 5), (7, 1)) -> "L3H5+L7H1" (greppable in the records)."""
    return heads_name(cond)


def check_heads(cond: Condition, n_layers: int, n_heads: int) -> None:
    """Every head of `cond` exists in a model of n_layers x n_heads (InvalidHeadError naming it)."""
    _check_heads(cond, n_layers, n_heads)
