"""Discovery and held-out panels: disjoint, de-duplicated, deterministic for a seed.

For a `TemplateTask` (finite indexed space per subtask) each panel has equal subtask shares,
remainders going to the first subtasks in order (held-out continuing where discovery stopped).
The items of one subtask for both panels are one draw of distinct indices without replacement
(`rng.choice(space_size, q, replace=False)`), so the two panels cannot overlap; the largest
accepted request is n_discovery + n_heldout = K * (smallest subtask space).

Any other object following the `Task` protocol is served by drawing `task.sample` in rounds
and keeping first occurrences of each `Item.id`, giving up (with an error) after a fixed
number of rounds that add nothing new.
"""

from __future__ import annotations

import hashlib

import numpy as np

from cel_numpy.errors import OptionError
from cel_numpy.tasks.base import Item, Task
from cel_numpy.tasks.template import TemplateTask

_FALLBACK_STALL_ROUNDS = 50


def max_panel_items(task: TemplateTask) -> int:
    """Largest n_discovery + n_heldout accepted for a template task: K * (smallest subtask space)."""
    return len(task.subtasks) * min(task.space_size(s) for s in task.subtasks)


def _shares(n: int, k: int, start: int) -> list[int]:
    """n split over k subtasks as evenly as possible; the n mod k extras go to start, start+1, ..."""
    counts = [n // k] * k
    for j in range(n % k):
        counts[(start + j) % k] += 1
    return counts


def make_panels(
    task: Task, n_discovery: int, n_heldout: int, seed: int
) -> tuple[list[Item], list[Item]]:
    """(discovery, heldout): n_discovery and n_heldout distinct items, no item in both."""
    for label, n in (("n_discovery", n_discovery), ("n_heldout", n_heldout)):
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise OptionError(
                f"{label} must be a positive integer, got {n!r}: an empty panel measures nothing"
            )
    rng = np.random.default_rng(seed)
    if isinstance(task, TemplateTask):
        discovery, heldout = _template_panels(task, int(n_discovery), int(n_heldout), rng)
    else:
        discovery, heldout = _sampled_panels(task, int(n_discovery), int(n_heldout), rng)
    ids_d, ids_h = [it.id for it in discovery], [it.id for it in heldout]
    assert len(discovery) == n_discovery and len(heldout) == n_heldout, "panel size mismatch"
    assert len(set(ids_d)) == len(ids_d) and len(set(ids_h)) == len(ids_h), (
        "duplicate item inside a panel"
    )
    assert not set(ids_d) & set(ids_h), "discovery and held-out panels share an item"
    return discovery, heldout


def _template_panels(task: TemplateTask, n_d: int, n_h: int, rng: np.random.Generator):
    k = len(task.subtasks)
    limit = max_panel_items(task)
    if n_d + n_h > limit:
        sizes = ", ".join(f"{s}={task.space_size(s)}" for s in task.subtasks)
        raise OptionError(
            f"task {task.name!r}: asked for {n_d} + {n_h} = {n_d + n_h} distinct items, the maximum is "
            f"{limit} (equal shares over {k} subtasks; template spaces {sizes})"
        )
    share_d = _shares(n_d, k, start=0)
    share_h = _shares(n_h, k, start=n_d % k)
    per_subtask_d, per_subtask_h = [], []
    for subtask, q_d, q_h in zip(task.subtasks, share_d, share_h):
        indices = rng.choice(task.space_size(subtask), q_d + q_h, replace=False)
        items = [task.item_at(subtask, int(i)) for i in indices]
        per_subtask_d.append(items[:q_d])
        per_subtask_h.append(items[q_d:])
    return _interleave(per_subtask_d), _interleave(per_subtask_h)


def _interleave(groups: list[list[Item]]) -> list[Item]:
    """Round-robin over subtasks, so any prefix of a panel is close to balanced."""
    out = []
    for j in range(max(len(g) for g in groups)):
        out.extend(g[j] for g in groups if j < len(g))
    return out


def _sampled_panels(task: Task, n_d: int, n_h: int, rng: np.random.Generator):
    wanted = n_d + n_h
    seen: dict[str, Item] = {}
    stalled = 0
    while len(seen) < wanted:
        before = len(seen)
        for item in task.sample(rng, wanted - len(seen)):
            seen.setdefault(item.id, item)
        stalled = stalled + 1 if len(seen) == before else 0
        if stalled >= _FALLBACK_STALL_ROUNDS:
            raise OptionError(
                f"task {task.name!r}: asked for {n_d} + {n_h} = {wanted} distinct items, but "
                f"{_FALLBACK_STALL_ROUNDS} rounds of sampling found no new item past {len(seen)}; "
                f"the maximum appears to be {len(seen)}"
            )
    items = list(seen.values())[:wanted]
    return items[:n_d], items[n_d:]


def panel_hash(items: list[Item]) -> str:
    """Order-sensitive hash of a panel's item ids (16 hex chars); raises on an empty panel."""
    if not items:
        raise ValueError("panel_hash of an empty panel")
    return hashlib.sha256("\n".join(it.id for it in items).encode("ascii")).hexdigest()[:16]
