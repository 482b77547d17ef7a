"""Conditions and per-example results: the vocabulary the routine, the evaluators and the run
directory share (a module of its own so that none of them imports another for it).

    Head       (layer, head), both 0-based: L3H1 is layer 3, head 1
    Condition  a sorted tuple of heads removed together; INTACT = () is the intact model
    ExampleResult  one item's verdict under one condition
"""

from __future__ import annotations

from dataclasses import dataclass

Head = tuple[int, int]  # (layer, head), 0-based
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
    """Any iterable of (layer, head) pairs -> sorted tuple of int pairs, duplicates an error."""
    cond = tuple(sorted((int(l), int(h)) for l, h in heads))
    if len(set(cond)) != len(cond):
        raise ValueError(f"condition {cond} names a head twice")
    return cond


def condition_name(cond: Condition) -> str:
    """() -> "intact"; ((3, 5), (7, 1)) -> "L3H5+L7H1" (greppable in the records)."""
    return "+".join(f"L{l}H{h}" for l, h in cond) if cond else "intact"


def check_heads(cond: Condition, n_layers: int, n_heads: int) -> None:
    """Every head of `cond` exists in a model of n_layers x n_heads (ValueError naming it)."""
    for l, h in cond:
        if not (0 <= l < n_layers and 0 <= h < n_heads):
            raise ValueError(
                f"head L{l}H{h} outside the model's {n_layers} layers x {n_heads} heads"
            )
